//! The ingestion decision script (SPEC §4.3): a fetched batch of worker messages (result
//! batches, completions, failures) decided in one transaction with a fixed number of
//! statements, whatever the batch holds.
//!
//! A batch is decided in waves: per attempt, its messages up to and including its first
//! completion or failure are in the first wave, what follows that in the second, and so on.
//! The common batch, result batches of many attempts each followed by at most one completion,
//! is one wave. Each wave is decided set-wise (`decide_wave`):
//! 1. `lock`: one statement locks every named attempt and its task (`FOR UPDATE`, in task
//!    order) and reads their scan jobs; `colliding_batches`: one reads the batch rows the
//!    results could collide with;
//! 2. `Verdicts`: the fence, replays, checksum and sequence conflicts are decided in Rust
//!    against that snapshot, message by message in order, so each message gets the answer it
//!    would get alone;
//! 3. `write::write_batches`: accepted batches, their assets, findings and evaluations are
//!    written with one statement each;
//! 4. `check_completions`: one statement counts each completing attempt's batches;
//!    `finish_attempts`: completions that pass move their attempt, task and scan job in one
//!    statement, and [`progress`] advances their scans (`completed_events`);
//! 5. `fail_attempts`: one statement ends every failing attempt, and [`progress::fail_tasks`]
//!    retries or fails their tasks (once per distinct failure, `by_failure`).
//!
//! 6. `hand_on`: completions that asked for their scan's next plugin get it leased, in the same
//!    transaction ([`crate::lease`]'s `hand_on`, in a savepoint: if it fails, the decision
//!    stands and the workers acquire their next plugins as usual).
//!
//! A later wave sees what the earlier ones wrote, so a repeat after an attempt's completion is
//! answered as a duplicate. When a statement fails for a reason that retrying cannot fix (a row
//! the schema refuses), the caller decides the batch again with [`decide_each`]: the same
//! code, run on one message at a time in a savepoint of its own, so one bad message cannot fail
//! its neighbours.

mod refusals;
mod write;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Duration;

use messages::v1;
use messages::{EventKind, Subjects};
use prost::Message as _;
use sqlx::{PgConnection, Postgres, Transaction};
use uuid::Uuid;

use crate::StoreError;
use crate::fence::{LeaseClaim, LockedAttempt, lease_lost};
use crate::lease::{GrantedLease, NextAsk};
use crate::outbox::{self, OutboxEvent, Staged};
use crate::progress::{self, CompletedJob, FailedTask, Failure};
use crate::retry::RetryPolicy;
use crate::sql;
use crate::states::{AttemptStatus, ScanJobState, TaskState};

/// What ingestion decided about one message.
#[derive(Debug, Clone, PartialEq)]
pub enum IngestOutcome {
    /// Written now.
    Accepted,
    /// Accepted earlier; nothing was written again.
    Duplicate,
    /// Refused; nothing was written.
    Refused(v1::Error),
}

/// One result batch, its checksum already verified against its payload.
#[derive(Debug, Clone)]
pub struct BatchParams<'a> {
    pub claim: &'a LeaseClaim,
    pub sequence_number: i32,
    pub idempotency_key: &'a str,
    pub payload_sha256: &'a str,
    pub findings: &'a [v1::Finding],
    pub assets: &'a [v1::Asset],
    /// Checked by the caller: each status one of [`crate::states::EvaluationStatus`], with a
    /// reason code where it needs one.
    pub evaluations: &'a [v1::Evaluation],
}

/// A completion: every batch below `batch_count` must be persisted.
#[derive(Debug, Clone)]
pub struct CompleteParams<'a> {
    pub claim: &'a LeaseClaim,
    pub batch_count: i32,
    pub summary: &'a str,
    /// The worker asks for its scan's next plugin with the acknowledgement
    /// (`TaskComplete.lease_next`).
    pub lease_next: bool,
}

/// A worker-reported failure.
#[derive(Debug, Clone)]
pub struct FailParams<'a> {
    pub claim: &'a LeaseClaim,
    pub error_code: &'a str,
    pub error_message: &'a str,
    pub retryable: bool,
    pub retry: RetryPolicy,
}

