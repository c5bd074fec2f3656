//! The stateright model: the database as the shared state, the actions that change it
//! (grants, the clock, the reaper, cancels, and every message any worker may have sent,
//! delivered in any order, any number of times), the invariants as `always` properties and a
//! few `sometimes` properties that show the checks are not vacuous. I16's (evaluations) are
//! apart, in [`evaluation_properties`] and [`observe_evaluations`].

use std::fmt;

use stateright::{Model, Property};

use crate::db::{
    ATTEMPTS_PER_TASK_MAX, AttemptStatus, BatchKey, Checksum, Db, Evaluation, Lease, TASKS_MAX,
    Task, TaskState, WORKERS_MAX,
};
use crate::protocol::{self, Answer, Claim, Protocol, Refusal, Token};

/// The size of the world the checker explores exhaustively.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    pub workers: u8,
    pub tasks: u8,
    /// Every task's `max_attempts`.
    pub max_attempts: u8,
    /// Attempts the model grants one task at most. A release refunds its attempt, so a task
    /// may have more attempts than its budget; one above `max_attempts` lets a release
    /// happen and the budget still be spent.
    pub attempts_per_task_max: u8,
    /// Leases one worker holds at once (`workers.max_concurrent_tasks`).
    pub worker_capacity: u8,
    /// How workers name their batches.
    pub batch_keys: BatchKeys,
    /// Explore one state per class of states that differ only in which worker or which task
    /// is which (they are interchangeable), in the order of batch or evaluation rows, or in
    /// columns no later step reads (the worker and lease of an attempt that ended): fewer
    /// states, but a path shows each state as its class's representative (tasks reordered,
    /// workers renamed).
    pub reduction: bool,
}

impl Bounds {
    /// What the main CI run checks: three workers of capacity 1, two tasks with a budget of
    /// two attempts, up to three attempts per task (so one may be released), batch keys per
    /// attempt as the worker SDK names them.
    pub const CI: Bounds = Bounds {
        workers: 3,
        tasks: 2,
        max_attempts: 2,
        attempts_per_task_max: 3,
        worker_capacity: 1,
        batch_keys: BatchKeys::PerAttempt,
        reduction: true,
    };
}

/// How workers name their batches (the protocol lets a worker choose its idempotency keys).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchKeys {
    /// Each attempt its own key, as the worker SDK does (`{attempt_id}:{sequence}`).
    PerAttempt,
    /// One key for every attempt of a task ([`BatchKey::OfTask`]): a key is its attempt's,
    /// so each attempt's batch under it is its own, and every attempt can complete with it.
    PerTask,
    /// Either, for every batch.
    Both,
}

/// The model: a protocol (the real one or a seeded bug) within bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseModel {
    pub bounds: Bounds,
    pub protocol: Protocol,
}

/// The database and what the monitors saw on the way to it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct State {
    pub db: Db,
    pub monitor: Monitor,
}

/// History the invariants about steps need (a state alone cannot tell that a write changed
/// something it should not have). Each flag is set by the step that saw it and never cleared;
/// the `always` flags stay false in every state of a correct protocol, so they cost no states.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Monitor {
    /// I1: a write whose claim did not hold its lease (superseded, ended or expired attempt)
    /// or carried a wrong token changed the database.
    pub write_without_lease_applied: bool,
    /// I2: a batch whose (attempt, key) was already accepted changed the database.
    pub replay_wrote: bool,
    /// I2: a batch sent with its attempt's own claim was answered otherwise than its
    /// (attempt, key) row says (`duplicate` for the same checksum, `batch_conflict` for
    /// another), or acknowledged without its row.
    pub replay_misanswered: bool,
    /// I1: a message without its attempt's token was answered otherwise than `lease_lost` or
    /// `cancel_requested` (acknowledged, or told about the attempt's batches).
    pub foreign_claim_answered: bool,
    /// I8: a step changed a task that had ended (or one of its attempts or batches).
    pub terminal_changed: bool,
    /// I16: a step changed a task's evaluation rows without a claim that held the task's lease
    /// at that moment (by the SPEC's words): a stale worker's write, or another step's.
    pub evaluation_written_without_lease: bool,
    /// I16: a replay (a batch whose (attempt, key) was already accepted, or the completion of
    /// an attempt that already succeeded) changed its task's evaluation rows.
    pub replay_changed_evaluations: bool,
    /// I16 (and I8): a step changed the evaluation rows of a task that had ended.
    pub terminal_evaluations_changed: bool,
    /// Coverage: a write from an attempt superseded by a later one was refused.
    pub superseded_write_refused: bool,
}

