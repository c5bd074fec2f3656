//! `/healthz` and `/readyz` over real HTTP, against a PostgreSQL and a NATS server of this
//! test's own (`tests::servers`, never the machine's shared ones), which the test stops and
//! starts again: `/readyz` turns 503 naming the failing check, and back to 200 without a
//! restart.

use std::net::SocketAddr;
use std::time::Duration;

use palisade::system::{System, SystemSettings};
use runtime::CommonSettings;
use runtime::health::checks;
use tests::WAIT_MAX;
use tests::servers::{NatsServer, PostgresServer, free_port};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_follows_postgres_and_nats_and_recovers_without_a_restart() {
    let mut postgres = PostgresServer::start().await;
    let (authority, subjects) = tests::OwnNats::installation();
    let mut nats = NatsServer::start_secured(&authority, &subjects).await;

    let mut common = CommonSettings::from_env().expect("valid environment");
    common.database = store::DatabaseSettings::new(postgres.url("palisade"));
    common.database.max_connections = 8;
    common.nats_url = nats.url();
    common.nats_credentials = tests::unrestricted_credentials(&authority);
    common.subjects = subjects;
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
    palisade::health::run(Some(url.clone()), std::time::Duration::from_secs(30))
        .await
        .expect("ready at once");

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
    // `palisade health --wait 2` asks again until the wait has passed, then fails with the
    // last answer.
    let started = std::time::Instant::now();
    let waited = palisade::health::run(Some(url.clone()), std::time::Duration::from_secs(2))
        .await
        .expect_err("never ready within the wait");
    assert!(
        started.elapsed() >= std::time::Duration::from_secs(1),
        "asked again"
    );
    assert!(
        format!("{waited:#}").contains("not ready (503)"),
        "{waited:#}"
    );

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

/// The streams check covers every stream palisade needs, the uploads stream and the artifact
/// bucket's included: each one deleted makes `/readyz` fail, naming it.
#[tokio::test]
async fn readyz_names_a_missing_uploads_stream_or_artifact_bucket() {
    for missing in ["uploads", "artifacts"] {
        let system = tests::TestSystem::spawn_with(|settings| {
            settings.http_addr = Some("127.0.0.1:0".parse().expect("address"));
        })
        .await;
        let addr = system.health_addr.expect("health endpoints served");
        let url = format!("http://127.0.0.1:{}/readyz", addr.port());
        let ready = palisade::probe::probe(&url).await.expect("an answer");
        assert!(ready.is_ready(), "{ready:?}");
        let stream = match missing {
            "uploads" => system.subjects.uploads_stream(),
            _ => system.subjects.artifacts_stream(),
        };
        system
            .bus
            .jetstream()
            .delete_stream(&stream)
            .await
            .expect("stream deleted");
        let answer = system
            .wait_for(&format!("/readyz to name the missing {stream}"), || async {
                let answer = palisade::probe::probe(&url).await.expect("an answer");
                (!answer.is_ready()).then_some(answer)
            })
            .await;
        assert_eq!(answer.status, 503, "{answer:?}");
        assert!(
            answer.body.contains(checks::STREAMS) && answer.body.contains(&stream),
            "{missing}: {answer:?}"
        );
        system.finish().await;
    }
}
