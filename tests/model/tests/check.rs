//! The lease model checked exhaustively (issue 9, item 6; I16 since issue 47): the real
//! protocol keeps I1, I2, I8, I10 and I16 in every reachable state, reaching every `sometimes`
//! state on the way, and each seeded bug is caught with a counterexample. Counts and times are
//! printed (see them with `cargo nextest run -p lease-model --no-capture`); the counts are
//! pinned so that a change to the model shows up here and in `docs/ARCHITECTURE.md`, which
//! quotes them. (Evaluations changed no count: in the real protocol a task's evaluation row
//! follows from its other rows.)

use lease_model::model::{
    COMPLETED_AFTER_RECOVERY, EVALUATION_REPLACED, FAILED_WITH_BUDGET_SPENT,
    I1_FOREIGN_CLAIM_REFUSED, I1_NUMBERS_INCREASE, I1_ONE_LIVE_ATTEMPT, I1_WRITE_NEEDS_LEASE,
    I2_KEY_ACCEPTED_ONCE, I2_REPLAY_WRITES_NOTHING, I8_TERMINAL_IS_TERMINAL,
    I10_FAILS_AFTER_BUDGET, I10_WAITS_WITH_BUDGET, I16_COMPLETED_KEEPS_ITS_OWN,
    I16_ONE_EVALUATION_PER_KEY, I16_REPLAY_KEEPS_EVALUATIONS, I16_STALE_WRITES_NO_EVALUATION,
    I16_TERMINAL_EVALUATIONS_FIXED, LEASED_TASK_CANCELLED, RELEASED_TASK_COMPLETES,
    REUSED_KEY_COMPLETES, SUPERSEDED_EVALUATION_DELETED, SUPERSEDED_WRITE_REFUSED,
};
use lease_model::{
    BatchKeys, Bounds, Bug, LeaseModel, Protocol, Run, check, describe_steps, invariants,
    shortest_counterexample,
};
use stateright::HasDiscoveries;

/// The bounds of the exhaustive runs ([`Bounds::CI`]). With two tasks at most two attempts
/// are live at once, so the third worker adds actions but, with the reduction, no states
/// (two workers give the same count); the run with three tasks keeps all three busy.
const BOUNDS: Bounds = Bounds::CI;

const EXAMPLES: [&str; 7] = [
    COMPLETED_AFTER_RECOVERY,
    FAILED_WITH_BUDGET_SPENT,
    SUPERSEDED_WRITE_REFUSED,
    RELEASED_TASK_COMPLETES,
    LEASED_TASK_CANCELLED,
    EVALUATION_REPLACED,
    SUPERSEDED_EVALUATION_DELETED,
];

/// The examples of a run where attempts share a batch key: also a later attempt completing
/// with its own batch under a key an earlier attempt's batch used (a key is its attempt's).
const EXAMPLES_SHARED_KEYS: [&str; 8] = [
    COMPLETED_AFTER_RECOVERY,
    FAILED_WITH_BUDGET_SPENT,
    SUPERSEDED_WRITE_REFUSED,
    RELEASED_TASK_COMPLETES,
    LEASED_TASK_CANCELLED,
    EVALUATION_REPLACED,
    SUPERSEDED_EVALUATION_DELETED,
    REUSED_KEY_COMPLETES,
];

fn print_run(what: &str, run: &Run) {
    println!(
        "{what}: {} states ({} generated), depth {}, {:.2?}",
        run.unique_states, run.states, run.max_depth, run.elapsed
    );
}

