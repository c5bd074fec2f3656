//! Who may be granted what (issue 26, "keys and grants"): an acquire grants only tasks of a
//! plugin the worker offers, of an organization it serves, at most as many as it has free
//! slots, highest priority first within an organization, and fairly between organizations
//! (the one with fewer tasks in flight first).

use tests::{ManualWorker, TestSystem};
use uuid::Uuid;

/// Submits a scan of `plugins` for `organization_id` with `priority`; its scan id.
async fn submit(
    system: &TestSystem,
    organization_id: Uuid,
    target: &str,
    plugins: &[&str],
    priority: i32,
) -> String {
    let mut request = system.request(organization_id, target, plugins);
    request.priority = priority;
    let reply = system.submit(&request).await;
    assert!(reply.error.is_none(), "{reply:?}");
    reply.scan_id
}

/// The scans of the leases an acquire was granted, in grant order.
fn scans_of(granted: &messages::v1::AcquireReply) -> Vec<&str> {
    granted
        .leases
        .iter()
        .map(|lease| lease.scan_id.as_str())
        .collect()
}

/// A registered worker of `organization_id` with `capacity` slots that said hello offering
/// `plugins`.
async fn ready_worker(
    system: &TestSystem,
    organization_id: Uuid,
    capacity: u32,
    plugins: &[&str],
) -> ManualWorker {
    let worker = system.manual_worker(organization_id, capacity).await;
    let hello = worker.hello_with_capacity(plugins, capacity).await;
    assert!(hello.error.is_none(), "{hello:?}");
    worker
}

#[tokio::test]
async fn a_worker_is_granted_only_plugins_it_offers() {
    let system = TestSystem::spawn().await;
    let organization_id = system.organization().await;
    let worker = ready_worker(&system, organization_id, 4, &["alpha"]).await;
    submit(&system, organization_id, "http://beta.test", &["beta"], 0).await;
    let nothing = worker.acquire(Uuid::new_v4(), 4, 0).await;
    assert!(
        nothing.error.is_none() && nothing.leases.is_empty(),
        "a plugin the worker does not offer: {nothing:?}"
    );
    let alpha = submit(&system, organization_id, "http://alpha.test", &["alpha"], 0).await;
    let granted = worker.acquire(Uuid::new_v4(), 4, 0).await;
    let scans = scans_of(&granted);
    assert_eq!(scans, [alpha.as_str()], "only the plugin it offers");
    system.finish().await;
}

#[tokio::test]
async fn a_worker_is_never_granted_another_organizations_task() {
    let system = TestSystem::spawn().await;
    let served = system.organization().await;
    let other = system.organization().await;
    let worker = ready_worker(&system, served, 4, &["alpha"]).await;
    submit(&system, other, "http://other.test", &["alpha"], 10).await;
    let nothing = worker.acquire(Uuid::new_v4(), 4, 0).await;
    assert!(
        nothing.error.is_none() && nothing.leases.is_empty(),
        "a task of an organization the worker does not serve: {nothing:?}"
    );
    let own = submit(&system, served, "http://own.test", &["alpha"], 0).await;
    let granted = worker.acquire(Uuid::new_v4(), 4, 0).await;
    assert_eq!(granted.leases.len(), 1, "{granted:?}");
    assert_eq!(
        (
            granted.leases[0].scan_id.as_str(),
            granted.leases[0].organization_id.as_str()
        ),
        (own.as_str(), served.to_string().as_str())
    );
    system.finish().await;
}

#[tokio::test]
async fn an_acquire_is_granted_at_most_the_workers_free_slots() {
    let system = TestSystem::spawn().await;
    let organization_id = system.organization().await;
    let worker = ready_worker(&system, organization_id, 2, &["alpha"]).await;
    for index in 0..5 {
        submit(
            &system,
            organization_id,
            &format!("http://slots-{index}.test"),
            &["alpha"],
            0,
        )
        .await;
    }
    let first = worker.acquire(Uuid::new_v4(), 10, 0).await;
    assert_eq!(first.leases.len(), 2, "capacity 2, asked for 10: {first:?}");
    let full = worker.acquire(Uuid::new_v4(), 10, 0).await;
    assert!(
        full.error.is_none() && full.leases.is_empty(),
        "no free slot while both leases live: {full:?}"
    );
    assert!(worker.complete(&first.leases[0], 0).await.error.is_none());
    let freed = worker.acquire(Uuid::new_v4(), 10, 0).await;
    assert_eq!(freed.leases.len(), 1, "one slot freed: {freed:?}");
    system.finish().await;
}

