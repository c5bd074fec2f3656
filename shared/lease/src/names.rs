//! Every lease name palisade uses.
//!
//! Every name lives here, so two loops never share one by accident: a shared name would elect
//! one of them and silently starve the other.

/// The reaper's sweeps (SPEC §4.5).
pub const REAPER: &str = "palisade-reaper";