/// Explores every reachable state of the real protocol and requires no counterexample, an
/// example of each of `examples`, and `states` states.
fn assert_real_protocol_holds(bounds: Bounds, examples: &[&'static str], states: usize) {
    let model = LeaseModel::new(bounds, Protocol::Real);
    let run = check(model, HasDiscoveries::All);
    print_run(&format!("real protocol, {bounds:?}"), &run);
    for invariant in invariants(&model) {
        if let Some(path) = run.discovery(invariant) {
            panic!(
                "counterexample to {invariant:?}:\n{}",
                describe_steps(&path.clone().into_vec())
            );
        }
    }
    for &example in examples {
        assert!(
            run.discovery(example).is_some(),
            "never reached: {example:?}"
        );
    }
    assert_eq!(
        run.unique_states, states,
        "the model changed: update the counts here and in docs/ARCHITECTURE.md"
    );
}

#[test]
fn the_real_protocol_keeps_every_invariant() {
    assert_real_protocol_holds(BOUNDS, &EXAMPLES, 344_868);
}

#[test]
fn the_real_protocol_keeps_every_invariant_when_attempts_share_batch_keys() {
    // A key is its attempt's, so one key shared by every attempt decides as each attempt's
    // own key does: the same count as with per-attempt keys, every attempt able to complete
    // with its batch (when a later attempt's batch replayed an earlier one's, 126,106).
    assert_real_protocol_holds(
        Bounds {
            batch_keys: BatchKeys::PerTask,
            ..BOUNDS
        },
        &EXAMPLES_SHARED_KEYS,
        344_868,
    );
}

#[test]
fn the_real_protocol_keeps_every_invariant_with_a_larger_budget() {
    // One task, a budget of three, up to four attempts, batches under either key.
    assert_real_protocol_holds(
        Bounds {
            tasks: 1,
            max_attempts: 3,
            attempts_per_task_max: 4,
            batch_keys: BatchKeys::Both,
            ..BOUNDS
        },
        &EXAMPLES_SHARED_KEYS,
        37_927,
    );
}

#[test]
fn the_real_protocol_keeps_every_invariant_with_three_workers_busy_at_once() {
    // Three tasks, so that three attempts are live at once; a budget of one (a recovered
    // task cannot run again, so it never completes after a recovery).
    assert_real_protocol_holds(
        Bounds {
            tasks: 3,
            max_attempts: 1,
            attempts_per_task_max: 2,
            ..BOUNDS
        },
        &EXAMPLES[1..],
        97_710,
    );
}

/// Steps a seeded bug's shortest counterexample may take at most.
const COUNTEREXAMPLE_STEPS_MAX: usize = 12;

/// Finds the shortest path by which `bug` breaks its invariant, prints it, and returns its
/// actions. Without the reduction, so that the path shows tasks and workers as they are.
fn counterexample(bug: Bug) -> Vec<String> {
    let broken = broken_by(bug);
    let bounds = Bounds {
        reduction: false,
        // Only a key that several attempts send can be looked up by task.
        batch_keys: if bug == Bug::BatchKeyByTask {
            BatchKeys::PerTask
        } else {
            BOUNDS.batch_keys
        },
        ..BOUNDS
    };
    let model = LeaseModel::new(bounds, Protocol::Seeded(bug));
    let (_, steps, run) = shortest_counterexample(model, &[broken], COUNTEREXAMPLE_STEPS_MAX)
        .unwrap_or_else(|| panic!("{bug:?} was not caught by {broken:?}"));
    print_run(&format!("{bug:?}, last deepening"), &run);
    println!("{bug:?} breaks {broken:?}:\n{}", describe_steps(&steps));
    steps
        .into_iter()
        .filter_map(|(_, action)| action)
        .map(|action| action.to_string())
        .collect()
}

#[test]
fn a_fence_without_its_token_check_is_caught() {
    let actions = counterexample(Bug::FenceSkipsToken);
    // The shortest: a lease is granted, and a message naming it with a wrong token writes.
    assert_eq!(actions.len(), 2, "{actions:?}");
    assert!(actions[0].contains("acquires"), "{actions:?}");
    assert!(actions[1].contains("WRONG token"), "{actions:?}");
}

/// The invariant each seeded bug breaks (a new bug does not compile until it says which).
fn broken_by(bug: Bug) -> &'static str {
    match bug {
        Bug::FenceSkipsToken | Bug::RenewSkipsExpiry => I1_WRITE_NEEDS_LEASE,
        Bug::NumberFromBudget => I1_NUMBERS_INCREASE,
        Bug::RecoveryIgnoresBudget => I10_WAITS_WITH_BUDGET,
        Bug::ReplayIgnoresChecksum | Bug::BatchKeyByTask => I2_REPLAY_WRITES_NOTHING,
        Bug::ReplayBeforeFence => I1_FOREIGN_CLAIM_REFUSED,
        Bug::CancelIgnoresTerminal => I8_TERMINAL_IS_TERMINAL,
        Bug::GrantSkipsStateCheck => I1_ONE_LIVE_ATTEMPT,
        Bug::BatchKeyUnchecked => I2_KEY_ACCEPTED_ONCE,
        Bug::FailureIgnoresRetryable => I10_FAILS_AFTER_BUDGET,
        Bug::EvaluationsBeforeFence => I16_STALE_WRITES_NO_EVALUATION,
        Bug::ReplayWritesEvaluations => I16_REPLAY_KEEPS_EVALUATIONS,
        Bug::EvaluationInsertedNotUpserted => I16_ONE_EVALUATION_PER_KEY,
        Bug::UpsertKeepsAttempt
        | Bug::CompletionKeepsSupersededEvaluations
        | Bug::SupersededSkipByBudget => I16_COMPLETED_KEEPS_ITS_OWN,
    }
}

/// The attempt a delivered message names (`t0/a1` of "… for t0/a1 with …").
fn attempt_of(action: &str) -> String {
    let rest = action.split(" for ").nth(1).unwrap_or_default();
    rest.split(' ').next().unwrap_or_default().to_owned()
}

/// A message delivered again (with either checksum, for a batch).
fn same_message(one: &str, other: &str) -> bool {
    let unchecked = |action: &str| action.replace("checksum: B", "checksum: A");
    unchecked(one) == unchecked(other)
}

