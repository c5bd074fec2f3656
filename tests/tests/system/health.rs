//! `/healthz` and `/readyz` over real HTTP, against a PostgreSQL and a NATS server of this
//! test's own (never the machine's shared ones), which the test stops and starts again:
//! `/readyz` turns 503 naming the failing check, and back to 200 without a restart.
//!
//! PostgreSQL's binaries come from `PALISADE_PG_BIN_DIR`, else the newest
//! `/usr/lib/postgresql/<version>/bin`, else `PATH`; NATS from `NATS_SERVER_BIN`, else `PATH`.
//! Run as root, PostgreSQL runs as the `postgres` user (it refuses to run as root).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use messages::Subjects;
use palisade::system::{System, SystemSettings};
use runtime::CommonSettings;
use runtime::health::checks;
use tests::WAIT_MAX;
use tokio::process::{Child, Command};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_follows_postgres_and_nats_and_recovers_without_a_restart() {
    let mut postgres = PostgresServer::start().await;
    let mut nats = NatsServer::start().await;

    let id = uuid::Uuid::new_v4().simple().to_string();
    let mut common = CommonSettings::from_env().expect("valid environment");
    common.database = store::DatabaseSettings::new(postgres.url("palisade"));
    common.database.max_connections = 8;
    common.nats_url = nats.url();
    common.subjects = Subjects::new(&format!("h{}", &id[..12])).expect("valid prefix");
    let mut settings = SystemSettings::from_common(common).expect("valid settings");
    settings.http_addr = Some("127.0.0.1:0".parse().expect("address"));
    let system = System::start(settings).await.expect("palisade starts");
    let addr = system.health_addr().expect("health endpoints served");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("HTTP client");

    assert_healthz(&http, addr).await;
    let ready = wait_readyz(&http, addr, "ready with everything up", is_ready).await;
    for check in [
        checks::POSTGRES,
        checks::NATS,
        checks::STREAMS,
        checks::MIGRATIONS,
    ] {
        assert_eq!(check_state(&ready, check), Some("ok"), "{ready}");
    }

    postgres.stop().await;
    let down = wait_readyz(&http, addr, "postgres failing", |status, body| {
        status == 503 && check_state(body, checks::POSTGRES) == Some("failing")
    })
    .await;
    let message = down["message"].as_str().expect("a message when not ready");
    assert!(message.contains("PostgreSQL unreachable at"), "{message}");
    assert_eq!(check_state(&down, checks::NATS), Some("ok"), "{down}");
    assert_healthz(&http, addr).await;
    postgres.restart().await;
    wait_readyz(&http, addr, "ready after PostgreSQL is back", is_ready).await;

    nats.kill().await;
    let down = wait_readyz(&http, addr, "nats failing", |status, body| {
        status == 503 && check_state(body, checks::NATS) == Some("failing")
    })
    .await;
    let message = down["message"].as_str().expect("a message when not ready");
    assert!(message.contains("NATS not connected"), "{message}");
    assert_eq!(check_state(&down, checks::POSTGRES), Some("ok"), "{down}");
    assert_healthz(&http, addr).await;
    nats.restart().await;
    wait_readyz(&http, addr, "ready after NATS is back", is_ready).await;

    system.stop().await;
}

/// `palisade health`, the containers' health check: ready while `/readyz` is, not ready with
/// the failing check named when a stream is gone, an error when nothing listens.
#[tokio::test]
async fn the_health_probe_follows_readyz() {
    let system = tests::TestSystem::spawn_with(|settings| {
        settings.http_addr = Some("127.0.0.1:0".parse().expect("address"));
    })
    .await;
    let addr = system.health_addr.expect("health endpoints served");
    let url = palisade::probe::readyz_url(SocketAddr::new([0, 0, 0, 0].into(), addr.port()));
    assert_eq!(url, format!("http://127.0.0.1:{}/readyz", addr.port()));
    let answer = palisade::probe::probe(&url).await.expect("an answer");
    assert!(answer.is_ready(), "{answer:?}");

    system
        .bus
        .jetstream()
        .delete_stream(system.subjects.results_stream())
        .await
        .expect("stream deleted");
    let answer = system
        .wait_for("the probe to report the missing stream", || async {
            let answer = palisade::probe::probe(&url).await.expect("an answer");
            (!answer.is_ready()).then_some(answer)
        })
        .await;
    assert_eq!(answer.status, 503, "{answer:?}");
    assert!(answer.body.contains(checks::STREAMS), "{answer:?}");

    let nothing_listens = format!("http://127.0.0.1:{}/readyz", free_port());
    assert!(palisade::probe::probe(&nothing_listens).await.is_err());
    system.finish().await;
}

