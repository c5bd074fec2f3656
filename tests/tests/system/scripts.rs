//! The decision scripts that had only system-level tests, driven directly against PostgreSQL:
//! `store::cancel`, `store::revoke` and `store::progress`. Each ends rows in the states
//! `docs/state_machine.md` documents and costs a fixed number of statements whatever the
//! number of rows it moves.

use messages::{EventKind, v1};
use store::admit::AdmitOutcome;
use store::cancel::{self, CancelOutcome, CancelTarget};
use store::progress::{self, CompletedJob, NewScanJob};
use store::revoke::{self, ActiveLeases, RevokeOutcome};
use store::states::{AttemptStatus, EnrichmentJobState, ScanJobState, ScanState, TaskState};
use telemetry::cost::{self, lanes};
use tests::TestSystem;
use uuid::Uuid;

use crate::admit::Requests;
use crate::decide::leased;

/// Runs `work` in `lane`; returns its output and the statements it took (COMMIT included).
async fn counted<T>(lane: &'static str, work: impl Future<Output = T>) -> (T, u64) {
    let before = cost::snapshot();
    let output = cost::in_lane(lane, work).await;
    let spent = cost::spent(&before, &cost::snapshot());
    (output, spent[lane].statements)
}

/// The states of a scan and of its scan jobs, tasks and attempts (each list by id).
#[derive(Debug, PartialEq, Eq)]
struct Rows {
    scan: String,
    jobs: Vec<String>,
    tasks: Vec<String>,
    attempts: Vec<String>,
}

async fn rows(system: &TestSystem, scan_id: Uuid) -> Rows {
    let scan = sqlx::query_scalar("SELECT state FROM scans WHERE id = $1")
        .bind(scan_id)
        .fetch_one(&system.pool)
        .await
        .unwrap();
    let jobs = sqlx::query_scalar("SELECT state FROM scan_jobs WHERE scan_id = $1 ORDER BY id")
        .bind(scan_id)
        .fetch_all(&system.pool)
        .await
        .unwrap();
    let tasks = sqlx::query_scalar("SELECT state FROM worker_tasks WHERE scan_id = $1 ORDER BY id")
        .bind(scan_id)
        .fetch_all(&system.pool)
        .await
        .unwrap();
    let attempts = sqlx::query_scalar(
        "SELECT a.status FROM worker_task_attempts a JOIN worker_tasks t ON t.id = a.task_id
         WHERE t.scan_id = $1 ORDER BY a.id",
    )
    .bind(scan_id)
    .fetch_all(&system.pool)
    .await
    .unwrap();
    Rows {
        scan,
        jobs,
        tasks,
        attempts,
    }
}

/// Events of `kind` written in this test, published or not.
async fn events(system: &TestSystem, kind: EventKind) -> i64 {
    tests::written_payloads(system, kind).await.len() as i64
}

