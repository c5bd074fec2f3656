//! The scan's next plugin handed on with a completion's acknowledgement (issue 24, item 3): a
//! completion that asks (`TaskComplete.lease_next`) is answered with the next plugin leased to
//! its worker, exactly as acquire would lease it (the worker offers the plugin, serves the
//! organization, has room), under the completed attempt's id as request id, so a resent
//! completion gets the same lease again; a worker that may not take it gets nothing and the
//! task waits for an acquire.

use messages::v1;
use store::revoke::ActiveLeases;
use tests::TestSystem;
use uuid::Uuid;

fn lease_ref(lease: &v1::Lease) -> v1::LeaseRef {
    lease.lease.clone().expect("a lease reference")
}

/// The attempt's request id: what it was granted under.
async fn request_id_of(system: &TestSystem, lease: &v1::Lease) -> Option<Uuid> {
    let attempt_id = Uuid::parse_str(&lease_ref(lease).attempt_id).expect("an attempt id");
    sqlx::query_scalar("SELECT acquire_request_id FROM worker_task_attempts WHERE id = $1")
        .bind(attempt_id)
        .fetch_one(&system.pool)
        .await
        .expect("the attempt")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_that_asks_is_answered_with_the_scans_next_plugin() {
    let system = TestSystem::spawn().await;
    let scan = system.leased_scan(&["alpha", "beta", "gamma"]).await;
    let worker = &scan.worker;

    let ack = worker.complete_asking_next(&scan.lease, 0).await;
    assert!(ack.error.is_none(), "{ack:?}");
    let [beta] = ack.leases.as_slice() else {
        panic!("one lease handed on: {ack:?}");
    };
    assert_eq!(
        (beta.plugin.as_str(), beta.scan_id.as_str(), beta.position),
        ("beta", scan.scan_id.as_str(), 1)
    );
    assert!(beta.lease_expires_in_ms > 0, "{beta:?}");
    assert_eq!(
        request_id_of(&system, beta).await.map(|id| id.to_string()),
        Some(lease_ref(&scan.lease).attempt_id),
        "granted under the completed attempt's id"
    );

    // The completion again (its acknowledgement was lost): the same lease, not a second one.
    let again = worker.complete_asking_next(&scan.lease, 0).await;
    assert!(again.duplicate && again.error.is_none(), "{again:?}");
    let handed: Vec<v1::LeaseRef> = again.leases.iter().map(lease_ref).collect();
    assert_eq!(handed, [lease_ref(beta)]);
    let reply = worker.acquire(Uuid::new_v4(), 8, 0).await;
    assert!(reply.leases.is_empty(), "nothing else to lease: {reply:?}");

    // The handed lease is the worker's: its completion hands on the last plugin, whose own
    // hands on nothing and completes the scan.
    let ack = worker.complete_asking_next(beta, 0).await;
    assert!(ack.error.is_none(), "{ack:?}");
    let [gamma] = ack.leases.as_slice() else {
        panic!("one lease handed on: {ack:?}");
    };
    assert_eq!(gamma.plugin, "gamma");
    let ack = worker.complete_asking_next(gamma, 0).await;
    assert!(ack.error.is_none() && ack.leases.is_empty(), "{ack:?}");
    system.wait_scan_state(&scan.scan_id, "completed").await;
    system.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_handed_to_a_worker_that_may_not_take_the_next_plugin() {
    let system = TestSystem::spawn().await;

    // A worker that does not offer the next plugin: it waits for one that does.
    let scan = system.leased_scan(&["alpha", "beta"]).await;
    let hello = scan.worker.hello(&["alpha"]).await;
    assert!(hello.error.is_none(), "{hello:?}");
    let ack = scan.worker.complete_asking_next(&scan.lease, 0).await;
    assert!(ack.error.is_none() && ack.leases.is_empty(), "{ack:?}");
    let other = system.manual_worker(scan.organization_id, 8).await;
    assert!(other.hello(&["beta"]).await.error.is_none());
    assert_eq!(other.acquire_one().await.plugin, "beta");

    // A worker no longer assigned to the organization, its leases let finish: the completion
    // is accepted, nothing is handed on.
    let scan = system.leased_scan(&["alpha", "beta"]).await;
    let revoked = store::revoke::revoke_assignment(
        &system.pool,
        &system.subjects,
        scan.organization_id,
        scan.worker.id,
        &store::audit::Change::new("test", "reassigned"),
        ActiveLeases::LetFinish,
    )
    .await
    .expect("revoked");
    assert!(matches!(
        revoked,
        store::revoke::RevokeOutcome::Revoked { .. }
    ));
    let ack = scan.worker.complete_asking_next(&scan.lease, 0).await;
    assert!(ack.error.is_none() && ack.leases.is_empty(), "{ack:?}");

    // A worker without room: two leases live, its capacity lowered to one.
    let scan = system.leased_scan(&["alpha", "beta"]).await;
    let worker = &scan.worker;
    let request = system.request(
        scan.organization_id,
        "http://second.test",
        &["alpha", "beta"],
    );
    assert!(system.submit(&request).await.error.is_none());
    let _second = worker.acquire_one().await;
    let hello = worker.hello_with_capacity(&["alpha", "beta"], 1).await;
    assert!(hello.error.is_none(), "{hello:?}");
    let ack = worker.complete_asking_next(&scan.lease, 0).await;
    assert!(ack.error.is_none() && ack.leases.is_empty(), "{ack:?}");
    system.finish().await;
}

/// The next plugin is leased in the completion's own transaction (issue 46): no acquire can
/// take it between two commits. Forced: while another transaction share-locks the worker's row
/// (as a second ingestion batch handing on to the same worker does), the completion is answered
/// with its lease at once, and another worker's acquire made right after finds nothing. (When
/// the hand-off was a transaction of its own after the decision's, it locked the worker's row
/// for update and waited here, with the next task pending for any acquire to take.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_plugin_is_leased_in_the_completions_own_transaction() {
    let system = TestSystem::spawn().await;
    let scan = system.leased_scan(&["alpha", "beta"]).await;
    let other = system.manual_worker(scan.organization_id, 8).await;
    assert!(other.hello(&["alpha", "beta"]).await.error.is_none());
    let mut sharer = system.pool.begin().await.expect("a transaction");
    sqlx::query("SELECT 1 FROM workers WHERE id = $1 FOR SHARE")
        .bind(scan.worker.id)
        .execute(&mut *sharer)
        .await
        .expect("the worker's row share-locked");

    let ack = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        scan.worker.complete_asking_next(&scan.lease, 0),
    )
    .await
    .expect("the completion waited for the worker's row");
    assert!(ack.error.is_none(), "{ack:?}");
    let [beta] = ack.leases.as_slice() else {
        panic!("the next plugin handed on: {ack:?}");
    };
    assert_eq!(beta.plugin, "beta");
    let reply = other.acquire(Uuid::new_v4(), 8, 0).await;
    assert!(
        reply.leases.is_empty(),
        "nothing left to acquire: {reply:?}"
    );
    sharer.rollback().await.expect("released");
    system.finish().await;
}

