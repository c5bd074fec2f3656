//! palisade's worker SDK: runs [`Plugin`]s on tasks leased from dispatch and delivers their
//! results to ingestion, exactly as `docs/protocol/worker.md` describes.
//!
//! One [`Worker`] per process: it subscribes to its ack subject, says hello, long-polls
//! `acquire` within its free capacity, and runs each lease in its own task. A lease task renews
//! on a timer, streams the plugin's findings and assets as result batches (each kept until
//! ingestion acknowledges it, resent under a new `Nats-Msg-Id` when no acknowledgement comes),
//! then completes or fails the attempt. It stops without a word when dispatch or ingestion says
//! `lease_lost` / `cancel_requested`, and releases its leases on shutdown.
//!
//! ```no_run
//! # async fn example(bus: bus::Bus, plugins: Vec<std::sync::Arc<dyn worker::Plugin>>) {
//! let config = worker::WorkerConfig::new(uuid::Uuid::new_v4(), 4);
//! let worker = worker::Worker::new(bus, config, plugins).expect("valid configuration");
//! let stats = worker.stats();
//! let shutdown = worker::CancellationToken::new();
//! worker.run(shutdown).await.expect("worker stopped cleanly");
//! println!("{} leases completed", stats.snapshot().completed);
//! # }
//! ```

mod acks;
mod artifacts;
mod batch;
mod config;
mod context;
mod dispatchers;
pub mod enrollment;
mod error;
mod lease;
mod plugin;
mod renew;
mod retry;
mod stats;
mod worker;

pub use artifacts::{ArtifactUploader, UploadedArtifact};
pub use config::{Session, WorkerConfig};
pub use error::WorkerError;
pub use futures::future::BoxFuture;
pub use messages::v1;
pub use plugin::{Plugin, PluginError, ResultItem, ResultSink, Rule, SinkClosed, TaskInput};
pub use stats::{StatsSnapshot, WorkerStats};
pub use tokio_util::sync::CancellationToken;
pub use worker::Worker;