/// One step of the world.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Dispatch's acquire for `worker` grants `task` ([`protocol::grant`]).
    Acquire { worker: u8, task: u8 },
    /// The clock passes a live lease's expiry ([`protocol::lapse`]).
    Lapse { task: u8, attempt: u8 },
    /// The reaper's stale recovery claims an attempt ([`protocol::recover`]).
    Recover { task: u8, attempt: u8 },
    /// A client cancels the task's scan ([`protocol::cancel`]).
    Cancel { task: u8 },
    /// A message about an attempt reaches the decider (dispatch or ingestion).
    Deliver { task: u8, claim: Claim, verb: Verb },
}

/// What a worker's message asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verb {
    Renew,
    Release,
    Result { key: BatchKey, checksum: Checksum },
    Complete { batch_count: u8 },
    Fail { retryable: bool },
}

pub const I1_ONE_LIVE_ATTEMPT: &str = "I1: at most one live attempt per task";
pub const I1_NUMBERS_INCREASE: &str = "I1: attempt numbers strictly increase";
pub const I1_WRITE_NEEDS_LEASE: &str =
    "I1: a write with a superseded attempt, a wrong token or an expired lease changes nothing";
pub const I1_FOREIGN_CLAIM_REFUSED: &str =
    "I1: a message without its attempt's token is refused lease_lost or cancel_requested";
pub const I2_KEY_ACCEPTED_ONCE: &str = "I2: an (attempt, idempotency key) is accepted once";
pub const I2_REPLAY_WRITES_NOTHING: &str =
    "I2: a replay writes nothing: same checksum duplicate, another batch_conflict";
pub const I8_TERMINAL_IS_TERMINAL: &str =
    "I8: nothing changes a completed, failed or cancelled task";
pub const I10_RUNS_WITHIN_BUDGET: &str =
    "I10: a task runs at most max_attempts times, and attempt_count counts its runs";
pub const I10_FAILS_AFTER_BUDGET: &str =
    "I10: failed_terminal only after max_attempts runs (or a failure not retryable)";
pub const I10_WAITS_WITH_BUDGET: &str =
    "I10: a task waits to run (pending or retry_wait) only with budget left";
pub const I16_STALE_WRITES_NO_EVALUATION: &str =
    "I16: only a message holding its task's lease writes or changes an evaluation";
pub const I16_REPLAY_KEEPS_EVALUATIONS: &str =
    "I16: a replayed batch or completion changes no evaluation";
pub const I16_ONE_EVALUATION_PER_KEY: &str = "I16: at most one evaluation per (scan, key)";
pub const I16_COMPLETED_KEEPS_ITS_OWN: &str =
    "I16: a completed task's evaluations are exactly those its completing attempt wrote";
pub const I16_TERMINAL_EVALUATIONS_FIXED: &str =
    "I16: nothing changes the evaluations of a completed, failed or cancelled task";
pub const COMPLETED_AFTER_RECOVERY: &str = "a task completes after the reaper recovered an attempt";
pub const FAILED_WITH_BUDGET_SPENT: &str = "a task fails terminally with its budget spent";
pub const SUPERSEDED_WRITE_REFUSED: &str = "a superseded attempt's write is refused";
pub const RELEASED_TASK_COMPLETES: &str = "a released task completes on a later attempt";
pub const LEASED_TASK_CANCELLED: &str = "a task is cancelled while an attempt holds it";
pub const REUSED_KEY_COMPLETES: &str =
    "a task completes with a batch under a key an earlier attempt's batch used";