#[test]
fn a_stale_evaluation_written_after_its_task_ended_is_caught_as_a_terminal_change() {
    // EvaluationsBeforeFence breaks I16's first check with a batch refused while its task
    // runs; asked for its terminal check, the checker finds a batch refused after the task
    // ended (completed, failed or cancelled).
    let bounds = Bounds {
        reduction: false,
        ..BOUNDS
    };
    let model = LeaseModel::new(bounds, Protocol::Seeded(Bug::EvaluationsBeforeFence));
    let (_, steps, run) = shortest_counterexample(
        model,
        &[I16_TERMINAL_EVALUATIONS_FIXED],
        COUNTEREXAMPLE_STEPS_MAX,
    )
    .expect("a stale evaluation after the task ended");
    print_run(
        "EvaluationsBeforeFence after the task ended, last deepening",
        &run,
    );
    println!("{}", describe_steps(&steps));
    let actions: Vec<String> = steps
        .into_iter()
        .filter_map(|(_, action)| action)
        .map(|action| action.to_string())
        .collect();
    let last = actions.last().expect("at least one step");
    assert!(last.starts_with("Result"), "{actions:?}");
    let ends = |action: &&String| {
        action.starts_with("Complete") || action.starts_with("Fail") || action.contains("cancels")
    };
    assert!(actions.iter().any(|action| ends(&action)), "{actions:?}");
}

#[test]
fn every_other_seeded_bug_is_caught() {
    for bug in Protocol::BUGS {
        if bug == Bug::FenceSkipsToken {
            continue;
        }
        let actions = counterexample(bug);
        let last = actions.last().expect("a bug needs at least one step");
        match bug {
            Bug::RenewSkipsExpiry => {
                assert!(actions.iter().any(|action| action.contains("lapses")));
                assert!(last.starts_with("Renew"), "{actions:?}");
            }
            Bug::NumberFromBudget => {
                assert!(actions.iter().any(|action| action.starts_with("Release")));
            }
            Bug::ReplayIgnoresChecksum => assert!(last.contains("checksum: B"), "{actions:?}"),
            Bug::BatchKeyUnchecked => {
                // The attempt's batch under its key delivered again (with either checksum),
                // inserted again.
                assert!(last.starts_with("Result"), "{actions:?}");
                assert!(
                    actions[..actions.len() - 1]
                        .iter()
                        .any(|action| same_message(action, last)),
                    "{actions:?}"
                );
            }
            Bug::BatchKeyByTask => {
                // One attempt's batch under the key another attempt's batch used, answered
                // from that attempt's row (a later attempt's, or an earlier one's sent late).
                let shared: Vec<&String> = actions
                    .iter()
                    .filter(|action| action.starts_with("Result { key: OfTask"))
                    .collect();
                assert_eq!(shared.len(), 2, "{actions:?}");
                assert_eq!(shared[1], last, "{actions:?}");
                assert_ne!(attempt_of(shared[0]), attempt_of(last), "{actions:?}");
            }
            Bug::ReplayBeforeFence => {
                assert!(last.starts_with("Result"), "{actions:?}");
                assert!(last.contains("WRONG token"), "{actions:?}");
            }
            Bug::RecoveryIgnoresBudget => {
                // Recovered into retry_wait with the budget spent: no grant needed.
                assert!(last.contains("recovers"), "{actions:?}");
            }
            Bug::EvaluationsBeforeFence => {
                // A batch refused (stale or without the token) still wrote its evaluation.
                assert!(last.starts_with("Result"), "{actions:?}");
            }
            Bug::ReplayWritesEvaluations => {
                assert!(last.starts_with("Result"), "{actions:?}");
                assert!(
                    actions[..actions.len() - 1]
                        .iter()
                        .any(|action| same_message(action, last)),
                    "{actions:?}"
                );
            }
            Bug::EvaluationInsertedNotUpserted => {
                // Two attempts' batches, each inserting the key's evaluation.
                let mut senders: Vec<String> = actions
                    .iter()
                    .filter(|action| action.starts_with("Result"))
                    .map(|action| attempt_of(action))
                    .collect();
                senders.dedup();
                assert!(senders.len() >= 2, "{actions:?}");
            }
            Bug::UpsertKeepsAttempt => {
                // The completing attempt's own evaluation, still naming the earlier attempt,
                // deleted as superseded.
                assert!(
                    last.starts_with("Complete { batch_count: 1 }"),
                    "{actions:?}"
                );
            }
            Bug::CompletionKeepsSupersededEvaluations => {
                assert!(
                    last.starts_with("Complete { batch_count: 0 }"),
                    "{actions:?}"
                );
            }
            Bug::SupersededSkipByBudget => {
                // A release refunded the run: the completing attempt is the task's second but
                // has spent its first run.
                assert!(
                    actions.iter().any(|action| action.starts_with("Release")),
                    "{actions:?}"
                );
                assert!(last.starts_with("Complete"), "{actions:?}");
            }
            Bug::CancelIgnoresTerminal
            | Bug::GrantSkipsStateCheck
            | Bug::FailureIgnoresRetryable
            | Bug::FenceSkipsToken => {}
        }
    }
}
