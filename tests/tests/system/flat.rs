//! Cost flat in table size (issue 8): on a database holding a large history, analyzed as
//! `docs/operations.md` tells operators to, a realistic workload through every service
//! (admission, dispatch, ingestion, completion, enrichment, reaper sweeps, a failure, a
//! cancellation, a lease recovered after expiry) reads no large table sequentially: every hot
//! statement is served by an index, so its cost does not grow with the history.
//!
//! PostgreSQL's own counters (`pg_stat_user_tables`) are the witness. Counters are reset after
//! the history is written, and read once every palisade backend has exited: PostgreSQL 15
//! flushes a backend's counters lazily (at most once a second while it works), and always when
//! it exits.

use std::time::Duration;

use futures::StreamExt as _;
use messages::EventKind;
use tests::{Component, TestSystem};
use uuid::Uuid;

/// Completed one-plugin scans of history: each leaves a row or more in every large table,
/// enough that a sequential scan is the wrong plan for any statement
/// that needs a few rows, and is written in about 15 s (one statement) on the 2-core CI.
const HISTORY_SCANS: usize = 25_000;

/// Scans of the workload that complete through the reference worker.
const SCANS: usize = 60;

/// Scans run on the empty database before the history is written, so the pooled connections
/// have run every hot statement (and, were statements prepared once and kept, could have
/// frozen their plans) while every table was empty.
const WARM_UP_SCANS: usize = 5;

/// Tables that grow with history: no statement of the workload may read one sequentially.
/// The others hold a row per organization, worker, assignment or lease (or nothing here:
/// uploads, dead letters; the outbox, which holds only events not yet published) and may be
/// scanned whole.
const LARGE_TABLES: [&str; 11] = [
    "targets",
    "scans",
    "scan_jobs",
    "worker_tasks",
    "worker_task_attempts",
    "worker_result_batches",
    "findings",
    "evaluations",
    "assets",
    "scan_assets",
    "enrichment_jobs",
];

/// Transport history older than this is pruned by the reaper: less than the history's age.
const RETENTION: Duration = Duration::from_secs(3_600);

/// The large tables retention prunes.
const PRUNED_TABLES: [&str; 1] = ["worker_result_batches"];

/// How long the workload may take to reach its outcomes.
const WORKLOAD_TIME_MAX: Duration = Duration::from_secs(60);

