//! Cancellation and revocation: persisted first, seen at the next renew, racing cleanly with
//! completion (I8), and no new lease once a revocation commits (I12).

use std::sync::Arc;

use messages::ErrorCode;
use store::cancel::{CancelOutcome, CancelTarget};
use store::revoke::{ActiveLeases, RevokeOutcome};
use tests::{TestSystem, findings_payload};
use tokio::sync::Barrier;
use uuid::Uuid;

fn task_id(lease: &messages::v1::Lease) -> Uuid {
    Uuid::parse_str(&lease.lease.as_ref().unwrap().task_id).unwrap()
}

#[tokio::test]
async fn a_cancelled_scan_stops_its_worker_at_the_next_renew() {
    let system = TestSystem::spawn().await;
    let scan = system.leased_scan(&["alpha", "beta"]).await;
    let worker = &scan.worker;
    assert!(
        worker
            .send_batch(&worker.batch(&scan.lease, 0, &findings_payload(1)))
            .await
            .error
            .is_none()
    );

    let reply = system
        .client()
        .cancel_scan(&scan.organization_id, &scan.scan_id, "operator said so")
        .await
        .unwrap();
    assert!(reply.error.is_none(), "{reply:?}");
    assert_eq!(
        (reply.outcome.as_str(), reply.state.as_str()),
        ("cancelled", "cancelled")
    );
    assert_eq!(system.scan_state(&scan.scan_id).await, "cancelled");
    let after_cancel = system.table_counts().await;

    let renew = worker.renew(&scan.lease).await;
    assert_eq!(
        renew.error.unwrap().error_code(),
        Some(ErrorCode::CancelRequested)
    );
    let ack = worker
        .send_batch(&worker.batch(&scan.lease, 1, &findings_payload(1)))
        .await;
    assert_eq!(
        ack.error.unwrap().error_code(),
        Some(ErrorCode::CancelRequested)
    );
    let ack = worker.complete(&scan.lease, 1).await;
    assert_eq!(
        ack.error.unwrap().error_code(),
        Some(ErrorCode::CancelRequested)
    );
    assert_eq!(
        system.table_counts().await,
        after_cancel,
        "refusals after a cancel write nothing"
    );

    // Terminal stays terminal: cancelling again changes nothing.
    let again = system
        .client()
        .cancel_scan(&scan.organization_id, &scan.scan_id, "again")
        .await
        .unwrap();
    assert_eq!(
        (again.outcome.as_str(), again.state.as_str()),
        ("already_terminal", "cancelled")
    );
    // Nothing of the scan is offered again.
    let idle = worker.acquire(Uuid::new_v4(), 1, 200).await;
    assert!(idle.leases.is_empty());
    system.finish().await;
}

/// Issue 26: the id of any task of a running scan cancels the scan, even the first plugin's
/// task that already completed while the second runs (it answered `already_terminal` /
/// `completed` and the scan ran on).
#[tokio::test]
async fn cancelling_by_a_completed_tasks_id_cancels_its_running_scan() {
    let system = TestSystem::spawn().await;
    let scan = system.leased_scan(&["alpha", "beta"]).await;
    assert!(scan.worker.complete(&scan.lease, 0).await.error.is_none());
    let second = scan.worker.acquire_one().await;
    assert_eq!(second.plugin, "beta");
    let reply = system
        .client()
        .cancel_task(
            &scan.organization_id,
            &task_id(&scan.lease).to_string(),
            "the first plugin's task names the scan",
        )
        .await
        .unwrap();
    assert!(reply.error.is_none(), "{reply:?}");
    assert_eq!(
        (
            reply.outcome.as_str(),
            reply.state.as_str(),
            reply.scan_id.as_str()
        ),
        ("cancelled", "cancelled", scan.scan_id.as_str()),
        "the reply's state is the scan's"
    );
    assert_eq!(system.scan_state(&scan.scan_id).await, "cancelled");
    assert_eq!(
        scan.worker
            .renew(&second)
            .await
            .error
            .map(|error| error.code),
        Some("cancel_requested".to_owned()),
        "the second plugin's worker hears of it at its next renew"
    );
    system.finish().await;
}