#[tokio::test]
async fn the_highest_priority_due_task_is_granted_first() {
    let system = TestSystem::spawn().await;
    let organization_id = system.organization().await;
    let worker = ready_worker(&system, organization_id, 1, &["alpha"]).await;
    let low = submit(&system, organization_id, "http://low.test", &["alpha"], 0).await;
    let high = submit(&system, organization_id, "http://high.test", &["alpha"], 10).await;
    let middle = submit(
        &system,
        organization_id,
        "http://middle.test",
        &["alpha"],
        5,
    )
    .await;
    let mut order = Vec::new();
    for _ in 0..3 {
        let lease = worker.acquire_one().await;
        order.push(lease.scan_id.clone());
        assert!(worker.complete(&lease, 0).await.error.is_none());
    }
    assert_eq!(order, [high, middle, low], "by priority, not by age");
    system.finish().await;
}

#[tokio::test]
async fn one_organizations_burst_leaves_anothers_task_leased_within_one_free_slot() {
    let system = TestSystem::spawn().await;
    let bursting = system.organization().await;
    let quiet = system.organization().await;
    // One worker serves both, four slots.
    let worker = ready_worker(&system, bursting, 4, &["alpha"]).await;
    store::admin::assign_worker(
        &system.pool,
        quiet,
        worker.id,
        &store::audit::Change::new("test", ""),
    )
    .await
    .unwrap();
    let mut burst = Vec::new();
    for index in 0..20 {
        burst.push(
            submit(
                &system,
                bursting,
                &format!("http://burst-{index}.test"),
                &["alpha"],
                0,
            )
            .await,
        );
    }
    // The burst takes three slots; the quiet organization's task arrives after all of it.
    let first = worker.acquire(Uuid::new_v4(), 3, 0).await;
    assert_eq!(scans_of(&first), burst[..3], "the burst, oldest first");
    let quiet_scan = submit(&system, quiet, "http://quiet.test", &["alpha"], 0).await;
    // The next free slot goes to the organization with fewer tasks in flight, though every
    // task of the burst is older (before: the burst's fourth task, and the quiet one only after
    // the other sixteen).
    let next = worker.acquire(Uuid::new_v4(), 1, 0).await;
    assert_eq!(scans_of(&next), [quiet_scan.as_str()]);

    // With slots for both, one acquire interleaves them by tasks in flight.
    let second_quiet = submit(&system, quiet, "http://quiet-2.test", &["alpha"], 0).await;
    for lease in first.leases.iter().chain(&next.leases) {
        assert!(worker.complete(lease, 0).await.error.is_none());
    }
    let both = worker.acquire(Uuid::new_v4(), 4, 0).await;
    let granted = scans_of(&both);
    assert_eq!(granted.len(), 4, "{both:?}");
    assert!(granted.contains(&second_quiet.as_str()), "{granted:?}");
    system.finish().await;
}

/// Waits until `count` backends of the test's database wait for a lock.
async fn wait_for_lock_waiters(system: &TestSystem, count: i64) {
    system
        .wait_for("backends waiting for the worker row", || async {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            .fetch_one(&system.pool)
            .await
            .expect("pg_stat_activity");
            (waiting >= count).then_some(())
        })
        .await;
}

/// Holds `worker_id`'s row in a transaction of its own until it is committed.
async fn hold_worker_row(
    system: &TestSystem,
    worker_id: Uuid,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut blocker = system.pool.begin().await.expect("a transaction");
    sqlx::query("SELECT 1 FROM workers WHERE id = $1 FOR UPDATE")
        .bind(worker_id)
        .execute(&mut *blocker)
        .await
        .expect("worker row locked");
    blocker
}

/// An acquire of one lease as dispatch decides it, in a task of its own; the leases granted.
fn spawn_acquire(system: &TestSystem, worker_id: Uuid) -> tokio::task::JoinHandle<usize> {
    let (pool, subjects) = (system.pool.clone(), system.subjects.clone());
    tokio::spawn(async move {
        let params = store::lease::AcquireParams {
            worker_id,
            request_id: Uuid::new_v4(),
            max_tasks: 1,
            lease_ttl: std::time::Duration::from_secs(30),
        };
        match store::lease::acquire(&pool, &mut store::Staged::default(), &subjects, &params)
            .await
            .expect("acquire decided")
            .0
        {
            store::lease::AcquireOutcome::Leases(leases) => leases.len(),
            store::lease::AcquireOutcome::Refused(error) => panic!("{error:?}"),
        }
    })
}

