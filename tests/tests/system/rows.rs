//! Row versions per scan (issue 24): what a one-plugin scan writes to each table, from
//! PostgreSQL's own counters (`pg_stat_user_tables`), pinned so it cannot grow. Every insert
//! and every update writes a row version; they are what PostgreSQL's backends spend most of a
//! burn-down on (README, "Measured"). `palisade bench` prints the same figures per table.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt as _;
use messages::EventKind;
use tests::TestSystem;

/// Enough scans that per-scan figures round to what one scan writes.
const SCANS: usize = 40;

/// PostgreSQL 15 publishes a backend's table counters when it goes idle, at most once a
/// second, else within 10 s.
const STATISTICS_FLUSH: Duration = Duration::from_secs(11);

/// Row versions (inserted + updated) one completed one-plugin scan writes per table, measured
/// on 2026-12-03 (the benchmark's burn-down of 1,000 gave the same): 27 in all, the outbox's
/// 5 events inserted and then marked published 10 of them; 22 once published rows were
/// removed instead of marked (a delete writes no row version); 17.6 once a decision's events
/// were one row (`outbox_batches`: 0.58 per scan here, where three decisions of a scan taken
/// alone would write 3 and one row per event 5; how many scans share a decision depends on
/// timing, so its ceiling leaves room); 15.6 once a lease stopped marking the scan and its
/// scan job `running` (read from the attempt instead). Coverage (issue 47) added what the plugin
/// checked: one evaluation per rule it checks (the synthetic plugin here declares and evaluates
/// five), written once. A table missing here may not be written at all. Lower a figure when a
/// change lowers it; never raise one.
const ROW_VERSIONS_PER_SCAN_MAX: [(&str, f64); 12] = [
    ("assets", 1.0),
    ("enrichment_jobs", 1.0),
    ("evaluations", 5.0),
    ("findings", 1.0),
    ("outbox_batches", 1.5),
    ("scan_assets", 1.0),
    ("scan_jobs", 2.0),
    ("scans", 2.0),
    ("targets", 1.0),
    ("worker_result_batches", 1.0),
    ("worker_task_attempts", 2.0),
    ("worker_tasks", 3.0),
];

/// Tables written by time, not by scan: a worker's row records when it was last seen (the
/// benchmark's burn-down of 1,000 spent 0.16 per scan there), a leader lease is renewed.
const WRITTEN_BY_TIME: [&str; 2] = ["workers", "leader_leases"];
/// 16.5 before coverage; the five evaluations are the plugin's, one row each.
const ROW_VERSIONS_PER_SCAN_TOTAL_MAX: f64 = 21.5;

