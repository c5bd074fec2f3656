//! Per-lane cost (issue 4): every PostgreSQL statement and NATS message palisade spends on a
//! scan is charged to the lane that spent it, nothing to no lane, and the totals per completed
//! scan stay under ceilings that catch a regression (an N+1 query, a lost batch).

use futures::StreamExt as _;
use messages::EventKind;
use telemetry::cost::{self, lanes};
use tests::{Component, TestSystem};

/// Enough scans that per-scan figures are not dominated by idle polling.
const SCANS: usize = 60;
/// The asset-discovery profile: three tasks per scan, the second fed by the first.
const PROFILE: [&str; 3] = ["tcp_connect", "http_headers", "synthetic"];

/// Statements per completed scan above which a lane has regressed. Measured (2 cores, this
/// test, a debug build, each request submitted alone so batches are small, and with up to four
/// batches decided at once, smaller still): admission ~7, dispatch ~6, ingestion 22–28 (three
/// tasks, each one message; since the next plugin is leased in the completion's transaction,
/// a decision that hands on runs five statements more: its savepoint, the lock bound set and
/// set back, the grant; 7–18 before, 2026-12-07), enrichment ~0.2 (no scan has a CVE to enrich), the outbox ~4 (its
/// events are handed off by their committers: one marking statement per round, no claims). The
/// ceilings leave room for idle polling and small batches on a slow machine, not for a query
/// per row or per message (the statements per batch are pinned in `decide.rs` and `admit.rs`).
const STATEMENTS_PER_SCAN_MAX: [(&str, f64); 5] = [
    (lanes::ADMISSION, 12.0),
    (lanes::DISPATCH, 15.0),
    (lanes::INGESTION, 35.0),
    (lanes::ENRICHMENT, 2.0),
    (lanes::OUTBOX, 8.0),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_statement_and_message_of_a_scan_is_charged_to_its_lane() {
    let system = TestSystem::spawn_with(|settings| {
        settings.http_addr = Some("127.0.0.1:0".parse().expect("address"));
    })
    .await;
    system.start(Component::Reaper);
    system.start(Component::Enrichment);
    let org = system.organization().await;
    let web_app = tests::start_web_app().await;
    let _stats = system.reference_worker(org, 16).await;
    let mut completed = system
        .bus
        .client()
        .subscribe(system.subjects.tenant_event(&org, EventKind::ScanCompleted))
        .await
        .expect("subscribe to scan.completed");
    system.bus.flush().await.expect("flush");

    // From here until the last completion, the test sends requests and listens: it runs no
    // statement, so every statement counted belongs to some service's lane.
    let before = cost::snapshot();
    let client = system.client();
    for index in 0..SCANS {
        let request = system.request(org, &format!("http://{web_app}/cost/{index}"), &PROFILE);
        let reply = client.submit(&request).await.expect("admission answers");
        assert!(reply.error.is_none(), "{reply:?}");
    }
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    for seen in 0..SCANS {
        tokio::time::timeout_at(deadline, completed.next())
            .await
            .unwrap_or_else(|_| panic!("only {seen} of {SCANS} scans completed in time"))
            .expect("subscription open");
    }
    let window = cost::spent(&before, &cost::snapshot());
    assert_eq!(
        window[lanes::OTHER].statements,
        0,
        "statements outside any lane: a task was spawned without `inherit` ({window:?})"
    );

    // Enrichment runs after completion; wait for it (these waits are the harness's, `other`).
    system
        .wait_for("every enrichment job to finish", || async {
            let pending: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM enrichment_jobs WHERE state <> 'completed'",
            )
            .fetch_one(&system.pool)
            .await
            .expect("count enrichment jobs");
            (pending == 0).then_some(())
        })
        .await;
    system.wait_outbox_drained().await;
    let total = cost::spent(&before, &cost::snapshot());

    let per_scan = |count: u64| count as f64 / SCANS as f64;
    for lane in [lanes::ADMISSION, lanes::DISPATCH, lanes::INGESTION] {
        let cost = total[lane];
        assert!(
            cost.statements > 0 && cost.messages_sent > 0 && cost.messages_received > 0,
            "{lane} did work on every scan: {cost:?}"
        );
    }
    assert!(total[lanes::ENRICHMENT].statements > 0, "{total:?}");
    assert!(
        total[lanes::OUTBOX].messages_sent > 0,
        "events were published: {total:?}"
    );
    // The election renews every TTL/3 (10 s): its campaign, before the window, counts.
    assert!(cost::statements(lanes::REAPER_ELECTION) > 0, "{total:?}");
    assert!(total[lanes::REAPER_RECOVERY].statements > 0, "{total:?}");
    assert!(total[lanes::REAPER_RETENTION].statements > 0, "{total:?}");
    let worker = total[lanes::WORKER];
    assert_eq!(worker.statements, 0, "workers never touch PostgreSQL");
    assert!(
        worker.messages_sent >= (SCANS * PROFILE.len()) as u64,
        "each task at least its completion (its only batch travels inside it): {worker:?}"
    );
    for (lane, max) in STATEMENTS_PER_SCAN_MAX {
        let statements = per_scan(total[lane].statements);
        assert!(
            statements <= max,
            "{lane}: {statements:.1} statements per scan, over the ceiling {max} ({total:?})"
        );
    }
    for (lane, cost) in &total {
        println!(
            "{lane:>18}: {:>6.1} statements, {:>6.1} messages sent, {:>6.1} received per scan",
            per_scan(cost.statements),
            per_scan(cost.messages_sent),
            per_scan(cost.messages_received),
        );
    }

    // The same counters are on /metrics, one series per lane whatever happened.
    let addr = system.health_addr.expect("health server");
    let text = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .expect("/metrics answers")
        .text()
        .await
        .expect("a text body");
    for lane in lanes::ALL {
        for series in [
            format!("palisade_db_statements_total{{lane=\"{lane}\"}}"),
            format!("palisade_nats_messages_total{{lane=\"{lane}\",direction=\"sent\"}}"),
            format!("palisade_nats_messages_total{{lane=\"{lane}\",direction=\"received\"}}"),
        ] {
            assert!(
                text.lines()
                    .any(|line| line.starts_with(&format!("{series} "))),
                "{series} missing from /metrics"
            );
        }
    }
    system.finish().await;
}
