//! The `palisade` command's library: the in-process system (`palisade dev`, `palisade demo`,
//! `palisade bench`, the system tests), the harness the demo and the benchmark share, the
//! demo, the benchmark, and the health probe (`palisade health`).

pub mod bench;
pub mod demo;
pub mod harness;
pub mod probe;
pub mod system;
