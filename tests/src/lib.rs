//! The system-test harness: [`TestSystem`] starts palisade's services in-process on real
//! PostgreSQL and NATS, with a database and a subject prefix of its own, so tests run in
//! parallel; [`ManualWorker`] speaks the worker protocol by hand so a test controls every
//! message. Tests wait on conditions with deadlines, never on sleeps.
//!
//! PostgreSQL and NATS come from `DATABASE_URL` / `NATS_URL`, else the local defaults.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bus::Bus;
use bus::async_nats;
use futures::StreamExt as _;
use messages::{ClientVerb, Subjects, WorkerVerb, v1};

/// The client id of [`TestSystem::client`]'s requests.
pub const TEST_CLIENT_ID: &str = "test-client";

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
use palisade::system::SystemSettings;
use prost::Message as _;
use runtime::{CommonSettings, Connections};
use store::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// How long a test waits for any one condition before failing.
pub const WAIT_MAX: Duration = Duration::from_secs(20);

/// Every table palisade writes, for "nothing was written" checks.
pub use store::testing::TABLES;

pub mod chaos;
pub mod empty_database;
pub mod nvd;
pub mod servers;
pub mod tls;

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

/// A started component: how to stop it, and its task.
type RunningComponent = (CancellationToken, JoinHandle<anyhow::Result<()>>);

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
    database_url: String,
    shutdown: CancellationToken,
    running: Mutex<HashMap<Component, RunningComponent>>,
    /// The NATS identities of this system: issues credentials when the server authenticates.
    pub nats: TestNats,
    /// Each service's own connection, with its own credentials.
    service_buses: HashMap<Component, Bus>,
}

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

