//! Progression (SPEC §4.3): the one place a scan advances, to its next plugin's job and task or
//! to its end, and the one place a task whose attempt ended badly goes back to the queue or
//! fails with its scan; set-wise for any number of scans with a fixed number of statements.

use std::collections::HashMap;

use messages::v1;
use messages::{EventKind, Subjects};
use prost::Message as _;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::StoreError;
use crate::outbox::OutboxEvent;
use crate::retry::RetryPolicy;
use crate::sql;
use crate::states::{EnrichmentJobState, ScanJobState, ScanState, TaskState};

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
    sql::scan_jobs::CreateMany {
        job_ids: &job_ids,
        task_ids: &task_ids,
        scan_ids: &scan_ids,
        organizations: &organizations,
        positions: &positions,
        plugins: &plugins,
        payloads: &payloads,
        priorities: &priorities,
        deadlines: &deadlines,
        max_attempts: &max_attempts,
    }
    .query()
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
/// in their scans' traces. Locks the scans in id order, after the caller's attempts and tasks
/// (`FOR NO KEY UPDATE`: no key changes, so inserts that reference a scan are not held up).
pub async fn advance(
    conn: &mut PgConnection,
    subjects: &Subjects,
    completed: &[CompletedJob],
) -> Result<Vec<OutboxEvent>, StoreError> {
    if completed.is_empty() {
        return Ok(Vec::new());
    }
    let scans = lock_scans(conn, completed).await?;
    let steps = next_steps(completed, &scans)?;
    let task_ids = create_jobs(conn, &steps.next).await?;
    let mut events = Vec::with_capacity(steps.next.len() + steps.finished.len());
    events.extend(ready_events(subjects, &steps.next, task_ids));
    let done = complete_scans(conn, &steps.finished).await?;
    let finished: Vec<Uuid> = done.iter().map(|done| done.scan_id).collect();
    let coverages = coverage_summaries(conn, &finished).await?;
    for done in done {
        let coverage = coverages.get(&done.scan_id).cloned();
        events.push(completed_event(
            subjects,
            &scans[&done.scan_id],
            &done,
            coverage,
        ));
    }
    Ok(events)
}

/// Locks the scans of `completed`, in id order (`FOR NO KEY UPDATE`), and reads what advancing
/// them needs.
async fn lock_scans(
    conn: &mut PgConnection,
    completed: &[CompletedJob],
) -> Result<HashMap<Uuid, LockedScan>, StoreError> {
    let mut scan_ids: Vec<Uuid> = completed.iter().map(|job| job.scan_id).collect();
    scan_ids.sort_unstable();
    scan_ids.dedup();
    Ok(sql::scans::LockForAdvance {
        scan_ids: &scan_ids,
    }
    .query_as::<LockedScan>()
    .fetch_all(conn)
    .await?
    .into_iter()
    .map(|scan| (scan.id, scan))
    .collect())
}

/// Where the active scans of the completed jobs go next.
struct NextSteps<'s> {
    /// Their next plugin's job, due now.
    next: Vec<NewScanJob<'s>>,
    /// (scan, organization) of each scan whose last plugin's job completed.
    finished: Vec<(Uuid, Uuid)>,
}

/// Decides, per completed job, its scan's next step: its next plugin's job, or its end. Scans
/// already ended (cancelled, failed) stay as they are.
fn next_steps<'s>(
    completed: &[CompletedJob],
    scans: &'s HashMap<Uuid, LockedScan>,
) -> Result<NextSteps<'s>, StoreError> {
    let mut steps = NextSteps {
        next: Vec::new(),
        finished: Vec::new(),
    };
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
            Some(plugin) => steps.next.push(NewScanJob {
                scan_id: job.scan_id,
                organization_id: job.organization_id,
                position: next_position,
                plugin,
                target: &scan.target,
                priority: scan.priority,
                execution_deadline_seconds: scan.execution_deadline_seconds,
                max_attempts: job.max_attempts,
            }),
            None => steps.finished.push((job.scan_id, job.organization_id)),
        }
    }
    Ok(steps)
}

