//! palisade's task-lease protocol as a model, checked exhaustively for small bounds with
//! [stateright](https://docs.rs/stateright): SPEC I1 (fencing), I2 (batch idempotency), I8
//! (terminal is terminal), I10 (attempt budget) and I16 (evaluations: a stale worker writes
//! none, a replay neither duplicates nor drops one).
//!
//! **What is modelled.** The database is the shared state ([`db::Db`]): tasks (state,
//! `attempt_count`, `last_attempt_number`, current attempt, cancel requested), their
//! attempts (worker, fencing number, status, whether the lease has expired) and their
//! accepted result batches (sending attempt, idempotency key, checksum; a key is its
//! attempt's, unique per attempt, since issue 26), and the evaluations those batches wrote
//! (issue 47: each task has one evaluation key, one rule on one resource, that every batch
//! reports; its row holds the attempt that wrote it and a verdict that follows the batch's
//! checksum, so it adds no branching of its own). An accepted batch upserts the key's row in
//! its own step (the real write is in the batch's fenced transaction), a later attempt's
//! replacing verdict and attempt; a refused or replayed batch writes none; a completion
//! deletes the rows other attempts wrote (`findings/delete_superseded_many.sql`, skipped for a
//! task's first attempt, `attempt_number = 1`). In the real protocol a task's evaluation row
//! follows from its other rows (the latest batch's, unless a completion without a batch
//! deleted it), so evaluations add no states, only checks. Every decision is one atomic step
//! ([`protocol`]), as each is one transaction under row locks in PostgreSQL; each function
//! names the `.sql` file or store function it stands for. The steps ([`model::Action`]):
//! - dispatch's grant (acquire) of any due task with budget left to any worker below its
//!   capacity;
//! - the database clock passing a lease's expiry (a lease may lapse at any moment unless
//!   renewed: a worker that crashed, stalled or was cut off renews nothing);
//! - the reaper's stale recovery of an expired attempt: the task retries with backoff, or
//!   fails terminally once its budget is spent;
//! - a client's cancel;
//! - the delivery of a worker's message: renew, release, result batch (a key of its attempt's
//!   own or one every attempt of the task sends, each attempt's batch under it its own; the
//!   first checksum or another), completion (with
//!   `batch_count` 0 or 1), failure (retryable or not), each carrying the attempt's token or
//!   a wrong one.
//!
//! **The network.** Every message any worker may have sent about any attempt ever granted is
//! deliverable at any later moment, any number of times, in any order: a worker may send
//! anything about a lease it was granted, crash right after (forgetting its leases, so they
//! lapse), and JetStream or core NATS may deliver what it sent late, twice, or after newer
//! messages. Instead of a multiset of messages in flight, the model lets every such message
//! arrive in every state; the states are then only the database's, and crashes,
//! duplication, reordering and loss (a message never delivered) all lie within what is
//! explored. A worker's restart is the same identity acquiring again.
//!
//! **What is abstracted.** Time is only which leases have expired; backoff (`available_at`)
//! is over at once, so acquire may take a `retry_wait` task at any moment. Which due task a
//! grant picks, and which expired attempts a sweep claims, are left open (every choice is
//! explored). Each attempt sends at most one batch (sequence number 0). Not modelled:
//! acquire's replay by request id, hello, revocation, execution deadlines, the stranded-task
//! sweep (its half that fails a due task whose budget is spent would never find one: a task
//! waits to run only with budget left, an invariant), evidence and scans beyond one task per
//! scan, findings and assets (deleted at a completion as evaluations are), evaluations of
//! several keys or several in one batch (within a batch the last wins), a batch carried in its
//! completion (`final_batch`), and the schema's constraints (unique attempt numbers, one live
//! attempt, unique `(attempt_id, idempotency_key)`, `(attempt_id, sequence_number)` and
//! `(scan_id, evaluation_key)`): the model checks that the protocol's own checks keep the
//! invariants, so the constraints remain a backstop that never fires.
//!
//! **The invariants** are `always` properties of [`LeaseModel`]; those about steps (a write
//! without its lease changed nothing, a replay wrote nothing, a terminal task did not change)
//! are judged by monitors ([`model::Monitor`]) that compare the database before and after
//! each step by the SPEC's words, not by the protocol's own checks. SPEC I2 says "a (task,
//! idempotency key) is accepted once"; the implementation scopes a key by its attempt (issue
//! 26 allowed it), and the model checks what it guarantees: an (attempt, key) is accepted
//! once, a replay with the attempt's own claim (lease held or not) writes nothing and gets
//! the row's answer, and a message without the attempt's token is refused `lease_lost` (or
//! `cancel_requested`), learning nothing of the attempt's batches. I16 is judged the same
//! way: every step that changed a task's evaluation rows was a message naming that task's
//! current, live, unexpired attempt with its token (a stale worker writes none); a replay (a
//! batch whose (attempt, key) was accepted, a completion of an attempt that succeeded)
//! changes none; the key has at most one row (no duplicate); a completed task's rows are
//! exactly the one its completing attempt's batch wrote, with that batch's verdict, or none
//! if it sent no batch (no superseded attempt's survives, the completer's is not dropped);
//! and a terminal task's rows never change. `sometimes` properties show the model reaches
//! what the invariants are about (a completion after a recovery, a task failed with its
//! budget spent, a superseded write refused, a released task completing later, a cancel of a
//! leased task, a later attempt's evaluation replacing an earlier one's, a completion
//! deleting an earlier attempt's evaluation, and, where attempts share a key, a later attempt
//! completing with its own batch under it).
//!
//! **Seeded bugs** ([`protocol::Bug`]) each remove or change one check; the tests show the
//! checker finds a counterexample for each, and none for [`protocol::Protocol::Real`].
//!
//! **Checking.** [`check`] explores every reachable state breadth first on every core. With
//! [`Bounds::reduction`] (the exhaustive runs) a state is replaced by the representative of
//! its class: workers and tasks renamed (they are interchangeable), batch and evaluation rows
//! sorted, and the worker and lease of an ended attempt blanked (no later step reads them).
//! [`shortest_counterexample`] deepens one step at a time on one thread, without the
//! reduction, so that a seeded bug's path is a shortest one and reads as it happened. Run the
//! tests with `cargo nextest run -p lease-model --no-capture` to see counts, times and
//! counterexamples; `cargo run -p lease-model --example explore` tries other bounds or a
//! seeded bug.

