//! [`TestSystem`]: palisade's services in-process on a database and a subject prefix of
//! their own, started, stopped and crashed by the test.

use super::*;

/// The services a test can start, stop and crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Component {
    Admission,
    Dispatch,
    Ingestion,
    Reaper,
    Enrichment,
}

impl Component {
    /// Every component, in start order.
    pub const ALL: [Component; 5] = [
        Component::Admission,
        Component::Dispatch,
        Component::Ingestion,
        Component::Reaper,
        Component::Enrichment,
    ];
}

/// palisade in-process for one test.
pub struct TestSystem {
    pub pool: PgPool,
    pub bus: Bus,
    pub subjects: Subjects,
    pub settings: SystemSettings,
    /// Set to make admission crash after its next commit, before acknowledging.
    pub admission_crash: Arc<AtomicBool>,
    /// Set to make ingestion crash after its next commit, before acknowledging.
    pub ingestion_crash: Arc<AtomicBool>,
    /// Where `/healthz` and `/readyz` listen, when `settings.http_addr` was set.
    pub health_addr: Option<std::net::SocketAddr>,
    pub(crate) database_url: String,
    pub(crate) shutdown: CancellationToken,
    pub(crate) running: Mutex<HashMap<Component, RunningComponent>>,
    /// The NATS identities of this system: issues credentials when the server authenticates.
    pub nats: TestNats,
    /// Each service's own connection, with its own credentials.
    pub(crate) service_buses: HashMap<Component, Bus>,
}

impl TestSystem {
    /// Admission, dispatch and ingestion running; the reaper is driven by the test.
    pub async fn spawn() -> Self {
        Self::spawn_with(|_| {}).await
    }

    /// Like [`TestSystem::spawn`], with settings adjusted first.
    pub async fn spawn_with(configure: impl FnOnce(&mut SystemSettings)) -> Self {
        Self::spawn_inner(None, configure).await
    }

    /// Like [`TestSystem::spawn_with`], on a NATS of the test's own that authenticates
    /// against the test's authority (a cluster, a server it stops).
    pub async fn spawn_on(nats: OwnNats, configure: impl FnOnce(&mut SystemSettings)) -> Self {
        Self::spawn_inner(Some(nats), configure).await
    }