pub const EVALUATION_REPLACED: &str = "a later attempt's evaluation replaces an earlier attempt's";
pub const SUPERSEDED_EVALUATION_DELETED: &str =
    "a completion deletes the evaluation an earlier attempt wrote";

impl LeaseModel {
    pub fn new(bounds: Bounds, protocol: Protocol) -> Self {
        assert!(
            (1..=WORKERS_MAX).contains(&usize::from(bounds.workers)),
            "1 to {WORKERS_MAX} workers"
        );
        assert!(
            (1..=TASKS_MAX).contains(&usize::from(bounds.tasks)),
            "1 to {TASKS_MAX} tasks"
        );
        assert!(
            usize::from(bounds.attempts_per_task_max) <= ATTEMPTS_PER_TASK_MAX,
            "at most {ATTEMPTS_PER_TASK_MAX} attempts per task"
        );
        assert!(bounds.max_attempts >= 1, "max_attempts is positive");
        assert!(
            bounds.attempts_per_task_max >= bounds.max_attempts,
            "a task must be able to spend its budget"
        );
        Self { bounds, protocol }
    }

    /// Carries out `action` on `db` and answers it.
    fn apply(&self, db: &mut Db, action: Action) -> Answer {
        let protocol = self.protocol;
        let max_attempts = self.bounds.max_attempts;
        match action {
            Action::Acquire { worker, task } => protocol::grant(
                protocol,
                db,
                usize::from(task),
                worker,
                self.bounds.worker_capacity,
                max_attempts,
            ),
            Action::Lapse { task, attempt } => {
                protocol::lapse(&mut db.tasks[usize::from(task)], attempt)
            }
            Action::Recover { task, attempt } => protocol::recover(
                protocol,
                &mut db.tasks[usize::from(task)],
                attempt,
                max_attempts,
            ),
            Action::Cancel { task } => protocol::cancel(protocol, &mut db.tasks[usize::from(task)]),
            Action::Deliver { task, claim, verb } => {
                let task = &mut db.tasks[usize::from(task)];
                match verb {
                    Verb::Renew => protocol::renew(protocol, task, claim),
                    Verb::Release => protocol::release(protocol, task, claim),
                    Verb::Result { key, checksum } => {
                        protocol::accept_batch(protocol, task, claim, key, checksum)
                    }
                    Verb::Complete { batch_count } => {
                        protocol::complete(protocol, task, claim, batch_count)
                    }
                    Verb::Fail { retryable } => {
                        protocol::fail(protocol, task, claim, retryable, max_attempts)
                    }
                }
            }
        }
    }

    /// The monitors: what this step did, judged by the SPEC's words rather than by the
    /// protocol's own checks. Returns whether the step changed the database.
    fn observe(
        &self,
        before: &Db,
        after: &Db,
        action: Action,
        answer: Answer,
        monitor: &mut Monitor,
    ) -> bool {
        let changed = before != after;
        observe_evaluations(before, after, action, monitor);
        if changed {
            for (was, is) in before.tasks.iter().zip(&after.tasks) {
                if was.state.is_terminal() && was != is {
                    monitor.terminal_changed = true;
                }
            }
        }
        let Action::Deliver { task, claim, verb } = action else {
            return changed;
        };
        let was = &before.tasks[usize::from(task)];
        let is = &after.tasks[usize::from(task)];
        if changed && !holds_lease_per_spec(was, claim) {
            monitor.write_without_lease_applied = true;
        }
        if claim.token == Token::Wrong
            && !matches!(
                answer,
                Answer::Refused(Refusal::LeaseLost | Refusal::CancelRequested)
            )
        {
            monitor.foreign_claim_answered = true;
        }
        if let Verb::Result { key, checksum } = verb {
            match was.batch(claim.attempt, key) {
                Some(row) => {
                    let expected = if row.checksum == checksum {
                        Answer::Duplicate
                    } else {
                        Answer::Refused(Refusal::BatchConflict)
                    };
                    if changed {
                        monitor.replay_wrote = true;
                    }
                    // A claim without the token is I1's (`foreign_claim_answered`).
                    if claim.token == Token::Granted && answer != expected {
                        monitor.replay_misanswered = true;
                    }
                }
                None => {
                    let stored = is
                        .batch(claim.attempt, key)
                        .is_some_and(|row| row.checksum == checksum);
                    if answer == Answer::Duplicate || (answer == Answer::Accepted && !stored) {
                        monitor.replay_misanswered = true;
                    }
                }
            }
        }
        let superseded = was
            .current_attempt
            .is_some_and(|current| current > claim.attempt);
        let refused = matches!(
            answer,
            Answer::Refused(Refusal::LeaseLost | Refusal::CancelRequested)
        );
        if superseded && claim.token == Token::Granted && refused && !changed {
            monitor.superseded_write_refused = true;
        }
        changed
    }