/// One message of a batch, validated.
#[derive(Debug, Clone)]
pub enum Message<'a> {
    Result(BatchParams<'a>),
    Complete(CompleteParams<'a>),
    Fail(FailParams<'a>),
}

impl Message<'_> {
    pub fn claim(&self) -> &LeaseClaim {
        match self {
            Message::Result(params) => params.claim,
            Message::Complete(params) => params.claim,
            Message::Fail(params) => params.claim,
        }
    }

    /// A completion or a failure: nothing its attempt sends after it can be accepted.
    fn ends_attempt(&self) -> bool {
        matches!(self, Message::Complete(_) | Message::Fail(_))
    }
}

/// Each message's own outcome, in the order of the messages: an `Err` is that message's own
/// failure, while an outer `Err` fails the whole transaction.
pub type Outcomes = Vec<Result<IngestOutcome, StoreError>>;

/// What [`Ingest`] decided: each message's outcome, the scan of each task the decision
/// locked (task id → scan id), so ingestion's spans can name the scan a message acted on, and
/// the leases handed on with completions, by completed attempt.
#[derive(Debug)]
pub struct Decisions {
    pub outcomes: Outcomes,
    pub scans: HashMap<Uuid, Uuid>,
    pub leases: HashMap<Uuid, Vec<GrantedLease>>,
}

/// The ingestion script over `messages`, for [`crate::decide_batch`].
pub struct Ingest<'a, 'm> {
    pub subjects: &'a Subjects,
    pub messages: &'a [Message<'m>],
    /// The lease of a next plugin handed on with its completion.
    pub lease_ttl: Duration,
}

impl crate::Script for Ingest<'_, '_> {
    type Outcomes = Decisions;

    async fn set_wise(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        staged: &mut Staged,
    ) -> Result<Self::Outcomes, StoreError> {
        let decisions = decide(tx, staged, self.subjects, self.messages).await?;
        self.with_hand_on(tx, staged, decisions).await
    }

    async fn one_by_one(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        staged: &mut Staged,
    ) -> Result<Self::Outcomes, StoreError> {
        let decisions = decide_each(tx, staged, self.subjects, self.messages).await?;
        self.with_hand_on(tx, staged, decisions).await
    }
}

impl Ingest<'_, '_> {
    /// `decisions` with the leases handed on to their completions (either form's last step).
    async fn with_hand_on(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        staged: &mut Staged,
        mut decisions: Decisions,
    ) -> Result<Decisions, StoreError> {
        decisions.leases = self.hand_on(tx, staged, &decisions.outcomes).await?;
        Ok(decisions)
    }

    /// Leases their scans' next plugins to the completions that asked, accepted now or
    /// earlier, in a savepoint: when it fails, only the hand-off is undone (logged; the workers
    /// acquire those plugins as usual).
    async fn hand_on(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        staged: &mut Staged,
        outcomes: &Outcomes,
    ) -> Result<HashMap<Uuid, Vec<GrantedLease>>, StoreError> {
        let asks: Vec<NextAsk> = self
            .messages
            .iter()
            .zip(outcomes)
            .filter_map(|(message, outcome)| match (message, outcome) {
                (
                    Message::Complete(CompleteParams {
                        claim,
                        lease_next: true,
                        ..
                    }),
                    Ok(outcome @ (IngestOutcome::Accepted | IngestOutcome::Duplicate)),
                ) => Some(NextAsk {
                    worker_id: claim.worker_id,
                    attempt_id: claim.attempt_id,
                    repeated: *outcome == IngestOutcome::Duplicate,
                }),
                _ => None,
            })
            .collect();
        if asks.is_empty() {
            return Ok(HashMap::new());
        }
        let mark = staged.mark();
        let mut savepoint = crate::savepoint(tx).await?;
        match crate::lease::hand_on(&mut savepoint, staged, self.subjects, &asks, self.lease_ttl)
            .await
        {
            Ok(leases) => {
                savepoint.commit().await?;
                Ok(leases)
            }
            Err(error) if error.is_unavailable() => Err(error),
            Err(error) => {
                savepoint.rollback().await?;
                staged.roll_back_to(mark);
                if error.is_transient() {
                    // A worker's row held past the bound (an acquire, a revocation): expected.
                    tracing::debug!(%error, asks = asks.len(), "next plugins not handed on with their completions; the workers acquire them");
                } else {
                    tracing::warn!(%error, asks = asks.len(), "next plugins not handed on with their completions; the workers acquire them");
                }
                Ok(HashMap::new())
            }
        }
    }
}