/// The NATS a test system runs on: by default a server of its own that authenticates every
/// connection and enforces each credential's permissions, so every system test runs with
/// credentials on; `NATS_URL` (or a test's own settings) points it at an open server instead.
pub struct TestNats {
    url: String,
    subjects: Subjects,
    /// `None` for an open server.
    pub authority: Option<Arc<identity::Authority>>,
    server: Option<servers::NatsServer>,
    /// Credential files written for child processes.
    files: tempfile::TempDir,
    /// The worker and client accounts pushed so far.
    pushed: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl TestNats {
    /// The server's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Credentials for `identity`; none on an open server. A worker's or client's own account
    /// is pushed to the server the first time (as `worker add` and `client add` do).
    pub async fn credentials(&self, identity: &messages::Identity) -> bus::NatsCredentials {
        match &self.authority {
            Some(authority) => {
                self.ensure_account(identity).await;
                bus::NatsCredentials::from_creds(
                    authority.issue(&self.subjects, identity).file.as_str(),
                )
            }
            None => bus::NatsCredentials::none(),
        }
    }

    /// Pushes the account of `identity` (a worker or a client) unless this system already did:
    /// a later push would replace whatever revocations a test pushed for it since.
    pub async fn ensure_account(&self, identity: &messages::Identity) {
        let Some(authority) = &self.authority else {
            return;
        };
        let account = authority.account_of(identity);
        if account == authority.account_public_key()
            || !self.pushed.lock().expect("not poisoned").insert(account)
        {
            return;
        }
        push_account(authority, &self.subjects, &self.url, identity).await;
    }

    /// Panics unless the server authenticates: a test of confinement means nothing on an open
    /// server.
    pub fn assert_secured(&self) {
        assert!(
            self.authority.is_some(),
            "this test needs a server that authenticates: unset NATS_URL so the test system runs its own"
        );
    }

    /// Credentials allowed everything: the test's own connection, which plays every part.
    fn unrestricted(&self) -> bus::NatsCredentials {
        match &self.authority {
            Some(authority) => unrestricted_credentials(authority),
            None => bus::NatsCredentials::none(),
        }
    }

    /// A connection as `identity` with its own credentials.
    pub async fn connect(&self, identity: &messages::Identity) -> Bus {
        let credentials = self.credentials(identity).await;
        let tls = bus::NatsTls::default();
        connect_patiently(|| {
            Bus::connect(
                &self.url,
                &credentials,
                &tls,
                self.subjects.clone(),
                identity,
            )
        })
        .await
        .unwrap_or_else(|error| panic!("{identity:?} cannot connect: {error}"))
    }

    /// `NATS_URL` and, on a server that authenticates, `NATS_CREDS` (a file of `identity`'s
    /// credentials, its account pushed) for a child process.
    pub async fn child_env(&self, identity: &messages::Identity) -> Vec<(&'static str, String)> {
        let mut env = vec![("NATS_URL", self.url.clone())];
        if let Some(authority) = &self.authority {
            self.ensure_account(identity).await;
            let path = write_credentials(authority, &self.subjects, identity, self.files.path());
            env.push(("NATS_CREDS", path.display().to_string()));
        }
        env
    }

    /// The secured server's log (empty for an open server).
    pub fn server_log(&self) -> String {
        self.server
            .as_ref()
            .map(servers::NatsServer::log)
            .unwrap_or_default()
    }

    /// Signs and pushes what PostgreSQL records of `holder`'s account (its refused
    /// credentials), as `palisade worker revoke`, `client revoke` and the rest do.
    pub async fn push_recorded(&self, pool: &PgPool, holder: &store::bus_identities::Holder) {
        let authority = self
            .authority
            .as_ref()
            .expect("a server that authenticates");
        palisade::accounts::push(
            authority,
            &self.subjects,
            &self.url,
            &bus::NatsTls::default(),
            pool,
            Some(holder),
        )
        .await
        .expect("account pushed");
    }
}

/// Pushes the account of `identity` (a worker or a client), with nothing revoked, to the
/// server at `url`.
pub async fn push_account(
    authority: &identity::Authority,
    subjects: &Subjects,
    url: &str,
    identity: &messages::Identity,
) {
    let account = authority
        .identity_account(subjects, identity, &[])
        .expect("a worker or a client has an account of its own");
    authority
        .push(url, &bus::NatsTls::default(), &[account])
        .await
        .unwrap_or_else(|error| panic!("the account of {identity:?} was not pushed: {error}"));
}

/// Credentials allowed everything, for a test's (or the chaos suite's) own connection, which
/// plays every part.
/// A NATS of a test's own (a cluster, a server it stops) that authenticates like the one
/// [`TestSystem::spawn`] starts: the test takes an [`OwnNats::installation`], starts its
/// servers for it ([`servers::NatsServer::start_secured`],
/// [`servers::NatsCluster::start_secured`]) and hands them to [`TestSystem::spawn_on`].
pub struct OwnNats {
    /// One server, or a cluster's comma-separated list.
    pub url: String,
    pub authority: Arc<identity::Authority>,
    pub subjects: Subjects,
}

impl OwnNats {
    /// A fresh authority and subject prefix, for the servers to start with.
    pub fn installation() -> (Arc<identity::Authority>, Subjects) {
        let id = Uuid::new_v4().simple().to_string();
        (
            Arc::new(identity::Authority::generate()),
            Subjects::new(&format!("t{}", &id[..12])).expect("valid prefix"),
        )
    }
}

pub fn unrestricted_credentials(authority: &identity::Authority) -> bus::NatsCredentials {
    let everything = messages::Permissions {
        publish: vec![">".into()],
        subscribe: vec![">".into()],
        responses: true,
    };
    bus::NatsCredentials::from_creds(authority.issue_with("test", &everything).file.as_str())
}

/// Writes a `.creds` file of `identity`'s own credentials into `dir`, for a child process's
/// `NATS_CREDS`.
pub fn write_credentials(
    authority: &identity::Authority,
    subjects: &Subjects,
    identity: &messages::Identity,
    dir: &std::path::Path,
) -> std::path::PathBuf {
    let path = dir.join(format!("{}-{}.creds", identity.token(), Uuid::new_v4()));
    identity::write_secret(&path, &authority.issue(subjects, identity).file)
        .expect("credentials written");
    path
}

/// Logs of a test's child process (`test-service`, `test-worker`): plain text on stderr, which
/// the test may send to a file, filtered by `RUST_LOG` (default `warn`). With
/// `OTEL_EXPORTER_OTLP_ENDPOINT` set, installs what the production binaries install instead (`telemetry::init` as
/// `service_name`, exporting spans); keep the guard until the process ends.
pub fn init_child_logging(service_name: &str) -> Option<telemetry::TelemetryGuard> {
    let otlp = telemetry::OtlpSettings::from_env().expect("valid OTLP settings");
    if otlp.is_some() {
        let mut settings = telemetry::TelemetrySettings::from_env().expect("valid settings");
        settings.default_filter = "warn".into();
        settings.to_stderr = true;
        return Some(telemetry::init(service_name, &settings).expect("telemetry installs"));
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    None
}

/// Statement counting (as in every palisade process) and, with `TEST_LOG` set, logs filtered
/// by `RUST_LOG`. A test that installed its own subscriber first (`telemetry::init`) keeps it.
pub fn init_test_logging() {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let logs = std::env::var_os("TEST_LOG").is_some().then(|| {
        tracing_subscriber::fmt::layer()
            .with_test_writer()
            .with_filter(tracing_subscriber::EnvFilter::from_default_env())
    });
    let _ = tracing_subscriber::registry()
        .with(telemetry::cost::statement_counter())
        .with(logs)
        .try_init();
}

/// Where the test's PostgreSQL and NATS are.
#[derive(Debug, Clone)]
struct Backends {
    database_url: String,
    /// `None`: each test system runs a `nats-server` of its own that authenticates.
    nats_url: Option<String>,
}

const LOCAL_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";
const LOCAL_NATS_URL: &str = "nats://127.0.0.1:4222";

/// `DATABASE_URL` / `NATS_URL` when set, else the local defaults when they answer, else
/// containers started with testcontainers where a Docker engine runs (once per process).
async fn backends() -> Backends {
    static BACKENDS: tokio::sync::OnceCell<Backends> = tokio::sync::OnceCell::const_new();
    BACKENDS
        .get_or_init(|| async {
            let database_url = match std::env::var("DATABASE_URL").ok() {
                Some(url) => url,
                None if port_answers(5432).await => LOCAL_DATABASE_URL.to_owned(),
                None => containers::postgres().await.unwrap_or_else(|| {
                    panic!(
                        "no PostgreSQL: set DATABASE_URL, start one on 127.0.0.1:5432, or run Docker for testcontainers"
                    )
                }),
            };
            let nats_url = match std::env::var("NATS_URL").ok() {
                Some(url) => Some(url),
                None if servers::nats_server_available() => None,
                None if port_answers(4222).await => {
                    eprintln!(
                        "no nats-server binary (NATS_SERVER_BIN or PATH): the tests run on the open server at {LOCAL_NATS_URL}, without credentials"
                    );
                    Some(LOCAL_NATS_URL.to_owned())
                }
                None => Some(containers::nats().await.unwrap_or_else(|| {
                    panic!(
                        "no NATS: install nats-server (or set NATS_SERVER_BIN), set NATS_URL, or run Docker for testcontainers"
                    )
                })),
            };
            Backends {
                database_url,
                nats_url,
            }
        })
        .await
        .clone()
}

async fn port_answers(port: u16) -> bool {
    let connect = tokio::net::TcpStream::connect(("127.0.0.1", port));
    matches!(
        tokio::time::timeout(Duration::from_millis(500), connect).await,
        Ok(Ok(_))
    )
}

/// The testcontainers fallback for machines with Docker and without local servers.
mod containers {
    use testcontainers_modules::nats::{Nats, NatsServerCmd};
    use testcontainers_modules::postgres::Postgres;
    use testcontainers_modules::testcontainers::runners::AsyncRunner as _;
    use testcontainers_modules::testcontainers::{ContainerAsync, Image, ImageExt as _};

    /// Containers live as long as the test process.
    static KEEP: std::sync::Mutex<Vec<Box<dyn std::any::Any + Send>>> =
        std::sync::Mutex::new(Vec::new());

    fn docker_available() -> bool {
        std::process::Command::new("docker")
            .arg("info")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    }

    fn keep<I: Image + 'static>(container: ContainerAsync<I>) {
        KEEP.lock().expect("not poisoned").push(Box::new(container));
    }

    pub async fn postgres() -> Option<String> {
        if !docker_available() {
            return None;
        }
        let container = Postgres::default()
            .with_tag("16-alpine")
            .start()
            .await
            .ok()?;
        let port = container.get_host_port_ipv4(5432).await.ok()?;
        keep(container);
        Some(format!(
            "postgres://postgres:postgres@127.0.0.1:{port}/postgres"
        ))
    }

    pub async fn nats() -> Option<String> {
        if !docker_available() {
            return None;
        }
        let command = NatsServerCmd::default().with_jetstream();
        let container = Nats::default()
            .with_cmd(&command)
            .with_tag("2.12.3")
            .start()
            .await
            .ok()?;
        let port = container.get_host_port_ipv4(4222).await.ok()?;
        keep(container);
        Some(format!("nats://127.0.0.1:{port}"))
    }
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

    async fn spawn_inner(
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
    fn connections(&self, component: Component) -> Connections {
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
                let mut settings = self.settings.admission.clone();
                settings.crash_after_commit = Some(self.admission_crash.clone());
                let service = admission::Service::from_connections(
                    settings,
                    self.connections(Component::Admission),
                );
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
                let mut settings = self.settings.ingestion();
                settings.crash_after_commit = Some(self.ingestion_crash.clone());
                let service = ingestion::Service::from_connections(
                    settings,
                    self.connections(Component::Ingestion),
                );
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

/// A worker whose every message the test sends by hand.
pub struct ManualWorker {
    pub id: Uuid,
    bus: Bus,
    acks: tokio::sync::Mutex<async_nats::Subscriber>,
}

impl ManualWorker {
    pub async fn connect(bus: Bus, id: Uuid) -> Self {
        let acks = bus
            .client()
            .subscribe(bus.subjects().worker(&id.to_string(), WorkerVerb::Ack))
            .await
            .expect("ack subscription");
        bus.flush().await.expect("subscription registered");
        Self {
            id,
            bus,
            acks: tokio::sync::Mutex::new(acks),
        }
    }

    fn subject(&self, verb: WorkerVerb) -> String {
        self.bus.subjects().worker(&self.id.to_string(), verb)
    }

    /// A request/reply round trip with raw bytes.
    pub async fn request_raw(&self, verb: WorkerVerb, payload: Vec<u8>) -> bytes::Bytes {
        self.bus
            .request(self.subject(verb), payload.into(), Duration::from_secs(35))
            .await
            .expect("dispatch answers")
            .payload
    }

    pub async fn hello(&self, capabilities: &[&str]) -> v1::HelloReply {
        self.hello_with_capacity(capabilities, 8).await
    }

    pub async fn hello_with_capacity(
        &self,
        capabilities: &[&str],
        capacity: u32,
    ) -> v1::HelloReply {
        let request = v1::HelloRequest {
            schema_version: 1,
            worker_id: self.id.to_string(),
            software_version: "manual/1".into(),
            protocol_version: messages::PROTOCOL_VERSION.into(),
            capabilities: capabilities.iter().map(|c| (*c).to_owned()).collect(),
            capacity,
        };
        v1::HelloReply::decode(
            self.request_raw(WorkerVerb::Hello, request.encode_to_vec())
                .await,
        )
        .expect("HelloReply")
    }

    pub async fn acquire(
        &self,
        request_id: Uuid,
        max_tasks: u32,
        wait_ms: u32,
    ) -> v1::AcquireReply {
        let request = v1::AcquireRequest {
            schema_version: 1,
            worker_id: self.id.to_string(),
            request_id: request_id.to_string(),
            max_tasks,
            wait_ms,
        };
        v1::AcquireReply::decode(
            self.request_raw(WorkerVerb::Acquire, request.encode_to_vec())
                .await,
        )
        .expect("AcquireReply")
    }

    /// Acquires exactly one lease, waiting for it.
    pub async fn acquire_one(&self) -> v1::Lease {
        let reply = self.acquire(Uuid::new_v4(), 1, 10_000).await;
        assert!(reply.error.is_none(), "acquire refused: {:?}", reply.error);
        reply
            .leases
            .into_iter()
            .next()
            .expect("a lease within the long-poll")
    }

    pub async fn renew(&self, lease: &v1::Lease) -> v1::RenewReply {
        let request = v1::RenewRequest {
            schema_version: 1,
            worker_id: self.id.to_string(),
            lease: lease.lease.clone(),
            more_leases: Vec::new(),
        };
        v1::RenewReply::decode(
            self.request_raw(WorkerVerb::Renew, request.encode_to_vec())
                .await,
        )
        .expect("RenewReply")
    }

    /// Renews `leases` in one request: the first as `lease`, the rest as `more_leases`.
    pub async fn renew_many(&self, leases: &[v1::LeaseRef]) -> v1::RenewReply {
        let request = v1::RenewRequest {
            schema_version: 1,
            worker_id: self.id.to_string(),
            lease: leases.first().cloned(),
            more_leases: leases.iter().skip(1).cloned().collect(),
        };
        v1::RenewReply::decode(
            self.request_raw(WorkerVerb::Renew, request.encode_to_vec())
                .await,
        )
        .expect("RenewReply")
    }

    pub async fn release(&self, lease: &v1::Lease) -> v1::ReleaseReply {
        let request = v1::ReleaseRequest {
            schema_version: 1,
            worker_id: self.id.to_string(),
            lease: lease.lease.clone(),
            reason: "test".into(),
        };
        v1::ReleaseReply::decode(
            self.request_raw(WorkerVerb::Release, request.encode_to_vec())
                .await,
        )
        .expect("ReleaseReply")
    }

    /// A well-formed batch for `lease` with a correct checksum and key `attempt:sequence`.
    pub fn batch(
        &self,
        lease: &v1::Lease,
        sequence_number: u32,
        payload: &v1::BatchPayload,
    ) -> v1::ResultBatch {
        let reference = lease.lease.clone().expect("lease ref");
        let bytes = payload.encode_to_vec();
        v1::ResultBatch {
            schema_version: 1,
            worker_id: self.id.to_string(),
            idempotency_key: format!("{}:{sequence_number}", reference.attempt_id),
            lease: Some(reference),
            sequence_number,
            payload_sha256: messages::sha256_hex(&bytes),
            payload: bytes,
        }
    }

    /// One artifact request for `lease` and its answer.
    pub async fn artifact(
        &self,
        lease: &v1::LeaseRef,
        step: v1::artifact_request::Step,
    ) -> v1::ArtifactReply {
        let request = v1::ArtifactRequest {
            schema_version: 1,
            worker_id: self.id.to_string(),
            lease: Some(lease.clone()),
            step: Some(step),
        };
        v1::ArtifactReply::decode(
            self.request_raw(WorkerVerb::Artifact, request.encode_to_vec())
                .await,
        )
        .expect("ArtifactReply")
    }

    /// Prepares upload `upload_id` of a file named `name` for `lease`.
    pub async fn prepare_upload(
        &self,
        lease: &v1::LeaseRef,
        upload_id: Uuid,
        name: &str,
    ) -> v1::ArtifactReply {
        self.artifact(
            lease,
            v1::artifact_request::Step::Prepare(v1::PrepareUpload {
                upload_id: upload_id.to_string(),
                name: name.into(),
                content_type: "application/json".into(),
            }),
        )
        .await
    }

    /// Publishes `data` on `subject` in chunks of `chunk_bytes` (indexes from 0), each awaiting
    /// its PubAck; the number of chunks.
    pub async fn send_chunks(
        &self,
        subject: &str,
        upload_id: Uuid,
        data: &[u8],
        chunk_bytes: usize,
    ) -> u32 {
        let mut index = 0;
        for piece in data.chunks(chunk_bytes) {
            let chunk = v1::ArtifactChunk {
                upload_id: upload_id.to_string(),
                index,
                data: piece.to_vec(),
            };
            self.bus
                .publish_durable(
                    subject.to_owned(),
                    &format!("{upload_id}:{index}"),
                    Default::default(),
                    chunk.encode_to_vec().into(),
                )
                .await
                .expect("chunk published");
            index += 1;
        }
        index
    }

    /// Commits upload `upload_id` claiming `size_bytes`, `sha256` and `chunks`.
    pub async fn commit_upload(
        &self,
        lease: &v1::LeaseRef,
        upload_id: Uuid,
        size_bytes: u64,
        sha256: &str,
        chunks: u32,
    ) -> v1::ArtifactReply {
        self.artifact(
            lease,
            v1::artifact_request::Step::Commit(v1::CommitUpload {
                upload_id: upload_id.to_string(),
                size_bytes,
                sha256: sha256.into(),
                chunks,
            }),
        )
        .await
    }

    /// Publishes raw bytes on this worker's `verb` stream subject with a fresh `Nats-Msg-Id`
    /// (so JetStream never de-duplicates a deliberate repeat).
    pub async fn publish_raw(&self, verb: WorkerVerb, payload: Vec<u8>) {
        self.bus
            .publish_durable(
                self.subject(verb),
                &Uuid::new_v4().to_string(),
                Default::default(),
                payload.into(),
            )
            .await
            .expect("published");
    }

    /// The next acknowledgement from ingestion.
    pub async fn next_ack(&self) -> v1::IngestAck {
        let mut acks = self.acks.lock().await;
        let message = tokio::time::timeout(WAIT_MAX, acks.next())
            .await
            .expect("ingestion answered in time")
            .expect("ack subscription open");
        v1::IngestAck::decode(message.payload.as_ref()).expect("IngestAck")
    }

    pub async fn send_batch(&self, batch: &v1::ResultBatch) -> v1::IngestAck {
        self.publish_raw(WorkerVerb::Result, batch.encode_to_vec())
            .await;
        self.next_ack().await
    }

    pub fn completion(&self, lease: &v1::Lease, batch_count: u32) -> v1::TaskComplete {
        v1::TaskComplete {
            schema_version: 1,
            worker_id: self.id.to_string(),
            lease: lease.lease.clone(),
            batch_count,
            summary: "done".into(),
            final_batch: None,
            lease_next: false,
        }
    }

    pub async fn complete(&self, lease: &v1::Lease, batch_count: u32) -> v1::IngestAck {
        self.publish_raw(
            WorkerVerb::Complete,
            self.completion(lease, batch_count).encode_to_vec(),
        )
        .await;
        self.next_ack().await
    }

    /// Completes `lease` asking for its scan's next plugin with the acknowledgement
    /// (`TaskComplete.lease_next`).
    pub async fn complete_asking_next(&self, lease: &v1::Lease, batch_count: u32) -> v1::IngestAck {
        let completion = v1::TaskComplete {
            lease_next: true,
            ..self.completion(lease, batch_count)
        };
        self.publish_raw(WorkerVerb::Complete, completion.encode_to_vec())
            .await;
        self.next_ack().await
    }

    pub fn failure(&self, lease: &v1::Lease, code: &str, retryable: bool) -> v1::TaskFail {
        v1::TaskFail {
            schema_version: 1,
            worker_id: self.id.to_string(),
            lease: lease.lease.clone(),
            error: Some(v1::Error {
                code: code.into(),
                message: "test failure".into(),
                ..Default::default()
            }),
            retryable,
        }
    }

    pub async fn fail(&self, lease: &v1::Lease, code: &str, retryable: bool) -> v1::IngestAck {
        self.publish_raw(
            WorkerVerb::Fail,
            self.failure(lease, code, retryable).encode_to_vec(),
        )
        .await;
        self.next_ack().await
    }
}

/// Decides `claim`'s completion (no batches) inside `tx` as ingestion does, through
/// `ingest::decide`: a forced race drives the path production runs.
pub async fn complete_attempt(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    subjects: &messages::Subjects,
    claim: &store::LeaseClaim,
) -> Result<store::ingest::IngestOutcome, store::StoreError> {
    let completion = store::ingest::Message::Complete(store::ingest::CompleteParams {
        claim,
        batch_count: 0,
        summary: "",
    });
    store::ingest::decide(tx, &mut store::Staged::default(), subjects, &[completion])
        .await?
        .outcomes
        .pop()
        .expect("one message, one outcome")
}

/// A small batch payload: `count` findings with stable keys.
pub fn findings_payload(count: usize) -> v1::BatchPayload {
    v1::BatchPayload {
        findings: (0..count)
            .map(|index| v1::Finding {
                rule_id: format!("rule-{index}"),
                resource: "http://example.test/".into(),
                severity: "low".into(),
                title: format!("finding {index}"),
                ..Default::default()
            })
            .collect(),
        assets: vec![v1::Asset {
            kind: "http_service".into(),
            value: "http://example.test:80".into(),
        }],
    }
}

/// Waits until a durable consumer has nothing pending and nothing unacknowledged: every
/// message was acknowledged or terminated (none is left to be redelivered).
pub async fn wait_consumer_idle(system: &TestSystem, stream: &str, consumer: &str) {
    system
        .wait_for(&format!("consumer {consumer} to drain"), || async {
            let stream = system.bus.jetstream().get_stream(stream).await.ok()?;
            let mut consumer: async_nats::jetstream::consumer::PullConsumer =
                stream.get_consumer(consumer).await.ok()?;
            let info = consumer.info().await.ok()?;
            (info.num_pending == 0 && info.num_ack_pending == 0).then_some(())
        })
        .await;
}

/// An organization, a manual worker serving it with `plugins` as capabilities, and one scan
/// of `plugins` whose first task the worker has leased.
pub struct LeasedScan {
    pub organization_id: Uuid,
    pub worker: ManualWorker,
    pub scan_id: String,
    pub lease: v1::Lease,
}

impl TestSystem {
    pub async fn leased_scan(&self, plugins: &[&str]) -> LeasedScan {
        let organization_id = self.organization().await;
        let worker = self.manual_worker(organization_id, 8).await;
        let hello = worker.hello(plugins).await;
        assert!(hello.error.is_none(), "{hello:?}");
        let reply = self
            .submit(&self.request(organization_id, "http://target.test", plugins))
            .await;
        assert!(reply.error.is_none(), "{reply:?}");
        let lease = worker.acquire_one().await;
        LeasedScan {
            organization_id,
            worker,
            scan_id: reply.scan_id,
            lease,
        }
    }

    /// Completes the single-task `scan` with one batch of `findings` findings, then waits for
    /// the scan to be completed and every event to be relayed.
    pub async fn complete_with_findings(&self, scan: &LeasedScan, findings: usize) {
        let worker = &scan.worker;
        let batch = worker.batch(&scan.lease, 0, &findings_payload(findings));
        let ack = worker.send_batch(&batch).await;
        assert!(ack.error.is_none(), "{ack:?}");
        let ack = worker.complete(&scan.lease, 1).await;
        assert!(ack.error.is_none(), "{ack:?}");
        self.wait_scan_state(&scan.scan_id, "completed").await;
        self.wait_outbox_drained().await;
    }

    /// One reaper sweep of lapsed enrichment claims, without backoff: a job returned to the
    /// queue is due again at once.
    pub async fn sweep_enrichment(&self) -> store::enrichment::RecoveredJobs {
        store::enrichment::recover_expired(
            &self.pool,
            &self.subjects,
            store::RetryPolicy::new(Duration::ZERO, Duration::ZERO),
            100,
        )
        .await
        .expect("a sweep")
    }

    /// Submits a `dependency_audit` scan of the test lockfile (`rust/Cargo.lock` under
    /// [`DEPENDENCY_AUDIT_DATA`]) for `organization` and waits until it completed: its id.
    pub async fn completed_dependency_audit(&self, organization: Uuid) -> Uuid {
        let lockfile = format!("{DEPENDENCY_AUDIT_DATA}/rust/Cargo.lock");
        let lockfile = std::fs::canonicalize(lockfile).expect("the test lockfile");
        let reply = self
            .submit(&self.request(
                organization,
                &lockfile.display().to_string(),
                &["dependency_audit"],
            ))
            .await;
        assert!(reply.error.is_none(), "{reply:?}");
        self.wait_scan_state(&reply.scan_id, "completed").await;
        reply.scan_id.parse().expect("a scan id")
    }

    /// A completed scan with two findings naming `cve_ids`, whose enrichment job is pending
    /// with `{}` as its checkpoint, as a dependency audit's would be: (scan id, job id).
    pub async fn scan_to_enrich(&self, cve_ids: &[&str]) -> (Uuid, Uuid) {
        let scan = self.leased_scan(&["alpha"]).await;
        self.complete_with_findings(&scan, 2).await;
        let job_id: Uuid = sqlx::query_scalar(
            "WITH cve AS (UPDATE findings SET cve_ids = $2 WHERE scan_id = $1::uuid) \
             UPDATE enrichment_jobs SET state = 'pending', finished_at = NULL, checkpoint = '{}' \
             WHERE scan_id = $1::uuid RETURNING id",
        )
        .bind(&scan.scan_id)
        .bind(cve_ids)
        .fetch_one(&self.pool)
        .await
        .expect("a job to enrich");
        (scan.scan_id.parse().expect("a scan id"), job_id)
    }

    /// Cancels the task `task_id` (and its scan) as dispatch's cancel does.
    pub async fn cancel_task(&self, task_id: Uuid) {
        let outcome = store::cancel::cancel(
            &self.pool,
            &self.subjects,
            None,
            store::cancel::CancelTarget::Task(task_id),
            "cancelled by the test",
        )
        .await
        .expect("cancel decided");
        assert!(
            matches!(outcome, store::cancel::CancelOutcome::Cancelled { .. }),
            "{outcome:?}"
        );
    }

    /// Expires the live attempt of `lease`'s task by the database clock, recovers it with the
    /// reaper, and makes the task due at once.
    pub async fn expire_and_recover(&self, lease: &v1::Lease) {
        let task_id =
            Uuid::parse_str(&lease.lease.as_ref().expect("lease ref").task_id).expect("uuid");
        store::testing::expire_live_attempt(&self.pool, task_id)
            .await
            .expect("expired");
        let outcome = self.reaper().run_once().await.expect("reaper sweep");
        assert!(outcome.recovered.retried.contains(&task_id), "{outcome:?}");
        store::testing::make_task_due(&self.pool, task_id)
            .await
            .expect("due");
    }
}

/// A local web app without the usual security headers, for the plugins to scan.
pub async fn start_web_app() -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buffer = [0_u8; 4096];
                let _ = stream.read(&mut buffer).await;
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\nServer: test-app/1.0\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
                    .await;
            });
        }
    });
    address
}

