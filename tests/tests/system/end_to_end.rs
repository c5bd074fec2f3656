//! The whole path with the reference worker: a three-plugin profile against a local web app.

use tests::TestSystem;

#[tokio::test]
async fn a_scan_runs_through_three_plugins_on_a_reference_worker() {
    let system = TestSystem::spawn().await;
    let org = system.organization().await;
    let address = tests::start_web_app().await;
    let _stats = system.reference_worker(org, 4).await;
    let request = system.request(
        org,
        &format!("http://{address}/"),
        &["tcp_connect", "http_headers", "synthetic"],
    );
    let reply = system.submit(&request).await;
    assert!(reply.error.is_none(), "{reply:?}");
    system.wait_scan_state(&reply.scan_id, "completed").await;

    let scan_id = uuid::Uuid::parse_str(&reply.scan_id).unwrap();
    let jobs = store::admin::scan_jobs(&system.pool, scan_id)
        .await
        .unwrap();
    assert_eq!(jobs.len(), 3);
    assert!(jobs.iter().all(|job| job.state == "completed"), "{jobs:?}");
    assert!(
        jobs[0].asset_count > 0,
        "tcp_connect discovered the web app"
    );
    let findings = store::admin::findings(&system.pool, scan_id).await.unwrap();
    assert!(
        findings
            .iter()
            .any(|finding| finding.plugin == "http_headers"),
        "http_headers checked the service tcp_connect discovered: {findings:?}"
    );
    system.finish().await;
}

#[tokio::test]
async fn every_event_is_relayed_once_from_the_outbox() {
    let system = TestSystem::spawn().await;
    let scan = system.leased_scan(&["alpha"]).await;
    system.complete_with_findings(&scan, 1).await;
    let counts = tests::event_counts(&system).await;
    let count = |name: &str| counts.get(name).copied().unwrap_or(0);
    assert_eq!(count("scan.admitted"), 1, "{counts:?}");
    assert_eq!(count("task.ready"), 1);
    assert_eq!(count("task.leased"), 1);
    assert_eq!(count("task.completed"), 1);
    assert_eq!(count("scan.completed"), 1);

    // A relay that re-publishes (its claim lapsed after a publish whose PubAck it never saw)
    // is de-duplicated by the stream: Nats-Msg-Id is the outbox row id.
    assert_eq!(tests::put_published_events_back(&system).await, 5);
    system.wait_outbox_drained().await;
    let again = tests::event_counts(&system).await;
    assert_eq!(again, counts);
    system.finish().await;
}
