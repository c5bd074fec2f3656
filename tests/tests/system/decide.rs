//! The ingestion decision script (`store::ingest`) driven directly against PostgreSQL: what a
//! batch costs in statements whatever its size, and each message of a mixed batch getting its
//! own answer; the reaper's recovery and deadline sweeps, whose cost does not grow with the
//! rows they fail either; a worker's renewals, one statement for any number of leases; and an
//! enrichment pass, three statements for any number of jobs; an acquire, the same statements for
//! one lease or fifty, reading about as many tasks as it grants whatever the backlog.

use messages::{ErrorCode, EventKind, v1};
use prost::Message as _;
use store::LeaseClaim;
use store::ingest::{self, CompleteParams, Message};
use store::ingest::{BatchParams, FailParams, IngestOutcome};
use store::lease::{RenewClaims, RenewOutcome};
use telemetry::cost::{self, lanes};
use tests::{ManualWorker, TestSystem, findings_payload};
use uuid::Uuid;

const PLUGIN: &str = "synthetic";

/// `count` one-plugin scans of one organization, each leased once by one manual worker.
pub(crate) async fn leased(system: &TestSystem, count: usize) -> (ManualWorker, Vec<v1::Lease>) {
    let worker = pending(system, count).await;
    let mut leases = Vec::with_capacity(count);
    while leases.len() < count {
        let reply = worker
            .acquire(Uuid::new_v4(), (count - leases.len()) as u32, 5_000)
            .await;
        assert!(reply.error.is_none(), "{reply:?}");
        leases.extend(reply.leases);
    }
    (worker, leases)
}

/// `count` admitted one-plugin scans of one organization, none leased yet, and a manual worker
/// that may take them all.
async fn pending(system: &TestSystem, count: usize) -> ManualWorker {
    let organization_id = system.organization().await;
    let worker = system
        .manual_worker(organization_id, count as u32 + 1)
        .await;
    let hello = worker
        .hello_with_capacity(&[PLUGIN], count as u32 + 1)
        .await;
    assert!(hello.error.is_none(), "{hello:?}");
    let client = system.client();
    for index in 0..count {
        let request = system.request(
            organization_id,
            &format!("http://target-{index}.test"),
            &[PLUGIN],
        );
        let reply = client.submit(&request).await.expect("admission answers");
        assert!(reply.error.is_none(), "{reply:?}");
    }
    worker
}

fn claim(worker: &ManualWorker, lease: &v1::Lease) -> LeaseClaim {
    LeaseClaim::from_wire(worker.id, lease.lease.as_ref()).expect("a valid lease reference")
}

/// A result batch as ingestion hands it to the store, owning what the params borrow.
struct Batch {
    claim: LeaseClaim,
    sequence_number: i32,
    key: String,
    checksum: String,
    payload: v1::BatchPayload,
}

impl Batch {
    fn new(claim: LeaseClaim, sequence_number: i32, payload: v1::BatchPayload) -> Self {
        Self {
            key: format!("{}:{sequence_number}", claim.attempt_id),
            checksum: messages::sha256_hex(&payload.encode_to_vec()),
            claim,
            sequence_number,
            payload,
        }
    }

    fn message(&self) -> Message<'_> {
        Message::Result(BatchParams {
            claim: &self.claim,
            sequence_number: self.sequence_number,
            idempotency_key: &self.key,
            payload_sha256: &self.checksum,
            findings: &self.payload.findings,
            assets: &self.payload.assets,
            evaluations: &self.payload.evaluations,
        })
    }
}

fn completion(claim: &LeaseClaim, batch_count: i32) -> Message<'_> {
    Message::Complete(CompleteParams {
        claim,
        batch_count,
        summary: "done",
        lease_next: false,
    })
}

