//! Test aids: reads and writes that only tests (and the failover benchmark) need, such as
//! ending a lease early, ageing history or holding a row lock. Behind the `testing` feature,
//! so no service can call them.

use sqlx::PgPool;
use uuid::Uuid;

use crate::StoreError;
use crate::states::{AttemptStatus, TaskState};

/// The statuses of a live attempt, bound as one array.
fn live() -> [&'static str; 2] {
    AttemptStatus::LIVE.map(AttemptStatus::as_str)
}

/// Every table palisade writes, for "nothing was written" checks.
pub const TABLES: [&str; 23] = [
    "organizations",
    "targets",
    "workers",
    "organization_workers",
    "scans",
    "scan_jobs",
    "worker_tasks",
    "worker_task_attempts",
    "worker_result_batches",
    "worker_artifact_uploads",
    "assets",
    "scan_assets",
    "findings",
    "evaluations",
    "enrichment_jobs",
    "outbox",
    "outbox_batches",
    "dead_letters",
    "leader_leases",
    "clients",
    "nats_users",
    "cves",
    "cve_sync",
];

/// Rows in one of [`TABLES`].
pub async fn count_rows(pool: &PgPool, table: &str) -> Result<i64, StoreError> {
    if !TABLES.contains(&table) {
        return Err(StoreError::Corrupt(format!("unknown table {table:?}")));
    }
    let sql = format!("SELECT count(*) FROM {table}");
    Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .fetch_one(pool)
        .await?)
}

/// What the decisions write, tallied: rows per table (per state where the table has one),
/// schedules per next slot, and events per subject in either outbox table. Read in the
/// caller's transaction, so a test can compare two decisions it rolls back.
pub async fn tally(
    conn: &mut sqlx::PgConnection,
) -> Result<std::collections::BTreeMap<String, i64>, StoreError> {
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT what, count(*) FROM (
             SELECT 'targets' AS what FROM targets
             UNION ALL SELECT 'scans ' || state FROM scans
             UNION ALL SELECT 'scan_jobs ' || state FROM scan_jobs
             UNION ALL SELECT 'worker_tasks ' || state FROM worker_tasks
             UNION ALL SELECT 'worker_task_attempts ' || status FROM worker_task_attempts
             UNION ALL SELECT 'worker_result_batches' FROM worker_result_batches
             UNION ALL SELECT 'assets' FROM assets
             UNION ALL SELECT 'scan_assets' FROM scan_assets
             UNION ALL SELECT 'findings' FROM findings
             UNION ALL SELECT 'enrichment_jobs ' || state FROM enrichment_jobs
             UNION ALL SELECT 'schedule_fires ' || outcome FROM schedule_fires
             UNION ALL SELECT 'scan_schedules next_slot '
                              || extract(epoch FROM next_slot)::bigint FROM scan_schedules
             UNION ALL SELECT 'event ' || subject FROM outbox
             UNION ALL SELECT 'event ' || unnest(subjects) FROM outbox_batches
         ) written
         GROUP BY what",
    )
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().collect())
}

/// Test and operator aid: ends the live attempt's lease now (by the database clock).
pub async fn expire_live_attempt(pool: &PgPool, task_id: Uuid) -> Result<u64, StoreError> {
    Ok(sqlx::query(
        "UPDATE worker_task_attempts SET lease_expires_at = now() - interval '1 millisecond'
         WHERE task_id = $1 AND status = ANY($2)",
    )
    .bind(task_id)
    .bind(live())
    .execute(pool)
    .await?
    .rows_affected())
}

/// Test and operator aid: a task waiting for a retry becomes due now.
pub async fn make_task_due(pool: &PgPool, task_id: Uuid) -> Result<u64, StoreError> {
    Ok(
        sqlx::query("UPDATE worker_tasks SET available_at = now() WHERE id = $1 AND state = $2")
            .bind(task_id)
            .bind(TaskState::RetryWait.as_str())
            .execute(pool)
            .await?
            .rows_affected(),
    )
}