/// A one-slot worker ready to acquire `alpha` and `beta`, with three due scans of `alpha`; its
/// organization.
async fn one_slot_worker_and_three_scans(system: &TestSystem) -> (ManualWorker, Uuid) {
    let organization_id = system.organization().await;
    let worker = ready_worker(system, organization_id, 1, &["alpha", "beta"]).await;
    for index in 0..3 {
        submit(
            system,
            organization_id,
            &format!("http://race-{index}.test"),
            &["alpha"],
            0,
        )
        .await;
    }
    (worker, organization_id)
}

/// Two acquires of one worker with different request ids, both waiting for its row: the
/// second to get it must count the leases the first granted. (It counted with the snapshot it
/// took before waiting, and a one-slot worker held two leases.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_acquires_of_one_worker_never_exceed_its_capacity() {
    let system = TestSystem::spawn().await;
    let (worker, _) = one_slot_worker_and_three_scans(&system).await;
    let blocker = hold_worker_row(&system, worker.id).await;
    let first = spawn_acquire(&system, worker.id);
    wait_for_lock_waiters(&system, 1).await;
    let second = spawn_acquire(&system, worker.id);
    wait_for_lock_waiters(&system, 2).await;
    blocker.commit().await.expect("released");
    let granted = first.await.unwrap() + second.await.unwrap();
    assert_eq!(granted, 1, "a one-slot worker holds one lease");
    system.finish().await;
}

/// The same race between an acquire and a lease handed on with a completion (`lease_next`),
/// which is decided in ingestion's transaction: holding attempts and tasks there, it waits at
/// most `HAND_ON_LOCK_TIMEOUT` for a worker's row another transaction holds (a revocation locks
/// the worker before the attempts it voids, so waiting longer could deadlock). Past it, it
/// hands nothing on to that worker, the completion stands, the task waits for an acquire, and
/// the one-slot worker holds one lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_handed_on_skips_a_worker_an_acquire_holds_and_never_exceeds_its_capacity() {
    let system = TestSystem::spawn().await;
    let organization_id = system.organization().await;
    let worker = ready_worker(&system, organization_id, 1, &["alpha", "beta"]).await;
    // A two-plugin scan: its first task completed frees the slot, and its second is what the
    // completion asks for.
    submit(
        &system,
        organization_id,
        "http://handed.test",
        &["alpha", "beta"],
        0,
    )
    .await;
    let first = worker.acquire_one().await;
    let reference = first.lease.clone().expect("a lease reference");
    let claim = store::LeaseClaim {
        worker_id: worker.id,
        task_id: Uuid::parse_str(&reference.task_id).expect("a task id"),
        attempt_id: Uuid::parse_str(&reference.attempt_id).expect("an attempt id"),
        attempt_number: i32::try_from(reference.attempt_number).expect("a fencing number"),
        lease_token: reference.lease_token.clone(),
    };

    let blocker = hold_worker_row(&system, worker.id).await;
    let acquired = spawn_acquire(&system, worker.id);
    wait_for_lock_waiters(&system, 1).await;
    let messages = [store::ingest::Message::Complete(
        store::ingest::CompleteParams {
            claim: &claim,
            batch_count: 0,
            summary: "done",
            lease_next: true,
        },
    )];
    let script = store::ingest::Ingest {
        subjects: &system.subjects,
        messages: &messages,
        lease_ttl: std::time::Duration::from_secs(30),
    };
    let (decisions, _) = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        store::decide_batch(&system.pool, store::ProgressEvents::On, &script),
    )
    .await
    .expect("the completion waited for the worker's row")
    .expect("the completion decided");
    assert!(
        matches!(
            decisions.outcomes.as_slice(),
            [Ok(store::ingest::IngestOutcome::Accepted)]
        ),
        "{decisions:?}"
    );
    let handed: usize = decisions.leases.values().map(Vec::len).sum();
    assert_eq!(handed, 0, "nothing handed to a worker an acquire holds");
    blocker.commit().await.expect("released");
    // The waiting acquire counted the worker's slot taken (its first statement's snapshot
    // predates the completion); the next plugin waits for the next acquire.
    let granted = acquired.await.unwrap() + spawn_acquire(&system, worker.id).await.unwrap();
    assert_eq!(granted, 1, "an acquire takes the next plugin");
    assert_eq!(
        store::testing::live_attempts_of_worker(&system.pool, worker.id)
            .await
            .expect("counted"),
        1,
        "a one-slot worker holds one lease"
    );
    system.finish().await;
}

