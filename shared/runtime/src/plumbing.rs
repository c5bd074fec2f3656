//! What every service runs beside its own work: the optional `/healthz`, `/readyz` and
//! `/metrics` server and, for a service that writes outbox rows, an outbox relay. A service
//! builds its `Plumbing` in `from_connections`, starts it at the top of `run_until_stopped`
//! and stops it at the end, after its own tasks.

use std::net::SocketAddr;

use outbox::Relay;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::health::{HealthError, HealthServer};
use crate::{CommonSettings, Connections};

/// A service's health server and outbox relay, not started yet. Cheap to clone.
#[derive(Clone)]
pub struct Plumbing {
    /// `None` where one process runs many services and serves the endpoints once.
    health: Option<HealthServer>,
    /// `None` for a service that writes no outbox rows.
    relay: Option<Relay>,
}

/// Started plumbing; [`RunningPlumbing::stop`] stops it.
#[must_use = "stop the plumbing when the service's own work has ended"]
pub struct RunningPlumbing {
    stop: CancellationToken,
    relay: Option<JoinHandle<()>>,
}

impl Plumbing {
    /// A health server on `http_addr` (none when `None`) over `connections`, and no relay.
    pub fn new(
        common: &CommonSettings,
        http_addr: Option<SocketAddr>,
        connections: &Connections,
    ) -> Self {
        let health = http_addr.map(|addr| HealthServer::new(addr, common, connections.clone()));
        Self {
            health,
            relay: None,
        }
    }

    /// Adds an outbox relay over `connections` (default config), started and stopped with the
    /// rest; returns a handle to wake it after committing outbox rows.
    pub fn relay_outbox(&mut self, connections: &Connections) -> Relay {
        assert!(self.relay.is_none(), "a service runs one outbox relay");
        let relay = Relay::new(
            connections.pool.clone(),
            connections.bus.clone(),
            Default::default(),
        );
        self.relay = Some(relay.clone());
        relay
    }

    /// Binds and serves the health endpoints (when configured) and spawns the relay (when
    /// added), both until `stop` is cancelled. The relay charges its work to the `outbox`
    /// lane itself (`Relay::run`), whichever lane calls this.
    pub async fn start(&self, stop: &CancellationToken) -> Result<RunningPlumbing, HealthError> {
        if let Some(health) = &self.health {
            health.serve(stop.clone()).await?;
        }
        let relay = self
            .relay
            .clone()
            .map(|relay| tokio::spawn(relay.run(stop.clone())));
        Ok(RunningPlumbing {
            stop: stop.clone(),
            relay,
        })
    }
}

impl RunningPlumbing {
    /// Cancels the stop token given to [`Plumbing::start`] (and with it the service's other
    /// tasks on that token) and waits for the relay to finish its pass.
    pub async fn stop(self) {
        self.stop.cancel();
        if let Some(relay) = self.relay {
            let _ = relay.await;
        }
    }
}
