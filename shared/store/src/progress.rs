//! Progression (SPEC §4.3): the one place a scan advances, to its next plugin's job and task or
//! to its end, set-wise for any number of scans with a fixed number of statements.

use std::collections::HashMap;

use messages::v1;
use messages::{EventKind, Subjects};
use prost::Message as _;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::StoreError;
use crate::outbox::OutboxEvent;
use crate::states::{EnrichmentJobState, ScanState};

/// A scan job (and its task), due now.
#[derive(Debug, Clone)]
pub struct NewScanJob<'a> {
    pub scan_id: Uuid,
    pub organization_id: Uuid,
    pub position: i32,
    pub plugin: &'a str,
    pub target: &'a str,
    pub priority: i32,
    pub execution_deadline_seconds: Option<i32>,
    pub max_attempts: i32,
}

/// Creates scan jobs and their tasks, due now, in one statement. Returns the task ids, in the
/// order of `jobs`.
pub async fn create_jobs(
    conn: &mut PgConnection,
    jobs: &[NewScanJob<'_>],
) -> Result<Vec<Uuid>, StoreError> {
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    let job_ids: Vec<Uuid> = jobs.iter().map(|_| Uuid::now_v7()).collect();
    let task_ids: Vec<Uuid> = jobs.iter().map(|_| Uuid::now_v7()).collect();
    let scan_ids: Vec<Uuid> = jobs.iter().map(|job| job.scan_id).collect();
    let organizations: Vec<Uuid> = jobs.iter().map(|job| job.organization_id).collect();
    let positions: Vec<i32> = jobs.iter().map(|job| job.position).collect();
    let plugins: Vec<&str> = jobs.iter().map(|job| job.plugin).collect();
    let payloads: Vec<serde_json::Value> = jobs
        .iter()
        .map(|job| {
            serde_json::json!({
                "plugin": job.plugin,
                "target": job.target,
                "position": job.position,
            })
        })
        .collect();
    let priorities: Vec<i32> = jobs.iter().map(|job| job.priority).collect();
    let deadlines: Vec<Option<i32>> = jobs
        .iter()
        .map(|job| job.execution_deadline_seconds)
        .collect();
    let max_attempts: Vec<i32> = jobs.iter().map(|job| job.max_attempts).collect();
    sqlx::query(
        r#"
        WITH input AS (
            SELECT * FROM UNNEST($1::uuid[], $2::uuid[], $3::uuid[], $4::uuid[], $5::int[], $6::text[],
                                 $7::jsonb[], $8::int[], $9::int[], $10::int[])
                AS u(job_id, task_id, scan_id, organization_id, position, plugin, payload, priority,
                     deadline, max_attempts)
        ), jobs AS (
            INSERT INTO scan_jobs (id, scan_id, organization_id, position, plugin)
            SELECT job_id, scan_id, organization_id, position, plugin FROM input
        )
        INSERT INTO worker_tasks (id, organization_id, scan_id, scan_job_id, required_capabilities,
                                  payload, priority, execution_deadline_seconds, max_attempts)
        SELECT task_id, organization_id, scan_id, job_id, ARRAY[plugin], payload, priority, deadline,
               max_attempts
        FROM input
        "#,
    )
    .bind(&job_ids)
    .bind(&task_ids)
    .bind(&scan_ids)
    .bind(&organizations)
    .bind(&positions)
    .bind(&plugins)
    .bind(&payloads)
    .bind(&priorities)
    .bind(&deadlines)
    .bind(&max_attempts)
    .execute(conn)
    .await?;
    Ok(task_ids)
}

/// A scan job whose evidence was just published.
#[derive(Debug, Clone, Copy)]
pub struct CompletedJob {
    pub organization_id: Uuid,
    pub scan_id: Uuid,
    pub position: i32,
    /// The budget the next plugin's task gets.
    pub max_attempts: i32,
}

#[derive(sqlx::FromRow)]
struct LockedScan {
    id: Uuid,
    plugins: Vec<String>,
    state: String,
    client_id: String,
    idempotency_key: String,
    priority: i32,
    execution_deadline_seconds: Option<i32>,
    target: String,
    admitted_at_unix_ms: i64,
}

/// Advances the scans of `completed` (jobs of distinct scans): each active scan gets its next
/// plugin's job and task, or is completed with its one enrichment job. Scans already ended
/// (cancelled, failed) stay as they are. Returns the `task.ready` and `scan.completed` events,
/// in their scans' traces. Locks the scans in id order, after the caller's attempts and tasks.
pub async fn advance(
    conn: &mut PgConnection,
    subjects: &Subjects,
    completed: &[CompletedJob],
) -> Result<Vec<OutboxEvent>, StoreError> {
    if completed.is_empty() {
        return Ok(Vec::new());
    }
    let mut scan_ids: Vec<Uuid> = completed.iter().map(|job| job.scan_id).collect();
    scan_ids.sort_unstable();
    scan_ids.dedup();
    let scans: HashMap<Uuid, LockedScan> = sqlx::query_as::<_, LockedScan>(
        r#"
        SELECT s.id, s.plugins, s.state, s.client_id, s.idempotency_key, s.priority,
               s.execution_deadline_seconds, t.locator AS target,
               (extract(epoch FROM s.created_at) * 1000)::bigint AS admitted_at_unix_ms
        FROM scans s JOIN targets t ON t.id = s.target_id
        WHERE s.id = ANY($1)
        ORDER BY s.id
        FOR UPDATE OF s
        "#,
    )
    .bind(&scan_ids)
    .fetch_all(&mut *conn)
    .await?
    .into_iter()
    .map(|scan| (scan.id, scan))
    .collect();

    let mut next = Vec::new();
    let mut finished = Vec::new();
    for job in completed {
        let scan = scans
            .get(&job.scan_id)
            .ok_or_else(|| StoreError::Corrupt(format!("scan {} vanished", job.scan_id)))?;
        let state = ScanState::parse(&scan.state)
            .ok_or_else(|| StoreError::Corrupt(format!("scan state {:?}", scan.state)))?;
        if state.is_terminal() {
            continue;
        }
        let next_position = job.position + 1;
        match scan.plugins.get(next_position as usize) {
            Some(plugin) => next.push(NewScanJob {
                scan_id: job.scan_id,
                organization_id: job.organization_id,
                position: next_position,
                plugin,
                target: &scan.target,
                priority: scan.priority,
                execution_deadline_seconds: scan.execution_deadline_seconds,
                max_attempts: job.max_attempts,
            }),
            None => finished.push((job.scan_id, job.organization_id)),
        }
    }

    let task_ids = create_jobs(conn, &next).await?;
    let mut events = Vec::with_capacity(next.len() + finished.len());
    for (job, task_id) in next.iter().zip(task_ids) {
        events.push(
            OutboxEvent::new(
                subjects.event(EventKind::TaskReady),
                v1::TaskReady {
                    task_id: task_id.to_string(),
                    scan_id: job.scan_id.to_string(),
                    organization_id: job.organization_id.to_string(),
                    plugin: job.plugin.to_owned(),
                    required_capabilities: vec![job.plugin.to_owned()],
                }
                .encode_to_vec(),
            )
            .in_trace_of(job.scan_id),
        );
    }
    for done in complete_scans(conn, &finished).await? {
        let scan = &scans[&done.scan_id];
        events.push(
            OutboxEvent::new(
                subjects.event(EventKind::ScanCompleted),
                v1::ScanCompleted {
                    scan_id: done.scan_id.to_string(),
                    organization_id: done.organization_id.to_string(),
                    client_id: scan.client_id.clone(),
                    idempotency_key: scan.idempotency_key.clone(),
                    finding_count: done.finding_count as u32,
                    admitted_at_unix_ms: scan.admitted_at_unix_ms,
                    completed_at_unix_ms: done.completed_at_unix_ms,
                    enrichment_job_id: done.enrichment_job_id.to_string(),
                }
                .encode_to_vec(),
            )
            .in_trace_of(done.scan_id),
        );
    }
    Ok(events)
}

#[derive(sqlx::FromRow)]
struct CompletedScan {
    scan_id: Uuid,
    organization_id: Uuid,
    finding_count: i32,
    completed_at_unix_ms: i64,
    enrichment_job_id: Uuid,
}

/// Marks the scans completed and creates each one's enrichment job, in one statement.
async fn complete_scans(
    conn: &mut PgConnection,
    scans: &[(Uuid, Uuid)],
) -> Result<Vec<CompletedScan>, StoreError> {
    if scans.is_empty() {
        return Ok(Vec::new());
    }
    let scan_ids: Vec<Uuid> = scans.iter().map(|(scan_id, _)| *scan_id).collect();
    let job_ids: Vec<Uuid> = scans.iter().map(|_| Uuid::now_v7()).collect();
    Ok(sqlx::query_as(
        r#"
        WITH input AS (
            SELECT * FROM UNNEST($1::uuid[], $2::uuid[]) AS u(scan_id, job_id)
        ), done AS (
            UPDATE scans s SET state = $3, finished_at = now(), updated_at = now(),
                   finding_count = (SELECT count(*) FROM findings f WHERE f.scan_id = s.id)
            FROM input
            WHERE s.id = input.scan_id
            RETURNING s.id, s.organization_id, s.finding_count,
                      (extract(epoch FROM s.finished_at) * 1000)::bigint AS completed_at_unix_ms
        ), created AS (
            -- A scan without CVE findings has nothing to enrich: its job is born completed,
            -- so enrichment never spends a claim on it.
            INSERT INTO enrichment_jobs (id, scan_id, organization_id, state, checkpoint, finished_at)
            SELECT input.job_id, done.id, done.organization_id,
                   CASE WHEN cves.any THEN $4 ELSE $5 END,
                   CASE WHEN cves.any THEN '{}'::jsonb
                        ELSE jsonb_build_object('cve_ids', '[]'::jsonb, 'source', 'none') END,
                   CASE WHEN cves.any THEN NULL ELSE now() END
            FROM done JOIN input ON input.scan_id = done.id
            CROSS JOIN LATERAL (
                SELECT EXISTS (SELECT 1 FROM findings f
                               WHERE f.scan_id = done.id AND cardinality(f.cve_ids) > 0) AS any
            ) cves
            ON CONFLICT (scan_id) DO NOTHING
            RETURNING id, scan_id
        )
        SELECT done.id AS scan_id, done.organization_id, done.finding_count, done.completed_at_unix_ms,
               coalesce(created.id, existing.id) AS enrichment_job_id
        FROM done
        LEFT JOIN created ON created.scan_id = done.id
        LEFT JOIN enrichment_jobs existing ON existing.scan_id = done.id
        "#,
    )
    .bind(&scan_ids)
    .bind(&job_ids)
    .bind(ScanState::Completed.as_str())
    .bind(EnrichmentJobState::Pending.as_str())
    .bind(EnrichmentJobState::Completed.as_str())
    .fetch_all(conn)
    .await?)
}