    /// The messages a worker may send about one of its attempts. A batch under a key no row
    /// has yet is sent with one checksum only: which of two equal-looking payloads comes
    /// first does not matter, what matters is whether a later one is the same.
    fn verbs(&self, task: &Task, attempt: u8, verbs: &mut Vec<Verb>) {
        verbs.push(Verb::Renew);
        verbs.push(Verb::Release);
        let own = BatchKey::OfAttempt(attempt);
        let keys: &[BatchKey] = match self.bounds.batch_keys {
            BatchKeys::PerAttempt => &[own],
            BatchKeys::PerTask => &[BatchKey::OfTask],
            BatchKeys::Both => &[own, BatchKey::OfTask],
        };
        for &key in keys {
            verbs.push(Verb::Result {
                key,
                checksum: Checksum::A,
            });
            if task.batch(attempt, key).is_some() {
                verbs.push(Verb::Result {
                    key,
                    checksum: Checksum::B,
                });
            }
        }
        verbs.push(Verb::Complete { batch_count: 0 });
        verbs.push(Verb::Complete { batch_count: 1 });
        verbs.push(Verb::Fail { retryable: true });
        verbs.push(Verb::Fail { retryable: false });
    }
}

/// I16's monitors: which steps changed a task's evaluation rows, judged by the SPEC's words
/// ("a stale worker writes no evaluation; a replay neither duplicates nor drops one"; a
/// terminal task does not change), not by the protocol's checks.
fn observe_evaluations(before: &Db, after: &Db, action: Action, monitor: &mut Monitor) {
    for (index, (was, is)) in before.tasks.iter().zip(&after.tasks).enumerate() {
        if was.evaluations == is.evaluations {
            continue;
        }
        if was.state.is_terminal() {
            monitor.terminal_evaluations_changed = true;
        }
        let Action::Deliver { task, claim, verb } = action else {
            monitor.evaluation_written_without_lease = true;
            continue;
        };
        if usize::from(task) != index {
            monitor.evaluation_written_without_lease = true;
            continue;
        }
        if !holds_lease_per_spec(was, claim) {
            monitor.evaluation_written_without_lease = true;
        }
        let replay = match verb {
            Verb::Result { key, .. } => was.batch(claim.attempt, key).is_some(),
            Verb::Complete { .. } => {
                was.attempts[usize::from(claim.attempt)].status == AttemptStatus::Succeeded
            }
            Verb::Renew | Verb::Release | Verb::Fail { .. } => false,
        };
        if replay {
            monitor.replay_changed_evaluations = true;
        }
    }
}

