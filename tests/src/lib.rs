//! The system-test harness: [`TestSystem`] starts palisade's services in-process on real
//! PostgreSQL and NATS, with a database and a subject prefix of its own, so tests run in
//! parallel; [`ManualWorker`] speaks the worker protocol by hand so a test controls every
//! message. Tests wait on conditions with deadlines, never on sleeps.
//!
//! PostgreSQL and NATS come from `DATABASE_URL` / `NATS_URL`, else the local defaults.

//! The harness is split by concern: `system` (the services in-process), `workers` (manual,
//! in-process and child-process workers), `scenarios` (ready-made situations), `events`
//! (reading what palisade published), `nats` and `backends` (the servers), `logging`, and
//! the servers and fixtures tests start of their own (`servers`, `tls`, `nvd`,
//! `empty_database`, `chaos`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bus::Bus;
use bus::async_nats;
use futures::StreamExt as _;
use messages::{ClientVerb, Subjects, WorkerVerb, v1};
use palisade::system::SystemSettings;
use prost::Message as _;
use runtime::{CommonSettings, Connections};
use store::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Every table palisade writes, for "nothing was written" checks.
pub use store::testing::TABLES;

pub mod chaos;
pub mod empty_database;
pub mod impair;
pub mod netns;
pub mod nvd;
pub mod servers;
pub mod tls;

mod backends;
mod events;
mod logging;
mod nats;
mod scenarios;
mod system;
mod workers;

use backends::*;
pub use events::*;
pub use logging::*;
pub use nats::*;
pub use scenarios::*;
pub use system::*;
pub use workers::*;

/// The value of one series (`name` or `name{labels}`) as this process exports it on
/// `/metrics`, if it is exported.
pub fn exported(series: &str) -> Option<f64> {
    telemetry::metrics::encode_text().lines().find_map(|line| {
        line.strip_prefix(series)?
            .strip_prefix(' ')
            .map(|value| value.trim().parse().expect("a number"))
    })
}

/// The client id of [`TestSystem::client`]'s requests.
pub const TEST_CLIENT_ID: &str = "test-client";

/// How long a test waits for any one condition before failing.
pub const WAIT_MAX: Duration = Duration::from_secs(20);

/// The reference worker's test data for `dependency_audit`: lockfiles under `rust/`, `web/`
/// and `legacy/`, and the OSV advisories they are matched against under `osv/`.
pub const DEPENDENCY_AUDIT_DATA: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../services/reference-worker/testdata/dependency_audit"
);

/// The plugins of the test system's reference workers: all of them, `dependency_audit` with
/// the test advisories.
pub fn reference_plugins() -> Vec<Arc<dyn worker::Plugin>> {
    reference_worker::configured_plugins(&reference_worker::PluginSettings {
        osv_dir: Some(std::path::Path::new(DEPENDENCY_AUDIT_DATA).join("osv")),
        ..Default::default()
    })
}

/// A started component: how to stop it, and its task.
type RunningComponent = (CancellationToken, JoinHandle<anyhow::Result<()>>);

/// Connects, trying again twice: a test's own nats-server that has just started, on a
/// machine loaded by the rest of the suite, can take longer than `bus::CONNECT_TIMEOUT` (2 s)
/// to greet its first clients (seen in CI: `cannot connect … timed out` right after the
/// server listened). Services do not retry their first connection (README); tests start
/// their server a moment before they connect, which a deployment never does.
async fn connect_patiently<T, E, F, Fut>(mut connect: F) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: std::fmt::Display,
{
    let mut tries = 1;
    loop {
        match connect().await {
            Ok(connected) => return Ok(connected),
            // Each try is bounded by the client's own connect timeout: no pause between.
            Err(error) if tries < 3 => {
                tracing::warn!(%error, tries, "test connection failed; trying again");
                tries += 1;
            }
            Err(error) => return Err(error),
        }
    }
}
