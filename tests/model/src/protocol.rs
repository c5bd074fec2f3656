//! The protocol's decisions, one function per statement or script of `shared/store`, each
//! over the rows that statement locks, as one atomic step (the real ones are one transaction
//! each, under `FOR UPDATE` of the rows they decide on, so they serialize on those rows).
//!
//! Each function's documentation names what it stands for, so that a reader can hold the two
//! side by side. A [`Bug`] changes one check, to show that the checker notices.

use crate::db::{
    ATTEMPTS_PER_TASK_MAX, AttemptStatus, Batch, BatchKey, Checksum, Db, Evaluation, Lease, Task,
    TaskState, WorkerId,
};

/// Which protocol the model runs: the real one, or the real one with one seeded bug.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Protocol {
    Real,
    Seeded(Bug),
}

/// One check removed or changed, each caught by the invariant it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bug {
    /// The fence (`fence.rs`, `LockedAttempt::is_presented_by`) does not compare the lease
    /// token, so a message naming the attempt with a wrong token passes it. Caught by I1: a
    /// write with a wrong token changes something.
    FenceSkipsToken,
    /// Renew (`worker_task_attempts/renew_many.sql`) does not check `lease_expires_at >
    /// now()`, so it revives a lapsed lease the reaper has not recovered yet. Caught by I1: a
    /// write with an expired lease changes something.
    RenewSkipsExpiry,
    /// Acquire (`worker_tasks/grant.sql`) numbers the attempt from the budget counter
    /// (`attempt_count + 1`) instead of `last_attempt_number + 1`; after a release, which
    /// refunds the budget, the next attempt gets the released one's number. Caught by I1:
    /// attempt numbers strictly increase.
    NumberFromBudget,
    /// Stale recovery (`recover.rs`, `progress::fail_tasks`) retries whatever the budget.
    /// Caught by I10: a task waits in `retry_wait` with its budget spent. (It never runs past
    /// its budget: the grant checks `attempt_count < max_attempts`; the reaper's stranded sweep
    /// would fail it `no_worker`.)
    RecoveryIgnoresBudget,
    /// Batch acceptance (`ingest.rs`, `same_checksum_or_conflict`) answers a known key as a
    /// duplicate without comparing checksums, so another payload under the same key is
    /// acknowledged and silently dropped. Caught by I2: a replay with another checksum is
    /// `batch_conflict`.
    ReplayIgnoresChecksum,
    /// Cancel (`cancel.rs`) does not check that the task already ended. Caught by I8.
    CancelIgnoresTerminal,
    /// Acquire (`worker_tasks/grant.sql`) does not check the task's state, so it leases a
    /// task an attempt already holds. Caught by I1: at most one live attempt per task.
    GrantSkipsStateCheck,
    /// Batch acceptance (`ingest.rs`, `colliding_batches`) reads none of the rows the batch
    /// collides with (`worker_result_batches/colliding.sql`, which serves both the key look-up
    /// and the sequence-number check), so an attempt's batch delivered again is inserted again
    /// (the schema's unique indexes would refuse it; the model has none). Caught by I2: an
    /// (attempt, key) is accepted once.
    BatchKeyUnchecked,
    /// Batch acceptance (`ingest.rs`) looks a key up by task, as before issue 26: a later
    /// attempt's batch under a key an earlier attempt used is answered `duplicate` from the
    /// earlier attempt's row and not stored, so that attempt's completion is refused
    /// `batch_missing` for good. Caught by I2: a batch acknowledged without its (attempt, key)
    /// row.
    BatchKeyByTask,
    /// Batch acceptance (`ingest.rs`) answers a replayed key from its row to any claim, before
    /// the fence, as before issue 26: a message with the attempt's id but a wrong token learns
    /// whether its payload is the stored one (`duplicate` or `batch_conflict`). Caught by I1: a
    /// message without the attempt's token is refused `lease_lost` (or `cancel_requested`).
    ReplayBeforeFence,
    /// Failure (`progress::fail_tasks`) fails every task terminally, retryable or not.
    /// Caught by I10: `failed_terminal` only after `max_attempts` runs.
    FailureIgnoresRetryable,
    /// Batch acceptance (`ingest.rs`) writes a batch's evaluations (`write_evaluations`)
    /// before the fence, so a batch refused `lease_lost` or `cancel_requested` (a stale
    /// worker's, or one without the token) still upserts its verdict. Caught by I16: only an
    /// attempt holding the lease writes an evaluation (and, after its task ended, by I16's
    /// terminal check).
    EvaluationsBeforeFence,
    /// Batch acceptance (`ingest.rs`) writes the evaluations of every batch presented with its
    /// attempt's claim, not only of the accepted ones: a replayed batch (answered `duplicate`
    /// or `batch_conflict`) upserts its verdict again. Caught by I16: a replay changes no
    /// evaluation.
    ReplayWritesEvaluations,
    /// `evaluations/upsert_many.sql` without its `ON CONFLICT (scan_id, evaluation_key)`: a
    /// later attempt's evaluation of the key is inserted beside the earlier one's (the
    /// schema's unique index would refuse it; the model has none). Caught by I16: at most one
    /// evaluation per key.
    EvaluationInsertedNotUpserted,
    /// `evaluations/upsert_many.sql`'s `DO UPDATE` replaces the verdict but not `attempt_id`:
    /// a later attempt's evaluation still names the earlier attempt, and that attempt's
    /// completion deletes it as superseded. Caught by I16: a completed task's evaluations are
    /// exactly its completing attempt's.
    UpsertKeepsAttempt,
    /// Completion (`ingest.rs`, `finish_attempts`) does not run
    /// `findings/delete_superseded_many.sql`, so an earlier attempt's evaluation survives a
    /// completion whose attempt wrote none. Caught by I16: a completed task's evaluations are
    /// exactly its completing attempt's.
    CompletionKeepsSupersededEvaluations,
    /// Completion (`ingest.rs`, `finish_attempts`) skips the superseded delete when the task
    /// has spent one run (`attempt_count = 1`) instead of when the attempt is its task's
    /// first (`attempt_number = 1`): after a release, which refunds its run, the next
    /// attempt's completion keeps the released attempt's evaluation. Caught by I16: a
    /// completed task's evaluations are exactly its completing attempt's.
    SupersededSkipByBudget,
}

