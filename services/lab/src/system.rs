//! The whole of palisade in one process: the five services over shared connections, and
//! optionally reference workers. `palisade dev`, `palisade demo` and the system tests use it,
//! so all three run the same code the service binaries run.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use runtime::{CommonSettings, Connections};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Settings of every service, each starting from the environment.
#[derive(Debug, Clone)]
pub struct SystemSettings {
    pub common: CommonSettings,
    pub admission: admission::Settings,
    pub dispatch: dispatch::Settings,
    pub ingestion: ingestion::Settings,
    pub enrichment: enrichment::Settings,
    pub reaper: reaper::Settings,
    /// Run the reaper's sweeps (tests that drive recovery by hand turn them off).
    pub reaper_enabled: bool,
    /// Where the process's one `/healthz` and `/readyz` listen (`PALISADE_HTTP_ADDR`); the
    /// services' own `http_addr` stay `None`, so the port is bound once.
    pub http_addr: Option<SocketAddr>,
}

impl SystemSettings {
    /// Every service's settings from the environment over `common`.
    pub fn from_common(common: CommonSettings) -> Result<Self, runtime::SettingsError> {
        let mut settings = Self {
            admission: admission::Settings::from_common(common.clone())?,
            dispatch: dispatch::Settings::from_common(common.clone())?,
            ingestion: ingestion::Settings::from_common(common.clone())?,
            enrichment: enrichment::Settings::from_common(common.clone())?,
            reaper: reaper::Settings::from_common(common.clone())?,
            reaper_enabled: true,
            http_addr: runtime::health::http_addr_from_env()?,
            common,
        };
        settings.admission.http_addr = None;
        settings.dispatch.http_addr = None;
        settings.ingestion.http_addr = None;
        settings.enrichment.http_addr = None;
        settings.reaper.http_addr = None;
        Ok(settings)
    }

    /// Ingestion's settings as it runs beside dispatch in one process: the leases it hands on
    /// with completions last as long as dispatch's (both read `PALISADE_LEASE_TTL_MS`; here
    /// dispatch's settings may have been changed after they were read).
    pub fn ingestion(&self) -> ingestion::Settings {
        let mut ingestion = self.ingestion.clone();
        ingestion.lease_ttl = self.dispatch.lease.ttl;
        ingestion
    }
}

/// What `palisade dev`, the demo and the benchmark print about the NATS they run on: they
/// connect every service as one identity, so they need a server without authentication
/// (or NATS_CREDS of an unrestricted user), and say so.
pub fn bus_notice(common: &CommonSettings) -> String {
    let url = bus::redact_url(&common.nats_url);
    if common.nats_credentials.is_some() {
        format!(
            "NATS {url}: one credential (NATS_CREDS) for all five services; production gives each service, worker and client its own (docs/security.md)"
        )
    } else {
        format!(
            "NATS {url}: OPEN server, no credentials; anyone who reaches it can act as any worker, client or service. For development only: production runs `palisade nats init` (docs/security.md)"
        )
    }
}

/// A running palisade.
pub struct System {
    pub connections: Connections,
    health_addr: Option<SocketAddr>,
    shutdown: CancellationToken,
    tasks: JoinSet<(String, anyhow::Result<()>)>,
    /// Workers stop first, so they can still release their leases to running services.
    workers_shutdown: CancellationToken,
    workers: JoinSet<(String, anyhow::Result<()>)>,
}

impl System {
    /// Creates the database if missing, migrates, provisions, and starts the five services
    /// and, when `http_addr` is set, the health endpoints.
    pub async fn start(settings: SystemSettings) -> anyhow::Result<Self> {
        prepare_database(&settings.common).await?;
        let connections = Connections::open(&settings.common, &messages::Identity::Operator)
            .await
            .context("failed to connect")?;
        let shutdown = CancellationToken::new();
        let health_addr = match settings.http_addr {
            Some(addr) => Some(
                runtime::health::serve_health(
                    addr,
                    &settings.common,
                    connections.clone(),
                    shutdown.child_token(),
                )
                .await
                .context("failed to serve the health endpoints")?,
            ),
            None => None,
        };
        let mut system = Self {
            connections: connections.clone(),
            health_addr,
            shutdown: shutdown.clone(),
            tasks: JoinSet::new(),
            workers_shutdown: CancellationToken::new(),
            workers: JoinSet::new(),
        };
        let c = || connections.clone();
        let ingestion_settings = settings.ingestion();
        system.spawn(
            "admission",
            admission::Service::from_connections(settings.admission, c())
                .run_until_stopped(shutdown.clone()),
        );
        system.spawn(
            "dispatch",
            dispatch::Service::from_connections(settings.dispatch, c())
                .run_until_stopped(shutdown.clone()),
        );
        system.spawn(
            "ingestion",
            ingestion::Service::from_connections(ingestion_settings, c())
                .run_until_stopped(shutdown.clone()),
        );
        system.spawn(
            "enrichment",
            enrichment::Service::from_connections(settings.enrichment, c())?
                .run_until_stopped(shutdown.clone()),
        );
        if settings.reaper_enabled {
            system.spawn(
                "reaper",
                reaper::Service::from_connections(settings.reaper, c())
                    .run_until_stopped(shutdown.clone()),
            );
        }
        Ok(system)
    }