/// The worker SDK asks with every completion and runs what it is handed in the same slot: each
/// plugin after the first is leased with its predecessor's completion, none through an acquire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reference_worker_runs_a_scans_plugins_one_after_another_without_acquiring() {
    let system = TestSystem::spawn().await;
    let organization_id = system.organization().await;
    let address = tests::start_web_app().await;
    let stats = system.reference_worker(organization_id, 1).await;
    let request = system.request(
        organization_id,
        &format!("http://{address}/"),
        &["tcp_connect", "http_headers", "synthetic"],
    );
    let reply = system.submit(&request).await;
    assert!(reply.error.is_none(), "{reply:?}");
    system.wait_scan_state(&reply.scan_id, "completed").await;

    let attempts: Vec<(Uuid, Option<Uuid>)> = sqlx::query_as(
        "SELECT a.id, a.acquire_request_id FROM worker_task_attempts a \
         JOIN worker_tasks t ON t.id = a.task_id JOIN scan_jobs j ON j.id = t.scan_job_id \
         WHERE t.scan_id = $1 ORDER BY j.position",
    )
    .bind(Uuid::parse_str(&reply.scan_id).expect("a scan id"))
    .fetch_all(&system.pool)
    .await
    .expect("the scan's attempts");
    assert_eq!(attempts.len(), 3, "one attempt per plugin: {attempts:?}");
    for pair in attempts.windows(2) {
        assert_eq!(
            pair[1].1,
            Some(pair[0].0),
            "the next plugin was leased with the previous one's completion: {attempts:?}"
        );
    }
    assert_eq!(
        stats.snapshot().leases_acquired,
        3,
        "{:?}",
        stats.snapshot()
    );
    system.finish().await;
}