/// Messages stored per subject in `stream`, for subjects matching `filter`.
pub async fn stream_subject_counts(
    system: &TestSystem,
    stream: &str,
    filter: &str,
) -> HashMap<String, usize> {
    use futures::TryStreamExt as _;
    let stream = system
        .bus
        .jetstream()
        .get_stream(stream)
        .await
        .expect("stream exists");
    stream
        .info_with_subjects(filter)
        .await
        .expect("stream info")
        .try_collect()
        .await
        .expect("subject counts")
}

/// The test system's events stream, to read what was published on it.
pub async fn events_stream(system: &TestSystem) -> bus::async_nats::jetstream::stream::Stream {
    system
        .bus
        .jetstream()
        .get_stream(system.subjects.events_stream())
        .await
        .expect("events stream exists")
}

/// Every event on the events stream that came from the outbox, in order (its id is the
/// message's `Nats-Msg-Id`; published rows are no longer in the table). `scan.rejected`, which
/// admission publishes directly under a `scan-rejected:<sequence>` id, is left out.
pub async fn published_events(system: &TestSystem) -> Vec<store::OutboxEvent> {
    let mut stream = events_stream(system).await;
    let last = stream
        .info()
        .await
        .expect("stream info")
        .state
        .last_sequence;
    let mut events = Vec::new();
    for sequence in 1..=last {
        let message = stream
            .get_raw_message(sequence)
            .await
            .expect("an event on the stream");
        let kind = system.subjects.event_kind_of(&message.subject);
        let Some(id) = message
            .headers
            .get(messages::HEADER_MSG_ID)
            .and_then(|id| Uuid::parse_str(id.as_str()).ok())
        else {
            assert_eq!(
                kind,
                Some(messages::EventKind::ScanRejected),
                "every event but scan.rejected carries its outbox id as Nats-Msg-Id"
            );
            continue;
        };
        events.push(store::OutboxEvent {
            id,
            kind,
            subject: message.subject.to_string(),
            payload: message.payload.to_vec(),
            headers: Default::default(),
            trace_scan_id: None,
        });
    }
    events
}

