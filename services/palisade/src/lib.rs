//! The `palisade` command's library: the in-process system (`palisade dev`, `palisade demo`,
//! the system tests) and the demo.

pub mod demo;
pub mod system;