/// One table's counters since the reset, and its size as the seeding's `ANALYZE` saw it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct TableReads {
    pub(crate) relname: String,
    pub(crate) seq_scan: i64,
    pub(crate) seq_tup_read: i64,
    pub(crate) idx_scan: i64,
    /// Rows fetched from the table through its indexes.
    pub(crate) idx_tup_fetch: i64,
    pub(crate) rows: f32,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flat_cost_no_large_table_is_read_sequentially_on_a_large_history() {
    let system = TestSystem::spawn_with(|settings| {
        // The history (two hours old) is past retention, as it is on any installation older
        // than `PALISADE_RETENTION_HOURS`: the retention sweep prunes during the workload.
        settings.reaper.retention = RETENTION;
    })
    .await;
    system.start(Component::Reaper);
    system.start(Component::Enrichment);
    // The reverse risk, a plan made on an empty table kept once it is large: every palisade
    // statement runs unnamed and is planned for its own arguments at each execution
    // (`store`'s `sql::query*`, which a unit test there keeps the only way in), so the
    // warm-up's plans below are not reused on the large tables.

    let organization_id = system.organization().await;
    let _stats = system.reference_worker(organization_id, 16).await;
    let mut completed = system
        .bus
        .client()
        .subscribe(
            system
                .subjects
                .tenant_event_wildcard(EventKind::ScanCompleted),
        )
        .await
        .expect("subscribe to scan.completed");
    system.bus.flush().await.expect("flush");
    submit(&system, organization_id, "warm-up", WARM_UP_SCANS).await;
    wait_completed(&mut completed, WARM_UP_SCANS).await;

    let history_worker = system.registered_worker(organization_id, 1).await;
    seed_history(&system, organization_id, history_worker).await;
    sqlx::query("SELECT pg_stat_reset()")
        .execute(&system.pool)
        .await
        .expect("statistics reset");

    // The workload: scans completed by the reference worker, one failing, one cancelled while
    // it runs, and one whose lease expires and is recovered by the reaper before a manual
    // worker completes it.
    let mut scan_ids = submit(&system, organization_id, "flat", SCANS).await;
    let failing = submit_target(
        &system,
        organization_id,
        "synthetic://flat-fails?fail=1&retryable=false",
    )
    .await;
    let slow = submit_target(
        &system,
        organization_id,
        "synthetic://flat-slow?duration_ms=30000",
    )
    .await;
    let recovered = recovered_scan(&system).await;
    system.wait_scan_state(&slow, "running").await;
    let reply = system
        .client()
        .cancel_scan(&organization_id, &slow, "flat-cost test")
        .await
        .expect("dispatch answers");
    assert!(reply.error.is_none(), "{reply:?}");
    wait_completed(&mut completed, SCANS + 1).await;
    system.wait_scan_state(&failing, "failed").await;
    system.wait_scan_state(&slow, "cancelled").await;
    system.wait_scan_state(&recovered, "completed").await;
    scan_ids.push(recovered);
    wait_enriched(&system, &scan_ids).await;
    system.wait_outbox_drained().await;
    // What `/metrics` reads, once.
    store::observability::snapshot(&system.pool, Duration::from_secs(60))
        .await
        .expect("metrics snapshot");

    system.stop_all().await;
    let reads = table_reads(&system).await;
    let report: String = reads
        .iter()
        .map(|table| {
            format!(
                "\n  {:<22} seq_scan {:>4}  seq_tup_read {:>8}  idx_scan {:>6}  rows {:>7}",
                table.relname, table.seq_scan, table.seq_tup_read, table.idx_scan, table.rows
            )
        })
        .collect();
    println!("reads during the workload:{report}");
    let read = |name: &str| {
        reads
            .iter()
            .find(|table| table.relname == name)
            .unwrap_or_else(|| panic!("{name} has statistics"))
    };
    // The counters arrived: the workload's index reads of the tables it works on are there.
    for name in [
        "scans",
        "worker_tasks",
        "worker_task_attempts",
        "enrichment_jobs",
    ] {
        assert!(
            read(name).idx_scan > 0,
            "no index reads of {name} were counted: the backends' statistics did not arrive{report}"
        );
    }
    // The history is in every large table (retention was already pruning the result batches
    // when the seeding analyzed them).
    let history = HISTORY_SCANS as f32;
    for name in LARGE_TABLES
        .into_iter()
        .filter(|name| !PRUNED_TABLES.contains(name))
    {
        let table = read(name);
        assert!(
            table.rows >= history * 0.9,
            "{name} holds {} rows, not the history's {history}{report}",
            table.rows
        );
    }
    let sequential: Vec<&str> = LARGE_TABLES
        .into_iter()
        .filter(|name| read(name).seq_scan > 0)
        .collect();
    assert!(
        sequential.is_empty(),
        "large tables read sequentially during the workload: {sequential:?}; EXPLAIN the \
         statements that read them on a seeded database{report}"
    );
    system.finish().await;
}

/// Submits `count` one-plugin synthetic scans, `label`ed, and returns their ids.
async fn submit(
    system: &TestSystem,
    organization_id: Uuid,
    label: &str,
    count: usize,
) -> Vec<String> {
    let mut scan_ids = Vec::with_capacity(count);
    for index in 0..count {
        let target = format!("synthetic://{label}/{index}?findings=3");
        scan_ids.push(submit_target(system, organization_id, &target).await);
    }
    scan_ids
}

async fn submit_target(system: &TestSystem, organization_id: Uuid, target: &str) -> String {
    let reply = system
        .submit(&system.request(organization_id, target, &["synthetic"]))
        .await;
    assert!(reply.error.is_none(), "{reply:?}");
    reply.scan_id
}

/// Waits for `count` more `scan.completed` events.
async fn wait_completed(completed: &mut bus::async_nats::Subscriber, count: usize) {
    let deadline = tokio::time::Instant::now() + WORKLOAD_TIME_MAX;
    for seen in 0..count {
        tokio::time::timeout_at(deadline, completed.next())
            .await
            .unwrap_or_else(|_| panic!("only {seen} of {count} scans completed in time"))
            .expect("subscription open");
    }
}