/// The definition of a CHECK constraint (tests compare it with the state enums).
pub async fn check_constraint(
    pool: &PgPool,
    table: &str,
    name: &str,
) -> Result<String, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid
         WHERE t.relname = $1 AND c.conname = $2",
    )
    .bind(table)
    .bind(name)
    .fetch_one(pool)
    .await?)
}

/// Ends the hand-off of every staged, unpublished outbox row now, as if its committer had
/// crashed [`crate::outbox::HANDOFF`] ago: the relays' next poll publishes it.
pub async fn lapse_outbox_hand_offs(pool: &PgPool) -> Result<u64, StoreError> {
    let lapsed: i64 = sqlx::query_scalar(
        "WITH single AS (
             UPDATE outbox SET claimed_until = now() - interval '1 second'
             WHERE published_at IS NULL AND claimed_until > now() RETURNING 1
         ), batches AS (
             UPDATE outbox_batches SET claimed_until = now() - interval '1 second'
             WHERE claimed_until > now() RETURNING 1
         )
         SELECT (SELECT count(*) FROM single) + (SELECT count(*) FROM batches)",
    )
    .fetch_one(pool)
    .await?;
    Ok(lapsed as u64)
}

/// Every event written and not yet published, in either outbox table, in the order written,
/// with how many times a poll claimed its row. Tests read events as the stream's plus these.
pub async fn unpublished_events(
    pool: &PgPool,
) -> Result<Vec<(crate::OutboxEvent, i32)>, StoreError> {
    let rows: Vec<(Uuid, String, Vec<u8>, i32)> = sqlx::query_as(
        "SELECT id, subject, payload, publish_attempts FROM (
             SELECT id AS row_id, 1 AS position, id, subject, payload, publish_attempts
             FROM outbox WHERE published_at IS NULL
             UNION ALL
             SELECT b.id, e.position, e.id, e.subject, e.payload, b.publish_attempts
             FROM outbox_batches b,
                  UNNEST(b.event_ids, b.subjects, b.payloads) WITH ORDINALITY
                      AS e(id, subject, payload, position)
         ) waiting
         ORDER BY row_id, position",
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, subject, payload, attempts)| {
            let event = crate::OutboxEvent {
                id,
                subject,
                payload,
                headers: Default::default(),
                trace_scan_id: None,
                kind: None,
            };
            (event, attempts)
        })
        .collect())
}

/// Live attempts a worker holds (tests and operators).
pub async fn live_attempts_of_worker(pool: &PgPool, worker_id: Uuid) -> Result<i64, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM worker_task_attempts WHERE worker_id = $1 AND status = ANY($2)",
    )
    .bind(worker_id)
    .bind(live())
    .fetch_one(pool)
    .await?)
}

/// Test aid: the task's state and, when waiting for a retry, how long after its last attempt
/// ended it becomes due.
pub async fn task_retry_delay(
    pool: &PgPool,
    task_id: Uuid,
) -> Result<(String, Option<std::time::Duration>), StoreError> {
    let (state, millis): (String, Option<f64>) = sqlx::query_as(
        r#"
        SELECT t.state,
               CASE WHEN t.state = $2 THEN (extract(epoch FROM t.available_at - a.finished_at) * 1000)::float8 END
        FROM worker_tasks t LEFT JOIN worker_task_attempts a ON a.id = t.current_attempt_id
        WHERE t.id = $1
        "#,
    )
    .bind(task_id)
    .bind(TaskState::RetryWait.as_str())
    .fetch_one(pool)
    .await?;
    Ok((
        state,
        millis.map(|ms| std::time::Duration::from_millis(ms.max(0.0) as u64)),
    ))
}