#[tokio::test]
async fn cancelling_a_completed_scan_is_refused_cleanly() {
    let system = TestSystem::spawn().await;
    let scan = system.leased_scan(&["alpha"]).await;
    assert!(scan.worker.complete(&scan.lease, 0).await.error.is_none());
    system.wait_scan_state(&scan.scan_id, "completed").await;
    let reply = system
        .client()
        .cancel_task(
            &scan.organization_id,
            &task_id(&scan.lease).to_string(),
            "too late",
        )
        .await
        .unwrap();
    assert_eq!(
        (reply.outcome.as_str(), reply.state.as_str()),
        ("already_terminal", "completed")
    );
    assert_eq!(system.scan_state(&scan.scan_id).await, "completed");
    let unknown = system
        .client()
        .cancel_scan(&scan.organization_id, &Uuid::new_v4().to_string(), "")
        .await
        .unwrap();
    assert_eq!(
        unknown.error.unwrap().error_code(),
        Some(ErrorCode::NotFound)
    );
    system.finish().await;
}

/// Runs `operation` until it is not a transient database failure (a deadlock between the two
/// racers is resolved by PostgreSQL aborting one; the loser retries, as a redelivery would).
async fn retry_transient<T, F, Fut>(mut operation: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, store::StoreError>>,
{
    for _ in 0..10 {
        match operation().await {
            Ok(value) => return value,
            Err(error) if error.is_transient() => continue,
            Err(error) => panic!("{error}"),
        }
    }
    panic!("still failing after 10 tries")
}

#[tokio::test]
async fn cancellation_and_completion_race_cleanly_in_both_orders() {
    let system = TestSystem::spawn().await;
    let (mut cancel_won, mut completion_won) = (0, 0);
    for round in 0..24 {
        let scan = system.leased_scan(&["alpha"]).await;
        let claim =
            store::LeaseClaim::from_wire(scan.worker.id, scan.lease.lease.as_ref()).unwrap();
        let scan_id = Uuid::parse_str(&scan.scan_id).unwrap();
        // Rounds 1 and 2 (mod 3) force an order by running one side after the other; the
        // rest release both sides at a barrier and let PostgreSQL decide.
        let race = round % 3 == 0;
        let barrier = Arc::new(Barrier::new(2));
        let complete = {
            let pool = system.pool.clone();
            let subjects = system.subjects.clone();
            let barrier = barrier.clone();
            let claim = claim.clone();
            async move {
                if race {
                    barrier.wait().await;
                }
                retry_transient(|| async {
                    let mut tx = pool.begin().await?;
                    let outcome = tests::complete_attempt(&mut tx, &subjects, &claim).await?;
                    tx.commit().await?;
                    Ok(outcome)
                })
                .await
            }
        };
        let cancel = {
            let pool = system.pool.clone();
            let subjects = system.subjects.clone();
            let barrier = barrier.clone();
            async move {
                if race {
                    barrier.wait().await;
                }
                retry_transient(|| {
                    store::cancel::cancel(
                        &pool,
                        &subjects,
                        None,
                        CancelTarget::Scan(scan_id),
                        "race",
                    )
                })
                .await
            }
        };
        let (completed, cancelled) = match round % 3 {
            1 => {
                let cancelled = cancel.await;
                (complete.await, cancelled)
            }
            2 => {
                let completed = complete.await;
                (completed, cancel.await)
            }
            _ => tokio::join!(complete, cancel),
        };
        let state = system.scan_state(&scan.scan_id).await;
        match (&completed, &cancelled) {
            (
                store::ingest::IngestOutcome::Accepted,
                CancelOutcome::AlreadyTerminal { state: s, .. },
            ) => {
                assert_eq!((state.as_str(), s.as_str()), ("completed", "completed"));
                completion_won += 1;
            }
            (store::ingest::IngestOutcome::Refused(error), CancelOutcome::Cancelled { .. }) => {
                assert_eq!(error.error_code(), Some(ErrorCode::CancelRequested));
                assert_eq!(state, "cancelled");
                cancel_won += 1;
            }
            other => panic!("round {round}: not a clean outcome: {other:?} with scan {state}"),
        }
    }
    assert!(
        cancel_won > 0 && completion_won > 0,
        "both orders happened: {cancel_won} / {completion_won}"
    );
    system.finish().await;
}

#[tokio::test]
async fn revoking_a_worker_voids_its_lease_and_offers_the_task_to_another() {
    let system = TestSystem::spawn().await;
    let scan = system.leased_scan(&["alpha"]).await;
    let outcome = store::revoke::revoke_worker(
        &system.pool,
        &system.subjects,
        scan.worker.id,
        &store::audit::Change::new("test", "compromised"),
        ActiveLeases::Cancel,
    )
    .await
    .unwrap();
    assert_eq!(
        outcome,
        RevokeOutcome::Revoked {
            leases_cancelled: 1
        }
    );

    let renew = scan.worker.renew(&scan.lease).await;
    assert_eq!(
        renew.error.unwrap().error_code(),
        Some(ErrorCode::LeaseLost)
    );
    let ack = scan.worker.complete(&scan.lease, 0).await;
    assert_eq!(ack.error.unwrap().error_code(), Some(ErrorCode::LeaseLost));
    let acquire = scan.worker.acquire(Uuid::new_v4(), 1, 0).await;
    assert_eq!(
        acquire.error.unwrap().error_code(),
        Some(ErrorCode::WorkerDisabled)
    );

    let other = system.manual_worker(scan.organization_id, 4).await;
    assert!(other.hello(&["alpha"]).await.error.is_none());
    let lease = other.acquire_one().await;
    assert_eq!(
        lease.lease.as_ref().unwrap().task_id,
        scan.lease.lease.as_ref().unwrap().task_id
    );
    let jobs = store::admin::scan_jobs(&system.pool, Uuid::parse_str(&scan.scan_id).unwrap())
        .await
        .unwrap();
    assert_eq!(
        jobs[0].attempt_count,
        Some(1),
        "the voided attempt did not spend the budget"
    );
    assert!(other.complete(&lease, 0).await.error.is_none());
    system.wait_scan_state(&scan.scan_id, "completed").await;
    system.finish().await;
}

#[tokio::test]
async fn a_routine_reassignment_lets_active_leases_finish() {
    let system = TestSystem::spawn().await;
    let scan = system.leased_scan(&["alpha", "beta"]).await;
    let outcome = store::revoke::revoke_assignment(
        &system.pool,
        &system.subjects,
        scan.organization_id,
        scan.worker.id,
        &store::audit::Change::new("test", "moved to another team"),
        ActiveLeases::LetFinish,
    )
    .await
    .unwrap();
    assert_eq!(
        outcome,
        RevokeOutcome::Revoked {
            leases_cancelled: 0
        }
    );
    assert!(scan.worker.renew(&scan.lease).await.error.is_none());
    assert!(scan.worker.complete(&scan.lease, 0).await.error.is_none());
    // The next plugin's task is not leased to it any more.
    let acquire = scan.worker.acquire(Uuid::new_v4(), 1, 300).await;
    assert_eq!(
        acquire.error.unwrap().error_code(),
        Some(ErrorCode::WorkerNotAssigned)
    );
    system.finish().await;
}

#[tokio::test]
async fn no_lease_is_granted_after_a_revocation_commits() {
    // Acquire and revocation race at a barrier, many times; whichever order PostgreSQL picks,
    // a revoked worker ends holding no live lease.
    let system = TestSystem::spawn().await;
    for _ in 0..16 {
        let organization_id = system.organization().await;
        let worker = system.manual_worker(organization_id, 4).await;
        assert!(worker.hello(&["alpha"]).await.error.is_none());
        assert!(
            system
                .submit(&system.request(organization_id, "http://revoke.test", &["alpha"]))
                .await
                .error
                .is_none()
        );
        let barrier = Arc::new(Barrier::new(2));
        let acquire = {
            let pool = system.pool.clone();
            let subjects = system.subjects.clone();
            let barrier = barrier.clone();
            let worker_id = worker.id;
            async move {
                barrier.wait().await;
                let params = store::lease::AcquireParams {
                    worker_id,
                    request_id: Uuid::new_v4(),
                    max_tasks: 1,
                    lease_ttl: std::time::Duration::from_secs(30),
                };
                store::lease::acquire(&pool, &mut store::Staged::default(), &subjects, &params)
                    .await
                    .unwrap()
            }
        };
        let revoke = {
            let pool = system.pool.clone();
            let subjects = system.subjects.clone();
            let barrier = barrier.clone();
            let worker_id = worker.id;
            async move {
                barrier.wait().await;
                store::revoke::revoke_worker(
                    &pool,
                    &subjects,
                    worker_id,
                    &store::audit::Change::new("test", "race"),
                    ActiveLeases::Cancel,
                )
                .await
                .unwrap()
            }
        };
        let _ = tokio::join!(acquire, revoke);
        let live = store::testing::live_attempts_of_worker(&system.pool, worker.id)
            .await
            .unwrap();
        assert_eq!(live, 0, "a revoked worker holds no live lease");
    }
    system.finish().await;
}