impl Protocol {
    /// Every seeded bug, for the tests that show each is caught.
    pub const BUGS: [Bug; 17] = [
        Bug::FenceSkipsToken,
        Bug::RenewSkipsExpiry,
        Bug::NumberFromBudget,
        Bug::RecoveryIgnoresBudget,
        Bug::ReplayIgnoresChecksum,
        Bug::CancelIgnoresTerminal,
        Bug::GrantSkipsStateCheck,
        Bug::BatchKeyUnchecked,
        Bug::BatchKeyByTask,
        Bug::ReplayBeforeFence,
        Bug::FailureIgnoresRetryable,
        Bug::EvaluationsBeforeFence,
        Bug::ReplayWritesEvaluations,
        Bug::EvaluationInsertedNotUpserted,
        Bug::UpsertKeepsAttempt,
        Bug::CompletionKeepsSupersededEvaluations,
        Bug::SupersededSkipByBudget,
    ];

    fn has(self, bug: Bug) -> bool {
        self == Protocol::Seeded(bug)
    }
}

/// What a worker presents with a mutating message (`fence::LeaseClaim`): the task is the
/// caller's, the attempt one of its attempts. The worker id and attempt number are always the
/// attempt's own: NATS credentials fix the worker id (its subjects), and a wrong number with
/// the right attempt id and token is refused by the same comparison as a wrong token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Claim {
    pub attempt: u8,
    pub token: Token,
}

/// The lease token a message carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Token {
    /// The secret the grant handed to the attempt's worker.
    Granted,
    /// Anything else: sent by a process with the worker's identity but not the lease (a
    /// restarted worker that read the attempt id in a `task.leased` event, a second process
    /// run under the same worker id), or a corrupted message.
    Wrong,
}

