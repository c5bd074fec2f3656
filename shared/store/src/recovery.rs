//! Stale-attempt recovery (SPEC §4.5): expired leases go back to the queue or fail
//! terminally when the budget is spent. One statement decides, with `FOR UPDATE SKIP LOCKED`
//! and guards on state and expiry, so it never waits on a busy row and never touches an
//! attempt that completed, renewed or was superseded meanwhile.

use messages::v1;
use messages::{EventKind, Subjects};
use prost::Message as _;
use sqlx::PgPool;
use uuid::Uuid;

use crate::StoreError;
use crate::ingestion::{TerminalFailure, fail_scan_job_and_scan};
use crate::outbox::{self, OutboxEvent};
use crate::retry::RetryPolicy;

/// What one recovery pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryOutcome {
    /// Tasks returned to `retry_wait`.
    pub retried: Vec<Uuid>,
    /// Tasks that spent their budget and failed terminally (their scans failed too).
    pub failed: Vec<Uuid>,
}

impl RecoveryOutcome {
    pub fn is_empty(&self) -> bool {
        self.retried.is_empty() && self.failed.is_empty()
    }
}

#[derive(sqlx::FromRow)]
struct Recovered {
    task_id: Uuid,
    attempt_id: Uuid,
    state: String,
    scan_id: Option<Uuid>,
    scan_job_id: Option<Uuid>,
    organization_id: Uuid,
    plugin: String,
}

impl Recovered {
    /// The task.failed event for this row.
    fn task_failed(&self, subjects: &Subjects, error: &v1::Error, will_retry: bool) -> OutboxEvent {
        OutboxEvent::new(
            subjects.event(EventKind::TaskFailed),
            v1::TaskFailed {
                task_id: self.task_id.to_string(),
                attempt_id: self.attempt_id.to_string(),
                scan_id: self.scan_id.map(|id| id.to_string()).unwrap_or_default(),
                plugin: self.plugin.clone(),
                error: Some(error.clone()),
                will_retry,
            }
            .encode_to_vec(),
        )
    }

    /// Fails this row's scan job and scan; the scan.failed event when the scan changed.
    async fn fail_scan(
        &self,
        conn: &mut sqlx::PgConnection,
        subjects: &Subjects,
        error: &v1::Error,
        reason: &str,
    ) -> Result<Option<OutboxEvent>, StoreError> {
        fail_scan_job_and_scan(
            conn,
            subjects,
            &TerminalFailure {
                organization_id: self.organization_id,
                scan_id: self.scan_id,
                scan_job_id: self.scan_job_id,
                error,
                scan_reason: reason,
            },
        )
        .await
    }
}

/// Recovers up to `limit` expired attempts in one transaction.
pub async fn recover_expired(
    pool: &PgPool,
    subjects: &Subjects,
    retry: RetryPolicy,
    limit: i64,
) -> Result<RecoveryOutcome, StoreError> {
    let mut tx = pool.begin().await?;
    let recovered = sqlx::query_as::<_, Recovered>(
        r#"
        WITH stale AS (
            SELECT a.id, a.task_id FROM worker_task_attempts a
            WHERE a.status IN ('leased', 'running') AND a.lease_expires_at <= now()
            ORDER BY a.lease_expires_at
            LIMIT $1
            FOR UPDATE SKIP LOCKED
        ),
        expired AS (
            UPDATE worker_task_attempts a
            SET status = 'expired', finished_at = now(), updated_at = now(), error_code = 'lease_expired',
                error_message = 'lease expired without renewal'
            FROM stale
            WHERE a.id = stale.id AND a.status IN ('leased', 'running') AND a.lease_expires_at <= now()
            RETURNING a.id, a.task_id
        )
        UPDATE worker_tasks t
        SET state = CASE WHEN t.attempt_count >= t.max_attempts THEN 'failed_terminal' ELSE 'retry_wait' END,
            available_at = now() + make_interval(secs =>
                random() * least($3, $2 * power(2, greatest(t.attempt_count, 1) - 1))),
            completed_at = CASE WHEN t.attempt_count >= t.max_attempts THEN now() END,
            last_error_code = 'lease_expired', last_error = 'lease expired without renewal',
            updated_at = now()
        FROM expired
        WHERE t.id = expired.task_id AND t.current_attempt_id = expired.id AND t.state IN ('leased', 'running')
        RETURNING t.id AS task_id, expired.id AS attempt_id, t.state, t.scan_id, t.scan_job_id,
                  t.organization_id, coalesce(t.payload->>'plugin', '') AS plugin
        "#,
    )
    .bind(limit)
    .bind(retry.base.as_secs_f64())
    .bind(retry.cap.as_secs_f64())
    .fetch_all(&mut *tx)
    .await?;

    let mut outcome = RecoveryOutcome::default();
    let mut events = Vec::new();
    // A failure code, not a refusal: like plugin failure codes it is free-form, and it is
    // the same code the attempt and task rows record.
    let error = v1::Error {
        code: "lease_expired".into(),
        message: "every attempt's lease expired without renewal".into(),
        ..Default::default()
    };
    for row in &recovered {
        let terminal = row.state == "failed_terminal";
        events.push(row.task_failed(subjects, &error, !terminal));
        if !terminal {
            if let Some(scan_job_id) = row.scan_job_id {
                sqlx::query("UPDATE scan_jobs SET state = 'pending', updated_at = now() WHERE id = $1 AND state = 'running'")
                    .bind(scan_job_id)
                    .execute(&mut *tx)
                    .await?;
            }
            outcome.retried.push(row.task_id);
            continue;
        }
        outcome.failed.push(row.task_id);
        let reason = format!(
            "plugin {} spent its attempt budget: every lease expired",
            row.plugin
        );
        events.extend(row.fail_scan(&mut tx, subjects, &error, &reason).await?);
    }
    outbox::enqueue(&mut tx, &events).await?;
    tx.commit().await?;
    Ok(outcome)
}

