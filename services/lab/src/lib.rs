//! palisade in one process, for everything that is not a deployment: the whole system over
//! shared connections (`system`: `palisade dev` and the system tests run it), and what runs a
//! load through it against a fresh database: `palisade demo` (`demo`), `palisade bench`
//! (`bench`), what the two share (`harness`), and the NATS server they and `palisade dev` run
//! themselves where the local one cannot serve palisade (`private_nats`). The `palisade` command parses their
//! arguments (each module's `…Args`) and calls their `command`; the service binaries do not
//! depend on this crate.

pub mod bench;
pub mod demo;
pub mod harness;
pub mod private_nats;
pub mod system;