/// What the decider answers (the reply to the worker, or its `IngestAck`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Answer {
    /// Written now.
    Accepted,
    /// Accepted earlier; nothing written again (a replayed batch, completion or failure, a
    /// repeated release).
    Duplicate,
    /// Refused; nothing written.
    Refused(Refusal),
}

/// The error codes (`messages::ErrorCode`) the modelled decisions answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refusal {
    LeaseLost,
    CancelRequested,
    BatchConflict,
    BatchMissing,
    SequenceOutOfRange,
    /// Not a wire code: acquire grants nothing, cancel answers `already_terminal`, the
    /// reaper finds nothing to recover.
    NothingToDo,
}

/// `worker_tasks/grant.sql` for one task: the worker is below its capacity (live, unexpired
/// attempts, `workers/for_acquire.sql`); the task is due (`pending`, or `retry_wait` whose
/// backoff passed), has no cancel requested and has budget left (`attempt_count <
/// max_attempts`; a due task whose budget is spent is the reaper's stranded sweep's to fail,
/// `claim_stranded.sql`). The task is leased with `attempt_count + 1`,
/// `last_attempt_number + 1` and a new current attempt, which gets that number, a fresh token
/// and an unexpired lease. (Which due task a grant picks, by priority and age under `SKIP
/// LOCKED`, is left open: the model tries each.)
pub fn grant(
    protocol: Protocol,
    db: &mut Db,
    task_index: usize,
    worker: WorkerId,
    capacity: u8,
    max_attempts: u8,
) -> Answer {
    if db.live_leases_of(worker) >= usize::from(capacity) {
        return Answer::Refused(Refusal::NothingToDo);
    }
    let task = &mut db.tasks[task_index];
    let due = task.state.is_due() || protocol.has(Bug::GrantSkipsStateCheck);
    if !due || task.cancel_requested || task.attempt_count >= max_attempts {
        return Answer::Refused(Refusal::NothingToDo);
    }
    task.state = TaskState::Leased;
    task.attempt_count += 1;
    task.last_attempt_number += 1;
    let number = if protocol.has(Bug::NumberFromBudget) {
        task.attempt_count
    } else {
        task.last_attempt_number
    };
    let attempt = u8::try_from(task.attempts.len()).expect("attempts are bounded");
    task.current_attempt = Some(attempt);
    task.attempts.push(crate::db::Attempt {
        worker,
        number,
        status: AttemptStatus::Leased,
        lease: Lease::Unexpired,
    });
    Answer::Accepted
}

/// Time passes the lease's `lease_expires_at` (it was not renewed in time: its worker
/// crashed, stalled or was cut off). Only the database clock counts; nothing is written.
pub fn lapse(task: &mut Task, attempt: u8) -> Answer {
    let attempt = &mut task.attempts[usize::from(attempt)];
    if !attempt.status.is_live() || attempt.lease == Lease::Expired {
        return Answer::Refused(Refusal::NothingToDo);
    }
    attempt.lease = Lease::Expired;
    Answer::Accepted
}

/// `worker_task_attempts/renew_many.sql` for one claim: the worker, number and token match, the
/// attempt is live and unexpired, it is the task's current attempt, the task is leased or
/// running without a cancel requested. The lease is extended (it is unexpired again, and may
/// lapse again later), the attempt and task move to `running`. Otherwise `cancel_requested`
/// when the named task has a cancel requested (or is cancelled), else `lease_lost`.
pub fn renew(protocol: Protocol, task: &mut Task, claim: Claim) -> Answer {
    let index = usize::from(claim.attempt);
    let attempt = task.attempts[index];
    let unexpired = attempt.lease == Lease::Unexpired || protocol.has(Bug::RenewSkipsExpiry);
    let holds = claim.token == Token::Granted
        && attempt.status.is_live()
        && unexpired
        && task.current_attempt == Some(claim.attempt)
        && task.state.is_leased()
        && !task.cancel_requested;
    if !holds {
        return Answer::Refused(
            if task.cancel_requested || task.state == TaskState::Cancelled {
                Refusal::CancelRequested
            } else {
                Refusal::LeaseLost
            },
        );
    }
    let attempt = &mut task.attempts[index];
    attempt.status = AttemptStatus::Running;
    attempt.lease = Lease::Unexpired;
    if task.state == TaskState::Leased {
        task.state = TaskState::Running;
    }
    Answer::Accepted
}

