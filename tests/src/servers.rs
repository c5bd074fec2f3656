//! Servers of a test's own, which it may stop, kill and start again: never the machine's
//! shared PostgreSQL and NATS.
//!
//! PostgreSQL's binaries come from `PALISADE_PG_BIN_DIR`, else the newest
//! `/usr/lib/postgresql/<version>/bin`, else `PATH`; NATS from `NATS_SERVER_BIN`, else `PATH`.
//! Run as root, PostgreSQL runs as the `postgres` user (it refuses to run as root).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

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

/// A port nothing listens on now (the server started on it binds it a moment later).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("address")
        .port()
}

pub async fn port_answers(port: u16) -> bool {
    tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_ok()
}

/// A `nats-server -js` of this test's own; its JetStream store survives restarts.
pub struct NatsServer {
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl NatsServer {
    pub async fn start() -> Self {
        let mut server = Self {
            port: free_port(),
            dir: tempfile::tempdir().expect("temporary directory"),
            child: None,
        };
        server.restart().await;
        server
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub async fn restart(&mut self) {
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
    pub async fn kill(&mut self) {
        let mut child = self.child.take().expect("nats-server running");
        child.kill().await.expect("nats-server killed");
    }
}

/// A PostgreSQL cluster of this test's own, in a temporary directory.
pub struct PostgresServer {
    port: u16,
    bin_dir: PathBuf,
    /// `(uid, gid)` of the `postgres` user when this test runs as root.
    run_as: Option<(u32, u32)>,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl PostgresServer {
    pub async fn start() -> Self {
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

    pub fn url(&self, database: &str) -> String {
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

    pub async fn restart(&mut self) {
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
    pub async fn stop(&mut self) {
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

/// Sends `signal` (`INT`, `STOP`, …) to a running child.
pub fn signal(child: &Child, signal: &str) {
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
