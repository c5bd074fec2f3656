//! Runs the model once and prints what it found:
//! `cargo run -p lease-model --example explore -- [workers tasks max_attempts attempts_max keys reduction]`.
use lease_model::{BatchKeys, Bounds, LeaseModel, Protocol, check, describe_steps};
use stateright::HasDiscoveries;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let number =
        |index: usize, default: u8| args.get(index).map_or(default, |a| a.parse().unwrap());
    let flag =
        |index: usize, default: bool| args.get(index).map_or(default, |a| a.parse().unwrap());
    let bounds = Bounds {
        workers: number(0, 2),
        tasks: number(1, 2),
        max_attempts: number(2, 2),
        attempts_per_task_max: number(3, 3),
        batch_keys: match args.get(4).map(String::as_str) {
            Some("task") => BatchKeys::PerTask,
            Some("both") => BatchKeys::Both,
            _ => BatchKeys::PerAttempt,
        },
        reduction: flag(5, true),
        ..Bounds::CI
    };
    println!("{bounds:?}");
    let run = check(
        LeaseModel::new(bounds, Protocol::Real),
        HasDiscoveries::AnyFailures,
    );
    println!(
        "{} unique, {} total, depth {}, {:?}",
        run.unique_states, run.states, run.max_depth, run.elapsed
    );
    for (name, path) in &run.discoveries {
        println!("{name}:\n{}", describe_steps(&path.clone().into_vec()));
    }
}