/// `lease::release`: a repeated release of a released attempt answers success and writes
/// nothing; a claim that does not hold the lease is `lease_lost`; otherwise
/// `worker_task_attempts/release.sql` ends the attempt `released` and
/// `worker_tasks/release.sql` makes the task `pending` with the attempt refunded.
pub fn release(protocol: Protocol, task: &mut Task, claim: Claim) -> Answer {
    let attempt = task.attempts[usize::from(claim.attempt)];
    if is_presented_by(protocol, claim) && attempt.status == AttemptStatus::Released {
        return Answer::Duplicate;
    }
    if !holds_lease(protocol, task, claim) {
        return Answer::Refused(Refusal::LeaseLost);
    }
    task.attempts[usize::from(claim.attempt)].status = AttemptStatus::Released;
    task.state = TaskState::Pending;
    task.attempt_count = (task.attempt_count.checked_sub(1))
        .expect("a task whose attempt holds the lease has spent budget");
    Answer::Accepted
}

/// A result batch, as `ingest::decide` decides it, with the attempt and its task locked: a
/// key is its attempt's (`(attempt_id, idempotency_key)`, read by
/// `worker_result_batches/colliding.sql`), so another attempt may use it again for a batch of
/// its own. A key this attempt already accepted is a replay, answered from its row to the
/// attempt's own claim only, whether or not it still holds the lease (same checksum:
/// `duplicate`; another: `batch_conflict`), and `lease_lost` to any other claim. Otherwise the
/// fence; then the sequence number (`batch_conflict` when the attempt already used it); then
/// the row is inserted (`worker_result_batches/insert_many.sql`) with its evaluation
/// ([`write_evaluation`], in the same transaction) and the attempt and task move from
/// `leased` to `running` (`worker_task_attempts/finish_many.sql`).
pub fn accept_batch(
    protocol: Protocol,
    task: &mut Task,
    claim: Claim,
    key: BatchKey,
    checksum: Checksum,
) -> Answer {
    let collisions_read = !protocol.has(Bug::BatchKeyUnchecked);
    let replayed = if protocol.has(Bug::BatchKeyByTask) {
        task.batches.iter().find(|batch| batch.key == key).copied()
    } else {
        task.batch(claim.attempt, key).copied()
    };
    if let Some(row) = replayed.filter(|_| collisions_read) {
        if !is_presented_by(protocol, claim) && !protocol.has(Bug::ReplayBeforeFence) {
            return Answer::Refused(Refusal::LeaseLost);
        }
        if protocol.has(Bug::ReplayWritesEvaluations) {
            write_evaluation(protocol, task, claim.attempt, checksum);
        }
        return if row.checksum == checksum || protocol.has(Bug::ReplayIgnoresChecksum) {
            Answer::Duplicate
        } else {
            Answer::Refused(Refusal::BatchConflict)
        };
    }
    if protocol.has(Bug::EvaluationsBeforeFence) {
        write_evaluation(protocol, task, claim.attempt, checksum);
    }
    if let Some(refusal) = refusal(protocol, task, claim) {
        return Answer::Refused(refusal);
    }
    let sequence_taken = if collisions_read {
        task.batches
            .iter()
            .any(|batch| batch.attempt == claim.attempt)
    } else {
        // The model's rows are bounded: past them the seeded bug inserts nothing more (its
        // invariant broke with the second row).
        task.batches.len() == ATTEMPTS_PER_TASK_MAX
    };
    if sequence_taken {
        return Answer::Refused(Refusal::BatchConflict);
    }
    task.batches.push(Batch {
        key,
        attempt: claim.attempt,
        checksum,
    });
    if !protocol.has(Bug::EvaluationsBeforeFence) {
        write_evaluation(protocol, task, claim.attempt, checksum);
    }
    let attempt = &mut task.attempts[usize::from(claim.attempt)];
    if attempt.status == AttemptStatus::Leased {
        attempt.status = AttemptStatus::Running;
    }
    if task.state == TaskState::Leased {
        task.state = TaskState::Running;
    }
    Answer::Accepted
}

