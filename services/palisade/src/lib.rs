//! The `palisade` command's library: the NATS accounts of workers and clients (`accounts`), the in-process system (`palisade dev`, `palisade demo`,
//! `palisade bench`, the system tests), the harness the demo and the benchmark share, the
//! demo, the benchmark, the health probe (`palisade health`), the subcommands that
//! answer in JSON (`commands`), `scan show` and `scan submit --wait` (`scans`), recurring scans (`schedules`), `worker show` and `org show` (`tenants`), `migrate`
//! (`migrate`), and the exit statuses of every command (`exit`).

pub mod accounts;
pub mod artifact;
pub mod bench;
pub mod cli_support;
pub mod client;
pub mod commands;
pub mod cve;
pub mod dead_letters;
pub mod demo;
pub mod exit;
pub mod finding;
pub mod harness;
pub mod health;
pub mod migrate;
pub mod nats;
pub mod org;
pub mod probe;
pub mod queue;
pub mod scan;
pub mod scans;
pub mod schedules;
pub mod system;
pub mod task;
pub mod tenants;
pub mod worker;