/// I16's properties: the state invariants (one evaluation per key; a completed task keeps
/// exactly its completing attempt's), the monitors' (stale writes, replays, terminal tasks),
/// and examples of an evaluation replaced by a later attempt's and of one deleted by a
/// completion.
fn evaluation_properties() -> Vec<Property<LeaseModel>> {
    vec![
        Property::always(
            I16_STALE_WRITES_NO_EVALUATION,
            |_: &LeaseModel, state: &State| !state.monitor.evaluation_written_without_lease,
        ),
        Property::always(
            I16_REPLAY_KEEPS_EVALUATIONS,
            |_: &LeaseModel, state: &State| !state.monitor.replay_changed_evaluations,
        ),
        Property::always(
            I16_ONE_EVALUATION_PER_KEY,
            |_: &LeaseModel, state: &State| {
                // Every row is of the task's one key.
                state
                    .db
                    .tasks
                    .iter()
                    .all(|task| task.evaluations.len() <= 1)
            },
        ),
        Property::always(
            I16_COMPLETED_KEEPS_ITS_OWN,
            |_: &LeaseModel, state: &State| state.db.tasks.iter().all(completed_keeps_its_own),
        ),
        Property::always(
            I16_TERMINAL_EVALUATIONS_FIXED,
            |_: &LeaseModel, state: &State| !state.monitor.terminal_evaluations_changed,
        ),
        Property::sometimes(EVALUATION_REPLACED, |_: &LeaseModel, state: &State| {
            state.db.tasks.iter().any(|task| {
                task.evaluations.iter().any(|evaluation| {
                    (task.batches.iter()).any(|batch| batch.attempt < evaluation.attempt)
                })
            })
        }),
        Property::sometimes(
            SUPERSEDED_EVALUATION_DELETED,
            |_: &LeaseModel, state: &State| {
                // Every accepted batch wrote an evaluation: only a completion removes one.
                state.db.tasks.iter().any(|task| {
                    task.state == TaskState::Completed
                        && task.evaluations.is_empty()
                        && !task.batches.is_empty()
                })
            },
        ),
    ]
}

/// I16 at a completion: a completed task's evaluation rows are exactly the one its completing
/// attempt's accepted batch wrote (with that batch's verdict), or none when it sent no batch:
/// no superseded attempt's survives, and the completing attempt's is not dropped.
fn completed_keeps_its_own(task: &Task) -> bool {
    if task.state != TaskState::Completed {
        return true;
    }
    let completing = (task.attempts.iter())
        .position(|attempt| attempt.status == AttemptStatus::Succeeded)
        .map(|index| u8::try_from(index).expect("attempts are bounded"));
    // The completing attempt's last accepted batch (it has one at most, sequence number 0).
    let expected: Option<Evaluation> = (task.batches.iter())
        .rfind(|batch| Some(batch.attempt) == completing)
        .map(|batch| Evaluation {
            attempt: batch.attempt,
            status: batch.checksum.evaluation_status(),
        });
    *task.evaluations == *expected.as_slice()
}

/// SPEC I1, in its own words: a write may change something only when it names its task's
/// current attempt, with that attempt's token, and the attempt is live with its lease
/// unexpired.
fn holds_lease_per_spec(task: &Task, claim: Claim) -> bool {
    let attempt = task.attempts[usize::from(claim.attempt)];
    claim.token == Token::Granted
        && task.current_attempt == Some(claim.attempt)
        && attempt.status.is_live()
        && attempt.lease == Lease::Unexpired
}