/// `evaluations/upsert_many.sql` for an accepted batch's one evaluation: the key's row, if
/// any, gets the batch's verdict and attempt (`ON CONFLICT (scan_id, evaluation_key) DO
/// UPDATE`); else the row is inserted.
fn write_evaluation(protocol: Protocol, task: &mut Task, attempt: u8, checksum: Checksum) {
    let row = Evaluation {
        attempt,
        status: checksum.evaluation_status(),
    };
    if protocol.has(Bug::EvaluationInsertedNotUpserted) {
        task.evaluations.push(row);
        return;
    }
    match task.evaluations.first_mut() {
        Some(existing) => {
            existing.status = row.status;
            if !protocol.has(Bug::UpsertKeepsAttempt) {
                existing.attempt = row.attempt;
            }
        }
        None => task.evaluations.push(row),
    }
}

/// A completion, as `ingest::decide` decides it: an attempt that already succeeded, presented
/// with its token, is answered `duplicate`; then the fence; then every batch of the attempt
/// below `batch_count` must be persisted (`batch_missing`) and none at or above it
/// (`sequence_out_of_range`); then, unless the attempt is its task's first (`attempt_number =
/// 1`: none was superseded), `findings/delete_superseded_many.sql` deletes the evaluations
/// other attempts of the task wrote (`finish_attempts`); then the attempt `succeeded` and the
/// task `completed`. (`evidence_conflict` is left out: a scan job's evidence is published only
/// with its task's completion, after which the fence refuses.)
pub fn complete(protocol: Protocol, task: &mut Task, claim: Claim, batch_count: u8) -> Answer {
    let attempt = task.attempts[usize::from(claim.attempt)];
    if is_presented_by(protocol, claim) && attempt.status == AttemptStatus::Succeeded {
        return Answer::Duplicate;
    }
    if let Some(refusal) = refusal(protocol, task, claim) {
        return Answer::Refused(refusal);
    }
    // Every batch of an attempt has sequence number 0.
    let sent = task
        .batches
        .iter()
        .filter(|batch| batch.attempt == claim.attempt)
        .count();
    let below = if batch_count > 0 { sent } else { 0 };
    if below < usize::from(batch_count) {
        return Answer::Refused(Refusal::BatchMissing);
    }
    if sent - below > 0 {
        return Answer::Refused(Refusal::SequenceOutOfRange);
    }
    let first = if protocol.has(Bug::SupersededSkipByBudget) {
        task.attempt_count == 1
    } else {
        task.attempts[usize::from(claim.attempt)].number == 1
    };
    if !first && !protocol.has(Bug::CompletionKeepsSupersededEvaluations) {
        task.evaluations = (task.evaluations.iter())
            .filter(|evaluation| evaluation.attempt == claim.attempt)
            .copied()
            .collect();
    }
    task.attempts[usize::from(claim.attempt)].status = AttemptStatus::Succeeded;
    task.state = TaskState::Completed;
    Answer::Accepted
}

/// A worker-reported failure, as `ingest::decide` decides it: an attempt that already
/// failed, presented with its token, is answered `duplicate`; then the fence; then the attempt
/// `failed` (`worker_task_attempts/fail_many.sql`) and [`fail_task`].
pub fn fail(
    protocol: Protocol,
    task: &mut Task,
    claim: Claim,
    retryable: bool,
    max_attempts: u8,
) -> Answer {
    let attempt = task.attempts[usize::from(claim.attempt)];
    if is_presented_by(protocol, claim) && matches!(attempt.status, AttemptStatus::Failed { .. }) {
        return Answer::Duplicate;
    }
    if let Some(refusal) = refusal(protocol, task, claim) {
        return Answer::Refused(refusal);
    }
    task.attempts[usize::from(claim.attempt)].status = AttemptStatus::Failed { retryable };
    let retryable = retryable && !protocol.has(Bug::FailureIgnoresRetryable);
    fail_task(task, retryable, max_attempts);
    Answer::Accepted
}

