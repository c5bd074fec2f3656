//! The database the model abstracts: `worker_tasks`, with each task's `worker_task_attempts`,
//! `worker_result_batches` and the `evaluations` its batches wrote, reduced to the columns the
//! lease protocol decides on.
//!
//! Ids are indexes: a task is its index in [`Db::tasks`], an attempt its index in
//! [`Task::attempts`] (its `id`; the fencing number is [`Attempt::number`], a column of its
//! own), a worker a small number. Times are abstracted: `lease_expires_at > now()` is
//! [`Lease::Unexpired`], and `available_at <= now()` of a task in `retry_wait` is always
//! true (the backoff may have passed at any moment, so acquire may take it at any moment).

use std::fmt;

use crate::rows::Rows;

/// Workers the model holds at most.
pub const WORKERS_MAX: usize = 4;
/// Tasks the model holds at most.
pub const TASKS_MAX: usize = 3;
/// Attempts one task has at most (and so batches: one per attempt at most; and evaluation
/// rows, one per accepted batch at most, even with a seeded bug that inserts instead of
/// upserting).
pub const ATTEMPTS_PER_TASK_MAX: usize = 4;

/// A worker's id (`workers.id`): 0, 1, 2…
pub type WorkerId = u8;

/// The rows of one database: every task with its attempts and batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Db {
    pub tasks: Rows<Task, TASKS_MAX>,
}

/// One `worker_tasks` row, with the attempt, batch and evaluation rows that name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Task {
    pub state: TaskState,
    /// Executions that spent budget: acquire adds one, release gives it back.
    pub attempt_count: u8,
    /// The fencing counter: the number of the latest attempt, never decreasing.
    pub last_attempt_number: u8,
    /// `current_attempt_id`: the index of the latest attempt granted, if any.
    pub current_attempt: Option<u8>,
    /// `cancel_requested_at IS NOT NULL`.
    pub cancel_requested: bool,
    /// `worker_task_attempts` of this task, in the order they were granted.
    pub attempts: Rows<Attempt, ATTEMPTS_PER_TASK_MAX>,
    /// `worker_result_batches` of this task's attempts, in the order they were accepted.
    pub batches: Rows<Batch, ATTEMPTS_PER_TASK_MAX>,
    /// `evaluations` of this task's scan job under its one evaluation key (one rule on one
    /// resource, which every batch reports): the protocol keeps at most one row, upserted by
    /// `(scan_id, evaluation_key)` (a scan runs one task in the model).
    pub evaluations: Rows<Evaluation, ATTEMPTS_PER_TASK_MAX>,
}

/// One `worker_task_attempts` row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Attempt {
    pub worker: WorkerId,
    /// `attempt_number`, the fencing token the grant handed out.
    pub number: u8,
    pub status: AttemptStatus,
    /// `lease_expires_at` against the database clock.
    pub lease: Lease,
}

/// One `worker_result_batches` row. Each attempt sends at most one batch, sequence number 0,
/// so a second batch of the same attempt under another key is `sequence_taken`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Batch {
    pub key: BatchKey,
    /// The attempt that sent it (`attempt_id`).
    pub attempt: u8,
    /// `payload_sha256`.
    pub checksum: Checksum,
}

/// One `evaluations` row (`evaluations/upsert_many.sql`) of the task's one evaluation key,
/// written with an accepted batch in its transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Evaluation {
    /// The attempt whose batch wrote (or last replaced) it (`attempt_id`).
    pub attempt: u8,
    pub status: EvaluationStatus,
}

/// `evaluations.status`: what the rule concluded, which is the batch's content, so it follows
/// the batch's [`Checksum`] (two payloads, two verdicts) and adds no branching of its own.
/// (`error` and `not_applicable` decide as these two do.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EvaluationStatus {
    Pass,
    Fail,
}

/// A batch's `idempotency_key`. A key is its attempt's: `(attempt_id, idempotency_key)` is
/// unique, and another attempt of the task may use the same key again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BatchKey {
    /// `{attempt_id}:{sequence}`, the key the worker SDK uses: one attempt's own.
    OfAttempt(u8),
    /// One key that every attempt of the task sends (a worker that names batches by task and
    /// sequence only; the protocol allows any key): each attempt's batch under it is that
    /// attempt's own, stored for it.
    OfTask,
}

/// Two different payloads' checksums.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Checksum {
    A,
    B,
}

impl Checksum {
    /// The verdict on the task's evaluation key that a payload with this checksum carries.
    pub fn evaluation_status(self) -> EvaluationStatus {
        match self {
            Checksum::A => EvaluationStatus::Pass,
            Checksum::B => EvaluationStatus::Fail,
        }
    }
}

/// `worker_tasks.state` (`store::states::TaskState`), less the reserved `cancelling`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TaskState {
    Pending,
    Leased,
    Running,
    RetryWait,
    Completed,
    FailedTerminal,
    Cancelled,
}

