//! The runtime image, checked where it can be neither pulled nor built (issue 45, item 3): its
//! final contents, assembled from this machine's Debian packages of the names its base holds
//! (`scripts/image-rootfs.sh`), with the binaries of this build, and every binary run in it
//! under chroot as the image's user (65532): each one's shared libraries are found there and
//! nowhere else, there is no shell, each binary answers `--version`, `palisade migrate` runs, each
//! service becomes ready by its own `/readyz`, and a scan submitted from inside completes on a
//! `palisade-worker` running there. What only a real image shows (the registry's base as
//! published, the build stage itself): docs/deploy.md, "What the tests prove".

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tests::empty_database::EmptyDatabase;
use tests::servers::{NatsServer, free_port};
use uuid::Uuid;

/// The binaries the Dockerfile copies into the image.
pub(crate) const BINARIES: [&str; 7] = [
    "palisade",
    "palisade-admission",
    "palisade-dispatch",
    "palisade-ingestion",
    "palisade-enrichment",
    "palisade-reaper",
    "palisade-worker",
];
const SERVICES: [&str; 5] = [
    "palisade-admission",
    "palisade-dispatch",
    "palisade-ingestion",
    "palisade-enrichment",
    "palisade-reaper",
];
/// The image's user (`USER 65532:65532`).
const USER: &str = "65532:65532";

/// Where cargo put this build's binaries: beside this test's own directory (`target/<profile>`).
pub(crate) fn binaries_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps");
    for binary in BINARIES {
        assert!(
            dir.join(binary).is_file(),
            "{} is missing: the image test runs this build's binaries; `cargo build --workspace --bins` (scripts/test does) first",
            dir.join(binary).display()
        );
    }
    dir.to_owned()
}

/// The shared libraries `binary` needs (its ELF `NEEDED` entries).
fn needed(binary: &Path) -> Vec<String> {
    let output = std::process::Command::new("readelf")
        .args(["-d", "-W"])
        .arg(binary)
        .output()
        .expect("readelf runs (binutils)");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|line| line.contains("(NEEDED)"))
        .filter_map(|line| Some(line.split('[').nth(1)?.trim_end_matches(']').to_owned()))
        .collect()
}

/// This machine's `name` (chroot, ip) by its path: a command run in the image has the image's
/// PATH, where the program that enters it is not.
pub(crate) fn system_program(name: &str) -> PathBuf {
    ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
        .iter()
        .map(|dir| Path::new(dir).join(name))
        .find(|path| path.is_file())
        .unwrap_or_else(|| panic!("{name} is not installed"))
}

/// A command run in `root` under chroot as the image's user, with only `env`.
fn in_image(root: &Path, binary: &str, env: &[(&str, String)]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(system_program("chroot"));
    command
        .arg(format!("--userspec={USER}"))
        .arg(root)
        .arg(format!("/usr/local/bin/{binary}"))
        .env_clear()
        .env("PATH", "/usr/local/bin")
        .envs(env.iter().map(|(name, value)| (*name, value.as_str())))
        .kill_on_drop(true);
    command
}