fn texts<const N: usize>(states: [&'static str; N]) -> Vec<String> {
    states.iter().map(|state| (*state).to_owned()).collect()
}

#[tokio::test]
async fn cancel_ends_a_scan_and_its_live_attempt_in_a_fixed_number_of_statements() {
    let system = TestSystem::spawn().await;
    let leased = system.leased_scan(&["alpha", "beta"]).await;
    let leased_scan: Uuid = leased.scan_id.parse().unwrap();
    // A scan nothing leased yet: no attempt to end, yet the same statements.
    let [(pending_scan, pending_task)] =
        admitted(&system, leased.organization_id, 1, &["alpha"]).await[..]
    else {
        panic!("one scan admitted");
    };

    let cancel_now =
        |target| cancel::cancel(&system.pool, &system.subjects, None, target, "on request");
    let (outcome, leased_statements) =
        counted(lanes::DISPATCH, cancel_now(CancelTarget::Scan(leased_scan))).await;
    assert!(
        matches!(outcome.as_ref().unwrap(), CancelOutcome::Cancelled { scan_id, .. } if *scan_id == leased_scan),
        "{outcome:?}"
    );
    // By one of its tasks: one more statement, the task's look-up.
    let (outcome, pending_statements) = counted(
        lanes::DISPATCH,
        cancel_now(CancelTarget::Task(pending_task)),
    )
    .await;
    assert!(
        matches!(outcome.as_ref().unwrap(), CancelOutcome::Cancelled { scan_id, .. } if *scan_id == pending_scan),
        "{outcome:?}"
    );
    // Locks of attempts, tasks and scan; attempts, tasks, scan jobs and scan; the event; COMMIT.
    assert_eq!(
        (leased_statements, pending_statements),
        (9, 10),
        "statements to cancel a leased scan, a pending one by its task"
    );

    // Terminal at once: `cancelling` stays reserved, the worker learns at its next renew.
    let cancelled = ScanState::Cancelled.as_str().to_owned();
    for (scan_id, attempts) in [(leased_scan, 1), (pending_scan, 0)] {
        assert_eq!(
            rows(&system, scan_id).await,
            Rows {
                scan: cancelled.clone(),
                jobs: texts([ScanJobState::Cancelled.as_str()]),
                tasks: texts([TaskState::Cancelled.as_str()]),
                attempts: vec![AttemptStatus::Cancelled.as_str().to_owned(); attempts],
            }
        );
    }
    let (code, requested): (String, bool) = sqlx::query_as(
        "SELECT s.failure_code, t.cancel_requested_at IS NOT NULL
         FROM scans s JOIN worker_tasks t ON t.scan_id = s.id WHERE s.id = $1",
    )
    .bind(leased_scan)
    .fetch_one(&system.pool)
    .await
    .unwrap();
    assert_eq!((code.as_str(), requested), ("cancelled", true));
    assert_eq!(events(&system, EventKind::ScanCancelled).await, 2);
    let renew = leased.worker.renew(&leased.lease).await;
    assert_eq!(
        renew.error.and_then(|error| error.error_code()),
        Some(messages::ErrorCode::CancelRequested)
    );

    // Again, by scan or by task: already ended, nothing written, still a fixed cost.
    let (outcome, again_statements) =
        counted(lanes::DISPATCH, cancel_now(CancelTarget::Scan(leased_scan))).await;
    assert_eq!(
        outcome.unwrap(),
        CancelOutcome::AlreadyTerminal {
            scan_id: leased_scan,
            state: cancelled.clone(),
        }
    );
    // Locks of attempts, tasks and scan; the ROLLBACK of the dropped transaction.
    assert_eq!(again_statements, 4);
    assert_eq!(
        cancel_now(CancelTarget::Task(pending_task)).await.unwrap(),
        CancelOutcome::AlreadyTerminal {
            scan_id: pending_scan,
            state: TaskState::Cancelled.as_str().to_owned(),
        }
    );
    assert_eq!(events(&system, EventKind::ScanCancelled).await, 2);

    for target in [
        CancelTarget::Scan(Uuid::now_v7()),
        CancelTarget::Task(Uuid::now_v7()),
    ] {
        assert_eq!(cancel_now(target).await.unwrap(), CancelOutcome::NotFound);
    }
    system.finish().await;
}

/// Revokes the worker in the dispatch lane: its outcome and the statements it took.
async fn revoke_counted(
    system: &TestSystem,
    worker_id: Uuid,
    active: ActiveLeases,
) -> (Result<RevokeOutcome, store::StoreError>, u64) {
    let change = store::audit::Change::new("test", "revoked");
    let revoke = revoke::revoke_worker(&system.pool, &system.subjects, worker_id, &change, active);
    counted(lanes::DISPATCH, revoke).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoke_voids_every_live_attempt_and_refunds_it_in_a_fixed_number_of_statements() {
    let system = TestSystem::spawn().await;
    let mut counts = Vec::new();
    for size in [1, 10] {
        let (worker, leases) = leased(&system, size).await;
        let (outcome, statements) = revoke_counted(&system, worker.id, ActiveLeases::Cancel).await;
        assert_eq!(
            outcome.unwrap(),
            RevokeOutcome::Revoked {
                leases_cancelled: size
            }
        );
        counts.push((size, statements));
        assert_eq!(
            store::testing::live_attempts_of_worker(&system.pool, worker.id)
                .await
                .unwrap(),
            0
        );
        for lease in &leases {
            let task_id: Uuid = lease.lease.as_ref().unwrap().task_id.parse().unwrap();
            let (state, attempt_count, job_state, attempt_status): (String, i32, String, String) =
                sqlx::query_as(
                    "SELECT t.state, t.attempt_count, j.state, a.status
                     FROM worker_tasks t JOIN scan_jobs j ON j.id = t.scan_job_id
                     JOIN worker_task_attempts a ON a.task_id = t.id
                     WHERE t.id = $1",
                )
                .bind(task_id)
                .fetch_one(&system.pool)
                .await
                .unwrap();
            // Offered again at once, the voided attempt not counted against the budget.
            assert_eq!(
                (
                    state.as_str(),
                    attempt_count,
                    job_state.as_str(),
                    attempt_status.as_str()
                ),
                (
                    TaskState::Pending.as_str(),
                    0,
                    ScanJobState::Pending.as_str(),
                    AttemptStatus::Cancelled.as_str()
                )
            );
        }
    }
    println!("(live attempts, statements to revoke): {counts:?}");
    // The worker; attempts and tasks; the events; COMMIT (a voided lease writes no scan job:
    // its `running` is read from the attempt).
    assert_eq!(counts, [(1, 4), (10, 4)]);
    // One `task.ready` per task at admission, one per voided lease.
    assert_eq!(events(&system, EventKind::TaskReady).await, 2 * (1 + 10));

    // Nothing live: the worker row only, whatever it held before.
    let (worker, _) = leased(&system, 1).await;
    let (outcome, statements) = revoke_counted(&system, worker.id, ActiveLeases::LetFinish).await;
    assert_eq!(
        (outcome.unwrap(), statements),
        (
            RevokeOutcome::Revoked {
                leases_cancelled: 0
            },
            2
        )
    );
    assert_eq!(
        store::testing::live_attempts_of_worker(&system.pool, worker.id)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        revoke::revoke_worker(
            &system.pool,
            &system.subjects,
            Uuid::now_v7(),
            &store::audit::Change::new("test", "unknown"),
            ActiveLeases::Cancel,
        )
        .await
        .unwrap(),
        RevokeOutcome::NotFound
    );
    system.finish().await;
}

/// `count` scans of `plugins` admitted in `organization_id`: (scan id, first task id).
async fn admitted(
    system: &TestSystem,
    organization_id: Uuid,
    count: usize,
    plugins: &[&str],
) -> Vec<(Uuid, Uuid)> {
    let wire: Vec<v1::ScanRequest> = (0..count)
        .map(|index| {
            system.request(
                organization_id,
                &format!("http://admitted-{index}.test"),
                plugins,
            )
        })
        .collect();
    let requests = Requests::new(&wire);
    let mut tx = system.pool.begin().await.unwrap();
    let outcomes = store::admit::decide(
        &mut tx,
        &mut store::Staged::default(),
        &system.subjects,
        &requests.params(),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    outcomes
        .iter()
        .map(|outcome| match outcome {
            AdmitOutcome::Admitted { scan_id, task_id } => (*scan_id, *task_id),
            other => panic!("not admitted: {other:?}"),
        })
        .collect()
}

/// Statements to create the second plugin's jobs, to advance to the third, and to complete.
async fn progress_costs(system: &TestSystem, scans: &[(Uuid, Uuid)]) -> (u64, u64, u64) {
    let (created, create_statements) = counted(lanes::INGESTION, async {
        let mut tx = system.pool.begin().await.unwrap();
        let jobs: Vec<NewScanJob<'_>> = scans
            .iter()
            .map(|(scan_id, organization_id)| NewScanJob {
                scan_id: *scan_id,
                organization_id: *organization_id,
                position: 1,
                plugin: "beta",
                target: "http://progress.test",
                priority: 0,
                execution_deadline_seconds: None,
                max_attempts: 3,
            })
            .collect();
        let task_ids = progress::create_jobs(&mut tx, &jobs).await.unwrap();
        tx.commit().await.unwrap();
        task_ids
    })
    .await;
    assert_eq!(created.len(), scans.len());

    let completed = |position| -> Vec<CompletedJob> {
        scans
            .iter()
            .map(|(scan_id, organization_id)| CompletedJob {
                organization_id: *organization_id,
                scan_id: *scan_id,
                position,
                max_attempts: 3,
            })
            .collect()
    };
    let advance = |jobs: Vec<CompletedJob>| async move {
        let mut tx = system.pool.begin().await.unwrap();
        let events = progress::advance(&mut tx, &system.subjects, &jobs)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        events
    };
    let mut statements = Vec::new();
    // The second plugin's jobs completed: a `task.ready` per scan; the third's: `scan.completed`.
    for (position, kind) in [(1, EventKind::TaskReady), (2, EventKind::ScanCompleted)] {
        let (events, spent) = counted(lanes::INGESTION, advance(completed(position))).await;
        let kinds: Vec<Option<EventKind>> = events.iter().map(|event| event.kind).collect();
        assert_eq!(kinds, vec![Some(kind); scans.len()]);
        statements.push(spent);
    }
    for (scan_id, _) in scans {
        let rows = rows(system, *scan_id).await;
        assert_eq!(rows.scan, ScanState::Completed.as_str());
        assert_eq!(rows.jobs.len(), 3);
        assert_eq!(rows.tasks.len(), 3);
    }
    (create_statements, statements[0], statements[1])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_creates_jobs_and_advances_scans_in_a_fixed_number_of_statements() {
    let system = TestSystem::spawn().await;
    let mut counts = Vec::new();
    for size in [1, 50] {
        let organization_id = system.organization().await;
        let scans: Vec<(Uuid, Uuid)> =
            admitted(&system, organization_id, size, &["alpha", "beta", "gamma"])
                .await
                .into_iter()
                .map(|(scan_id, _)| (scan_id, organization_id))
                .collect();
        counts.push((size, progress_costs(&system, &scans).await));
    }
    println!("(scans, statements to create jobs, to advance, to complete): {counts:?}");
    // create_jobs: one insert and COMMIT; advance: the scans' lock, one write, COMMIT; to
    // complete, also the scans' coverage read for scan.completed (issue 47).
    assert_eq!(counts, [(1, (2, 3, 4)), (50, (2, 3, 4))]);
    // Without CVE findings, every enrichment job is born completed.
    let enrichment: Vec<String> = sqlx::query_scalar("SELECT DISTINCT state FROM enrichment_jobs")
        .fetch_all(&system.pool)
        .await
        .unwrap();
    assert_eq!(enrichment, [EnrichmentJobState::Completed.as_str()]);
    system.finish().await;
}