    pub(crate) async fn spawn_inner(
        own: Option<OwnNats>,
        configure: impl FnOnce(&mut SystemSettings),
    ) -> Self {
        init_test_logging();
        let id = Uuid::new_v4().simple().to_string();
        let backends = backends().await;
        let database_url =
            store::with_database(&backends.database_url, &format!("palisade_test_{id}"));
        let mut common = CommonSettings::from_env().expect("valid environment");
        common.database = store::DatabaseSettings::new(database_url.clone());
        common.database.max_connections = 8;
        common.subjects = Subjects::new(&format!("t{}", &id[..12])).expect("valid prefix");
        // Secured unless NATS_URL names a server to use.
        let (authority, server) = match (own, &backends.nats_url) {
            (Some(own), _) => {
                common.nats_url = own.url;
                common.subjects = own.subjects;
                (Some(own.authority), None)
            }
            (None, Some(url)) => {
                common.nats_url = url.clone();
                (None, None)
            }
            (None, None) => {
                let authority = identity::Authority::generate();
                let server = servers::NatsServer::start_secured(&authority, &common.subjects).await;
                common.nats_url = server.url();
                (Some(Arc::new(authority)), Some(server))
            }
        };

        let mut settings = SystemSettings::from_common(common.clone()).expect("valid settings");
        // Fast redelivery and polling so tests finish quickly; behaviour is unchanged.
        settings.admission.consumer.ack_wait = Duration::from_secs(1);
        settings.ingestion.consumer.ack_wait = Duration::from_secs(1);
        settings.dispatch.acquire_poll = Duration::from_millis(100);
        settings.ingestion.retry = store::RetryPolicy {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(1),
        };
        settings.reaper.retry = settings.ingestion.retry;
        settings.reaper.interval = Duration::from_millis(100);
        settings.enrichment.poll = Duration::from_millis(100);
        // No network here: the local CVE table alone, unless a test serves NVD pages.
        settings.enrichment.cve.source = enrichment::cve::CveSource::Local;
        // Tests run in parallel: no health server unless a test asks for one on a free port.
        settings.http_addr = None;
        // Dispatch signs enrolled workers' credentials with the authority's enrollment key.
        settings.dispatch.enroller = authority
            .as_ref()
            .and_then(|authority| authority.enroller())
            .map(Arc::new);
        let secured_url = settings.common.nats_url.clone();
        configure(&mut settings);
        // A test that chose its own NATS in `configure` runs it open (`spawn_on` secures one).
        let own_nats = settings.common.nats_url != secured_url;
        let nats = TestNats {
            url: settings.common.nats_url.clone(),
            subjects: settings.common.subjects.clone(),
            authority: if own_nats { None } else { authority },
            server: if own_nats { None } else { server },
            files: tempfile::tempdir().expect("temporary directory"),
            pushed: Default::default(),
        };
        settings.common.nats_credentials = nats.unrestricted();

        palisade::system::prepare_database(&settings.common)
            .await
            .unwrap_or_else(|error| {
                panic!(
                    "PostgreSQL is not usable at {}: {error:#}; start it or set DATABASE_URL",
                    store::redact_url(&database_url)
                )
            });
        let connections = connect_patiently(|| {
            Connections::open(&settings.common, &messages::Identity::Operator)
        })
        .await
        .unwrap_or_else(|error| {
            panic!("cannot start palisade: {error}; is NATS with JetStream running (NATS_URL)?")
        });
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
                .expect("health endpoints served"),
            ),
            None => None,
        };
        let mut service_buses = HashMap::new();
        for (component, service) in [
            (Component::Admission, messages::Service::Admission),
            (Component::Dispatch, messages::Service::Dispatch),
            (Component::Ingestion, messages::Service::Ingestion),
            (Component::Reaper, messages::Service::Reaper),
            (Component::Enrichment, messages::Service::Enrichment),
        ] {
            service_buses.insert(
                component,
                nats.connect(&messages::Identity::Service(service)).await,
            );
        }
        let system = Self {
            nats,
            service_buses,
            pool: connections.pool.clone(),
            bus: connections.bus.clone(),
            subjects: settings.common.subjects.clone(),
            settings,
            admission_crash: Arc::new(AtomicBool::new(false)),
            ingestion_crash: Arc::new(AtomicBool::new(false)),
            health_addr,
            database_url,
            shutdown,
            running: Mutex::new(HashMap::new()),
        };
        for component in [
            Component::Admission,
            Component::Dispatch,
            Component::Ingestion,
        ] {
            system.start(component);
        }
        system
    }

    /// The connections `component` runs on: the shared pool and its own NATS connection.
    pub(crate) fn connections(&self, component: Component) -> Connections {
        Connections {
            pool: self.pool.clone(),
            bus: self.service_buses[&component].clone(),
        }
    }

    /// Starts (or restarts) a component.
    pub fn start(&self, component: Component) {
        let stop = self.shutdown.child_token();
        let token = stop.clone();
        let handle = match component {
            Component::Admission => {
                let service = admission::Service::from_connections(
                    self.settings.admission.clone(),
                    self.connections(Component::Admission),
                )
                .crash_after_commit(self.admission_crash.clone());
                tokio::spawn(service.run_until_stopped(token))
            }
            Component::Dispatch => {
                let service = dispatch::Service::from_connections(
                    self.settings.dispatch.clone(),
                    self.connections(Component::Dispatch),
                );
                tokio::spawn(service.run_until_stopped(token))
            }
            Component::Ingestion => {
                let service = ingestion::Service::from_connections(
                    self.settings.ingestion(),
                    self.connections(Component::Ingestion),
                )
                .crash_after_commit(self.ingestion_crash.clone());
                tokio::spawn(service.run_until_stopped(token))
            }
            Component::Reaper => {
                let service = reaper::Service::from_connections(
                    self.settings.reaper.clone(),
                    self.connections(Component::Reaper),
                );
                tokio::spawn(service.run_until_stopped(token))
            }
            Component::Enrichment => {
                let mut settings = self.settings.enrichment.clone();
                settings.http_addr = None;
                let service = enrichment::Service::from_connections(
                    settings,
                    self.connections(Component::Enrichment),
                )
                .expect("an enrichment service");
                tokio::spawn(service.run_until_stopped(token))
            }
        };
        // A component that ends by itself says why in the test's log (the handle is awaited
        // only by a test that stops it).
        let handle = tokio::spawn(async move {
            let ended = handle.await.expect("component did not panic");
            if let Err(error) = &ended {
                tracing::error!(
                    ?component,
                    error = format!("{error:#}"),
                    "component ended by itself"
                );
            }
            ended
        });
        let previous = self
            .running
            .lock()
            .expect("not poisoned")
            .insert(component, (stop, handle));
        if let Some((previous_stop, _)) = previous {
            previous_stop.cancel();
        }
    }

    /// Stops a running component, as scaling its deployment to zero would, and waits for it.
    pub async fn stop(&self, component: Component) {
        let (stop, handle) = self
            .running
            .lock()
            .expect("not poisoned")
            .remove(&component)
            .expect("component was started");
        stop.cancel();
        tokio::time::timeout(WAIT_MAX, handle)
            .await
            .unwrap_or_else(|_| panic!("{component:?} did not stop within {WAIT_MAX:?}"))
            .expect("component did not panic")
            .expect("component stopped cleanly");
    }

    /// Whether a started component is still running: it has not ended by itself (an error it
    /// could not recover from) and was not stopped.
    pub fn is_running(&self, component: Component) -> bool {
        self.running
            .lock()
            .expect("not poisoned")
            .get(&component)
            .is_some_and(|(_, handle)| !handle.is_finished())
    }

    /// Waits for a component to end by itself (an injected crash) and returns how it ended.
    pub async fn wait_stopped(&self, component: Component) -> anyhow::Result<()> {
        let (_, handle) = self
            .running
            .lock()
            .expect("not poisoned")
            .remove(&component)
            .expect("component was started");
        tokio::time::timeout(WAIT_MAX, handle)
            .await
            .unwrap_or_else(|_| panic!("{component:?} did not stop within {WAIT_MAX:?}"))
            .expect("component did not panic")
    }

    /// A reaper whose `run_once` the test calls.
    pub fn reaper(&self) -> reaper::Service {
        reaper::Service::from_connections(
            self.settings.reaper.clone(),
            self.connections(Component::Reaper),
        )
    }

    /// A new organization.
    pub async fn organization(&self) -> Uuid {
        let id = Uuid::now_v7();
        store::admin::create_organization(&self.pool, id, "test", None)
            .await
            .expect("organization created");
        id
    }

    /// A registered worker assigned to `organization_id`, driven by hand.
    pub async fn manual_worker(&self, organization_id: Uuid, capacity: u32) -> ManualWorker {
        let id = self.registered_worker(organization_id, capacity).await;
        ManualWorker::connect(self.worker_bus(id).await, id).await
    }

    /// A connection as worker `worker_id`, with its own credentials.
    pub async fn worker_bus(&self, worker_id: Uuid) -> Bus {
        self.nats
            .connect(&messages::Identity::Worker { worker_id })
            .await
    }

    /// Registers a worker and assigns it; returns its id.
    pub async fn registered_worker(&self, organization_id: Uuid, capacity: u32) -> Uuid {
        let id = Uuid::new_v4();
        store::admin::register_worker(&self.pool, id, "test-worker", capacity as i32)
            .await
            .expect("worker registered");
        store::admin::assign_worker(
            &self.pool,
            organization_id,
            id,
            &store::audit::Change::new("test", ""),
        )
        .await
        .expect("worker assigned");
        id
    }

    /// Runs a reference worker (all plugins) in-process until the test ends.
    pub async fn reference_worker(
        &self,
        organization_id: Uuid,
        capacity: u32,
    ) -> Arc<worker::WorkerStats> {
        let id = self.registered_worker(organization_id, capacity).await;
        let worker = worker::Worker::new(
            self.worker_bus(id).await,
            worker::WorkerConfig::new(id, capacity),
            reference_plugins(),
        )
        .expect("valid worker");
        let stats = worker.stats();
        tokio::spawn(worker.run(self.shutdown.child_token()));
        stats
    }

    /// Runs a reference worker (all plugins) in-process until [`StoppableWorker::stop`].
    pub async fn stoppable_reference_worker(
        &self,
        organization_id: Uuid,
        capacity: u32,
    ) -> StoppableWorker {
        let worker_id = self.registered_worker(organization_id, capacity).await;
        let mut config = worker::WorkerConfig::new(worker_id, capacity);
        // A stop waits for the long-poll in flight (its leases are released, not abandoned):
        // keep it short.
        config.acquire_wait = Duration::from_millis(250);
        let worker = worker::Worker::new(
            self.worker_bus(worker_id).await,
            config,
            reference_plugins(),
        )
        .expect("valid worker");
        let stop = self.shutdown.child_token();
        let handle = tokio::spawn(worker.run(stop.clone()));
        StoppableWorker {
            worker_id,
            stop,
            handle,
        }
    }

    pub fn client(&self) -> client::Client {
        client::Client::new(self.bus.clone(), TEST_CLIENT_ID)
    }

    /// A valid request for `organization_id` with a fresh key.
    pub fn request(
        &self,
        organization_id: Uuid,
        target: &str,
        plugins: &[&str],
    ) -> v1::ScanRequest {
        self.client().request(
            &organization_id.to_string(),
            target,
            plugins,
            &Uuid::new_v4().to_string(),
        )
    }

    /// Submits over request/reply.
    pub async fn submit(&self, request: &v1::ScanRequest) -> v1::ScanRequestReply {
        self.client()
            .submit(request)
            .await
            .expect("admission answers")
    }

    /// Publishes raw bytes to the durable scan request subject of `organization_id` and the
    /// test client, with a fresh `Nats-Msg-Id`.
    pub async fn publish_request_bytes(&self, organization_id: Uuid, payload: Vec<u8>) {
        self.bus
            .publish_durable(
                self.subjects
                    .client(&organization_id, TEST_CLIENT_ID, ClientVerb::Request)
                    .expect("a token"),
                &Uuid::new_v4().to_string(),
                Default::default(),
                payload.into(),
            )
            .await
            .expect("request published");
    }

    /// Row count of every table palisade writes, but the outbox (below).
    ///
    /// The outbox is not counted as rows: the relay deletes a row once it is published, at a
    /// moment of its own. `events_written` counts every event written instead, published or
    /// not ([`written_events`]), which only grows.
    pub async fn table_counts(&self) -> BTreeMap<&'static str, i64> {
        let mut counts = BTreeMap::new();
        for table in TABLES
            .into_iter()
            .filter(|table| !table.starts_with("outbox"))
        {
            let count: i64 = store::testing::count_rows(&self.pool, table)
                .await
                .expect("count rows");
            counts.insert(table, count);
        }
        let events = written_events(self).await.len();
        counts.insert("events_written", i64::try_from(events).expect("a count"));
        counts
    }

    /// Polls `probe` until it returns `Some`, failing the test after [`WAIT_MAX`].
    pub async fn wait_for<T, F, Fut>(&self, what: &str, probe: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        self.wait_for_within(what, WAIT_MAX, probe).await
    }

    /// Polls `probe` until it returns `Some`, failing the test after `time_max` (for what is
    /// not one event but many, such as a load draining).
    pub async fn wait_for_within<T, F, Fut>(
        &self,
        what: &str,
        time_max: Duration,
        mut probe: F,
    ) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        let deadline = tokio::time::Instant::now() + time_max;
        loop {
            if let Some(value) = probe().await {
                return value;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Waits until every outbox row is published.
    pub async fn wait_outbox_drained(&self) {
        self.wait_for("the outbox to drain", || async {
            (store::outbox::backlog(&self.pool).await.expect("backlog").0 == 0).then_some(())
        })
        .await;
    }

    /// The scan's state.
    pub async fn scan_state(&self, scan_id: &str) -> String {
        let id = Uuid::parse_str(scan_id).expect("scan id is a UUID");
        store::admin::scan(&self.pool, id)
            .await
            .expect("scan read")
            .expect("scan exists")
            .state
    }

    /// Waits until the scan reaches `state`.
    pub async fn wait_scan_state(&self, scan_id: &str, state: &str) {
        self.wait_for(&format!("scan {scan_id} to be {state}"), || async {
            (self.scan_state(scan_id).await == state).then_some(())
        })
        .await;
    }

    /// The test's own database.
    pub fn database_url(&self) -> &str {
        &self.database_url
    }

    /// Stops every component and closes the pool, keeping the database (for what a test reads
    /// once no palisade backend is left, such as the statistics they flush when they exit).
    /// [`TestSystem::finish`] still cleans up afterwards.
    pub async fn stop_all(&self) {
        self.shutdown.cancel();
        let running: Vec<_> = self.running.lock().expect("not poisoned").drain().collect();
        for (_, (_, handle)) in running {
            let _ = handle.await;
        }
        self.pool.close().await;
    }

    /// Stops everything, drops the test's database and deletes its streams.
    pub async fn finish(self) {
        self.shutdown.cancel();
        let running: Vec<_> = self.running.lock().expect("not poisoned").drain().collect();
        for (_, (_, handle)) in running {
            let _ = handle.await;
        }
        self.pool.close().await;
        let _ = store::drop_database(&self.database_url).await;
        // The shared NATS keeps streams on disk: remove this test's three.
        for stream in [
            self.subjects.requests_stream(),
            self.subjects.events_stream(),
            self.subjects.results_stream(),
        ] {
            let _ = self.bus.jetstream().delete_stream(&stream).await;
        }
    }
}