async fn run_in_image(root: &Path, env: &[(&str, String)], args: &[&str]) -> String {
    let output = in_image(root, "palisade", env)
        .args(args)
        .output()
        .await
        .expect("chroot runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "palisade {args:?} in the image: {}\n{stdout}{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// Assembles the image's root filesystem with this build's binaries.
pub(crate) async fn assemble(root: &Path) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/image-rootfs.sh");
    let output = tokio::process::Command::new("bash")
        .arg(script)
        .arg(root)
        .arg(binaries_dir())
        .output()
        .await
        .expect("bash runs");
    assert!(
        output.status.success(),
        "scripts/image-rootfs.sh: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Every binary's shared libraries are in the image's base, there is no shell, and the command
/// runs as the image's user.
fn check_contents(root: &Path) {
    let libraries = ["lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib64"];
    for binary in BINARIES {
        let path = root.join("usr/local/bin").join(binary);
        for library in needed(&path) {
            assert!(
                libraries
                    .iter()
                    .any(|dir| root.join(dir).join(&library).exists()),
                "{binary} needs {library}, which the image's base does not provide"
            );
        }
    }
    for shell in [
        "bin/sh",
        "bin/bash",
        "bin/dash",
        "usr/bin/sh",
        "usr/bin/bash",
    ] {
        assert!(
            !root.join(shell).exists(),
            "the image holds a shell: {shell}"
        );
    }
    assert!(
        std::fs::metadata(root.join("etc/ssl/certs/ca-certificates.crt"))
            .is_ok_and(|bundle| bundle.len() > 100_000),
        "the image's CA bundle"
    );
}

/// Waits until the service listening on `port` answers `/readyz` with 200.
async fn ready(service: &str, port: u16, child: &mut tokio::process::Child) {
    let url = format!("http://127.0.0.1:{port}/readyz");
    let deadline = tokio::time::Instant::now() + tests::WAIT_MAX;
    loop {
        if let Ok(answer) = reqwest::get(&url).await
            && answer.status().is_success()
        {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{service} in the image exited before it was ready: {status}");
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{service} in the image is not ready at {url}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn the_images_binaries_run_on_its_base_as_its_user_and_complete_a_scan() {
    let root = tempfile::tempdir().expect("a scratch root");
    assemble(root.path()).await;
    check_contents(root.path());
    for binary in BINARIES {
        let output = in_image(root.path(), binary, &[])
            .arg("--version")
            .output()
            .await
            .expect("chroot runs");
        let version = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && version.starts_with(&format!("{binary} ")),
            "{binary} --version in the image: {} {version}{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }

    let nats = NatsServer::start().await;
    let database = EmptyDatabase::create().await;
    let prefix = format!("img{}", &Uuid::now_v7().simple().to_string()[20..]);
    let env = vec![
        (
            "DATABASE_URL",
            database.url.replace("@localhost", "@127.0.0.1"),
        ),
        ("NATS_URL", nats.url()),
        ("PALISADE_SUBJECT_PREFIX", prefix),
        ("PALISADE_LOG_FORMAT", "json".to_owned()),
    ];
    run_in_image(root.path(), &env, &["migrate"]).await;

    let mut running = Vec::new();
    for service in SERVICES {
        let port = free_port();
        let mut env = env.clone();
        env.push(("PALISADE_HTTP_ADDR", format!("127.0.0.1:{port}")));
        let mut child = in_image(root.path(), service, &env)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chroot runs");
        ready(service, port, &mut child).await;
        running.push(child);
    }

    // A scan, from inside the image, completes on a worker running there.
    let organization = Uuid::now_v7().to_string();
    let worker = Uuid::new_v4().to_string();
    run_in_image(
        root.path(),
        &env,
        &["org", "add", "--name", "image", "--id", &organization],
    )
    .await;
    run_in_image(
        root.path(),
        &env,
        &["worker", "add", "--name", "image", "--id", &worker],
    )
    .await;
    run_in_image(
        root.path(),
        &env,
        &[
            "worker",
            "assign",
            "--worker",
            &worker,
            "--org",
            &organization,
        ],
    )
    .await;
    let mut worker_env = env.clone();
    worker_env.push(("PALISADE_WORKER_ID", worker));
    running.push(
        in_image(root.path(), "palisade-worker", &worker_env)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chroot runs"),
    );
    let target = tests::start_web_app().await;
    let scan = run_in_image(
        root.path(),
        &env,
        &[
            "scan",
            "submit",
            "--org",
            &organization,
            "--target",
            &format!("http://{target}/"),
            "--plugins",
            "tcp_connect,http_headers",
            "--wait",
            "--timeout-secs",
            "60",
        ],
    )
    .await;
    assert!(scan.contains("completed"), "{scan}");
    drop(running);
    database.drop().await;
}