/// `task.ready` of each new job's task, in its scan's trace.
fn ready_events(
    subjects: &Subjects,
    next: &[NewScanJob<'_>],
    task_ids: Vec<Uuid>,
) -> Vec<OutboxEvent> {
    next.iter()
        .zip(task_ids)
        .map(|(job, task_id)| {
            OutboxEvent::new(
                subjects,
                EventKind::TaskReady,
                v1::TaskReady {
                    task_id: task_id.to_string(),
                    scan_id: job.scan_id.to_string(),
                    organization_id: job.organization_id.to_string(),
                    plugin: job.plugin.to_owned(),
                    required_capabilities: vec![job.plugin.to_owned()],
                }
                .encode_to_vec(),
            )
            .in_trace_of(job.scan_id)
        })
        .collect()
}

/// The coverage summary of each scan just completed, in one statement (none: no statement).
async fn coverage_summaries(
    conn: &mut PgConnection,
    scan_ids: &[Uuid],
) -> Result<HashMap<Uuid, v1::CoverageSummary>, StoreError> {
    if scan_ids.is_empty() {
        return Ok(HashMap::new());
    }
    Ok(crate::coverage::summaries(conn, None, scan_ids)
        .await?
        .into_iter()
        .map(|(scan_id, summary)| (scan_id, summary.to_wire()))
        .collect())
}

/// `scan.completed` of a scan just completed, in its trace.
fn completed_event(
    subjects: &Subjects,
    scan: &LockedScan,
    done: &CompletedScan,
    coverage: Option<v1::CoverageSummary>,
) -> OutboxEvent {
    OutboxEvent::for_tenant(
        subjects,
        &done.organization_id,
        EventKind::ScanCompleted,
        v1::ScanCompleted {
            scan_id: done.scan_id.to_string(),
            organization_id: done.organization_id.to_string(),
            client_id: scan.client_id.clone(),
            idempotency_key: scan.idempotency_key.clone(),
            finding_count: done.finding_count as u32,
            admitted_at_unix_ms: scan.admitted_at_unix_ms,
            completed_at_unix_ms: done.completed_at_unix_ms,
            enrichment_job_id: done.enrichment_job_id.to_string(),
            coverage,
        }
        .encode_to_vec(),
    )
    .in_trace_of(done.scan_id)
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
    Ok(sql::scans::CompleteMany {
        scan_ids: &scan_ids,
        job_ids: &job_ids,
        completed_scan_state: ScanState::Completed.as_str(),
        pending_state: EnrichmentJobState::Pending.as_str(),
        completed_state: EnrichmentJobState::Completed.as_str(),
    }
    .query_as()
    .fetch_all(conn)
    .await?)
}

/// A task whose current attempt just ended badly (failed, expired, overdue). The caller has
/// ended the attempt and holds it and its task locked, the task `leased` or `running` with
/// this attempt current.
#[derive(Debug, Clone)]
pub struct FailedTask<'a> {
    pub task_id: Uuid,
    /// The attempt that ended; `None` for a task that was never leased (a stranded one).
    pub attempt_id: Option<Uuid>,
    pub organization_id: Uuid,
    pub scan_id: Option<Uuid>,
    pub scan_job_id: Option<Uuid>,
    pub plugin: &'a str,
    /// Attempts spent, the one that just ended included.
    pub attempt_count: i32,
    pub max_attempts: i32,
}

/// Why the attempts of one [`fail_tasks`] call ended: the same for every task of the call.
#[derive(Debug, Clone, Copy)]
pub struct Failure<'a> {
    /// Published in `task.failed` and `scan.failed`; its code is each task's, failed scan
    /// job's and failed scan's failure code, its message each failed scan job's.
    pub error: &'a v1::Error,
    /// Recorded as each task's `last_error`.
    pub task_message: &'a str,
    /// Whether retrying may help; a task retries only when it is and budget remains.
    pub retryable: bool,
    /// What the plugin did, for people: a failed scan's reason is `plugin <name> <this>`.
    pub scan_reason: &'a str,
    /// The states the tasks are failed from; a task found in another state (it moved on) is
    /// left alone. `TaskState::LEASED` for an attempt that ended, `[Pending]` for a task that
    /// was never leased.
    pub from: &'a [TaskState],
}

/// What [`fail_tasks`] decided.
#[derive(Debug, Clone, Default)]
pub struct FailedTasks {
    /// Tasks now in `retry_wait`.
    pub retried: Vec<Uuid>,
    /// Tasks now `failed_terminal` (their scan jobs and scans failed with them).
    pub failed: Vec<Uuid>,
    /// `task.failed` per task and `scan.failed` per scan that failed now, each in its scan's
    /// trace; the caller enqueues them.
    pub events: Vec<OutboxEvent>,
}

#[derive(sqlx::FromRow)]
struct FailedRow {
    ord: i64,
    retry: bool,
    client_id: Option<String>,
    idempotency_key: Option<String>,
    failed_at_unix_ms: Option<i64>,
}