/// Every event written, published or not: those on the events stream, then the outbox rows
/// not among them. Exact whenever it is read: the rows are read first, and a row removed
/// since was published before it was removed, so it is on the stream when that is read.
pub async fn written_events(system: &TestSystem) -> Vec<store::OutboxEvent> {
    let unpublished = store::testing::unpublished_events(&system.pool)
        .await
        .expect("outbox rows");
    let mut events = published_events(system).await;
    let published: HashSet<Uuid> = events.iter().map(|event| event.id).collect();
    for (mut event, _) in unpublished {
        if !published.contains(&event.id) {
            event.kind = system.subjects.event_kind_of(&event.subject);
            events.push(event);
        }
    }
    events
}

/// The payloads of every event of `kind` written ([`written_events`]).
pub async fn written_payloads(system: &TestSystem, kind: messages::EventKind) -> Vec<Vec<u8>> {
    written_events(system)
        .await
        .into_iter()
        .filter(|event| event.kind == Some(kind))
        .map(|event| event.payload)
        .collect()
}

/// Puts every event on the events stream back in the outbox, unpublished, under its own id:
/// what a relay finds after publishing rows whose PubAcks it never saw. Returns how many.
pub async fn put_published_events_back(system: &TestSystem) -> usize {
    let events = published_events(system).await;
    let mut conn = system.pool.acquire().await.expect("a connection");
    store::outbox::enqueue(&mut conn, &events)
        .await
        .expect("events back in the outbox");
    events.len()
}