pub mod db;
pub mod model;
pub mod protocol;
mod reduce;
pub mod rows;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use stateright::{Checker, HasDiscoveries, Model, Path};

pub use model::{Action, BatchKeys, Bounds, LeaseModel, State, Steps, describe_steps};
pub use protocol::{Bug, Protocol};

/// What one run of the checker found.
pub struct Run {
    /// Distinct states explored (classes of states when [`Bounds::reduction`] is on).
    pub unique_states: usize,
    /// States generated, repeats included.
    pub states: usize,
    pub max_depth: usize,
    pub elapsed: Duration,
    /// Property name → the path that shows it (a counterexample for `always`, an example for
    /// `sometimes`), not necessarily a shortest one.
    pub discoveries: Vec<(&'static str, Path<State, Action>)>,
}

impl Run {
    /// The path found for `property`, if any.
    pub fn discovery(&self, property: &str) -> Option<&Path<State, Action>> {
        self.discoveries
            .iter()
            .find(|(name, _)| *name == property)
            .map(|(_, path)| path)
    }
}

/// Checks `model` breadth first on every core, until every reachable state has been explored
/// or `until` holds.
pub fn check(model: LeaseModel, until: HasDiscoveries) -> Run {
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    run(model, until, threads, None)
}

/// A shortest path to a state that breaks one of `broken` (invariants of `model`), with the
/// invariant it breaks and the run that found it: breadth first on one thread (so that every
/// state is first reached by a shortest path), deepening one step at a time up to
/// `depth_max` steps. `None` when no path of at most `depth_max` steps breaks any of them.
pub fn shortest_counterexample(
    model: LeaseModel,
    broken: &[&'static str],
    depth_max: usize,
) -> Option<(&'static str, Steps, Run)> {
    let known = invariants(&model);
    for invariant in broken {
        assert!(
            known.contains(invariant),
            "{invariant:?} is not an invariant of the model"
        );
    }
    let wanted: BTreeSet<&'static str> = broken.iter().copied().collect();
    for steps in 1..=depth_max {
        // The checker counts the initial state as depth 1 and skips states at the target.
        let run = run(
            model,
            HasDiscoveries::AnyOf(wanted.clone()),
            1,
            Some(steps + 2),
        );
        let found = run
            .discoveries
            .iter()
            .find(|(name, _)| wanted.contains(name))
            .map(|(name, path)| (*name, path.clone().into_vec()));
        if let Some((invariant, path)) = found {
            assert_eq!(
                path.len(),
                steps + 1,
                "breadth first finds the shortest path"
            );
            return Some((invariant, path, run));
        }
        if run.max_depth < steps + 1 {
            // Every reachable state was explored: no path breaks them.
            return None;
        }
    }
    None
}

fn run(model: LeaseModel, until: HasDiscoveries, threads: usize, depth: Option<usize>) -> Run {
    let started = Instant::now();
    let builder = model.checker().threads(threads).finish_when(until);
    let builder = match depth {
        Some(depth) => builder.target_max_depth(depth),
        None => builder,
    };
    let checker = builder.spawn_bfs().join();
    let elapsed = started.elapsed();
    let mut discoveries: Vec<_> = checker.discoveries().into_iter().collect();
    discoveries.sort_by_key(|(name, _)| *name);
    Run {
        unique_states: checker.unique_state_count(),
        states: checker.state_count(),
        max_depth: checker.max_depth(),
        elapsed,
        discoveries,
    }
}

/// The names of `model`'s `always` properties.
pub fn invariants(model: &LeaseModel) -> Vec<&'static str> {
    model
        .properties()
        .into_iter()
        .filter(|property| property.expectation == stateright::Expectation::Always)
        .map(|property| property.name)
        .collect()
}