fn is_ready(status: u16, body: &serde_json::Value) -> bool {
    status == 200 && body["status"] == "ready"
}

/// The state (`ok` / `failing`) of the check called `name` in a `/readyz` body.
fn check_state<'a>(body: &'a serde_json::Value, name: &str) -> Option<&'a str> {
    body["checks"]
        .as_array()?
        .iter()
        .find(|check| check["name"] == name)?["state"]
        .as_str()
}

async fn assert_healthz(http: &reqwest::Client, addr: SocketAddr) {
    let response = http
        .get(format!("http://{addr}/healthz"))
        .send()
        .await
        .expect("/healthz answers");
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.expect("body"), "ok");
}

/// Polls `/readyz` until `accept(status, body)` holds; fails after [`WAIT_MAX`] showing the
/// last answer.
async fn wait_readyz(
    http: &reqwest::Client,
    addr: SocketAddr,
    what: &str,
    accept: impl Fn(u16, &serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + WAIT_MAX;
    loop {
        let response = http
            .get(format!("http://{addr}/readyz"))
            .send()
            .await
            .expect("/readyz answers");
        let status = response.status().as_u16();
        let text = response.text().await.expect("body");
        let body: serde_json::Value = serde_json::from_str(&text).expect("a JSON body");
        if accept(status, &body) {
            return body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for /readyz: {what}; last answer {status} {text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls `probe` until it holds; fails after [`WAIT_MAX`].
async fn wait_until<F, Fut>(what: &str, mut probe: F)
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

/// A port nothing listens on now (the server started on it binds it a moment later).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("address")
        .port()
}

async fn port_answers(port: u16) -> bool {
    tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_ok()
}

/// A `nats-server -js` of this test's own; its JetStream store survives restarts.
struct NatsServer {
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl NatsServer {
    async fn start() -> Self {
        let mut server = Self {
            port: free_port(),
            dir: tempfile::tempdir().expect("temporary directory"),
            child: None,
        };
        server.restart().await;
        server
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    async fn restart(&mut self) {
        assert!(self.child.is_none(), "nats-server already running");
        let binary = std::env::var("NATS_SERVER_BIN").unwrap_or_else(|_| "nats-server".into());
        let child = Command::new(&binary)
            .args([
                "-js",
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-sd",
            ])
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|error| {
                panic!("cannot run {binary} ({error}); install nats-server or set NATS_SERVER_BIN")
            });
        self.child = Some(child);
        let port = self.port;
        wait_until("nats-server to listen", || port_answers(port)).await;
    }

    /// SIGKILL: the connection drops without a goodbye.
    async fn kill(&mut self) {
        let mut child = self.child.take().expect("nats-server running");
        child.kill().await.expect("nats-server killed");
    }
}

/// A PostgreSQL cluster of this test's own, in a temporary directory.
pub(crate) struct PostgresServer {
    port: u16,
    bin_dir: PathBuf,
    /// `(uid, gid)` of the `postgres` user when this test runs as root.
    run_as: Option<(u32, u32)>,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl PostgresServer {
    pub(crate) async fn start() -> Self {
        let bin_dir = postgres_bin_dir();
        let run_as = postgres_user_when_root();
        let dir = tempfile::tempdir().expect("temporary directory");
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).expect("chown to postgres");
        }
        let mut server = Self {
            port: free_port(),
            bin_dir,
            run_as,
            dir,
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
        server.restart().await;
        server
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub(crate) fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(self.bin_dir.join(program));
        if let Some((uid, gid)) = self.run_as {
            command.uid(uid).gid(gid);
        }
        command.stdout(Stdio::null()).kill_on_drop(true);
        command
    }

    pub(crate) async fn restart(&mut self) {
        assert!(self.child.is_none(), "postgres already running");
        let child = self
            .command("postgres")
            .arg("-D")
            .arg(self.data_dir())
            .args(["-p", &self.port.to_string(), "-k"])
            .arg(self.dir.path())
            .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"])
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
    pub(crate) async fn stop(&mut self) {
        let mut child = self.child.take().expect("postgres running");
        signal(&child, "INT");
        tokio::time::timeout(WAIT_MAX, child.wait())
            .await
            .expect("postgres stops in time")
            .expect("postgres exit status");
    }
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

fn signal(child: &Child, signal: &str) {
    if let Some(pid) = child.id() {
        let _ = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &pid.to_string()])
            .status();
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