/// Messages on the events stream by event name (`scan.completed`), tenant and services'
/// events alike.
pub async fn event_counts(system: &TestSystem) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for (subject, count) in
        stream_subject_counts(system, &system.subjects.events_stream(), ">").await
    {
        let kind = system
            .subjects
            .event_kind_of(&subject)
            .unwrap_or_else(|| panic!("{subject} on the events stream names no event"));
        *counts.entry(kind.name().to_owned()).or_default() += count;
    }
    counts
}

/// A reference worker in-process that a test stops the way an operator would: it releases
/// what it holds and says no more.
pub struct StoppableWorker {
    pub worker_id: Uuid,
    stop: CancellationToken,
    handle: JoinHandle<Result<(), worker::WorkerError>>,
}

impl StoppableWorker {
    /// Stops the worker and waits until it has.
    pub async fn stop(self) {
        self.stop.cancel();
        tokio::time::timeout(WAIT_MAX, self.handle)
            .await
            .unwrap_or_else(|_| panic!("worker did not stop within {WAIT_MAX:?}"))
            .expect("worker did not panic")
            .expect("worker stopped cleanly");
    }
}

/// A reference worker running as a child process, so a test can SIGKILL or SIGSTOP it.
pub struct WorkerProcess {
    pub worker_id: Uuid,
    child: tokio::process::Child,
}

