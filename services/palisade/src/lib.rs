//! The `palisade` command's library. One module per command group, each holding its clap
//! arguments and its `run` (`main.rs` only parses and dispatches): `scan`, `finding`, `worker`,
//! `org`, `client`, `nats` (also the credentials and account pushes `worker` and `client` use),
//! `artifact`, `cve`, `task`, `queue`, `health`, `schedules`, `dead_letters`, `migrate`, with
//! the arguments they share and the one way every answer is printed (text, or JSON with
//! `--output json`) in `cli_support`, and the exit statuses of every command in `exit`.
//! Besides: the NATS accounts of workers and clients (`accounts`), the health probe (`probe`),
//! what some subcommands do apart from printing (`commands`), `scan show` and `scan submit --wait`
//! (`scans`), and `worker show` and `org show` (`tenants`). The in-process system, the demo
//! and the benchmark are the `lab` crate's (`system` is re-exported for the system tests).

pub mod accounts;
pub mod artifact;
pub mod cli_support;
pub mod client;
pub mod commands;
pub mod coverage;
pub mod cve;
pub mod dead_letters;
pub mod exit;
pub mod finding;
pub mod health;
pub mod migrate;
pub mod nats;
pub mod org;
pub mod probe;
pub mod queue;
pub mod scan;
pub mod scans;
pub mod schedules;
pub mod target;
pub mod task;
pub mod tenants;
pub mod worker;

pub use lab::system;