/// An organization's cap on tasks in flight holds over every worker serving it, set on the
/// live organization.
#[tokio::test]
async fn an_organizations_cap_on_tasks_in_flight_holds_over_every_worker() {
    let system = TestSystem::spawn().await;
    let organization_id = system.organization().await;
    let one = ready_worker(&system, organization_id, 4, &["alpha"]).await;
    let two = ready_worker(&system, organization_id, 4, &["alpha"]).await;
    for index in 0..6 {
        submit(
            &system,
            organization_id,
            &format!("http://capped-{index}.test"),
            &["alpha"],
            0,
        )
        .await;
    }
    store::admin::set_max_running_tasks(
        &system.pool,
        organization_id,
        Some(2),
        &store::audit::Change::new("test", ""),
    )
    .await
    .unwrap()
    .unwrap();
    let first = one.acquire(Uuid::new_v4(), 4, 0).await;
    assert_eq!(first.leases.len(), 2, "capped at 2: {first:?}");
    let none = two.acquire(Uuid::new_v4(), 4, 0).await;
    assert!(none.error.is_none() && none.leases.is_empty(), "{none:?}");
    assert!(one.complete(&first.leases[0], 0).await.error.is_none());
    let freed = two.acquire(Uuid::new_v4(), 4, 0).await;
    assert_eq!(
        freed.leases.len(),
        1,
        "one slot under the cap freed: {freed:?}"
    );
    // Lifted, the rest is granted.
    store::admin::set_max_running_tasks(
        &system.pool,
        organization_id,
        None,
        &store::audit::Change::new("test", ""),
    )
    .await
    .unwrap()
    .unwrap();
    let rest = two.acquire(Uuid::new_v4(), 4, 0).await;
    assert_eq!(rest.leases.len(), 3, "{rest:?}");
    system.finish().await;
}

/// Two acquires of different workers of one capped organization, both waiting for its row
/// together: the second to get it must count the lease the first granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_acquires_of_two_workers_never_exceed_their_organizations_cap() {
    let system = TestSystem::spawn().await;
    let organization_id = system.organization().await;
    let one = ready_worker(&system, organization_id, 1, &["alpha"]).await;
    let two = ready_worker(&system, organization_id, 1, &["alpha"]).await;
    for index in 0..3 {
        submit(
            &system,
            organization_id,
            &format!("http://cap-race-{index}.test"),
            &["alpha"],
            0,
        )
        .await;
    }
    store::admin::set_max_running_tasks(
        &system.pool,
        organization_id,
        Some(1),
        &store::audit::Change::new("test", ""),
    )
    .await
    .unwrap()
    .unwrap();
    let mut blocker = system.pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM organizations WHERE id = $1 FOR UPDATE")
        .bind(organization_id)
        .execute(&mut *blocker)
        .await
        .unwrap();
    let first = spawn_acquire(&system, one.id);
    let second = spawn_acquire(&system, two.id);
    wait_for_lock_waiters(&system, 2).await;
    blocker.commit().await.unwrap();
    let granted = first.await.unwrap() + second.await.unwrap();
    assert_eq!(granted, 1, "a cap of one: one lease over both workers");
    system.finish().await;
}

/// A due task whose attempts are spent is never granted (the grant checks the budget; today's
/// leased it, past `max_attempts`), and the reaper fails it with its scan once the pending
/// deadline passed, although a live worker offers its plugin: no worker can take it.
#[tokio::test]
async fn a_task_whose_attempts_are_spent_is_never_granted_and_the_reaper_fails_it() {
    const DEADLINE: std::time::Duration = std::time::Duration::from_millis(300);
    let system = TestSystem::spawn_with(|settings| {
        settings.reaper.pending_deadline = DEADLINE;
    })
    .await;
    let organization_id = system.organization().await;
    let worker = ready_worker(&system, organization_id, 4, &["alpha"]).await;
    let spent = submit(&system, organization_id, "http://spent.test", &["alpha"], 0).await;
    sqlx::query(
        "UPDATE worker_tasks SET attempt_count = max_attempts, last_attempt_number = max_attempts \
         WHERE scan_id = $1::uuid",
    )
    .bind(&spent)
    .execute(&system.pool)
    .await
    .expect("budget spent");
    let fresh = submit(&system, organization_id, "http://fresh.test", &["alpha"], 0).await;
    let granted = worker.acquire(Uuid::new_v4(), 4, 0).await;
    let scans = scans_of(&granted);
    assert_eq!(scans, [fresh.as_str()], "{granted:?}");

    let outcome = system
        .wait_for(
            "the reaper to fail the spent task past the deadline",
            || async {
                let outcome = system.reaper().run_once().await.expect("sweep");
                (!outcome.stranded.is_empty()).then_some(outcome)
            },
        )
        .await;
    assert_eq!(outcome.stranded.len(), 1, "{outcome:?}");
    assert_eq!(system.scan_state(&spent).await, "failed");
    assert_eq!(system.scan_state(&fresh).await, "running");
    system.finish().await;
}
