//! The chaos suite (`tests::chaos`): palisade's services and workers as separate processes on
//! a PostgreSQL and a NATS of the suite's own, a steady load with a ledger, faults on a
//! schedule, duplicate and late delivery injected in the bus, and a checker.
//!
//! - `bounded` (CI): every fault once, in an order drawn from `CHAOS_SEED` (a fresh seed when
//!   unset; the report prints it, so a failure can be replayed with the same order), or the
//!   faults `CHAOS_FAULTS` names (`postgres-down,nats-restart,nats-node-kill,kill:admission`,
//!   `cut-from-nats:dispatch,isolate-worker,postgres-cut-from:ingestion`,
//!   `nats-node-partition:leader,slow-links`: see `chaos::Fault`). The network faults join the
//!   plan where the machine lets the suite make network namespaces, slow links where it can
//!   queue packets (`tests::impair`).
//! - `soak` (on demand): faults every `CHAOS_FAULT_GAP_SECS` (default 3) for
//!   `CHAOS_SOAK_SECS` (default 3600), then the same checks; prints its report and keeps the
//!   logs:
//!   `cargo nextest run --workspace --test chaos --run-ignored only --no-capture`
//!   (with `CHAOS_SERVICE_BIN` and `CHAOS_WORKER_BIN` naming copies of the two binaries when
//!   the target directory may be rebuilt meanwhile)

use std::time::Duration;

use tests::chaos::{self, Binaries, Plan};

/// The child binaries cargo built, or copies `CHAOS_SERVICE_BIN` and `CHAOS_WORKER_BIN` name:
/// an hour's soak restarts its processes from these paths, so a build in the same target
/// directory meanwhile must not swap the code under it.
fn binaries() -> Binaries {
    let path = |variable: &str, built: &str| {
        std::env::var_os(variable).map_or_else(|| built.into(), Into::into)
    };
    Binaries {
        service: path("CHAOS_SERVICE_BIN", env!("CARGO_BIN_EXE_test-service")),
        worker: path("CHAOS_WORKER_BIN", env!("CARGO_BIN_EXE_test-worker")),
    }
}

/// `CHAOS_FAULTS=postgres-down,nats-restart` replaces the plan's faults (names as
/// `chaos::Fault` parses them), to replay a sequence.
fn with_faults(mut plan: Plan) -> Plan {
    if let Ok(faults) = std::env::var("CHAOS_FAULTS") {
        plan.faults = faults
            .split(',')
            .map(|fault| fault.trim().parse().expect("CHAOS_FAULTS names faults"))
            .collect();
    }
    plan
}

fn seed() -> u64 {
    std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(rand::random)
}

fn env_secs(name: &str, default: u64) -> Duration {
    Duration::from_secs(
        std::env::var(name)
            .ok()
            .and_then(|secs| secs.parse().ok())
            .unwrap_or(default),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounded() {
    tests::init_test_logging();
    let report = chaos::run(&with_faults(Plan::bounded(seed())), &binaries(), false).await;
    println!("{report}");
    assert!(
        report.violations.is_empty() && report.unexpected_exits.is_empty(),
        "the chaos suite found violations:\n{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "an hour by default: run on demand (see the module's doc)"]
async fn soak() {
    tests::init_test_logging();
    let plan = with_faults(Plan::soak(
        seed(),
        env_secs("CHAOS_SOAK_SECS", 3_600),
        env_secs("CHAOS_FAULT_GAP_SECS", 3),
    ));
    let report = chaos::run(&plan, &binaries(), true).await;
    println!("{report}");
    assert!(
        report.violations.is_empty() && report.unexpected_exits.is_empty(),
        "the chaos soak found violations:\n{report}"
    );
}