/// How many `retry_wait` tasks are due now (index-served).
pub async fn due_retries(pool: &PgPool) -> Result<i64, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT 1 FROM worker_tasks WHERE state = 'retry_wait' AND available_at <= now() LIMIT 1000) due",
    )
    .fetch_one(pool)
    .await?)
}

/// Fails live attempts that passed their task's execution deadline, even if they renew:
/// lease expiry and the deadline are separate clocks. A deadline failure is not retried (the
/// same work would overrun again); the task fails terminally and its scan with it. One
/// statement decides, skipping rows another transaction holds.
pub async fn fail_overdue(
    pool: &PgPool,
    subjects: &Subjects,
    limit: i64,
) -> Result<Vec<Uuid>, StoreError> {
    let mut tx = pool.begin().await?;
    let overdue = sqlx::query_as::<_, Recovered>(
        r#"
        WITH overdue AS (
            SELECT a.id FROM worker_task_attempts a JOIN worker_tasks t ON t.id = a.task_id
            WHERE a.status IN ('leased', 'running') AND t.execution_deadline_seconds IS NOT NULL
              AND a.started_at + make_interval(secs => t.execution_deadline_seconds) <= now()
            ORDER BY a.started_at
            LIMIT $1
            FOR UPDATE OF a SKIP LOCKED
        ),
        failed AS (
            UPDATE worker_task_attempts a
            SET status = 'failed', finished_at = now(), updated_at = now(), error_code = 'deadline_exceeded',
                error_message = 'the execution deadline passed'
            FROM overdue WHERE a.id = overdue.id AND a.status IN ('leased', 'running')
            RETURNING a.id, a.task_id
        )
        UPDATE worker_tasks t
        SET state = 'failed_terminal', completed_at = now(), updated_at = now(),
            last_error_code = 'deadline_exceeded', last_error = 'the execution deadline passed'
        FROM failed
        WHERE t.id = failed.task_id AND t.current_attempt_id = failed.id AND t.state IN ('leased', 'running')
        RETURNING t.id AS task_id, failed.id AS attempt_id, t.state, t.scan_id, t.scan_job_id,
                  t.organization_id, coalesce(t.payload->>'plugin', '') AS plugin
        "#,
    )
    .bind(limit)
    .fetch_all(&mut *tx)
    .await?;
    let error = v1::Error {
        code: "deadline_exceeded".into(),
        message: "the execution deadline passed".into(),
        ..Default::default()
    };
    let mut events = Vec::new();
    for row in &overdue {
        events.push(row.task_failed(subjects, &error, false));
        let reason = format!("plugin {} ran past its execution deadline", row.plugin);
        events.extend(row.fail_scan(&mut tx, subjects, &error, &reason).await?);
    }
    outbox::enqueue(&mut tx, &events).await?;
    tx.commit().await?;
    Ok(overdue.iter().map(|row| row.task_id).collect())
}

/// Upload sessions past their expiry (never committed) become `expired`.
pub async fn expire_uploads(pool: &PgPool, limit: i64) -> Result<u64, StoreError> {
    Ok(sqlx::query(
        r#"
        UPDATE worker_artifact_uploads SET status = 'expired'
        WHERE id IN (
            SELECT id FROM worker_artifact_uploads
            WHERE status IN ('prepared', 'uploaded') AND expires_at <= now()
            ORDER BY expires_at LIMIT $1
            FOR UPDATE SKIP LOCKED
        )
        "#,
    )
    .bind(limit)
    .execute(pool)
    .await?
    .rows_affected())
}

/// What one retention pass removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    pub outbox: u64,
    pub batches: u64,
    pub dead_letters: u64,
}

/// Removes transport history older than `retention`: published outbox rows, result-batch
/// records of tasks that ended, dead letters. Evidence (scans, findings, assets) and attempt
/// history are kept. At most `limit` rows of each per pass.
pub async fn prune(
    pool: &PgPool,
    retention: std::time::Duration,
    limit: i64,
) -> Result<Pruned, StoreError> {
    let seconds = crate::seconds(retention);
    let outbox = sqlx::query(
        r#"
        DELETE FROM outbox WHERE id IN (
            SELECT id FROM outbox WHERE published_at < now() - make_interval(secs => $1)
            ORDER BY published_at LIMIT $2
        )
        "#,
    )
    .bind(seconds)
    .bind(limit)
    .execute(pool)
    .await?
    .rows_affected();
    let batches = sqlx::query(
        r#"
        DELETE FROM worker_result_batches WHERE id IN (
            SELECT b.id FROM worker_result_batches b JOIN worker_tasks t ON t.id = b.task_id
            WHERE t.state IN ('completed', 'failed_terminal', 'cancelled')
              AND t.completed_at < now() - make_interval(secs => $1)
            LIMIT $2
        )
        "#,
    )
    .bind(seconds)
    .bind(limit)
    .execute(pool)
    .await?
    .rows_affected();
    let dead_letters = sqlx::query(
        r#"
        DELETE FROM dead_letters WHERE id IN (
            SELECT id FROM dead_letters WHERE created_at < now() - make_interval(secs => $1)
            ORDER BY created_at LIMIT $2
        )
        "#,
    )
    .bind(seconds)
    .bind(limit)
    .execute(pool)
    .await?
    .rows_affected();
    Ok(Pruned {
        outbox,
        batches,
        dead_letters,
    })
}