/// Writes the history on a connection of its own, closed before the counters are reset, so
/// none of the seeding's reads is counted against the workload.
async fn seed_history(system: &TestSystem, organization_id: Uuid, worker_id: Uuid) {
    let mut settings = store::DatabaseSettings::new(system.database_url().to_owned());
    settings.max_connections = 1;
    let pool = store::connect(&settings).await.expect("seeding connection");
    store::history::seed(&pool, organization_id, worker_id, HISTORY_SCANS, |_| {})
        .await
        .expect("history written and analyzed");
    pool.close().await;
}

/// A scan of an organization of its own, served by a manual worker: leased, renewed, its
/// lease expired and recovered by the running reaper (stale recovery, retry), leased again
/// and completed with one batch. Returns its id once it is completed.
async fn recovered_scan(system: &TestSystem) -> String {
    let scan = system.leased_scan(&["synthetic"]).await;
    let renewed = scan.worker.renew(&scan.lease).await;
    assert!(renewed.error.is_none(), "{renewed:?}");
    let reference = scan.lease.lease.as_ref().expect("lease reference");
    let task_id = Uuid::parse_str(&reference.task_id).expect("task id");
    let attempt_id = Uuid::parse_str(&reference.attempt_id).expect("attempt id");
    store::testing::expire_live_attempt(&system.pool, task_id)
        .await
        .expect("lease expired");
    system
        .wait_for("the reaper to recover the expired lease", || async {
            let status = store::testing::attempt_status(&system.pool, attempt_id)
                .await
                .expect("attempt read");
            (status == "expired").then_some(())
        })
        .await;
    let lease = scan.worker.acquire_one().await;
    let batch = scan.worker.batch(&lease, 0, &tests::findings_payload(2));
    let ack = scan.worker.send_batch(&batch).await;
    assert!(ack.error.is_none(), "{ack:?}");
    let ack = scan.worker.complete(&lease, 1).await;
    assert!(ack.error.is_none(), "{ack:?}");
    scan.scan_id
}

/// Waits until the enrichment job of every scan in `scan_ids` is completed (by scan id: the
/// unique index serves it).
async fn wait_enriched(system: &TestSystem, scan_ids: &[String]) {
    let ids: Vec<Uuid> = scan_ids
        .iter()
        .map(|id| Uuid::parse_str(id).expect("scan id"))
        .collect();
    system
        .wait_for_within("every enrichment job to finish", WORKLOAD_TIME_MAX, || async {
            let done: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM enrichment_jobs WHERE scan_id = ANY($1) AND state = 'completed'",
            )
            .bind(&ids)
            .fetch_one(&system.pool)
            .await
            .expect("enrichment jobs read");
            (done == ids.len() as i64).then_some(())
        })
        .await;
}

/// The counters of every table, read on a connection of its own once no other backend is
/// connected to the test's database (a backend flushes its counters before it leaves
/// `pg_stat_activity`).
pub(crate) async fn table_reads(system: &TestSystem) -> Vec<TableReads> {
    let mut settings = store::DatabaseSettings::new(system.database_url().to_owned());
    settings.max_connections = 1;
    let pool = store::connect(&settings)
        .await
        .expect("statistics connection");
    let deadline = tokio::time::Instant::now() + tests::WAIT_MAX;
    loop {
        let others: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .fetch_one(&pool)
        .await
        .expect("backends read");
        if others == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{others} backends still connected after every component stopped"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // A snapshot of the shared statistics taken at the first read in a transaction; outside
    // one, each read sees the latest.
    let reads = sqlx::query_as::<_, TableReads>(
        "SELECT s.relname::text AS relname, s.seq_scan, s.seq_tup_read,
                coalesce(s.idx_scan, 0) AS idx_scan, coalesce(s.idx_tup_fetch, 0) AS idx_tup_fetch,
                c.reltuples AS rows
         FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
         ORDER BY s.relname",
    )
    .fetch_all(&pool)
    .await
    .expect("table statistics read");
    pool.close().await;
    reads
}