    /// Where `/healthz` and `/readyz` listen, when they do.
    pub fn health_addr(&self) -> Option<SocketAddr> {
        self.health_addr
    }

    /// Runs `future` as part of the system, named for error reports.
    pub fn spawn(
        &mut self,
        name: &str,
        future: impl Future<Output = anyhow::Result<()>> + Send + 'static,
    ) {
        let name = name.to_owned();
        self.tasks.spawn(async move { (name, future.await) });
    }

    /// Registers `count` reference workers (idempotently, by name), assigns them to
    /// `organization_id`, and runs them in-process. Returns their stats.
    pub async fn spawn_workers(
        &mut self,
        organization_id: Uuid,
        count: usize,
        capacity: u32,
    ) -> anyhow::Result<Vec<Arc<worker::WorkerStats>>> {
        // `PALISADE_OSV_DIR`, as the worker binary reads it, for `dependency_audit`.
        let plugins = reference_worker::PluginSettings::from_env()
            .context("invalid settings for the in-process workers' plugins")?;
        let mut stats = Vec::with_capacity(count);
        for index in 0..count {
            let worker_id = Uuid::new_v4();
            store::admin::register_worker(
                &self.connections.pool,
                worker_id,
                &format!("in-process-{index}"),
                capacity as i32,
            )
            .await?;
            store::admin::assign_worker(
                &self.connections.pool,
                organization_id,
                worker_id,
                &store::audit::Change::new("palisade", "an in-process worker"),
            )
            .await?;
            let worker = worker::Worker::new(
                self.connections.bus.clone(),
                in_process_worker_config(worker_id, capacity),
                reference_worker::configured_plugins(&plugins),
            )?;
            stats.push(worker.stats());
            let shutdown = self.workers_shutdown.clone();
            let name = format!("worker-{index}");
            self.workers
                .spawn(async move { (name, worker.run(shutdown).await.context("worker stopped")) });
        }
        Ok(stats)
    }

    /// Waits until `stop` fires or a component fails; then stops everything.
    pub async fn run_until(mut self, stop: CancellationToken) -> anyhow::Result<()> {
        let result = tokio::select! {
            () = stop.cancelled() => Ok(()),
            Some(joined) = self.workers.join_next() => match joined {
                Ok((name, Ok(()))) => Err(anyhow::anyhow!("{name} stopped unexpectedly")),
                Ok((name, Err(error))) => Err(error.context(format!("{name} failed"))),
                Err(error) => Err(anyhow::anyhow!("a worker panicked: {error}")),
            },
            Some(joined) = self.tasks.join_next() => match joined {
                Ok((name, Ok(()))) => Err(anyhow::anyhow!("{name} stopped unexpectedly")),
                Ok((name, Err(error))) => Err(error.context(format!("{name} failed"))),
                Err(error) => Err(anyhow::anyhow!("a component panicked: {error}")),
            },
        };
        self.stop().await;
        result
    }

    /// Stops every component and waits for them.
    pub async fn stop(mut self) {
        self.workers_shutdown.cancel();
        while self.workers.join_next().await.is_some() {}
        self.shutdown.cancel();
        while self.tasks.join_next().await.is_some() {}
    }
}

/// Creates the database if it does not exist and applies every migration.
pub async fn prepare_database(common: &CommonSettings) -> anyhow::Result<()> {
    store::create_database_if_missing(&common.database.url)
        .await
        .context("failed to create the database")?;
    let pool = store::connect(&common.database).await?;
    store::migrate(&pool)
        .await
        .context("failed to migrate the database")?;
    pool.close().await;
    Ok(())
}

/// In-process workers share the process with dispatch: short long-polls and a short grace
/// keep `Ctrl-C` and the end of the demo prompt.
fn in_process_worker_config(worker_id: Uuid, capacity: u32) -> worker::WorkerConfig {
    let mut config = worker::WorkerConfig::new(worker_id, capacity);
    config.acquire_wait = std::time::Duration::from_secs(2);
    config.shutdown_grace = std::time::Duration::from_secs(5);
    // As the reference worker reads it (`PALISADE_WORKER_LEASE_NEXT`, on by default).
    config.lease_next =
        std::env::var("PALISADE_WORKER_LEASE_NEXT").map_or(true, |value| value.trim() != "false");
    config
}