/// Decides `messages` inside `tx`, wave by wave.
pub async fn decide(
    tx: &mut Transaction<'_, Postgres>,
    staged: &mut Staged,
    subjects: &Subjects,
    messages: &[Message<'_>],
) -> Result<Decisions, StoreError> {
    let mut scans = HashMap::new();
    let mut outcomes: Vec<Option<Result<IngestOutcome, StoreError>>> =
        messages.iter().map(|_| None).collect();
    for wave in waves(messages) {
        let decided = decide_wave(tx, staged, subjects, messages, &wave, &mut scans).await?;
        for (index, outcome) in decided {
            outcomes[index] = Some(outcome);
        }
    }
    let outcomes = outcomes
        .into_iter()
        .map(|outcome| outcome.expect("every message is in a wave"))
        .collect();
    Ok(Decisions {
        outcomes,
        scans,
        leases: HashMap::new(),
    })
}

/// Decides `messages` one at a time, each in a savepoint kept only when it was accepted: the
/// fallback when a statement failed for a reason retrying cannot fix, so that the message at
/// fault is found and fails alone (its error is its own outcome).
pub async fn decide_each(
    tx: &mut Transaction<'_, Postgres>,
    staged: &mut Staged,
    subjects: &Subjects,
    messages: &[Message<'_>],
) -> Result<Decisions, StoreError> {
    let mut scans = HashMap::new();
    let mut outcomes = Vec::with_capacity(messages.len());
    for index in 0..messages.len() {
        let mark = staged.mark();
        let mut savepoint = crate::savepoint(tx).await?;
        let decided = decide_wave(
            &mut savepoint,
            staged,
            subjects,
            messages,
            &[index],
            &mut scans,
        )
        .await;
        let outcome = match decided {
            Ok(mut decided) => decided.pop().expect("one message, one outcome").1,
            Err(error) => Err(error),
        };
        match outcome {
            Ok(IngestOutcome::Accepted) => savepoint.commit().await?,
            _ => {
                savepoint.rollback().await?;
                staged.roll_back_to(mark);
            }
        }
        outcomes.push(outcome);
    }
    Ok(Decisions {
        outcomes,
        scans,
        leases: HashMap::new(),
    })
}

/// The waves of `messages` (indices, in order): a message goes in the wave after the one that
/// holds its attempt's last completion or failure before it.
fn waves(messages: &[Message<'_>]) -> Vec<Vec<usize>> {
    let mut next_wave: HashMap<Uuid, usize> = HashMap::new();
    let mut waves: Vec<Vec<usize>> = Vec::new();
    for (index, message) in messages.iter().enumerate() {
        let attempt_id = message.claim().attempt_id;
        let wave = next_wave.get(&attempt_id).copied().unwrap_or(0);
        if message.ends_attempt() {
            next_wave.insert(attempt_id, wave + 1);
        }
        if waves.len() <= wave {
            waves.resize_with(wave + 1, Vec::new);
        }
        waves[wave].push(index);
    }
    waves
}

/// An attempt and its task as locked by the batch, with the task's scan job.
#[derive(Debug, Clone, sqlx::FromRow)]
struct LockedRow {
    attempt_id: Uuid,
    attempt_task_id: Uuid,
    #[sqlx(flatten)]
    locked: LockedAttempt,
    position: Option<i32>,
    evidence_published: Option<bool>,
}

/// A batch row that a result of this batch may replay or collide with.
#[derive(Debug, sqlx::FromRow)]
struct BatchRow {
    attempt_id: Uuid,
    sequence_number: i32,
    idempotency_key: String,
    payload_sha256: String,
}

/// The scan and scan job a live attempt writes into.
#[derive(Debug, Clone, Copy)]
struct Job {
    organization_id: Uuid,
    scan_id: Uuid,
    scan_job_id: Uuid,
    position: i32,
}

impl LockedRow {
    /// The scan job the attempt's results and completion write into; every task a worker
    /// leases has one.
    fn job(&self) -> Result<Job, StoreError> {
        let corrupt =
            || StoreError::Corrupt(format!("task {} has no scan job", self.attempt_task_id));
        Ok(Job {
            organization_id: self.locked.organization_id,
            scan_id: self.locked.scan_id.ok_or_else(corrupt)?,
            scan_job_id: self.locked.scan_job_id.ok_or_else(corrupt)?,
            position: self.position.ok_or_else(corrupt)?,
        })
    }

    /// The claim presents this attempt and the attempt already ended as `status`: the message
    /// that ended it, sent again.
    fn ended_by(&self, claim: &LeaseClaim, status: AttemptStatus) -> Result<bool, StoreError> {
        Ok(self.attempt_task_id == claim.task_id
            && self.locked.is_presented_by(claim)
            && self.locked.attempt_status()? == status)
    }
}

/// The fence (SPEC I1) against the locked rows: the claim's row when it may write, its refusal
/// otherwise.
fn fenced<'r>(
    rows: &'r HashMap<Uuid, LockedRow>,
    claim: &LeaseClaim,
) -> Result<Result<&'r LockedRow, v1::Error>, StoreError> {
    let Some(row) = rows
        .get(&claim.attempt_id)
        .filter(|row| row.attempt_task_id == claim.task_id)
    else {
        return Ok(Err(lease_lost(claim)));
    };
    Ok(match row.locked.refusal(claim)? {
        None => Ok(row),
        Some(refusal) => Err(refusal),
    })
}

/// What one message of a wave came to: decided, or written by the wave once it is.
type Decided = Vec<(usize, Result<IngestOutcome, StoreError>)>;

/// An accepted result batch, with its attempt's locked row and scan job.
type Accepted<'w, 'm> = (&'w BatchParams<'m>, &'w LockedRow, Job);

/// A fenced completion, with its slot in the wave's [`Decided`]: decided once the batches are
/// written and counted.
type Completing<'w, 'm> = (usize, &'w CompleteParams<'m>, &'w LockedRow, Job);

/// A completion that passed every check: its attempt, task and scan job are finished.
type Completed<'w, 'm> = (&'w CompleteParams<'m>, &'w LockedRow, Job);

/// A fenced failure, with its attempt's locked row.
type Failing<'w, 'm> = (&'w FailParams<'m>, &'w LockedRow);

/// Decides one wave: the messages at `indices`, at most one completion or failure per attempt
/// and nothing of that attempt after it. The scan of each task it locks goes to `scans`.
async fn decide_wave(
    conn: &mut PgConnection,
    staged: &mut Staged,
    subjects: &Subjects,
    messages: &[Message<'_>],
    indices: &[usize],
    scans: &mut HashMap<Uuid, Uuid>,
) -> Result<Decided, StoreError> {
    if indices.is_empty() {
        return Ok(Vec::new());
    }
    let rows = lock(conn, messages, indices).await?;
    scans.extend(
        rows.values()
            .filter_map(|row| Some((row.attempt_task_id, row.locked.scan_id?))),
    );
    let batch_rows = colliding_batches(conn, messages, indices).await?;

    let mut verdicts = Verdicts::new(&batch_rows, indices.len());
    for &index in indices {
        let outcome = verdicts.decide(&messages[index], &rows)?;
        verdicts.decided.push((index, outcome));
    }

    write::write_batches(conn, &verdicts.accepted).await?;
    let completed = check_completions(conn, &mut verdicts.decided, verdicts.completing).await?;
    let running: Vec<&LockedRow> = verdicts.accepted.iter().map(|(_, row, _)| *row).collect();
    let published = finish_attempts(conn, &running, &completed).await?;
    let (mut events, jobs) = completed_events(subjects, &completed, &published)?;
    events.extend(progress::advance(conn, subjects, &jobs).await?);
    events.extend(fail_attempts(conn, subjects, &verdicts.failing).await?);
    outbox::stage(conn, staged, events).await?;
    Ok(verdicts.decided)
}

/// Step 2 of a wave: its messages decided in Rust, in order, against the locked rows, the
/// colliding batch rows and what earlier messages accepted; and what the wave is to write.
struct Verdicts<'w, 'm> {
    /// Each message's outcome so far; a completion's is settled by [`check_completions`].
    decided: Decided,
    accepted: Vec<Accepted<'w, 'm>>,
    completing: Vec<Completing<'w, 'm>>,
    failing: Vec<Failing<'w, 'm>>,
    /// The checksum of each batch key taken, in the database or earlier in the wave. A key is
    /// its attempt's: another attempt of the task may use it again.
    keys: HashMap<(Uuid, &'w str), String>,
    /// The (attempt, sequence number) pairs taken.
    sequences: HashSet<(Uuid, i32)>,
}

/// A message's own outcome, or its own failure.
type Outcome = Result<IngestOutcome, StoreError>;

impl<'w, 'm> Verdicts<'w, 'm> {
    fn new(batch_rows: &'w [BatchRow], wave_len: usize) -> Self {
        let mut keys: HashMap<(Uuid, &str), String> = HashMap::new();
        let mut sequences: HashSet<(Uuid, i32)> = HashSet::new();
        for row in batch_rows {
            keys.insert(
                (row.attempt_id, row.idempotency_key.as_str()),
                row.payload_sha256.clone(),
            );
            sequences.insert((row.attempt_id, row.sequence_number));
        }
        Verdicts {
            decided: Vec::with_capacity(wave_len),
            accepted: Vec::new(),
            completing: Vec::new(),
            failing: Vec::new(),
            keys,
            sequences,
        }
    }

    /// The outcome of `message`, the next of the wave; what it writes is noted.
    fn decide(
        &mut self,
        message: &'w Message<'m>,
        rows: &'w HashMap<Uuid, LockedRow>,
    ) -> Result<Outcome, StoreError> {
        match message {
            Message::Result(params) => self.result(params, rows),
            Message::Complete(params) => self.complete(params, rows),
            Message::Fail(params) => self.fail(params, rows),
        }
    }

    /// A result batch: a replay, refused by the fence, a taken sequence number, or accepted.
    fn result(
        &mut self,
        params: &'w BatchParams<'m>,
        rows: &'w HashMap<Uuid, LockedRow>,
    ) -> Result<Outcome, StoreError> {
        let claim = params.claim;
        if let Some(checksum) = self.keys.get(&(claim.attempt_id, params.idempotency_key)) {
            // A replay: answered after the fence, to the attempt's own claim only,
            // whether or not it still holds the lease (its batch is in).
            return Ok(Ok(match rows.get(&claim.attempt_id) {
                Some(row)
                    if row.attempt_task_id == claim.task_id
                        && row.locked.is_presented_by(claim) =>
                {
                    refusals::same_checksum_or_conflict(checksum, params)
                }
                _ => IngestOutcome::Refused(lease_lost(claim)),
            }));
        }
        let row = match fenced(rows, claim)? {
            Ok(row) => row,
            Err(refusal) => return Ok(Ok(IngestOutcome::Refused(refusal))),
        };
        Ok(match row.job() {
            Err(error) => Err(error),
            Ok(_)
                if !self
                    .sequences
                    .insert((claim.attempt_id, params.sequence_number)) =>
            {
                Ok(IngestOutcome::Refused(refusals::sequence_taken(params)))
            }
            Ok(job) => {
                self.keys.insert(
                    (claim.attempt_id, params.idempotency_key),
                    params.payload_sha256.to_owned(),
                );
                self.accepted.push((params, row, job));
                Ok(IngestOutcome::Accepted)
            }
        })
    }

    /// A completion: a duplicate, refused by the fence, or accepted for now (its batches are
    /// checked once written).
    fn complete(
        &mut self,
        params: &'w CompleteParams<'m>,
        rows: &'w HashMap<Uuid, LockedRow>,
    ) -> Result<Outcome, StoreError> {
        let claim = params.claim;
        if let Some(row) = rows.get(&claim.attempt_id)
            && row.ended_by(claim, AttemptStatus::Succeeded)?
        {
            return Ok(Ok(IngestOutcome::Duplicate));
        }
        Ok(match fenced(rows, claim)? {
            Err(refusal) => Ok(IngestOutcome::Refused(refusal)),
            Ok(row) => match row.job() {
                Err(error) => Err(error),
                Ok(job) => {
                    self.completing.push((self.decided.len(), params, row, job));
                    Ok(IngestOutcome::Accepted)
                }
            },
        })
    }

    /// A failure: a duplicate, refused by the fence, or accepted.
    fn fail(
        &mut self,
        params: &'w FailParams<'m>,
        rows: &'w HashMap<Uuid, LockedRow>,
    ) -> Result<Outcome, StoreError> {
        let claim = params.claim;
        if let Some(row) = rows.get(&claim.attempt_id)
            && row.ended_by(claim, AttemptStatus::Failed)?
        {
            return Ok(Ok(IngestOutcome::Duplicate));
        }
        Ok(match fenced(rows, claim)? {
            Err(refusal) => Ok(IngestOutcome::Refused(refusal)),
            Ok(row) => {
                self.failing.push((params, row));
                Ok(IngestOutcome::Accepted)
            }
        })
    }
}

/// Counts the completing attempts' batches (one statement) and refuses, in `decided`, each
/// completion that fails a check ([`completion_verdict`]). Returns those that pass.
async fn check_completions<'w, 'm>(
    conn: &mut PgConnection,
    decided: &mut Decided,
    completing: Vec<Completing<'w, 'm>>,
) -> Result<Vec<Completed<'w, 'm>>, StoreError> {
    let counts = count_batches(conn, &completing).await?;
    let mut completed = Vec::new();
    for (slot, params, row, job) in completing {
        match completion_verdict(conn, params, row, job, &counts).await? {
            Some(refusal) => decided[slot].1 = Ok(IngestOutcome::Refused(refusal)),
            None => completed.push((params, row, job)),
        }
    }
    Ok(completed)
}

/// Each completed attempt's `TaskCompleted` (with its scan job's published counts), and its
/// scan job for [`progress::advance`].
fn completed_events(
    subjects: &Subjects,
    completed: &[Completed<'_, '_>],
    published: &HashMap<Uuid, (i32, i32)>,
) -> Result<(Vec<OutboxEvent>, Vec<CompletedJob>), StoreError> {
    let mut events = Vec::with_capacity(completed.len() * 2);
    let mut jobs = Vec::with_capacity(completed.len());
    for (params, row, job) in completed {
        let (finding_count, asset_count) = published
            .get(&job.scan_job_id)
            .copied()
            .ok_or_else(|| StoreError::Corrupt(format!("scan job {} vanished", job.scan_job_id)))?;
        events.push(
            OutboxEvent::new(
                subjects,
                EventKind::TaskCompleted,
                v1::TaskCompleted {
                    task_id: params.claim.task_id.to_string(),
                    attempt_id: params.claim.attempt_id.to_string(),
                    scan_id: job.scan_id.to_string(),
                    plugin: row.locked.plugin.clone(),
                    finding_count: finding_count as u32,
                    asset_count: asset_count as u32,
                }
                .encode_to_vec(),
            )
            .in_trace_of(job.scan_id),
        );
        jobs.push(CompletedJob {
            organization_id: job.organization_id,
            scan_id: job.scan_id,
            position: job.position,
            max_attempts: row.locked.max_attempts,
        });
    }
    Ok((events, jobs))
}

/// The failures as workers reported them: code, message, retryable, retry policy.
type Reported<'f> = (&'f str, &'f str, bool, RetryPolicy);

/// Ends the failing attempts (one statement), then retries or fails their tasks: one
/// [`progress::fail_tasks`] per distinct failure, the failure logic the reaper's sweeps share.
/// Returns the events to publish.
async fn fail_attempts(
    conn: &mut PgConnection,
    subjects: &Subjects,
    failing: &[Failing<'_, '_>],
) -> Result<Vec<OutboxEvent>, StoreError> {
    if failing.is_empty() {
        return Ok(Vec::new());
    }
    let attempt_ids: Vec<Uuid> = failing
        .iter()
        .map(|(params, _)| params.claim.attempt_id)
        .collect();
    let codes: Vec<&str> = failing
        .iter()
        .map(|(params, _)| params.error_code)
        .collect();
    let texts: Vec<&str> = failing
        .iter()
        .map(|(params, _)| params.error_message)
        .collect();
    sql::worker_task_attempts::FailMany {
        attempt_ids: &attempt_ids,
        codes: &codes,
        texts: &texts,
        failed_status: AttemptStatus::Failed.as_str(),
    }
    .query()
    .execute(&mut *conn)
    .await?;

    let mut events = Vec::new();
    for ((code, message, retryable, retry), tasks) in by_failure(failing) {
        let error = v1::Error {
            code: code.to_owned(),
            message: message.to_owned(),
            ..Default::default()
        };
        let failed = progress::fail_tasks(
            conn,
            subjects,
            retry,
            &Failure {
                error: &error,
                task_message: &error.message,
                retryable,
                scan_reason: &format!("failed: {}", error.message),
                from: &TaskState::LEASED,
            },
            &tasks,
        )
        .await?;
        events.extend(failed.events);
    }
    Ok(events)
}

/// The failing tasks grouped by the failure their workers reported, in order of first report.
fn by_failure<'f>(failing: &'f [Failing<'_, '_>]) -> Vec<(Reported<'f>, Vec<FailedTask<'f>>)> {
    let mut by_failure: Vec<(Reported<'_>, Vec<FailedTask<'_>>)> = Vec::new();
    for (params, row) in failing {
        let reported = (
            params.error_code,
            params.error_message,
            params.retryable,
            params.retry,
        );
        let task = FailedTask {
            task_id: params.claim.task_id,
            attempt_id: Some(params.claim.attempt_id),
            organization_id: row.locked.organization_id,
            scan_id: row.locked.scan_id,
            scan_job_id: row.locked.scan_job_id,
            plugin: &row.locked.plugin,
            attempt_count: row.locked.attempt_count,
            max_attempts: row.locked.max_attempts,
        };
        match by_failure.iter_mut().find(|(same, _)| *same == reported) {
            Some((_, tasks)) => tasks.push(task),
            None => by_failure.push((reported, vec![task])),
        }
    }
    by_failure
}

/// Locks every named attempt and its task, in task order (the order every writer of tasks
/// locks in), and reads the task's scan job.
async fn lock(
    conn: &mut PgConnection,
    messages: &[Message<'_>],
    indices: &[usize],
) -> Result<HashMap<Uuid, LockedRow>, StoreError> {
    let attempt_ids: Vec<Uuid> = indices
        .iter()
        .map(|&index| messages[index].claim().attempt_id)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let rows: Vec<LockedRow> = sql::worker_task_attempts::LockForIngest {
        attempt_ids: &attempt_ids,
    }
    .query_as()
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().map(|row| (row.attempt_id, row)).collect())
}

/// The batch rows with the same (attempt, key) or (attempt, sequence number) as a result of
/// this batch. Read after `lock`: every batch row of a locked attempt is written under its lock.
async fn colliding_batches(
    conn: &mut PgConnection,
    messages: &[Message<'_>],
    indices: &[usize],
) -> Result<Vec<BatchRow>, StoreError> {
    let results: Vec<&BatchParams<'_>> = indices
        .iter()
        .filter_map(|&index| match &messages[index] {
            Message::Result(params) => Some(params),
            _ => None,
        })
        .collect();
    if results.is_empty() {
        return Ok(Vec::new());
    }
    let keys: Vec<&str> = results
        .iter()
        .map(|params| params.idempotency_key)
        .collect();
    let attempt_ids: Vec<Uuid> = results
        .iter()
        .map(|params| params.claim.attempt_id)
        .collect();
    let sequences: Vec<i32> = results
        .iter()
        .map(|params| params.sequence_number)
        .collect();
    Ok(sql::worker_result_batches::Colliding {
        key_attempt_ids: &attempt_ids,
        keys: &keys,
        sequence_attempt_ids: &attempt_ids,
        sequences: &sequences,
    }
    .query_as()
    .fetch_all(conn)
    .await?)
}

/// Per completing attempt: its batches below `batch_count`, and at or above it.
async fn count_batches(
    conn: &mut PgConnection,
    completing: &[(usize, &CompleteParams<'_>, &LockedRow, Job)],
) -> Result<HashMap<Uuid, (i64, i64)>, StoreError> {
    if completing.is_empty() {
        return Ok(HashMap::new());
    }
    let attempt_ids: Vec<Uuid> = completing
        .iter()
        .map(|(_, params, _, _)| params.claim.attempt_id)
        .collect();
    let batch_counts: Vec<i32> = completing
        .iter()
        .map(|(_, params, _, _)| params.batch_count)
        .collect();
    let rows: Vec<(Uuid, i64, i64)> = sql::worker_result_batches::CountForCompletions {
        attempt_ids: &attempt_ids,
        batch_counts: &batch_counts,
    }
    .query_as()
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(attempt_id, below, beyond)| (attempt_id, (below, beyond)))
        .collect())
}

/// Why a fenced completion is refused: batches missing, then batches beyond its count, then
/// evidence already published.
async fn completion_verdict(
    conn: &mut PgConnection,
    params: &CompleteParams<'_>,
    row: &LockedRow,
    job: Job,
    counts: &HashMap<Uuid, (i64, i64)>,
) -> Result<Option<v1::Error>, StoreError> {
    let (below, beyond) = counts
        .get(&params.claim.attempt_id)
        .copied()
        .unwrap_or_default();
    if below < i64::from(params.batch_count) {
        // Rare: name the missing numbers (one statement for this message only).
        return Ok(Some(
            refusals::missing_batches(conn, params.claim.attempt_id, params.batch_count).await?,
        ));
    }
    if beyond > 0 {
        return Ok(Some(refusals::beyond_batch_count(
            beyond,
            params.batch_count,
        )));
    }
    if row.evidence_published == Some(true) {
        return Ok(Some(refusals::evidence_conflict(job.scan_job_id)));
    }
    Ok(None)
}

/// Marks attempts that sent a batch running and completed ones succeeded (with their tasks and
/// scan jobs), after removing what superseded attempts of the completed jobs left behind.
/// Deletes what earlier attempts of each completing scan job left (findings, evaluations,
/// asset links): one statement, none when every completing attempt is its task's first.
async fn delete_superseded(
    conn: &mut PgConnection,
    completed: &[(&CompleteParams<'_>, &LockedRow, Job)],
) -> Result<(), StoreError> {
    // An attempt numbered 1 is its task's first: nothing was superseded.
    let superseded: Vec<&(&CompleteParams<'_>, &LockedRow, Job)> = completed
        .iter()
        .filter(|(_, row, _)| row.locked.attempt_number > 1)
        .collect();
    if !superseded.is_empty() {
        let jobs: Vec<Uuid> = superseded
            .iter()
            .map(|(_, _, job)| job.scan_job_id)
            .collect();
        let attempts: Vec<Uuid> = superseded
            .iter()
            .map(|(params, _, _)| params.claim.attempt_id)
            .collect();
        sql::findings::DeleteSupersededMany {
            jobs: &jobs,
            attempts: &attempts,
        }
        .query()
        .execute(conn)
        .await?;
    }

    Ok(())
}

/// Returns each completed scan job's published finding and asset counts.
async fn finish_attempts(
    conn: &mut PgConnection,
    running: &[&LockedRow],
    completed: &[(&CompleteParams<'_>, &LockedRow, Job)],
) -> Result<HashMap<Uuid, (i32, i32)>, StoreError> {
    if running.is_empty() && completed.is_empty() {
        return Ok(HashMap::new());
    }
    delete_superseded(conn, completed).await?;

    // Per attempt and task: done (completed) wins over running.
    let mut done: BTreeMap<Uuid, (Uuid, bool)> = BTreeMap::new();
    for row in running {
        done.entry(row.attempt_id)
            .or_insert((row.attempt_task_id, false));
    }
    for (params, _, _) in completed {
        done.insert(params.claim.attempt_id, (params.claim.task_id, true));
    }
    let attempt_ids: Vec<Uuid> = done.keys().copied().collect();
    let task_ids: Vec<Uuid> = done.values().map(|(task_id, _)| *task_id).collect();
    let finished: Vec<bool> = done.values().map(|(_, finished)| *finished).collect();
    let job_ids: Vec<Uuid> = completed
        .iter()
        .map(|(_, _, job)| job.scan_job_id)
        .collect();
    let summaries: Vec<&str> = completed
        .iter()
        .map(|(params, _, _)| params.summary)
        .collect();
    let job_workers: Vec<Uuid> = completed
        .iter()
        .map(|(params, _, _)| params.claim.worker_id)
        .collect();
    let rows: Vec<(Uuid, i32, i32)> = sql::worker_task_attempts::FinishMany {
        attempt_ids: &attempt_ids,
        task_ids: &task_ids,
        finished: &finished,
        job_ids: &job_ids,
        summaries: &summaries,
        succeeded_status: AttemptStatus::Succeeded.as_str(),
        running_status: AttemptStatus::Running.as_str(),
        leased_status: AttemptStatus::Leased.as_str(),
        completed_state: TaskState::Completed.as_str(),
        running_state: TaskState::Running.as_str(),
        leased_state: TaskState::Leased.as_str(),
        completed_job_state: ScanJobState::Completed.as_str(),
        job_workers: &job_workers,
    }
    .query_as()
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, findings, assets)| (id, (findings, assets)))
        .collect())
}
