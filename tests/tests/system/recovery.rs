//! Recovery without people: stale attempts (I4), the attempt budget (I10), execution
//! deadlines, and barrier-forced races between the reaper and workers (I1, I8).

use std::sync::Arc;
use std::time::Duration;

use messages::ErrorCode;
use store::ingest::IngestOutcome;
use store::lease::RenewOutcome;
use tests::TestSystem;
use tokio::sync::Barrier;
use uuid::Uuid;

#[tokio::test]
async fn a_task_that_always_fails_runs_exactly_max_attempts_times_within_the_backoff() {
    let system = TestSystem::spawn().await;
    let scan = system.leased_scan(&["alpha"]).await;
    let task_id = Uuid::parse_str(&scan.lease.lease.as_ref().unwrap().task_id).unwrap();
    let retry = system.settings.ingestion.retry;
    let max_attempts = system.settings.admission.max_attempts;
    let mut lease = scan.lease.clone();
    for attempt in 1..=max_attempts {
        assert_eq!(lease.lease.as_ref().unwrap().attempt_number, attempt as u32);
        assert!(
            scan.worker
                .fail(&lease, "flaky", true)
                .await
                .error
                .is_none()
        );
        let (state, delay) = store::testing::task_retry_delay(&system.pool, task_id)
            .await
            .unwrap();
        if attempt < max_attempts {
            assert_eq!(state, "retry_wait");
            let delay = delay.expect("a retry delay");
            assert!(
                delay <= retry.delay_max(attempt as u32),
                "attempt {attempt}: {delay:?} over the bound"
            );
            lease = scan.worker.acquire_one().await;
        } else {
            assert_eq!(state, "failed_terminal");
        }
    }
    system.wait_scan_state(&scan.scan_id, "failed").await;
    let view = store::admin::scan(&system.pool, Uuid::parse_str(&scan.scan_id).unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(view.failure_code, "flaky");
    assert!(
        view.failure_reason.contains("alpha"),
        "{}",
        view.failure_reason
    );
    assert_eq!(
        system.table_counts().await["worker_task_attempts"],
        i64::from(max_attempts)
    );
    // Nothing more is offered.
    assert!(
        scan.worker
            .acquire(Uuid::new_v4(), 1, 200)
            .await
            .leases
            .is_empty()
    );
    system.finish().await;
}

#[tokio::test]
async fn expired_leases_are_retried_until_the_budget_is_spent() {
    let system = TestSystem::spawn().await;
    let scan = system.leased_scan(&["alpha"]).await;
    let task_id = Uuid::parse_str(&scan.lease.lease.as_ref().unwrap().task_id).unwrap();
    let mut lease = scan.lease.clone();
    for attempt in 1..=3 {
        assert_eq!(lease.lease.as_ref().unwrap().attempt_number, attempt);
        store::testing::expire_live_attempt(&system.pool, task_id)
            .await
            .unwrap();
        let outcome = system.reaper().run_once().await.unwrap();
        if attempt < 3 {
            assert_eq!(outcome.recovered.retried, vec![task_id]);
            store::testing::make_task_due(&system.pool, task_id)
                .await
                .unwrap();
            lease = scan.worker.acquire_one().await;
        } else {
            assert_eq!(outcome.recovered.failed, vec![task_id]);
        }
    }
    system.wait_scan_state(&scan.scan_id, "failed").await;
    let view = store::admin::scan(&system.pool, Uuid::parse_str(&scan.scan_id).unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(view.failure_code, "lease_expired");
    system.finish().await;
}

#[tokio::test]
async fn recovery_steps_over_rows_another_transaction_holds() {
    let system = TestSystem::spawn().await;
    let held = system.leased_scan(&["alpha"]).await;
    let free = system.leased_scan(&["alpha"]).await;
    for scan in [&held, &free] {
        let task_id = Uuid::parse_str(&scan.lease.lease.as_ref().unwrap().task_id).unwrap();
        store::testing::expire_live_attempt(&system.pool, task_id)
            .await
            .unwrap();
    }
    let held_task = Uuid::parse_str(&held.lease.lease.as_ref().unwrap().task_id).unwrap();
    let free_task = Uuid::parse_str(&free.lease.lease.as_ref().unwrap().task_id).unwrap();
    let lock = store::testing::hold_attempt_lock(&system.pool, held_task)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let outcome = system.reaper().run_once().await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "recovery waited on a locked row"
    );
    assert_eq!(outcome.recovered.retried, vec![free_task]);
    drop(lock);
    system.finish().await;
}

#[tokio::test]
async fn the_execution_deadline_fails_an_attempt_even_while_it_renews() {
    let system = TestSystem::spawn().await;
    let organization_id = system.organization().await;
    let worker = system.manual_worker(organization_id, 4).await;
    assert!(worker.hello(&["alpha"]).await.error.is_none());
    let mut request = system.request(organization_id, "http://slow.test", &["alpha"]);
    request.execution_deadline_seconds = 1;
    let reply = system.submit(&request).await;
    let lease = worker.acquire_one().await;
    assert!(lease.execution_deadline_in_ms > 0);
    let reaper = system.reaper();
    let task_id = Uuid::parse_str(&lease.lease.as_ref().unwrap().task_id).unwrap();
    system
        .wait_for("the deadline to fail the attempt", || async {
            // The worker keeps renewing; the deadline still applies.
            let _ = worker.renew(&lease).await;
            let outcome = reaper.run_once().await.unwrap();
            outcome.overdue.contains(&task_id).then_some(())
        })
        .await;
    let renew = worker.renew(&lease).await;
    assert_eq!(
        renew.error.unwrap().error_code(),
        Some(ErrorCode::LeaseLost)
    );
    system.wait_scan_state(&reply.scan_id, "failed").await;
    let view = store::admin::scan(&system.pool, Uuid::parse_str(&reply.scan_id).unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(view.failure_code, "deadline_exceeded");
    system.finish().await;
}

/// Sets the live attempt of `task_id` to expire `ms` milliseconds from now.
async fn expire_in(system: &TestSystem, task_id: Uuid, ms: i64) {
    store::testing::set_lease_expiry_in(&system.pool, task_id, ms)
        .await
        .unwrap();
}

/// One round of a worker-side call racing a reaper sweep: a fresh lease set to expire around
/// when both start (behind one barrier, then 5 ms). Expiries run from 0 to 45 ms after now
/// over each ten rounds: the first rounds are lost by the worker and the last won whatever
/// the machine's load; the ones between race for real.
async fn race_with_recovery<T, Fut>(
    system: &TestSystem,
    reaper: &reaper::Service,
    round: i64,
    worker_side: impl FnOnce(store::LeaseClaim) -> Fut,
) -> (
    tests::LeasedScan,
    store::LeaseClaim,
    T,
    reaper::SweepOutcome,
)
where
    Fut: Future<Output = T>,
{
    let scan = system.leased_scan(&["alpha"]).await;
    let claim = store::LeaseClaim::from_wire(scan.worker.id, scan.lease.lease.as_ref()).unwrap();
    expire_in(system, claim.task_id, (round % 10) * 5).await;
    let barrier = Barrier::new(2);
    let worker = async {
        barrier.wait().await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        worker_side(claim.clone()).await
    };
    let recover = async {
        barrier.wait().await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        reaper.run_once().await.unwrap()
    };
    let (outcome, sweep) = tokio::join!(worker, recover);
    (scan, claim, outcome, sweep)
}

#[tokio::test]
async fn renew_and_stale_recovery_race_cleanly() {
    let system = TestSystem::spawn().await;
    let reaper = Arc::new(system.reaper());
    let (mut renewed, mut recovered) = (0, 0);
    for round in 0..30_i64 {
        let pool = system.pool.clone();
        let (_scan, claim, renewal, sweep) =
            race_with_recovery(&system, &reaper, round, |claim| async move {
                store::lease::renew(&pool, &claim, Duration::from_secs(30))
                    .await
                    .unwrap()
            })
            .await;
        let status = store::testing::attempt_status(&system.pool, claim.attempt_id)
            .await
            .unwrap();
        let swept = sweep.recovered.retried.contains(&claim.task_id);
        match renewal {
            RenewOutcome::Renewed { .. } => {
                assert!(!swept, "round {round}: a renewed lease was recovered");
                assert!(matches!(status.as_str(), "running" | "leased"), "{status}");
                renewed += 1;
            }
            RenewOutcome::Refused(error) => {
                assert_eq!(error.error_code(), Some(ErrorCode::LeaseLost));
                // Expired either way; recovered now or by the next sweep.
                reaper.run_once().await.unwrap();
                let status = store::testing::attempt_status(&system.pool, claim.attempt_id)
                    .await
                    .unwrap();
                assert_eq!(status, "expired", "round {round}");
                recovered += 1;
            }
        }
    }
    assert!(
        renewed > 0 && recovered > 0,
        "both orders happened: {renewed} / {recovered}"
    );
    system.finish().await;
}

#[tokio::test]
async fn completion_and_stale_recovery_race_cleanly() {
    let system = TestSystem::spawn().await;
    let reaper = Arc::new(system.reaper());
    let (mut completed, mut recovered) = (0, 0);
    for round in 0..30_i64 {
        let (pool, subjects) = (system.pool.clone(), system.subjects.clone());
        let (scan, claim, completion, sweep) =
            race_with_recovery(&system, &reaper, round, |claim| async move {
                let mut tx = pool.begin().await.unwrap();
                let outcome = tests::complete_attempt(&mut tx, &subjects, &claim)
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
                outcome
            })
            .await;
        let swept = sweep.recovered.retried.contains(&claim.task_id);
        match completion {
            IngestOutcome::Accepted => {
                assert!(!swept, "round {round}: recovery reverted a completion");
                assert_eq!(system.scan_state(&scan.scan_id).await, "completed");
                completed += 1;
            }
            IngestOutcome::Refused(error) => {
                assert_eq!(
                    error.error_code(),
                    Some(ErrorCode::LeaseLost),
                    "round {round}"
                );
                assert_ne!(system.scan_state(&scan.scan_id).await, "completed");
                recovered += 1;
            }
            IngestOutcome::Duplicate => {
                panic!("round {round}: a first completion cannot be a duplicate")
            }
        }
    }
    assert!(
        completed > 0 && recovered > 0,
        "both orders happened: {completed} / {recovered}"
    );
    system.finish().await;
}

#[tokio::test]
async fn two_acquirers_never_lease_one_task_twice() {
    let system = TestSystem::spawn().await;
    for _ in 0..20 {
        let organization_id = system.organization().await;
        let first = system.manual_worker(organization_id, 4).await;
        let second = system.manual_worker(organization_id, 4).await;
        for worker in [&first, &second] {
            assert!(worker.hello(&["alpha"]).await.error.is_none());
        }
        assert!(
            system
                .submit(&system.request(organization_id, "http://one.test", &["alpha"]))
                .await
                .error
                .is_none()
        );
        let barrier = Arc::new(Barrier::new(2));
        let acquire = |worker_id: Uuid| {
            let (pool, subjects, barrier) = (
                system.pool.clone(),
                system.subjects.clone(),
                barrier.clone(),
            );
            async move {
                barrier.wait().await;
                let params = store::lease::AcquireParams {
                    worker_id,
                    request_id: Uuid::new_v4(),
                    max_tasks: 4,
                    lease_ttl: Duration::from_secs(30),
                };
                match store::lease::acquire(
                    &pool,
                    &mut store::Staged::default(),
                    &subjects,
                    &params,
                )
                .await
                .unwrap()
                .0
                {
                    store::lease::AcquireOutcome::Leases(leases) => leases.len(),
                    store::lease::AcquireOutcome::Refused(error) => panic!("{error:?}"),
                }
            }
        };
        let (a, b) = tokio::join!(acquire(first.id), acquire(second.id));
        assert_eq!(a + b, 1, "exactly one lease for one task");
    }
    system.finish().await;
}

#[tokio::test]
async fn retention_prunes_old_transport_history_and_keeps_evidence() {
    let system = TestSystem::spawn().await;
    let scan = system.leased_scan(&["alpha"]).await;
    system.complete_with_findings(&scan, 2).await;
    system.wait_outbox_drained().await;
    // Published rows are removed at once; one that a version before that marked published
    // is left to retention.
    sqlx::query(
        "INSERT INTO outbox (id, subject, payload, published_at) VALUES ($1, 'legacy', '', now())",
    )
    .bind(Uuid::now_v7())
    .execute(&system.pool)
    .await
    .expect("a row marked published");
    sqlx::query(
        "INSERT INTO cve_quarantine (record_key, action, reason, source) \
         VALUES ('sha256:00', 'set_aside', 'unreadable', 'nvd')",
    )
    .execute(&system.pool)
    .await
    .expect("a quarantined record");
    let outbox_rows = || store::testing::count_rows(&system.pool, "outbox");
    let before = system.table_counts().await;
    assert_eq!(outbox_rows().await.unwrap(), 1);
    assert_eq!(before["worker_result_batches"], 1);

    // Nothing is old enough yet.
    let outcome = system.reaper().run_once().await.unwrap();
    assert_eq!(outcome.pruned, store::recover::Pruned::default());

    store::testing::age_history(&system.pool, Duration::from_secs(31 * 24 * 3600))
        .await
        .unwrap();
    let outcome = system.reaper().run_once().await.unwrap();
    assert_eq!(outcome.pruned.outbox, 1);
    assert_eq!(outcome.pruned.batches, 1);
    assert_eq!(outcome.pruned.cve_quarantine, 1, "no longer seen upstream");
    let after = system.table_counts().await;
    assert_eq!(outbox_rows().await.unwrap(), 0);
    assert_eq!(after["worker_result_batches"], 0);
    for kept in [
        "scans",
        "scan_jobs",
        "worker_tasks",
        "worker_task_attempts",
        "findings",
        "assets",
    ] {
        assert_eq!(
            after[kept], before[kept],
            "{kept} is evidence or history and is kept"
        );
    }
    system.finish().await;
}

/// Nothing stranded (SPEC I4): a scan whose plugin no live worker of its organization offers
/// fails with `no_worker` once its task has waited past the pending deadline, and its target
/// is free for a new scan; a scan whose plugin a live worker offers waits on, however long.
#[tokio::test]
async fn a_scan_no_live_worker_can_take_fails_after_the_pending_deadline() {
    const DEADLINE: Duration = Duration::from_millis(500);
    let system = TestSystem::spawn_with(|settings| {
        settings.reaper.pending_deadline = DEADLINE;
    })
    .await;
    let org = system.organization().await;
    let worker = system.manual_worker(org, 1).await;
    assert!(worker.hello(&["alpha"]).await.error.is_none());
    let stranded = system
        .submit(&system.request(org, "http://stranded.test", &["nobody"]))
        .await;
    // The worker never acquires, so neither scan is leased.
    let waiting = system
        .submit(&system.request(org, "http://waiting.test", &["alpha"]))
        .await;
    assert!(stranded.error.is_none() && waiting.error.is_none());

    let early = system.reaper().run_once().await.expect("sweep");
    assert!(
        early.stranded.is_empty(),
        "not before the deadline: {early:?}"
    );
    tokio::time::sleep(DEADLINE * 2).await;
    let outcome = system.reaper().run_once().await.expect("sweep");
    assert_eq!(outcome.stranded.len(), 1, "{outcome:?}");

    assert_eq!(system.scan_state(&stranded.scan_id).await, "failed");
    let (code, reason): (Option<String>, Option<String>) =
        sqlx::query_as("SELECT failure_code, failure_reason FROM scans WHERE id = $1::uuid")
            .bind(&stranded.scan_id)
            .fetch_one(&system.pool)
            .await
            .expect("scan read");
    assert_eq!(code.as_deref(), Some(store::recover::NO_WORKER));
    assert!(reason.unwrap_or_default().contains("nobody"));
    assert_eq!(
        system.scan_state(&waiting.scan_id).await,
        "pending",
        "a live worker offers alpha: the scan waits"
    );
    let again = system
        .submit(&system.request(org, "http://stranded.test", &["nobody"]))
        .await;
    assert!(again.error.is_none(), "the target is free again: {again:?}");
    assert_ne!(again.scan_id, stranded.scan_id);
    system.finish().await;
}
