//! The `palisade` command's library: the in-process system (`palisade dev`, `palisade demo`,
//! the system tests), the demo, and the health probe (`palisade health`).

pub mod demo;
pub mod probe;
pub mod system;
