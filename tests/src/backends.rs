//! Where PostgreSQL and NATS come from: `DATABASE_URL` / `NATS_URL`, else the local defaults,
//! else containers where Docker exists.

use super::*;

/// Where the test's PostgreSQL and NATS are.
#[derive(Debug, Clone)]
pub(crate) struct Backends {
    pub(crate) database_url: String,
    /// `None`: each test system runs a `nats-server` of its own that authenticates.
    pub(crate) nats_url: Option<String>,
}

pub(crate) const LOCAL_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

pub(crate) const LOCAL_NATS_URL: &str = "nats://127.0.0.1:4222";

/// `DATABASE_URL` / `NATS_URL` when set, else the local defaults when they answer, else
/// containers started with testcontainers where a Docker engine runs (once per process).
pub(crate) async fn backends() -> Backends {
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

pub(crate) async fn port_answers(port: u16) -> bool {
    let connect = tokio::net::TcpStream::connect(("127.0.0.1", port));
    matches!(
        tokio::time::timeout(Duration::from_millis(500), connect).await,
        Ok(Ok(_))
    )
}

/// The testcontainers fallback for machines with Docker and without local servers.
pub(crate) mod containers {
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
