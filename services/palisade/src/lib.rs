//! The `palisade` command's library: the in-process system (`palisade dev`, `palisade demo`,
//! `palisade bench`, the system tests), the harness the demo and the benchmark share, the
//! demo, the benchmark, the health probe (`palisade health`), and the subcommands that
//! answer in JSON (`commands`).

pub mod bench;
pub mod commands;
pub mod demo;
pub mod harness;
pub mod probe;
pub mod system;