/// Test aid: the attempt's status.
pub async fn attempt_status(pool: &PgPool, attempt_id: Uuid) -> Result<String, StoreError> {
    Ok(
        sqlx::query_scalar("SELECT status FROM worker_task_attempts WHERE id = $1")
            .bind(attempt_id)
            .fetch_one(pool)
            .await?,
    )
}

/// Test aid: whether the attempt's worker renewed its lease at least once.
pub async fn attempt_renewed(pool: &PgPool, attempt_id: Uuid) -> Result<bool, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT last_renewed_at IS NOT NULL FROM worker_task_attempts WHERE id = $1",
    )
    .bind(attempt_id)
    .fetch_one(pool)
    .await?)
}

/// Test aid: the live attempt of the task expires `ms` milliseconds from now.
pub async fn set_lease_expiry_in(pool: &PgPool, task_id: Uuid, ms: i64) -> Result<u64, StoreError> {
    Ok(sqlx::query(
        "UPDATE worker_task_attempts SET lease_expires_at = now() + make_interval(secs => $2::float8 / 1000)
         WHERE task_id = $1 AND status = ANY($3)",
    )
    .bind(task_id)
    .bind(ms as f64)
    .bind(live())
    .execute(pool)
    .await?
    .rows_affected())
}

/// Test aid: holds `FOR UPDATE` on the task's live attempt until the returned transaction
/// is dropped (rolled back).
pub async fn hold_attempt_lock(
    pool: &PgPool,
    task_id: Uuid,
) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query(
        "SELECT id FROM worker_task_attempts WHERE task_id = $1 AND status = ANY($2) FOR UPDATE",
    )
    .bind(task_id)
    .bind(live())
    .execute(&mut *tx)
    .await?;
    Ok(tx)
}

/// Locks a worker's row (`FOR UPDATE`) until the returned transaction ends: acquires of that
/// worker wait for it, so a test can release several at once.
pub async fn hold_worker_lock(
    pool: &PgPool,
    worker_id: Uuid,
) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT id FROM workers WHERE id = $1 FOR UPDATE")
        .bind(worker_id)
        .execute(&mut *tx)
        .await?;
    Ok(tx)
}

/// Backends of this database waiting for a lock.
pub async fn backends_waiting_for_locks(pool: &PgPool) -> Result<i64, StoreError> {
    let (waiting,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM pg_stat_activity
          WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    .fetch_one(pool)
    .await?;
    Ok(waiting)
}

/// Attempts created by one acquire request.
pub async fn attempts_of_request(pool: &PgPool, request_id: Uuid) -> Result<i64, StoreError> {
    let (attempts,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM worker_task_attempts WHERE acquire_request_id = $1")
            .bind(request_id)
            .fetch_one(pool)
            .await?;
    Ok(attempts)
}

/// The attempts of a scan's tasks, oldest first: (attempt id, worker id, status).
pub async fn attempts_of_scan(
    pool: &PgPool,
    scan_id: Uuid,
) -> Result<Vec<(Uuid, Uuid, String)>, StoreError> {
    Ok(sqlx::query_as(
        r#"
        SELECT a.id, a.worker_id, a.status FROM worker_task_attempts a JOIN worker_tasks t ON t.id = a.task_id
        WHERE t.scan_id = $1 ORDER BY a.created_at, a.attempt_number
        "#,
    )
    .bind(scan_id)
    .fetch_all(pool)
    .await?)
}

/// Result batches accepted from one attempt.
pub async fn batches_of_attempt(pool: &PgPool, attempt_id: Uuid) -> Result<i64, StoreError> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM worker_result_batches WHERE attempt_id = $1")
            .bind(attempt_id)
            .fetch_one(pool)
            .await?,
    )
}

/// Workers of an organization that said hello at least once.
pub async fn workers_seen(pool: &PgPool, organization_id: Uuid) -> Result<i64, StoreError> {
    Ok(sqlx::query_scalar(
        r#"
        SELECT count(*) FROM workers w JOIN organization_workers ow ON ow.worker_id = w.id
        WHERE ow.organization_id = $1 AND w.last_seen_at IS NOT NULL
        "#,
    )
    .bind(organization_id)
    .fetch_one(pool)
    .await?)
}

