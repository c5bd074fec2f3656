//! Runs the model once with bounds of your choice, or finds a seeded bug's shortest
//! counterexample, and prints what it found:
//!
//! ```text
//! cargo run -p lease-model --example explore -- [workers tasks max_attempts attempts_per_task_max [attempt|task|both]]
//! cargo run -p lease-model --example explore -- bug FenceSkipsToken [attempt|task|both]
//! ```
//!
//! (`BatchKeyByTask` shows only where attempts share a key: `-- bug BatchKeyByTask task`.)

use lease_model::{
    BatchKeys, Bounds, Bug, LeaseModel, Protocol, check, describe_steps, invariants,
    shortest_counterexample,
};
use stateright::HasDiscoveries;

/// Steps a counterexample may take at most.
const STEPS_MAX: usize = 16;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("bug") {
        let name = args.get(1).map_or("FenceSkipsToken", String::as_str);
        let bug = Protocol::BUGS
            .into_iter()
            .find(|bug| format!("{bug:?}") == name)
            .unwrap_or_else(|| panic!("no seeded bug {name}; one of {:?}", Protocol::BUGS));
        show_bug(bug, batch_keys(args.get(2)));
        return;
    }
    let number = |index: usize, default: u8| {
        args.get(index)
            .map_or(default, |arg| arg.parse().expect("a small number"))
    };
    let bounds = Bounds {
        workers: number(0, Bounds::CI.workers),
        tasks: number(1, Bounds::CI.tasks),
        max_attempts: number(2, Bounds::CI.max_attempts),
        attempts_per_task_max: number(3, Bounds::CI.attempts_per_task_max),
        batch_keys: batch_keys(args.get(4)),
        ..Bounds::CI
    };
    let model = LeaseModel::new(bounds, Protocol::Real);
    let run = check(model, HasDiscoveries::AnyFailures);
    println!(
        "{bounds:?}: {} states ({} generated), depth {}, {:.2?}",
        run.unique_states, run.states, run.max_depth, run.elapsed
    );
    let mut broken = false;
    for invariant in invariants(&model) {
        if let Some(path) = run.discovery(invariant) {
            broken = true;
            println!(
                "counterexample to {invariant:?}:\n{}",
                describe_steps(&path.clone().into_vec())
            );
        }
    }
    if !broken {
        println!("every invariant holds in every reachable state");
    }
}

fn batch_keys(arg: Option<&String>) -> BatchKeys {
    match arg.map(String::as_str) {
        None | Some("attempt") => BatchKeys::PerAttempt,
        Some("task") => BatchKeys::PerTask,
        Some("both") => BatchKeys::Both,
        Some(other) => panic!("batch keys are attempt, task or both, not {other}"),
    }
}

fn show_bug(bug: Bug, batch_keys: BatchKeys) {
    let bounds = Bounds {
        reduction: false,
        batch_keys,
        ..Bounds::CI
    };
    let model = LeaseModel::new(bounds, Protocol::Seeded(bug));
    match shortest_counterexample(model, &invariants(&model), STEPS_MAX) {
        Some((invariant, steps, _)) => println!(
            "{bug:?} breaks {invariant:?} in {} steps:\n{}",
            steps.len() - 1,
            describe_steps(&steps)
        ),
        None => println!("{bug:?} breaks no invariant within {STEPS_MAX} steps"),
    }
}
