//! Real processes: the reference worker as a child process, killed with SIGKILL or paused
//! with SIGSTOP mid-task. The system heals without people (I1, I4).

use std::time::Duration;

use tests::{Component, TestSystem, WorkerProcess};
use uuid::Uuid;

/// The reference worker binary, built by cargo with this test.
const WORKER: &str = env!("CARGO_BIN_EXE_test-worker");

/// Short leases so recovery takes seconds: TTL 2 s, renew every 500 ms.
async fn system_with_short_leases() -> TestSystem {
    let system = TestSystem::spawn_with(|settings| {
        settings.dispatch.lease =
            runtime::LeaseSettings::new(Duration::from_secs(2), Duration::from_millis(500))
                .unwrap();
    })
    .await;
    system.start(Component::Reaper);
    system
}

/// The attempts of the scan's only task, oldest first: (attempt id, worker id, status).
async fn attempts(system: &TestSystem, scan_id: &str) -> Vec<(Uuid, Uuid, String)> {
    store::testing::attempts_of_scan(&system.pool, Uuid::parse_str(scan_id).unwrap())
        .await
        .unwrap()
}

async fn wait_leased_to(system: &TestSystem, scan_id: &str, worker_id: Uuid) {
    system
        .wait_for("the task to be leased to the child worker", || async {
            attempts(system, scan_id)
                .await
                .iter()
                .any(|(_, worker, status)| {
                    *worker == worker_id && matches!(status.as_str(), "leased" | "running")
                })
                .then_some(())
        })
        .await;
}

#[tokio::test]
async fn a_worker_killed_mid_task_loses_nothing_the_task_completes_elsewhere() {
    let system = system_with_short_leases().await;
    let organization_id = system.organization().await;
    let mut doomed = WorkerProcess::start(&system, WORKER, organization_id, 1).await;
    let request = system.request(
        organization_id,
        "synthetic://slow?duration_ms=3000&findings=4",
        &["synthetic"],
    );
    let reply = system.submit(&request).await;
    wait_leased_to(&system, &reply.scan_id, doomed.worker_id).await;

    doomed.kill().await;
    let survivor = WorkerProcess::start(&system, WORKER, organization_id, 1).await;
    system.wait_scan_state(&reply.scan_id, "completed").await;

    let attempts = attempts(&system, &reply.scan_id).await;
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    assert_eq!(
        (attempts[0].1, attempts[0].2.as_str()),
        (doomed.worker_id, "expired")
    );
    assert_eq!(
        (attempts[1].1, attempts[1].2.as_str()),
        (survivor.worker_id, "succeeded")
    );
    let findings = store::admin::findings(&system.pool, Uuid::parse_str(&reply.scan_id).unwrap())
        .await
        .unwrap();
    assert_eq!(findings.len(), 4);
    assert!(
        findings
            .iter()
            .all(|finding| finding.attempt_id == attempts[1].0),
        "evidence is the survivor's"
    );
    system.finish().await;
}

#[tokio::test]
async fn a_paused_worker_that_wakes_after_its_ttl_cannot_write_anything() {
    let system = system_with_short_leases().await;
    let organization_id = system.organization().await;
    let sleeper = WorkerProcess::start(&system, WORKER, organization_id, 1).await;
    let request = system.request(
        organization_id,
        "synthetic://pause?duration_ms=2500&findings=5",
        &["synthetic"],
    );
    let reply = system.submit(&request).await;
    wait_leased_to(&system, &reply.scan_id, sleeper.worker_id).await;

    sleeper.signal("STOP");
    let (sleeper_attempt, _, _) = attempts(&system, &reply.scan_id).await[0].clone();
    let batches_before = store::testing::batches_of_attempt(&system.pool, sleeper_attempt)
        .await
        .unwrap();
    let other = WorkerProcess::start(&system, WORKER, organization_id, 1).await;
    system.wait_scan_state(&reply.scan_id, "completed").await;

    sleeper.signal("CONT");
    // Watch for a while (an observation window, not a wait for an event): the woken worker
    // renews, sends what it had and tries to complete; none of it may land.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(4);
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let attempts = attempts(&system, &reply.scan_id).await;
        assert_eq!(attempts[0].2, "expired", "the paused attempt stays expired");
        assert_eq!(
            store::testing::batches_of_attempt(&system.pool, sleeper_attempt)
                .await
                .unwrap(),
            batches_before,
            "no batch of the paused attempt was accepted after it lost its lease"
        );
    }
    let attempts = attempts(&system, &reply.scan_id).await;
    let winner = attempts
        .iter()
        .find(|(_, _, status)| status == "succeeded")
        .expect("a successful attempt");
    assert_eq!(winner.1, other.worker_id);
    let findings = store::admin::findings(&system.pool, Uuid::parse_str(&reply.scan_id).unwrap())
        .await
        .unwrap();
    assert_eq!(findings.len(), 5);
    assert!(
        findings
            .iter()
            .all(|finding| finding.attempt_id == winner.0),
        "the final results are the other attempt's"
    );
    system.finish().await;
}
