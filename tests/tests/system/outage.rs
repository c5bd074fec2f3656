//! Nothing lost while PostgreSQL is down, however long (issue 9): requests that JetStream
//! confirmed while PostgreSQL was unreachable for longer than the whole redelivery budget
//! (`max_deliver × ack wait`) are each admitted exactly once when it is back, and nothing is
//! dead-lettered. Meanwhile the admission consumer holds them (in-progress acknowledgements,
//! so their delivery count does not grow) and says so on `/metrics`.
//!
//! Against a PostgreSQL of this test's own (`crate::health::PostgresServer`), which it stops
//! and starts; NATS is the machine's, under a prefix of this test's own.

use std::time::Duration;

use messages::Subjects;
use palisade::system::{System, SystemSettings};
use runtime::CommonSettings;
use tests::WAIT_MAX;
use uuid::Uuid;

use crate::health::PostgresServer;

const REQUESTS: usize = 5;
const ACK_WAIT: Duration = Duration::from_secs(1);
const MAX_DELIVER: i64 = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_confirmed_during_an_outage_longer_than_the_redelivery_budget_are_admitted_once() {
    let mut postgres = PostgresServer::start().await;
    let id = Uuid::new_v4().simple().to_string();
    let subjects = Subjects::new(&format!("o{}", &id[..12])).expect("valid prefix");
    let mut common = CommonSettings::from_env().expect("valid environment");
    common.database = store::DatabaseSettings::new(postgres.url("palisade"));
    common.database.max_connections = 8;
    common.database.acquire_timeout = Duration::from_secs(1);
    common.subjects = subjects.clone();
    let nats_url = common.nats_url.clone();
    let mut settings = SystemSettings::from_common(common).expect("valid settings");
    settings.admission.consumer.ack_wait = ACK_WAIT;
    settings.admission.consumer.max_deliver = MAX_DELIVER;
    let system = System::start(settings).await.expect("palisade starts");

    let organization_id = Uuid::new_v4();
    {
        let pool = store::connect(&store::DatabaseSettings::new(postgres.url("palisade")))
            .await
            .expect("PostgreSQL reachable");
        store::admin::create_organization(&pool, organization_id, "outage", None)
            .await
            .expect("organization created");
        pool.close().await;
    }
    let bus = bus::Bus::connect(&nats_url, subjects.clone(), "outage-test")
        .await
        .expect("NATS reachable");
    let client = client::Client::new(bus.clone(), "outage-client");

    postgres.stop().await;
    let mut keys = Vec::new();
    for index in 0..REQUESTS {
        let key = Uuid::new_v4().to_string();
        let request = client.request(
            &organization_id.to_string(),
            &format!("http://outage-{index}.test"),
            &["synthetic"],
            &key,
        );
        client
            .publish(&request)
            .await
            .expect("JetStream confirms the request");
        keys.push(key);
    }
    // Longer than the whole redelivery budget, with margin for the first delivery.
    let budget = ACK_WAIT * MAX_DELIVER as u32;
    tokio::time::sleep(budget * 2 + Duration::from_secs(1)).await;
    let held = held_messages(&bus::metrics::encode_text(), "admission");
    assert!(
        held >= 1.0,
        "admission holds the requests while PostgreSQL is down, and says so: {held}"
    );
    postgres.restart().await;

    let pool = store::connect(&store::DatabaseSettings::new(postgres.url("palisade")))
        .await
        .expect("PostgreSQL back");
    let deadline = tokio::time::Instant::now() + WAIT_MAX;
    loop {
        let admitted: i64 =
            sqlx::query_scalar("SELECT count(*) FROM scans WHERE idempotency_key = ANY($1)")
                .bind(&keys)
                .fetch_one(&pool)
                .await
                .expect("scans counted");
        if admitted == REQUESTS as i64 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{admitted} of {REQUESTS} confirmed requests admitted after the outage"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let per_key: Vec<i64> = sqlx::query_scalar(
        "SELECT count(*) FROM scans WHERE idempotency_key = ANY($1) GROUP BY idempotency_key",
    )
    .bind(&keys)
    .fetch_all(&pool)
    .await
    .expect("scans per key");
    assert_eq!(per_key, vec![1; REQUESTS], "one scan per confirmed request");
    let dead: i64 = sqlx::query_scalar("SELECT count(*) FROM dead_letters")
        .fetch_one(&pool)
        .await
        .expect("dead letters counted");
    assert_eq!(dead, 0, "nothing was dead-lettered for an outage");
    let released = tokio::time::Instant::now() + WAIT_MAX;
    while held_messages(&bus::metrics::encode_text(), "admission") > 0.0 {
        assert!(
            tokio::time::Instant::now() < released,
            "admission still holds messages after deciding them"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    pool.close().await;
    system.stop().await;
    for stream in [
        subjects.requests_stream(),
        subjects.events_stream(),
        subjects.results_stream(),
    ] {
        let _ = bus.jetstream().delete_stream(stream).await;
    }
}

/// `palisade_consumer_held_messages{consumer="<consumer>"}` in a `/metrics` text.
fn held_messages(metrics: &str, consumer: &str) -> f64 {
    let series = format!("palisade_consumer_held_messages{{consumer=\"{consumer}\"}} ");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series.as_str()))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0.0)
}