/// `worker_task_attempts.status` (`store::states::AttemptStatus`), less the reserved
/// `superseded`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AttemptStatus {
    Leased,
    Running,
    Succeeded,
    /// The real row keeps the worker's error code, not the flag; the model keeps the flag so
    /// that I10 can tell a failure that may end a task before its budget is spent.
    Failed {
        retryable: bool,
    },
    Expired,
    Released,
    Cancelled,
}

/// Whether `lease_expires_at > now()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Lease {
    Unexpired,
    Expired,
}

impl TaskState {
    /// `TaskState::TERMINAL`: completed, failed_terminal, cancelled.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Completed | TaskState::FailedTerminal | TaskState::Cancelled
        )
    }

    /// `TaskState::LEASED`: a live attempt holds the task.
    pub fn is_leased(self) -> bool {
        matches!(self, TaskState::Leased | TaskState::Running)
    }

    /// What acquire may take: `pending`, or `retry_wait` (its backoff abstracted away).
    pub fn is_due(self) -> bool {
        matches!(self, TaskState::Pending | TaskState::RetryWait)
    }
}

impl AttemptStatus {
    /// `AttemptStatus::LIVE`: leased or running.
    pub fn is_live(self) -> bool {
        matches!(self, AttemptStatus::Leased | AttemptStatus::Running)
    }
}

impl Db {
    /// `tasks` new tasks, `pending`, never leased.
    pub fn new(tasks: u8) -> Self {
        Self {
            tasks: (0..tasks).map(|_| Task::new()).collect(),
        }
    }

    /// The worker's live, unexpired attempts: what acquire counts against its capacity
    /// (`workers/for_acquire.sql`).
    pub fn live_leases_of(&self, worker: WorkerId) -> usize {
        self.tasks
            .iter()
            .flat_map(|task| &task.attempts)
            .filter(|attempt| {
                attempt.worker == worker
                    && attempt.status.is_live()
                    && attempt.lease == Lease::Unexpired
            })
            .count()
    }
}

impl Task {
    /// A task as admission (or ingestion, for the next plugin) creates it.
    pub fn new() -> Self {
        Self {
            state: TaskState::Pending,
            attempt_count: 0,
            last_attempt_number: 0,
            current_attempt: None,
            cancel_requested: false,
            attempts: Rows::new(),
            batches: Rows::new(),
            evaluations: Rows::new(),
        }
    }

    /// Attempts that ran: every one but those given back by release (which refunds them).
    pub fn runs(&self) -> usize {
        self.attempts
            .iter()
            .filter(|attempt| attempt.status != AttemptStatus::Released)
            .count()
    }

    /// The batch row that `attempt` accepted under `key`, if any (the unique
    /// `(attempt_id, idempotency_key)`).
    pub fn batch(&self, attempt: u8, key: BatchKey) -> Option<&Batch> {
        self.batches
            .iter()
            .find(|batch| batch.attempt == attempt && batch.key == key)
    }
}

impl Default for Task {
    fn default() -> Self {
        Self::new()
    }
}

/// An unused slot of [`Rows`] (never read as a row).
impl Default for Attempt {
    fn default() -> Self {
        Self {
            worker: 0,
            number: 0,
            status: AttemptStatus::Leased,
            lease: Lease::Unexpired,
        }
    }
}

/// An unused slot of [`Rows`] (never read as a row).
impl Default for Batch {
    fn default() -> Self {
        Self {
            key: BatchKey::OfTask,
            attempt: 0,
            checksum: Checksum::A,
        }
    }
}

/// An unused slot of [`Rows`] (never read as a row).
impl Default for Evaluation {
    fn default() -> Self {
        Self {
            attempt: 0,
            status: EvaluationStatus::Pass,
        }
    }
}

impl fmt::Display for Db {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, task) in self.tasks.iter().enumerate() {
            if index > 0 {
                f.write_str("; ")?;
            }
            write!(f, "t{index} {task}")?;
        }
        Ok(())
    }
}

impl fmt::Display for Task {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} count={} last_number={}",
            self.state, self.attempt_count, self.last_attempt_number
        )?;
        if let Some(current) = self.current_attempt {
            write!(f, " current=a{current}")?;
        }
        if self.cancel_requested {
            f.write_str(" cancel_requested")?;
        }
        for (index, attempt) in self.attempts.iter().enumerate() {
            write!(
                f,
                " [a{index} w{} #{} {:?} {:?}]",
                attempt.worker, attempt.number, attempt.status, attempt.lease
            )?;
        }
        for batch in &self.batches {
            write!(
                f,
                " {{batch {:?} from a{} {:?}}}",
                batch.key, batch.attempt, batch.checksum
            )?;
        }
        for evaluation in &self.evaluations {
            write!(
                f,
                " {{evaluation from a{} {:?}}}",
                evaluation.attempt, evaluation.status
            )?;
        }
        Ok(())
    }
}