/// Decides `messages` in one transaction in the ingestion lane; returns the outcomes and the
/// statements it took (BEGIN and COMMIT included).
async fn decide(
    system: &TestSystem,
    messages: &[Message<'_>],
) -> (Vec<Result<IngestOutcome, store::StoreError>>, u64) {
    let before = cost::snapshot();
    let outcomes = cost::in_lane(lanes::INGESTION, async {
        let mut tx = system.pool.begin().await.expect("begin");
        let outcomes = ingest::decide(
            &mut tx,
            &mut store::Staged::default(),
            &system.subjects,
            messages,
        )
        .await
        .expect("the batch is decided")
        .outcomes;
        tx.commit().await.expect("commit");
        outcomes
    })
    .await;
    let spent = cost::spent(&before, &cost::snapshot());
    (outcomes, spent[lanes::INGESTION].statements)
}

/// Decides `messages` one at a time (`ingest::decide_each`, the fallback) in one transaction.
async fn decide_each(
    system: &TestSystem,
    messages: &[Message<'_>],
) -> Vec<Result<IngestOutcome, store::StoreError>> {
    let mut tx = system.pool.begin().await.expect("begin");
    let outcomes = ingest::decide_each(
        &mut tx,
        &mut store::Staged::default(),
        &system.subjects,
        messages,
    )
    .await
    .expect("decided one by one")
    .outcomes;
    tx.commit().await.expect("commit");
    outcomes
}

fn code(outcome: &Result<IngestOutcome, store::StoreError>) -> Option<ErrorCode> {
    match outcome {
        Ok(IngestOutcome::Refused(error)) => error.error_code(),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_per_batch_do_not_grow_with_the_batch() {
    let system = TestSystem::spawn().await;
    let mut counts = Vec::new();
    for size in [10, 100] {
        let (worker, leases) = leased(&system, size).await;
        let batches: Vec<Batch> = leases
            .iter()
            .map(|lease| Batch::new(claim(&worker, lease), 0, findings_payload(2)))
            .collect();
        let claims: Vec<LeaseClaim> = leases.iter().map(|lease| claim(&worker, lease)).collect();

        // The results of every task in one batch, then their completions in another.
        let results: Vec<Message<'_>> = batches.iter().map(Batch::message).collect();
        let (outcomes, result_statements) = decide(&system, &results).await;
        assert!(
            outcomes
                .iter()
                .all(|outcome| matches!(outcome, Ok(IngestOutcome::Accepted))),
            "{outcomes:?}"
        );
        let completions: Vec<Message<'_>> =
            claims.iter().map(|claim| completion(claim, 1)).collect();
        let (outcomes, completion_statements) = decide(&system, &completions).await;
        assert!(
            outcomes
                .iter()
                .all(|outcome| matches!(outcome, Ok(IngestOutcome::Accepted))),
            "{outcomes:?}"
        );

        // Both in one batch (a result and its task's completion), as one fetch often holds.
        let (worker, leases) = leased(&system, size).await;
        let batches: Vec<Batch> = leases
            .iter()
            .map(|lease| Batch::new(claim(&worker, lease), 0, findings_payload(2)))
            .collect();
        let claims: Vec<LeaseClaim> = leases.iter().map(|lease| claim(&worker, lease)).collect();
        let mixed: Vec<Message<'_>> = batches
            .iter()
            .zip(&claims)
            .flat_map(|(batch, claim)| [batch.message(), completion(claim, 1)])
            .collect();
        let (outcomes, mixed_statements) = decide(&system, &mixed).await;
        assert!(
            outcomes
                .iter()
                .all(|outcome| matches!(outcome, Ok(IngestOutcome::Accepted))),
            "{outcomes:?}"
        );

        // Failures, all of one kind (a plugin timing out everywhere): retried or failed together.
        let (worker, leases) = leased(&system, size).await;
        let claims: Vec<LeaseClaim> = leases.iter().map(|lease| claim(&worker, lease)).collect();
        let failures: Vec<Message<'_>> = claims
            .iter()
            .map(|claim| {
                Message::Fail(FailParams {
                    claim,
                    error_code: "plugin_timeout",
                    error_message: "the plugin ran out of time",
                    retryable: true,
                    retry: store::RetryPolicy::default(),
                })
            })
            .collect();
        let (outcomes, failure_statements) = decide(&system, &failures).await;
        assert!(
            outcomes
                .iter()
                .all(|outcome| matches!(outcome, Ok(IngestOutcome::Accepted))),
            "{outcomes:?}"
        );
        counts.push((
            size,
            result_statements,
            completion_statements,
            mixed_statements,
            failure_statements,
        ));
    }
    println!("(batch size, statements for results, completions, both, failures): {counts:?}");
    let (_, results_10, completions_10, mixed_10, failures_10) = counts[0];
    let (_, results_100, completions_100, mixed_100, failures_100) = counts[1];
    assert_eq!(
        (results_10, completions_10, mixed_10, failures_10),
        (results_100, completions_100, mixed_100, failures_100),
        "statements per batch grew with the batch: {counts:?}"
    );
    // BEGIN, lock, the attempts, the tasks (retried: no scan moves), outbox, COMMIT.
    assert!(failures_100 <= 6, "failures: {failures_100} statements");
    // BEGIN, lock, batches, assets, findings, evaluations (the payload carries some: issue
    // 47), attempt/task update, COMMIT (the replays read is skipped: no key was taken).
    assert!(results_100 <= 8, "results: {results_100} statements");
    // Of BEGIN, lock, count, finish, lock scans, complete scans, their coverage for
    // scan.completed, outbox and COMMIT, each skipped when it has nothing to do.
    assert!(
        completions_100 <= 8,
        "completions: {completions_100} statements"
    );
    assert!(mixed_100 <= 13, "mixed: {mixed_100} statements");

    let completed: i64 = sqlx::query_scalar("SELECT count(*) FROM scans WHERE state = 'completed'")
        .fetch_one(&system.pool)
        .await
        .expect("count");
    assert_eq!(completed, 2 * (10 + 100));
    system.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_batch_gives_each_message_its_own_answer() {
    let system = TestSystem::spawn().await;
    mixed_batch(&system, Decider::Together).await;
    system.finish().await;
}

/// The fallback runs the same code on one message at a time: the same answers, the same rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_batch_decided_one_at_a_time_gets_the_same_answers() {
    let system = TestSystem::spawn().await;
    mixed_batch(&system, Decider::OneAtATime).await;
    system.finish().await;
}

enum Decider {
    /// `ingest::decide`, the whole batch in one transaction.
    Together,
    /// `ingest::decide_each`, each message in a savepoint of its own.
    OneAtATime,
}

/// A batch with every kind of answer, decided by `decider`: each message gets the answer it
/// would get alone after the messages before it, and what is written is what the accepted
/// messages carry.
async fn mixed_batch(system: &TestSystem, decider: Decider) {
    let (worker, leases) = leased(system, 6).await;
    let claims: Vec<LeaseClaim> = leases.iter().map(|lease| claim(&worker, lease)).collect();

    // Accepted earlier: batch 0 of task 1, so that this batch can replay and conflict with it.
    let earlier = Batch::new(claims[1].clone(), 0, findings_payload(1));
    let (outcomes, _) = decide(system, &[earlier.message()]).await;
    assert!(matches!(outcomes[0], Ok(IngestOutcome::Accepted)));

    let good = Batch::new(claims[0].clone(), 0, findings_payload(3));
    let replay = Batch::new(claims[1].clone(), 0, findings_payload(1));
    let mut other_checksum = Batch::new(claims[1].clone(), 0, findings_payload(2));
    other_checksum.key = earlier.key.clone();
    let mut sequence_taken = Batch::new(claims[1].clone(), 0, findings_payload(2));
    sequence_taken.key = "another-key".into();
    let mut forged = claims[2].clone();
    forged.lease_token = "not-the-token".into();
    let fenced_out = Batch::new(forged.clone(), 0, findings_payload(1));
    let only_first = Batch::new(claims[3].clone(), 0, findings_payload(1));
    let twice = Batch::new(claims[4].clone(), 0, findings_payload(1));
    let failure = FailParams {
        claim: &claims[5],
        error_code: "plugin_error",
        error_message: "it broke",
        retryable: false,
        retry: store::RetryPolicy::default(),
    };
    let messages = [
        good.message(),                 // 0 accepted
        completion(&claims[0], 1),      // 1 accepted: completes the scan
        replay.message(),               // 2 duplicate
        other_checksum.message(),       // 3 batch_conflict (same key, other checksum)
        sequence_taken.message(),       // 4 batch_conflict (sequence used under another key)
        fenced_out.message(),           // 5 lease_lost (wrong token)
        completion(&forged, 0),         // 6 lease_lost
        only_first.message(),           // 7 accepted
        completion(&claims[3], 2),      // 8 batch_missing [1]
        twice.message(),                // 9 accepted
        twice.message(),                // 10 duplicate (same batch, same key)
        completion(&claims[4], 1),      // 11 accepted
        completion(&claims[4], 1),      // 12 duplicate (after its completion: one by one)
        twice.message(),                // 13 duplicate (a replay after completion)
        Message::Fail(failure.clone()), // 14 accepted: fails the scan
        completion(&claims[5], 0),      // 15 lease_lost (after the failure)
        completion(&claims[0], 1),      // 16 duplicate
        Message::Fail(failure),         // 17 duplicate (the failure again)
    ];
    let outcomes = match decider {
        Decider::Together => decide(system, &messages).await.0,
        Decider::OneAtATime => decide_each(system, &messages).await,
    };
    let answers: Vec<String> = outcomes
        .iter()
        .map(|outcome| match outcome {
            Ok(IngestOutcome::Accepted) => "accepted".to_owned(),
            Ok(IngestOutcome::Duplicate) => "duplicate".to_owned(),
            Ok(IngestOutcome::Refused(error)) => error.code.clone(),
            Err(error) => format!("error: {error}"),
        })
        .collect();
    assert_eq!(
        answers,
        [
            "accepted",
            "accepted",
            "duplicate",
            "batch_conflict",
            "batch_conflict",
            "lease_lost",
            "lease_lost",
            "accepted",
            "batch_missing",
            "accepted",
            "duplicate",
            "accepted",
            "duplicate",
            "duplicate",
            "accepted",
            "lease_lost",
            "duplicate",
            "duplicate",
        ]
    );
    let Ok(IngestOutcome::Refused(missing)) = &outcomes[8] else {
        unreachable!()
    };
    assert_eq!(missing.missing_sequence_numbers, [1]);
    assert_eq!(code(&outcomes[5]), Some(ErrorCode::LeaseLost));

    // What was written is exactly what the accepted messages carry.
    let mut findings: Vec<(String, i64)> = Vec::new();
    for claim in &claims {
        let (scan_id, count): (Uuid, i64) = sqlx::query_as(
            "SELECT t.scan_id, (SELECT count(*) FROM findings f WHERE f.scan_id = t.scan_id) \
             FROM worker_tasks t WHERE t.id = $1",
        )
        .bind(claim.task_id)
        .fetch_one(&system.pool)
        .await
        .expect("the task's scan");
        findings.push((system.scan_state(&scan_id.to_string()).await, count));
    }
    assert_eq!(
        findings,
        [
            ("completed".to_owned(), 3),
            ("running".to_owned(), 1),
            ("running".to_owned(), 0),
            ("running".to_owned(), 1),
            ("completed".to_owned(), 1),
            ("failed".to_owned(), 0),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_the_schema_refuses_fails_alone_when_decided_one_by_one() {
    let system = TestSystem::spawn().await;
    let (worker, leases) = leased(&system, 3).await;
    let claims: Vec<LeaseClaim> = leases.iter().map(|lease| claim(&worker, lease)).collect();
    let good = Batch::new(claims[0].clone(), 0, findings_payload(1));
    let mut payload = findings_payload(1);
    // Past the schema's limit: parsing refuses it on the wire; here it reaches the store.
    payload.assets[0].kind = "k".repeat(65);
    let bad = Batch::new(claims[1].clone(), 0, payload);
    let also_good = Batch::new(claims[2].clone(), 0, findings_payload(1));
    let messages = [good.message(), bad.message(), also_good.message()];

    let mut tx = system.pool.begin().await.expect("begin");
    let error = ingest::decide(
        &mut tx,
        &mut store::Staged::default(),
        &system.subjects,
        &messages,
    )
    .await
    .expect_err("the set-wise asset statement is refused");
    assert!(!error.is_transient(), "{error}");
    tx.rollback().await.expect("rollback");

    let outcomes = decide_each(&system, &messages).await;
    assert!(matches!(outcomes[0], Ok(IngestOutcome::Accepted)));
    assert!(outcomes[1].is_err(), "{:?}", outcomes[1]);
    assert!(matches!(outcomes[2], Ok(IngestOutcome::Accepted)));
    let batches: i64 = sqlx::query_scalar("SELECT count(*) FROM worker_result_batches")
        .fetch_one(&system.pool)
        .await
        .expect("count");
    assert_eq!(batches, 2);
    system.finish().await;
}

/// Dispatch statements spent while `work` runs.
async fn dispatch_statements<T>(work: impl std::future::Future<Output = T>) -> (T, u64) {
    let before = cost::snapshot();
    let output = work.await;
    let spent = cost::spent(&before, &cost::snapshot());
    (output, spent[lanes::DISPATCH].statements)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_task_wakes_one_waiting_acquire_not_all() {
    // No polling during the test: only wake-ups make a waiting acquire look again.
    let system = TestSystem::spawn_with(|settings| {
        settings.dispatch.acquire_poll = std::time::Duration::from_secs(60);
    })
    .await;
    let organization_id = system.organization().await;
    let mut workers = Vec::new();
    for _ in 0..4 {
        let worker = system.manual_worker(organization_id, 1).await;
        assert!(worker.hello(&[PLUGIN]).await.error.is_none());
        workers.push(std::sync::Arc::new(worker));
    }
    // What one empty acquire round costs (nothing is due).
    let (reply, empty_round) = dispatch_statements(workers[0].acquire(Uuid::new_v4(), 1, 0)).await;
    assert!(
        reply.leases.is_empty() && reply.error.is_none(),
        "{reply:?}"
    );

    // Four long-polls, each started after the one before it had its first (empty) round:
    // alone, each round is decided on its own.
    let (leased, mut leases) = tokio::sync::mpsc::unbounded_channel();
    for worker in &workers {
        let before = cost::snapshot();
        let worker = worker.clone();
        let leased = leased.clone();
        tokio::spawn(async move {
            let reply = worker.acquire(Uuid::new_v4(), 1, 20_000).await;
            let _ = leased.send(reply);
        });
        system
            .wait_for("the acquire waiting", || async {
                let spent = cost::spent(&before, &cost::snapshot());
                (spent[lanes::DISPATCH].statements >= empty_round).then_some(())
            })
            .await;
    }

    let ((), woken) = dispatch_statements(async {
        let reply = system
            .submit(&system.request(organization_id, "http://one.test", &[PLUGIN]))
            .await;
        assert!(reply.error.is_none(), "{reply:?}");
        let reply = tokio::time::timeout(std::time::Duration::from_secs(10), leases.recv())
            .await
            .expect("one waiting acquire was granted the task")
            .expect("reply");
        assert_eq!(reply.leases.len(), 1, "{reply:?}");
    })
    .await;
    // One granting round (the empty round plus the event), not one round per waiter.
    println!("empty round {empty_round} statements; the ready task cost {woken}");
    assert!(
        woken < 2 * empty_round,
        "a ready task woke more than one waiting acquire: {woken} statements, {empty_round} per round"
    );
    system.finish().await;
}

/// Task ids of `leases`.
fn task_ids(leases: &[v1::Lease]) -> Vec<Uuid> {
    leases
        .iter()
        .map(|lease| Uuid::parse_str(&lease.lease.as_ref().expect("lease").task_id).expect("id"))
        .collect()
}

/// One reaper sweep; the statements its recovery and deadline steps spent.
async fn sweep(reaper: &reaper::Service) -> (reaper::SweepOutcome, u64, u64) {
    let before = cost::snapshot();
    let outcome = reaper.run_once().await.expect("reaper sweep");
    let spent = cost::spent(&before, &cost::snapshot());
    (
        outcome,
        spent[lanes::REAPER_RECOVERY].statements,
        spent[lanes::REAPER_DEADLINES].statements,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reaper_sweeps_cost_the_same_for_10_and_100_rows() {
    let system = TestSystem::spawn().await;
    let reaper = system.reaper();
    let mut counts = Vec::new();
    for size in [10_usize, 100] {
        // Expired leases: every other task spent its budget (fails with its scan), the rest
        // go back to the queue.
        let (_worker, leases) = leased(&system, size).await;
        let tasks = task_ids(&leases);
        let spent: Vec<Uuid> = tasks.iter().step_by(2).copied().collect();
        sqlx::query("UPDATE worker_tasks SET max_attempts = attempt_count WHERE id = ANY($1)")
            .bind(&spent)
            .execute(&system.pool)
            .await
            .expect("spend the budget");
        sqlx::query(
            "UPDATE worker_task_attempts SET lease_expires_at = now() - interval '1 second' \
             WHERE task_id = ANY($1) AND status IN ('leased', 'running')",
        )
        .bind(&tasks)
        .execute(&system.pool)
        .await
        .expect("expire the leases");
        let (outcome, recovery, _) = sweep(&reaper).await;
        let mut failed = outcome.recovered.failed.clone();
        failed.sort_unstable();
        let mut expected = spent.clone();
        expected.sort_unstable();
        assert_eq!(failed, expected);
        assert_eq!(outcome.recovered.retried.len(), size - spent.len());

        // Overdue attempts (live leases, started long before their deadline): all fail.
        let (_worker, leases) = leased(&system, size).await;
        let tasks = task_ids(&leases);
        sqlx::query("UPDATE worker_tasks SET execution_deadline_seconds = 60 WHERE id = ANY($1)")
            .bind(&tasks)
            .execute(&system.pool)
            .await
            .expect("set deadlines");
        sqlx::query(
            "UPDATE worker_task_attempts SET started_at = now() - interval '1 hour' \
             WHERE task_id = ANY($1) AND status IN ('leased', 'running')",
        )
        .bind(&tasks)
        .execute(&system.pool)
        .await
        .expect("start the attempts long ago");
        let (outcome, _, deadlines) = sweep(&reaper).await;
        assert_eq!(outcome.overdue.len(), size);
        counts.push((size, recovery, deadlines));
    }
    println!("(rows, statements for stale recovery, for deadlines): {counts:?}");
    let (_, recovery_10, deadlines_10) = counts[0];
    let (_, recovery_100, deadlines_100) = counts[1];
    assert_eq!(
        (recovery_10, deadlines_10),
        (recovery_100, deadlines_100),
        "statements per sweep step grew with its rows: {counts:?}"
    );
    // Claim and end the attempts, fail the tasks, scan jobs and scans, outbox, COMMIT.
    assert!(recovery_100 <= 4, "recovery: {recovery_100} statements");
    assert!(deadlines_100 <= 4, "deadlines: {deadlines_100} statements");

    // The events are today's: a task.failed per task (will_retry for the retried ones) and
    // a scan.failed per failed scan.
    let payloads = tests::written_payloads(&system, EventKind::TaskFailed).await;
    let will_retry = payloads
        .iter()
        .filter(|payload| {
            v1::TaskFailed::decode(payload.as_slice())
                .expect("a task.failed")
                .will_retry
        })
        .count();
    assert_eq!((payloads.len(), will_retry), (2 * 110, 55));
    let scan_failed = tests::written_payloads(&system, EventKind::ScanFailed)
        .await
        .len() as i64;
    let failed_scans: i64 = sqlx::query_scalar("SELECT count(*) FROM scans WHERE state = 'failed'")
        .fetch_one(&system.pool)
        .await
        .expect("failed scans");
    assert_eq!((scan_failed, failed_scans), (55 + 110, 55 + 110));
    system.finish().await;
}

/// The wire reference of `lease`, as a worker would present it.
fn lease_ref(lease: &v1::Lease) -> v1::LeaseRef {
    lease.lease.clone().expect("a lease reference")
}

/// Renews `refs` (the first as `lease`, the rest as `more_leases`) the way dispatch does, in
/// the dispatch lane; returns each lease's answer and the statements it took.
async fn renew_many(
    system: &TestSystem,
    worker: &ManualWorker,
    refs: &[v1::LeaseRef],
) -> (Vec<String>, u64) {
    let claims = RenewClaims::from_wire(worker.id, refs.first(), &refs[1..]).expect("valid leases");
    let (outcomes, statements) = dispatch_statements(cost::in_lane(
        lanes::DISPATCH,
        store::lease::renew_many(&system.pool, &claims, std::time::Duration::from_secs(30)),
    ))
    .await;
    let answers = outcomes
        .expect("renewed")
        .into_iter()
        .map(|outcome| match outcome {
            RenewOutcome::Renewed {
                lease_expires_in_ms,
            } => {
                assert!(
                    (29_000..=30_000).contains(&lease_expires_in_ms),
                    "{lease_expires_in_ms}"
                );
                "renewed".to_owned()
            }
            RenewOutcome::Refused(error) => error.code,
        })
        .collect();
    (answers, statements)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewing_a_worker_s_leases_is_one_statement_with_an_answer_per_lease() {
    let system = TestSystem::spawn().await;
    let (small_worker, small) = leased(&system, 10).await;
    let refs: Vec<v1::LeaseRef> = small.iter().map(lease_ref).collect();
    let (answers, statements_10) = renew_many(&system, &small_worker, &refs).await;
    assert!(
        answers.iter().all(|answer| answer == "renewed"),
        "{answers:?}"
    );

    // 100 leases of one worker; by index modulo 5: live, live, expired by the database clock,
    // presented with a wrong token, their task cancelled.
    let (worker, leases) = leased(&system, 100).await;
    let mut refs: Vec<v1::LeaseRef> = leases.iter().map(lease_ref).collect();
    let mut expected = Vec::new();
    for (index, lease) in refs.iter_mut().enumerate() {
        let task_id = Uuid::parse_str(&lease.task_id).expect("task id");
        expected.push(match index % 5 {
            2 => {
                store::testing::expire_live_attempt(&system.pool, task_id)
                    .await
                    .expect("expired");
                "lease_lost"
            }
            3 => {
                lease.lease_token = "not-the-token".into();
                "lease_lost"
            }
            4 => {
                system.cancel_task(task_id).await;
                "cancel_requested"
            }
            _ => "renewed",
        });
    }
    // A cancelled task is answered cancel_requested whatever the rest of the reference says;
    // a reference to no attempt of its task is lease_lost.
    refs[9].lease_token = "forged".into();
    refs[10].task_id = refs[11].task_id.clone();
    expected[10] = "lease_lost";
    let (answers, statements_100) = renew_many(&system, &worker, &refs).await;
    assert_eq!(answers, expected);
    println!("renewing 10 leases: {statements_10} statements; 100: {statements_100}");
    assert_eq!(
        (statements_10, statements_100),
        (1, 1),
        "a batch of renewals is one statement whatever its size"
    );

    // Only the renewed attempts and their tasks moved to running; nothing else was revived.
    for (index, lease) in refs.iter().enumerate() {
        let attempt_id =
            Uuid::parse_str(&leases[index].lease.as_ref().unwrap().attempt_id).expect("attempt id");
        let renewed = store::testing::attempt_renewed(&system.pool, attempt_id)
            .await
            .expect("attempt");
        let status = store::testing::attempt_status(&system.pool, attempt_id)
            .await
            .expect("attempt");
        let task_state: String = sqlx::query_scalar(
            "SELECT t.state FROM worker_task_attempts a JOIN worker_tasks t ON t.id = a.task_id \
             WHERE a.id = $1",
        )
        .bind(attempt_id)
        .fetch_one(&system.pool)
        .await
        .expect("task");
        let expected_rows = match expected[index] {
            "renewed" => (true, "running", "running"),
            "cancel_requested" => (false, "cancelled", "cancelled"),
            _ => (false, "leased", "leased"),
        };
        assert_eq!(
            (renewed, status.as_str(), task_state.as_str()),
            expected_rows,
            "lease {index} ({}) answered {}",
            lease.attempt_id,
            expected[index]
        );
    }

    // The single renew goes through the same statement and answers as it always did.
    let single = claim(&worker, &leases[0]);
    let (outcome, statements) = dispatch_statements(cost::in_lane(
        lanes::DISPATCH,
        store::lease::renew(&system.pool, &single, std::time::Duration::from_secs(30)),
    ))
    .await;
    assert!(
        matches!(outcome, Ok(RenewOutcome::Renewed { .. })),
        "{outcome:?}"
    );
    assert_eq!(statements, 1);
    let cancelled = claim(&worker, &leases[4]);
    let outcome = store::lease::renew(&system.pool, &cancelled, std::time::Duration::from_secs(30))
        .await
        .expect("answered");
    assert!(
        matches!(&outcome, RenewOutcome::Refused(error) if error.error_code() == Some(ErrorCode::CancelRequested)),
        "{outcome:?}"
    );
    system.finish().await;
}

/// One enrichment pass over `jobs` due jobs (history scans set back to pending, the first
/// with a CVE to find): the jobs completed and the statements the pass took.
async fn enrichment_pass(jobs: usize) -> (i64, u64, Vec<String>) {
    let system = TestSystem::spawn().await;
    let organization_id = system.organization().await;
    let worker_id = system.registered_worker(organization_id, 1).await;
    store::history::seed(&system.pool, organization_id, worker_id, jobs, |_| {})
        .await
        .expect("history");
    let first_scan: Uuid = sqlx::query_scalar(
        "WITH due AS (UPDATE enrichment_jobs SET state = 'pending', finished_at = NULL RETURNING scan_id)
         SELECT min(scan_id::text)::uuid FROM due",
    )
    .fetch_one(&system.pool)
    .await
    .expect("jobs due again");
    sqlx::query("UPDATE findings SET cve_ids = '{CVE-2021-44228}' WHERE scan_id = $1")
        .bind(first_scan)
        .execute(&system.pool)
        .await
        .expect("a CVE to find");
    let mut settings = system.settings.enrichment.clone();
    settings.http_addr = None;
    settings.concurrency = 64;
    let enrichment = enrichment::Service::from_connections(
        settings,
        runtime::Connections {
            pool: system.pool.clone(),
            bus: system.bus.clone(),
        },
    )
    .expect("an enrichment service");
    let before = cost::snapshot();
    let worked = cost::in_lane(lanes::ENRICHMENT, enrichment.run_once())
        .await
        .expect("an enrichment pass");
    let statements = cost::spent(&before, &cost::snapshot())[lanes::ENRICHMENT].statements;
    assert_eq!(worked.len(), jobs, "every due job claimed in one pass");
    let completed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM enrichment_jobs WHERE state = 'completed'")
            .fetch_one(&system.pool)
            .await
            .expect("count");
    let found: Vec<String> = sqlx::query_scalar(
        "SELECT jsonb_array_elements_text(checkpoint->'cve_ids') FROM enrichment_jobs WHERE scan_id = $1",
    )
    .bind(first_scan)
    .fetch_all(&system.pool)
    .await
    .expect("checkpoint");
    system.finish().await;
    (completed, statements, found)
}

#[tokio::test]
async fn enrichment_claims_a_batch_in_two_statements_and_completes_each_job_in_three() {
    let mut counted = Vec::new();
    for jobs in [3, 50] {
        let (completed, statements, found) = enrichment_pass(jobs).await;
        assert_eq!(
            completed, jobs as i64,
            "every due job completed in one pass"
        );
        assert_eq!(found, ["CVE-2021-44228"]);
        counted.push(statements);
    }
    // Per pass: the claim and the CVE look-up; per job: its completing transaction (three);
    // for the job with a CVE, two more: the local table's misses and the findings' write.
    assert_eq!(
        counted,
        [2 + 3 * 3 + 2, 2 + 50 * 3 + 2],
        "statements for 3 and 50 jobs"
    );
}

/// A worker that asks again with the same request id while its first ask is being granted (a
/// dispatch replica fell silent) is granted once: the two acquires take turns on the worker's
/// row, and the second grants nothing under a request id that has attempts.
#[tokio::test]
async fn the_same_acquire_asked_twice_at_once_is_granted_once() {
    let system = TestSystem::spawn().await;
    let worker = pending(&system, 4).await;
    let params = store::lease::AcquireParams {
        worker_id: worker.id,
        request_id: Uuid::new_v4(),
        max_tasks: 2,
        lease_ttl: std::time::Duration::from_secs(30),
    };
    // Both asks wait on the worker's row, then start as close together as PostgreSQL lets them.
    let lock = store::testing::hold_worker_lock(&system.pool, worker.id)
        .await
        .unwrap();
    let ask = || {
        let (pool, subjects, params) =
            (system.pool.clone(), system.subjects.clone(), params.clone());
        tokio::spawn(async move {
            let mut staged = store::Staged::default();
            match store::lease::acquire(&pool, &mut staged, &subjects, &params).await {
                Ok((store::lease::AcquireOutcome::Leases(leases), _)) => leases,
                other => panic!("acquire failed: {other:?}"),
            }
        })
    };
    let (first, second) = (ask(), ask());
    system
        .wait_for("both acquires to wait on the worker's row", || async {
            (store::testing::backends_waiting_for_locks(&system.pool)
                .await
                .unwrap()
                == 2)
                .then_some(())
        })
        .await;
    lock.rollback().await.unwrap();
    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    assert_eq!(
        store::testing::attempts_of_request(&system.pool, params.request_id)
            .await
            .unwrap(),
        2,
        "one request, at most max_tasks attempts (first got {}, second {})",
        first.len(),
        second.len()
    );
    system.finish().await;
}

/// `count` pending one-plugin tasks and a worker that may take them all, acquired directly
/// with the store in the dispatch lane: the leases, their staged events and the statements.
async fn acquire_directly(count: usize) -> (usize, usize, u64, usize) {
    let system = TestSystem::spawn().await;
    let worker = pending(&system, count).await;
    let params = store::lease::AcquireParams {
        worker_id: worker.id,
        request_id: Uuid::new_v4(),
        max_tasks: count as i64,
        lease_ttl: std::time::Duration::from_secs(30),
    };
    let mut staged = store::Staged::default();
    let before = cost::snapshot();
    let (outcome, _) = cost::in_lane(
        lanes::DISPATCH,
        store::lease::acquire(&system.pool, &mut staged, &system.subjects, &params),
    )
    .await
    .expect("acquired");
    let statements = cost::spent(&before, &cost::snapshot())[lanes::DISPATCH].statements;
    let store::lease::AcquireOutcome::Leases(leases) = outcome else {
        panic!("refused: {outcome:?}");
    };
    // The same request again (a lost reply) gets the same leases, and grants nothing new.
    let (replayed, _) = store::lease::acquire(
        &system.pool,
        &mut store::Staged::default(),
        &system.subjects,
        &params,
    )
    .await
    .expect("replayed");
    let store::lease::AcquireOutcome::Leases(replayed) = replayed else {
        panic!("replay refused: {replayed:?}");
    };
    let attempts = |leases: &[store::lease::GrantedLease]| {
        let mut ids: Vec<Uuid> = leases.iter().map(|lease| lease.attempt_id).collect();
        ids.sort();
        ids
    };
    assert_eq!(attempts(&replayed), attempts(&leases));
    let tasks: std::collections::HashSet<Uuid> = leases.iter().map(|lease| lease.task_id).collect();
    let granted = leases.len();
    let distinct = tasks.len();
    let events = staged.len();
    system.finish().await;
    (granted, distinct, statements, events)
}

#[tokio::test]
async fn acquire_grants_one_or_fifty_leases_in_the_same_statements() {
    let mut costs = Vec::new();
    for count in [1, 50] {
        let (granted, distinct, statements, events) = acquire_directly(count).await;
        assert_eq!(granted, count);
        assert_eq!(distinct, count, "each task leased once");
        assert_eq!(
            events, count,
            "one task.leased per lease, staged for hand-off"
        );
        costs.push(statements);
    }
    assert_eq!(
        costs[0], costs[1],
        "statements do not grow with the grant: {costs:?}"
    );
    assert!(
        costs[0] <= 4,
        "worker read, grant, events, commit: {costs:?}"
    );
}

/// Acquires of different workers that arrive together are decided together (issue 24): a
/// burst of one acquire per worker costs a few dispatch transactions, not one per acquire, and
/// each worker still gets its own lease, no task twice; a worker's acquire resent at the same
/// time is decided after its first and answered with the same lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_acquires_of_different_workers_are_decided_in_shared_transactions() {
    const WORKERS: usize = 40;
    let system = TestSystem::spawn().await;
    let organization_id = system.organization().await;
    let mut workers = Vec::with_capacity(WORKERS);
    for _ in 0..WORKERS {
        let worker = system.manual_worker(organization_id, 1).await;
        assert!(
            worker
                .hello_with_capacity(&[PLUGIN], 1)
                .await
                .error
                .is_none()
        );
        workers.push(worker);
    }
    let client = system.client();
    for index in 0..WORKERS {
        let request = system.request(
            organization_id,
            &format!("http://together-{index}.test"),
            &[PLUGIN],
        );
        assert!(
            client
                .submit(&request)
                .await
                .expect("admission answers")
                .error
                .is_none()
        );
    }
    let resent = Uuid::new_v4();
    let asks: Vec<(&ManualWorker, Uuid)> = workers
        .iter()
        .enumerate()
        .map(|(index, worker)| (worker, if index == 0 { resent } else { Uuid::new_v4() }))
        .chain(std::iter::once((&workers[0], resent)))
        .collect();

    let before = cost::snapshot();
    let replies = futures::future::join_all(
        asks.iter()
            .map(|(worker, request_id)| worker.acquire(*request_id, 1, 5_000)),
    )
    .await;
    let spent = cost::spent(&before, &cost::snapshot());

    let mut tasks = std::collections::HashSet::new();
    for ((worker, _), reply) in asks.iter().zip(&replies).take(WORKERS) {
        assert!(reply.error.is_none(), "{reply:?}");
        assert_eq!(
            reply.leases.len(),
            1,
            "worker {} got one lease: {reply:?}",
            worker.id
        );
        let lease = reply.leases[0].lease.as_ref().expect("a lease reference");
        assert!(
            tasks.insert(lease.task_id.clone()),
            "task {} leased twice",
            lease.task_id
        );
    }
    assert_eq!(
        task_ids(&replies[WORKERS].leases),
        task_ids(&replies[0].leases),
        "the resent acquire is answered with the first one's lease"
    );
    // Decided one per transaction, the burst costs 41 commits; the deciders take what queued
    // while they were busy, so a few transactions take it all.
    let commits = spent[lanes::DISPATCH].commits;
    assert!(
        commits <= (WORKERS / 4) as u64,
        "{commits} dispatch commits for {} acquires ({spent:?})",
        WORKERS + 1
    );
    system.finish().await;
}

/// An acquire reads about as many tasks as it grants, whatever its organization's backlog: it
/// walks `worker_tasks_due_by_org_idx` in priority order and stops. PostgreSQL's own counters
/// of the rows read from `worker_tasks` are the witness, taken around one acquire of two tasks
/// on a backlog of 4 and of 1,000 with every other backend gone. (With the index it replaced,
/// `(organization_id, state)`, the acquire read and sorted the whole backlog once the table
/// outgrew the ten pages PostgreSQL assumes of a table it has not analyzed: 1,004 rows here.)
#[tokio::test]
async fn an_acquire_reads_as_many_tasks_as_it_grants_whatever_the_backlog() {
    let mut reads = Vec::new();
    for backlog in [4, 1000] {
        let system = TestSystem::spawn().await;
        let worker = pending(&system, backlog).await;
        let subjects = system.subjects.clone();
        system.stop_all().await;
        let mut settings = store::DatabaseSettings::new(system.database_url().to_owned());
        settings.max_connections = 1;
        let pool = store::connect(&settings).await.expect("acquire connection");
        sqlx::query("SELECT pg_stat_reset()")
            .execute(&pool)
            .await
            .expect("counters reset");
        let params = store::lease::AcquireParams {
            worker_id: worker.id,
            request_id: Uuid::new_v4(),
            max_tasks: 2,
            lease_ttl: std::time::Duration::from_secs(30),
        };
        let (outcome, _) =
            store::lease::acquire(&pool, &mut store::Staged::default(), &subjects, &params)
                .await
                .expect("acquired");
        let store::lease::AcquireOutcome::Leases(leases) = outcome else {
            panic!("refused: {outcome:?}");
        };
        assert_eq!(leases.len(), 2, "two of {backlog} due tasks granted");
        pool.close().await;
        let tasks = crate::flat::table_reads(&system)
            .await
            .into_iter()
            .find(|table| table.relname == "worker_tasks")
            .expect("worker_tasks counted");
        reads.push((backlog, tasks.seq_tup_read + tasks.idx_tup_fetch));
        system.finish().await;
    }
    let (_, small) = reads[0];
    let (_, large) = reads[1];
    assert!(
        large <= small + 2 && large < 20,
        "rows of worker_tasks one acquire of two read, by backlog: {reads:?}"
    );
}