impl Model for LeaseModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            db: Db::new(self.bounds.tasks),
            monitor: Monitor::default(),
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        let mut verbs = Vec::new();
        for (task_index, task) in state.db.tasks.iter().enumerate() {
            let task_id = u8::try_from(task_index).expect("tasks are bounded");
            if task.attempts.len() < usize::from(self.bounds.attempts_per_task_max) {
                for worker in 0..self.bounds.workers {
                    actions.push(Action::Acquire {
                        worker,
                        task: task_id,
                    });
                }
            }
            actions.push(Action::Cancel { task: task_id });
            for (attempt_index, attempt) in task.attempts.iter().enumerate() {
                let attempt_id = u8::try_from(attempt_index).expect("attempts are bounded");
                if attempt.status.is_live() {
                    actions.push(match attempt.lease {
                        Lease::Unexpired => Action::Lapse {
                            task: task_id,
                            attempt: attempt_id,
                        },
                        Lease::Expired => Action::Recover {
                            task: task_id,
                            attempt: attempt_id,
                        },
                    });
                }
                verbs.clear();
                self.verbs(task, attempt_id, &mut verbs);
                for token in [Token::Granted, Token::Wrong] {
                    for &verb in &verbs {
                        actions.push(Action::Deliver {
                            task: task_id,
                            claim: Claim {
                                attempt: attempt_id,
                                token,
                            },
                            verb,
                        });
                    }
                }
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut db = last.db;
        let answer = self.apply(&mut db, action);
        let mut monitor = last.monitor;
        let changed = self.observe(&last.db, &db, action, answer, &mut monitor);
        if !changed && monitor == last.monitor {
            return None;
        }
        if self.bounds.reduction {
            db = crate::reduce::representative(db);
        }
        Some(State { db, monitor })
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            Property::always(I1_ONE_LIVE_ATTEMPT, |_: &LeaseModel, state: &State| {
                state.db.tasks.iter().all(|task| {
                    task.attempts
                        .iter()
                        .filter(|attempt| attempt.status.is_live())
                        .count()
                        <= 1
                })
            }),
            Property::always(I1_NUMBERS_INCREASE, |_: &LeaseModel, state: &State| {
                state.db.tasks.iter().all(|task| {
                    task.attempts
                        .windows(2)
                        .all(|pair| pair[0].number < pair[1].number)
                        && task
                            .attempts
                            .last()
                            .is_none_or(|last| last.number == task.last_attempt_number)
                })
            }),
            Property::always(I1_WRITE_NEEDS_LEASE, |_: &LeaseModel, state: &State| {
                !state.monitor.write_without_lease_applied
            }),
            Property::always(I1_FOREIGN_CLAIM_REFUSED, |_: &LeaseModel, state: &State| {
                !state.monitor.foreign_claim_answered
            }),
            Property::always(I2_KEY_ACCEPTED_ONCE, |_: &LeaseModel, state: &State| {
                state.db.tasks.iter().all(|task| {
                    task.batches.iter().enumerate().all(|(index, batch)| {
                        task.batches[..index].iter().all(|earlier| {
                            (earlier.attempt, earlier.key) != (batch.attempt, batch.key)
                        })
                    })
                })
            }),
            Property::always(I2_REPLAY_WRITES_NOTHING, |_: &LeaseModel, state: &State| {
                !state.monitor.replay_wrote && !state.monitor.replay_misanswered
            }),
            Property::always(I8_TERMINAL_IS_TERMINAL, |_: &LeaseModel, state: &State| {
                !state.monitor.terminal_changed
            }),
            Property::always(
                I10_RUNS_WITHIN_BUDGET,
                |model: &LeaseModel, state: &State| {
                    state.db.tasks.iter().all(|task| {
                        task.runs() <= usize::from(model.bounds.max_attempts)
                            && task.runs() == usize::from(task.attempt_count)
                    })
                },
            ),
            Property::always(
                I10_FAILS_AFTER_BUDGET,
                |model: &LeaseModel, state: &State| {
                    state.db.tasks.iter().all(|task| {
                        task.state != TaskState::FailedTerminal
                            || task.runs() == usize::from(model.bounds.max_attempts)
                            || task.attempts.last().is_some_and(|last| {
                                last.status == AttemptStatus::Failed { retryable: false }
                            })
                    })
                },
            ),
            Property::always(
                I10_WAITS_WITH_BUDGET,
                |model: &LeaseModel, state: &State| {
                    state.db.tasks.iter().all(|task| {
                        !task.state.is_due() || task.attempt_count < model.bounds.max_attempts
                    })
                },
            ),
            Property::sometimes(COMPLETED_AFTER_RECOVERY, |_: &LeaseModel, state: &State| {
                state.db.tasks.iter().any(|task| {
                    task.state == TaskState::Completed
                        && task
                            .attempts
                            .iter()
                            .any(|attempt| attempt.status == AttemptStatus::Expired)
                })
            }),
            Property::sometimes(
                FAILED_WITH_BUDGET_SPENT,
                |model: &LeaseModel, state: &State| {
                    state.db.tasks.iter().any(|task| {
                        task.state == TaskState::FailedTerminal
                            && task.runs() == usize::from(model.bounds.max_attempts)
                            && task
                                .attempts
                                .last()
                                .is_some_and(|last| last.status == AttemptStatus::Expired)
                    })
                },
            ),
            Property::sometimes(SUPERSEDED_WRITE_REFUSED, |_: &LeaseModel, state: &State| {
                state.monitor.superseded_write_refused
            }),
            Property::sometimes(RELEASED_TASK_COMPLETES, |_: &LeaseModel, state: &State| {
                state.db.tasks.iter().any(|task| {
                    task.state == TaskState::Completed
                        && task
                            .attempts
                            .iter()
                            .any(|attempt| attempt.status == AttemptStatus::Released)
                })
            }),
            Property::sometimes(LEASED_TASK_CANCELLED, |_: &LeaseModel, state: &State| {
                state.db.tasks.iter().any(|task| {
                    task.state == TaskState::Cancelled
                        && task
                            .attempts
                            .iter()
                            .any(|attempt| attempt.status == AttemptStatus::Cancelled)
                })
            }),
            Property::sometimes(REUSED_KEY_COMPLETES, |_: &LeaseModel, state: &State| {
                state.db.tasks.iter().any(|task| {
                    task.state == TaskState::Completed
                        && task.batches.iter().any(|batch| {
                            task.attempts[usize::from(batch.attempt)].status
                                == AttemptStatus::Succeeded
                                && task.batches.iter().any(|earlier| {
                                    earlier.key == batch.key && earlier.attempt < batch.attempt
                                })
                        })
                })
            }),
        ];
        properties.extend(evaluation_properties());
        properties
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.db)?;
        let Monitor {
            write_without_lease_applied,
            replay_wrote,
            replay_misanswered,
            foreign_claim_answered,
            terminal_changed,
            evaluation_written_without_lease,
            replay_changed_evaluations,
            terminal_evaluations_changed,
            superseded_write_refused: _,
        } = self.monitor;
        for (seen, what) in [
            (
                write_without_lease_applied,
                "a write without the lease changed the database",
            ),
            (replay_wrote, "a replayed batch changed the database"),
            (
                replay_misanswered,
                "a batch was answered otherwise than its (attempt, key) row says",
            ),
            (
                foreign_claim_answered,
                "a message without its attempt's token got more than a lease_lost or cancel_requested",
            ),
            (terminal_changed, "a terminal task changed"),
            (
                evaluation_written_without_lease,
                "an evaluation changed without the lease",
            ),
            (replay_changed_evaluations, "a replay changed an evaluation"),
            (
                terminal_evaluations_changed,
                "a terminal task's evaluations changed",
            ),
        ] {
            if seen {
                write!(f, " <<{what}>>")?;
            }
        }
        Ok(())
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Action::Acquire { worker, task } => write!(f, "w{worker} acquires t{task}"),
            Action::Lapse { task, attempt } => write!(f, "the lease of t{task}/a{attempt} lapses"),
            Action::Recover { task, attempt } => {
                write!(f, "the reaper recovers t{task}/a{attempt}")
            }
            Action::Cancel { task } => write!(f, "a client cancels t{task}"),
            Action::Deliver { task, claim, verb } => {
                let token = match claim.token {
                    Token::Granted => "its token",
                    Token::Wrong => "a WRONG token",
                };
                write!(
                    f,
                    "{verb:?} for t{task}/a{} with {token} arrives",
                    claim.attempt
                )
            }
        }
    }
}

/// A path: each state with the action taken from it (none from the last).
pub type Steps = Vec<(State, Option<Action>)>;

/// A path, one line per step: a state, then the action taken from it.
pub fn describe_steps(steps: &[(State, Option<Action>)]) -> String {
    let mut lines = Vec::new();
    for (state, action) in steps {
        lines.push(format!("  {state}"));
        if let Some(action) = action {
            lines.push(format!("{action}"));
        }
    }
    lines.join("\n")
}