/// The reaper's stale recovery for one attempt (`worker_task_attempts/recover_expired.sql`,
/// then `recover::fail_claimed`): an attempt still `leased`/`running` whose lease expired is
/// marked `expired`; if it is its task's current attempt and the task is leased or running,
/// the task fails retryably ([`fail_task`]). The real sweep claims many such attempts at
/// once with `SKIP LOCKED`; one at a time covers every subset it may claim.
pub fn recover(protocol: Protocol, task: &mut Task, attempt: u8, max_attempts: u8) -> Answer {
    let index = usize::from(attempt);
    let row = task.attempts[index];
    if !row.status.is_live() || row.lease != Lease::Expired {
        return Answer::Refused(Refusal::NothingToDo);
    }
    task.attempts[index].status = AttemptStatus::Expired;
    if task.current_attempt == Some(attempt) && task.state.is_leased() {
        let budget = if protocol.has(Bug::RecoveryIgnoresBudget) {
            u8::MAX
        } else {
            max_attempts
        };
        fail_task(task, true, budget);
    }
    Answer::Accepted
}

/// `cancel::cancel` of the task's scan (one plugin, one task): a task that ended answers
/// `already_terminal`; otherwise its live attempts become `cancelled`
/// (`worker_task_attempts/cancel_of_scan.sql`) and the task `cancelled` with
/// `cancel_requested_at` set (`worker_tasks/cancel_of_scan.sql`).
pub fn cancel(protocol: Protocol, task: &mut Task) -> Answer {
    if task.state.is_terminal() && !protocol.has(Bug::CancelIgnoresTerminal) {
        return Answer::Refused(Refusal::NothingToDo);
    }
    for attempt in &mut task.attempts {
        if attempt.status.is_live() {
            attempt.status = AttemptStatus::Cancelled;
        }
    }
    task.state = TaskState::Cancelled;
    task.cancel_requested = true;
    Answer::Accepted
}

/// `progress::fail_tasks` (`worker_tasks/fail_many.sql`) for one task whose attempt ended
/// badly: only from `leased`/`running`; to `retry_wait` when the failure is retryable and
/// `attempt_count < max_attempts`, else `failed_terminal`.
pub fn fail_task(task: &mut Task, retryable: bool, max_attempts: u8) {
    if !task.state.is_leased() {
        return;
    }
    task.state = if retryable && task.attempt_count < max_attempts {
        TaskState::RetryWait
    } else {
        TaskState::FailedTerminal
    };
}

/// `LockedAttempt::is_presented_by` (`fence.rs`): the claim names this attempt with its
/// worker id, number and token.
fn is_presented_by(protocol: Protocol, claim: Claim) -> bool {
    claim.token == Token::Granted || protocol.has(Bug::FenceSkipsToken)
}

/// `LockedAttempt::holds_lease` (`fence.rs`, over `worker_task_attempts/lock_fence.sql` or
/// `lock_for_ingest.sql`): presented by its worker, the task's current attempt, live,
/// unexpired, and the task leased or running.
fn holds_lease(protocol: Protocol, task: &Task, claim: Claim) -> bool {
    let attempt = task.attempts[usize::from(claim.attempt)];
    is_presented_by(protocol, claim)
        && task.current_attempt == Some(claim.attempt)
        && attempt.status.is_live()
        && attempt.lease == Lease::Unexpired
        && task.state.is_leased()
}

/// `LockedAttempt::refusal` (`fence.rs`): `None` when the claim holds the lease;
/// `cancel_requested` for the attempt's own worker once its task is being cancelled;
/// `lease_lost` otherwise.
fn refusal(protocol: Protocol, task: &Task, claim: Claim) -> Option<Refusal> {
    if holds_lease(protocol, task, claim) {
        None
    } else if is_presented_by(protocol, claim) && task.cancel_requested {
        Some(Refusal::CancelRequested)
    } else {
        Some(Refusal::LeaseLost)
    }
}