impl WorkerProcess {
    /// Registers a worker for `organization_id` and starts `palisade-worker` for it.
    /// `binary` is the `test-worker` binary: `env!("CARGO_BIN_EXE_test-worker")` in the
    /// integration tests.
    pub async fn start(
        system: &TestSystem,
        binary: &str,
        organization_id: Uuid,
        capacity: u32,
    ) -> Self {
        Self::start_with_env(system, binary, organization_id, capacity, &[]).await
    }

    /// [`WorkerProcess::start`] with more environment (`OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub async fn start_with_env(
        system: &TestSystem,
        binary: &str,
        organization_id: Uuid,
        capacity: u32,
        env: &[(String, String)],
    ) -> Self {
        let worker_id = system.registered_worker(organization_id, capacity).await;
        let child = tokio::process::Command::new(binary)
            .envs(env.iter().map(|(key, value)| (key, value)))
            .envs(
                system
                    .nats
                    .child_env(&messages::Identity::Worker { worker_id })
                    .await,
            )
            .env("PALISADE_SUBJECT_PREFIX", system.subjects.prefix())
            .env("PALISADE_WORKER_ID", worker_id.to_string())
            .env("PALISADE_WORKER_CAPACITY", capacity.to_string())
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .kill_on_drop(true)
            .spawn()
            .expect("palisade-worker starts");
        Self { worker_id, child }
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("still running")
    }

    /// SIGTERM, as an orchestrator stops it: it releases its leases and flushes its spans.
    /// Waits at most `grace` for it to exit, then kills it.
    pub async fn terminate(mut self, grace: std::time::Duration) {
        self.signal("TERM");
        if tokio::time::timeout(grace, self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }

    /// SIGKILL: no release, no goodbye; its lease must expire and be recovered.
    pub async fn kill(&mut self) {
        self.child.kill().await.expect("SIGKILL delivered");
    }

    /// SIGSTOP / SIGCONT: a paused process that wakes up believing it still holds its lease.
    pub fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &self.pid().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{signal} failed");
    }
}