/// Fails the tasks of attempts that ended badly, in one statement whatever their number:
/// a task with budget left (`attempt_count < max_attempts`) and a retryable failure waits in
/// `retry_wait` for a fully jittered backoff from `retry` (its running scan job back to
/// `pending`); every other one fails terminally, and so do its scan job and its scan (scans
/// still pending or running only). Tasks no longer `leased` or `running` are left alone.
/// Locks scan jobs and scans after the caller's attempts and tasks.
pub async fn fail_tasks(
    conn: &mut PgConnection,
    subjects: &Subjects,
    retry: RetryPolicy,
    failure: &Failure<'_>,
    tasks: &[FailedTask<'_>],
) -> Result<FailedTasks, StoreError> {
    if tasks.is_empty() {
        return Ok(FailedTasks::default());
    }
    let task_ids: Vec<Uuid> = tasks.iter().map(|task| task.task_id).collect();
    let job_ids: Vec<Option<Uuid>> = tasks.iter().map(|task| task.scan_job_id).collect();
    let scan_ids: Vec<Option<Uuid>> = tasks.iter().map(|task| task.scan_id).collect();
    let retries = will_retry(failure, tasks);
    let delays = retry_delays(retry, tasks, &retries);
    let reasons = scan_reasons(failure, tasks, &retries);
    let rows: Vec<FailedRow> = sql::worker_tasks::FailMany {
        task_ids: &task_ids,
        job_ids: &job_ids,
        scan_ids: &scan_ids,
        retries: &retries,
        delays: &delays,
        reasons: &reasons,
        retry_wait_state: TaskState::RetryWait.as_str(),
        failed_terminal_state: TaskState::FailedTerminal.as_str(),
        error_code: &failure.error.code,
        task_message: failure.task_message,
        from_states: failure
            .from
            .iter()
            .map(|state| state.as_str())
            .collect::<Vec<_>>(),
        pending_job_state: ScanJobState::Pending.as_str(),
        failed_job_state: ScanJobState::Failed.as_str(),
        error_message: &failure.error.message,
        running_job_state: ScanJobState::Running.as_str(),
        failed_scan_state: ScanState::Failed.as_str(),
        pending_scan_state: ScanState::Pending.as_str(),
        running_scan_state: ScanState::Running.as_str(),
    }
    .query_as()
    .fetch_all(conn)
    .await?;

    failed_tasks(subjects, failure, tasks, rows)
}

/// Per task, whether it waits for a retry: a retryable failure with budget left.
fn will_retry(failure: &Failure<'_>, tasks: &[FailedTask<'_>]) -> Vec<bool> {
    tasks
        .iter()
        .map(|task| failure.retryable && task.attempt_count < task.max_attempts)
        .collect()
}

/// Per task, its backoff in seconds before its next attempt (fully jittered, from `retry`);
/// 0 for a task that does not retry.
fn retry_delays(retry: RetryPolicy, tasks: &[FailedTask<'_>], retries: &[bool]) -> Vec<f64> {
    let mut rng = rand::rng();
    tasks
        .iter()
        .zip(retries)
        .map(|(task, &retries)| {
            if retries {
                crate::seconds(retry.delay(task.attempt_count.max(0) as u32, &mut rng))
            } else {
                0.0
            }
        })
        .collect()
}

/// Per task, the reason its scan fails with; empty for a task that retries.
fn scan_reasons(failure: &Failure<'_>, tasks: &[FailedTask<'_>], retries: &[bool]) -> Vec<String> {
    tasks
        .iter()
        .zip(retries)
        .map(|(task, &retries)| {
            if retries {
                String::new()
            } else {
                format!("plugin {} {}", task.plugin, failure.scan_reason)
            }
        })
        .collect()
}

/// What the failing statement decided, from its `rows` (one per task it moved, by ordinal):
/// the tasks retried and failed, each one's `task.failed` and each failed scan's
/// `scan.failed`.
fn failed_tasks(
    subjects: &Subjects,
    failure: &Failure<'_>,
    tasks: &[FailedTask<'_>],
    rows: Vec<FailedRow>,
) -> Result<FailedTasks, StoreError> {
    let mut outcome = FailedTasks::default();
    for row in rows {
        let task = usize::try_from(row.ord - 1)
            .ok()
            .and_then(|index| tasks.get(index))
            .ok_or_else(|| StoreError::Corrupt(format!("failed task ordinal {}", row.ord)))?;
        let in_trace = |event: OutboxEvent| event.in_trace_of(task.scan_id);
        outcome.events.push(in_trace(OutboxEvent::new(
            subjects,
            EventKind::TaskFailed,
            v1::TaskFailed {
                task_id: task.task_id.to_string(),
                attempt_id: task.attempt_id.map(|id| id.to_string()).unwrap_or_default(),
                scan_id: task.scan_id.map(|id| id.to_string()).unwrap_or_default(),
                plugin: task.plugin.to_owned(),
                error: Some(failure.error.clone()),
                will_retry: row.retry,
            }
            .encode_to_vec(),
        )));
        if row.retry {
            outcome.retried.push(task.task_id);
            continue;
        }
        outcome.failed.push(task.task_id);
        if let (Some(scan_id), Some(client_id), Some(idempotency_key), Some(failed_at_unix_ms)) = (
            task.scan_id,
            row.client_id,
            row.idempotency_key,
            row.failed_at_unix_ms,
        ) {
            outcome.events.push(in_trace(OutboxEvent::for_tenant(
                subjects,
                &task.organization_id,
                EventKind::ScanFailed,
                v1::ScanFailed {
                    scan_id: scan_id.to_string(),
                    organization_id: task.organization_id.to_string(),
                    client_id,
                    idempotency_key,
                    error: Some(failure.error.clone()),
                    failed_at_unix_ms,
                }
                .encode_to_vec(),
            )));
        }
    }
    Ok(outcome)
}