/// Test aid: makes published outbox rows (as versions before published rows were removed at
/// once left them), ended tasks, result batches and quarantined CVE records look `by` older.
pub async fn age_history(pool: &PgPool, by: std::time::Duration) -> Result<(), StoreError> {
    let seconds = crate::seconds(by);
    sqlx::query("UPDATE outbox SET published_at = published_at - make_interval(secs => $1) WHERE published_at IS NOT NULL")
        .bind(seconds)
        .execute(pool)
        .await?;
    sqlx::query("UPDATE worker_tasks SET completed_at = completed_at - make_interval(secs => $1) WHERE completed_at IS NOT NULL")
        .bind(seconds)
        .execute(pool)
        .await?;
    sqlx::query(
        "UPDATE worker_result_batches SET received_at = received_at - make_interval(secs => $1)",
    )
    .bind(seconds)
    .execute(pool)
    .await?;
    sqlx::query(
        "UPDATE cve_quarantine SET last_seen_at = last_seen_at - make_interval(secs => $1)",
    )
    .bind(seconds)
    .execute(pool)
    .await?;
    Ok(())
}

/// The queue indexes an acquire reads: the due tasks, and the worker's live leases.
pub const QUEUE_INDEXES: [&str; 2] = [
    "worker_tasks_due_by_org_idx",
    "worker_task_attempts_worker_live_idx",
];

/// The shared buffers (hit or read) one acquire's grant statement reads from the queue's
/// indexes ([`QUEUE_INDEXES`]), from `EXPLAIN (ANALYZE, BUFFERS)` of `worker_tasks/grant.sql` as
/// dispatch binds it, run for `worker_id` offering `capabilities` with `free` slots, in a
/// transaction rolled back afterwards: the cost of finding what to lease, in pages, whatever
/// the machine's speed (the writes of the leases themselves are the same whatever the queue
/// holds).
pub async fn grant_queue_buffers(
    pool: &PgPool,
    worker_id: Uuid,
    capabilities: &[String],
    free: i64,
) -> Result<i64, StoreError> {
    let mut tx = pool.begin().await?;
    let explain = format!(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {}",
        crate::sql::worker_tasks::GRANT
    );
    let grantable = [TaskState::Pending.as_str(), TaskState::RetryWait.as_str()];
    let leased_states = TaskState::LEASED.map(TaskState::as_str);
    let plan: serde_json::Value = sqlx::query_scalar(sqlx::AssertSqlSafe(explain))
        .bind(worker_id)
        .bind(capabilities)
        .bind(free)
        .bind(Uuid::new_v4())
        .bind(300.0_f64)
        .bind(&grantable[..])
        .bind(TaskState::Leased.as_str())
        .bind(AttemptStatus::Leased.as_str())
        .bind(&live()[..])
        .bind(&leased_states[..])
        .fetch_one(&mut *tx)
        .await?;
    tx.rollback().await?;
    Ok(index_buffers(&plan[0]["Plan"], &QUEUE_INDEXES))
}

/// The buffers of every node of `plan` that scans one of `indexes` (a scan node's own, as it
/// has no children).
fn index_buffers(plan: &serde_json::Value, indexes: &[&str]) -> i64 {
    let own = if plan["Index Name"]
        .as_str()
        .is_some_and(|name| indexes.contains(&name))
    {
        let blocks = |key: &str| plan[key].as_i64().unwrap_or_default();
        blocks("Shared Hit Blocks") + blocks("Shared Read Blocks")
    } else {
        0
    };
    own + plan["Plans"].as_array().map_or(0, |children| {
        children
            .iter()
            .map(|child| index_buffers(child, indexes))
            .sum()
    })
}