/// Inserted plus updated rows per table, once every backend's counters are published.
async fn row_versions(system: &TestSystem) -> BTreeMap<String, i64> {
    tokio::time::sleep(STATISTICS_FLUSH).await;
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT relname::text, n_tup_ins + n_tup_upd FROM pg_stat_user_tables")
            .fetch_all(&system.pool)
            .await
            .expect("table statistics read");
    rows.into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_plugin_scan_writes_no_more_row_versions_than_pinned() {
    let system = TestSystem::spawn().await;
    let org = system.organization().await;
    let _worker = system.reference_worker(org, 16).await;
    let mut completed = system
        .bus
        .client()
        .subscribe(system.subjects.tenant_event(&org, EventKind::ScanCompleted))
        .await
        .expect("subscribe to scan.completed");
    system.bus.flush().await.expect("flush");
    let before = row_versions(&system).await;

    let client = system.client();
    for index in 0..SCANS {
        let request = system.request(
            org,
            &format!("synthetic://rows-{index}?duration_ms=0&findings=1"),
            &["synthetic"],
        );
        client.publish(&request).await.expect("request confirmed");
    }
    for _ in 0..SCANS {
        tokio::time::timeout(tests::WAIT_MAX, completed.next())
            .await
            .expect("every scan completes")
            .expect("a subscription");
    }
    system
        .wait_for("every event published", || async {
            let (unpublished, _) = store::outbox::backlog(&system.pool)
                .await
                .expect("outbox read");
            (unpublished == 0).then_some(())
        })
        .await;
    let after = row_versions(&system).await;

    let per_scan: BTreeMap<&str, f64> = after
        .iter()
        .map(|(table, count)| {
            let written = count - before.get(table).copied().unwrap_or(0);
            (table.as_str(), written as f64 / SCANS as f64)
        })
        .filter(|(table, written)| *written > 0.0 && !WRITTEN_BY_TIME.contains(table))
        .collect();
    let ceilings: BTreeMap<&str, f64> = ROW_VERSIONS_PER_SCAN_MAX.into_iter().collect();
    for (table, written) in &per_scan {
        let ceiling = ceilings.get(table).copied().unwrap_or(0.0);
        assert!(
            *written <= ceiling,
            "{table}: {written:.2} row versions per scan, over the pinned {ceiling} ({per_scan:?})"
        );
    }
    let total: f64 = per_scan.values().sum();
    assert!(
        total <= ROW_VERSIONS_PER_SCAN_TOTAL_MAX,
        "{total:.2} row versions per scan, over the pinned {ROW_VERSIONS_PER_SCAN_TOTAL_MAX} ({per_scan:?})"
    );
    println!("row versions per one-plugin scan: {total:.2} {per_scan:?}");
    system.finish().await;
}

/// A lease writes no scan or scan-job row (two of the row versions pinned above): the rows stay
/// `pending`, and `running` is read from the attempt. `scan show` and a replayed submission
/// report the scan `running` from its first lease to its end; a job reads `running` while its
/// task holds a lease and `pending` again once the lease is released.
#[tokio::test]
async fn a_lease_writes_no_scan_row_yet_the_scan_reads_running() {
    let system = TestSystem::spawn().await;
    let org = system.organization().await;
    let worker = system.manual_worker(org, 8).await;
    assert!(worker.hello(&["alpha", "beta"]).await.error.is_none());
    let request = system.request(org, "http://reads-running.test", &["alpha", "beta"]);
    let submitted = system.submit(&request).await;
    assert!(submitted.error.is_none(), "{submitted:?}");
    let scan_id: uuid::Uuid = submitted.scan_id.parse().expect("a scan id");
    let stored = || async {
        let scan: String = sqlx::query_scalar("SELECT state FROM scans WHERE id = $1")
            .bind(scan_id)
            .fetch_one(&system.pool)
            .await
            .expect("scan row");
        let jobs: Vec<String> =
            sqlx::query_scalar("SELECT state FROM scan_jobs WHERE scan_id = $1 ORDER BY position")
                .bind(scan_id)
                .fetch_all(&system.pool)
                .await
                .expect("scan job rows");
        (scan, jobs)
    };
    let reported = || async {
        let scan = store::admin::scan(&system.pool, scan_id)
            .await
            .expect("scan read")
            .expect("scan exists");
        let jobs: Vec<String> = store::admin::scan_jobs(&system.pool, scan_id)
            .await
            .expect("scan jobs read")
            .into_iter()
            .map(|job| job.state)
            .collect();
        (scan.state, scan.started_at.is_some(), jobs)
    };
    let pending = || vec!["pending".to_owned()];

    assert_eq!(reported().await, ("pending".to_owned(), false, pending()));
    let lease = worker.acquire_one().await;
    assert_eq!(stored().await, ("pending".to_owned(), pending()));
    assert_eq!(
        reported().await,
        ("running".to_owned(), true, vec!["running".to_owned()])
    );
    let replay = system.submit(&request).await;
    assert_eq!(
        (replay.deduplicated, replay.state.as_str()),
        (true, "running"),
        "{replay:?}"
    );

    assert!(worker.release(&lease).await.error.is_none());
    assert_eq!(stored().await, ("pending".to_owned(), pending()));
    assert_eq!(reported().await, ("running".to_owned(), true, pending()));

    let lease = worker.acquire_one().await;
    assert!(worker.complete(&lease, 0).await.error.is_none());
    let next = worker.acquire_one().await;
    assert_eq!(next.plugin, "beta");
    assert_eq!(
        stored().await,
        (
            "pending".to_owned(),
            vec!["completed".to_owned(), "pending".to_owned()]
        )
    );
    assert_eq!(
        reported().await,
        (
            "running".to_owned(),
            true,
            vec!["completed".to_owned(), "running".to_owned()]
        )
    );
    assert!(worker.complete(&next, 0).await.error.is_none());
    system
        .wait_scan_state(&submitted.scan_id, "completed")
        .await;
    assert_eq!(system.submit(&request).await.state, "completed");
    system.finish().await;
}
