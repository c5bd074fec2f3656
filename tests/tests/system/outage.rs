//! Nothing lost while PostgreSQL is down, however long (issue 9): messages JetStream confirmed
//! while PostgreSQL was unreachable for longer than the whole redelivery budget
//! (`max_deliver × ack wait`) are each decided exactly once when it is back, and nothing is
//! dead-lettered: scan requests (admission) and a worker's completion carrying its result
//! batch (ingestion). Meanwhile the consumer holds them (in-progress acknowledgements, so their
//! delivery count does not grow) and says so on `/metrics`.
//!
//! Against a PostgreSQL of this test's own (`tests::servers::PostgresServer`), which it stops
//! and starts; NATS is the machine's, under a prefix of this test's own.

use std::time::Duration;

use messages::{Subjects, WorkerVerb, v1};
use palisade::system::{System, SystemSettings};
use prost::Message as _;
use runtime::CommonSettings;
use tests::{ManualWorker, WAIT_MAX, findings_payload};
use uuid::Uuid;

use tests::servers::PostgresServer;

const ACK_WAIT: Duration = Duration::from_secs(1);
const MAX_DELIVER: i64 = 3;

/// A running palisade on a PostgreSQL of its own, with short redelivery budgets.
struct Outage {
    postgres: PostgresServer,
    /// A NATS of its own (the machine's may be older than palisade's minimum), open.
    _nats: tests::servers::NatsServer,
    system: System,
    subjects: Subjects,
    bus: bus::Bus,
    client: client::Client,
    organization_id: Uuid,
}

impl Outage {
    async fn start() -> Self {
        Self::start_with(Duration::from_secs(1), |consumer| {
            consumer.ack_wait = ACK_WAIT;
            consumer.max_deliver = MAX_DELIVER;
        })
        .await
    }

    /// A running palisade whose pool waits `acquire_timeout` for a connection, and whose
    /// admission and ingestion consumers `configure` sets.
    async fn start_with(
        acquire_timeout: Duration,
        configure: impl Fn(&mut runtime::env::ConsumerTuning),
    ) -> Self {
        tests::init_test_logging();
        let postgres = PostgresServer::start().await;
        let (authority, subjects) = tests::OwnNats::installation();
        let nats = tests::servers::NatsServer::start_secured(&authority, &subjects).await;
        let credentials = tests::unrestricted_credentials(&authority);
        let mut common = CommonSettings::from_env().expect("valid environment");
        common.database = store::DatabaseSettings::new(postgres.url("palisade"));
        common.database.max_connections = 8;
        common.database.acquire_timeout = acquire_timeout;
        common.subjects = subjects.clone();
        common.nats_url = nats.url();
        common.nats_credentials = credentials.clone();
        let nats_url = common.nats_url.clone();
        let mut settings = SystemSettings::from_common(common).expect("valid settings");
        // `/metrics` is read in this process (`bus::metrics`); no port to share.
        settings.http_addr = None;
        for consumer in [
            &mut settings.admission.consumer,
            &mut settings.ingestion.consumer,
        ] {
            configure(consumer);
        }
        let system = System::start(settings).await.expect("palisade starts");
        let organization_id = Uuid::new_v4();
        let pool = Self::pool(&postgres).await;
        store::admin::create_organization(&pool, organization_id, "outage", None)
            .await
            .expect("organization created");
        pool.close().await;
        let bus = bus::Bus::connect(
            &nats_url,
            &credentials,
            &bus::NatsTls::default(),
            subjects.clone(),
            &messages::Identity::Operator,
        )
        .await
        .expect("NATS reachable");
        let client = client::Client::new(bus.clone(), "outage-client");
        Self {
            postgres,
            _nats: nats,
            system,
            subjects,
            bus,
            client,
            organization_id,
        }
    }

    async fn pool(postgres: &PostgresServer) -> sqlx::PgPool {
        store::connect(&store::DatabaseSettings::new(postgres.url("palisade")))
            .await
            .expect("PostgreSQL reachable")
    }

    fn request(&self, index: usize) -> v1::ScanRequest {
        self.client.request(
            &self.organization_id.to_string(),
            &format!("http://outage-{index}.test"),
            &["synthetic"],
            &Uuid::new_v4().to_string(),
        )
    }

    /// PostgreSQL down for twice the whole redelivery budget, with `consumer` seen holding.
    async fn outage(&mut self, during: impl AsyncFnOnce(&Self), consumer: &str) {
        self.postgres.stop().await;
        during(self).await;
        tokio::time::sleep(ACK_WAIT * MAX_DELIVER as u32 * 2 + Duration::from_secs(1)).await;
        let held = held_messages(consumer);
        assert!(
            held >= 1.0,
            "{consumer} holds what it could not decide while PostgreSQL is down, and says so: {held}"
        );
        assert!(
            bus::consume::held_messages()
                .iter()
                .any(|(holder, count)| holder == consumer && *count >= 1),
            "and /readyz's consumers check sees it: {:?}",
            bus::consume::held_messages()
        );
        self.postgres.restart().await;
    }

    /// Waits until `query` (one count) answers `expected`.
    async fn wait_count(&self, what: &str, query: &str, expected: i64) {
        let pool = Self::pool(&self.postgres).await;
        let deadline = tokio::time::Instant::now() + WAIT_MAX;
        loop {
            let count: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(query))
                .fetch_one(&pool)
                .await
                .expect("counted");
            if count == expected {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: {count}, expected {expected}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        pool.close().await;
    }

    /// Waits until every one of `requests` has its scan.
    async fn wait_admitted(&self, requests: &[v1::ScanRequest]) {
        let keys: Vec<String> = requests
            .iter()
            .map(|request| format!("'{}'", request.idempotency_key))
            .collect();
        self.wait_count(
            "scans of the confirmed requests",
            &format!(
                "SELECT count(*) FROM scans WHERE idempotency_key IN ({})",
                keys.join(",")
            ),
            requests.len() as i64,
        )
        .await;
    }

    async fn finish(self, consumer: &str) {
        self.wait_count("dead letters", "SELECT count(*) FROM dead_letters", 0)
            .await;
        let released = tokio::time::Instant::now() + WAIT_MAX;
        while held_messages(consumer) > 0.0 {
            assert!(
                tokio::time::Instant::now() < released,
                "{consumer} still holds messages after deciding them"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.system.stop().await;
        for stream in [
            self.subjects.requests_stream(),
            self.subjects.events_stream(),
            self.subjects.results_stream(),
        ] {
            let _ = self.bus.jetstream().delete_stream(stream).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_confirmed_during_an_outage_longer_than_the_redelivery_budget_are_admitted_once() {
    const REQUESTS: usize = 5;
    let mut outage = Outage::start().await;
    let requests: Vec<v1::ScanRequest> = (0..REQUESTS).map(|index| outage.request(index)).collect();
    outage
        .outage(
            async |outage: &Outage| {
                for request in &requests {
                    outage
                        .client
                        .publish(request)
                        .await
                        .expect("JetStream confirms the request");
                }
            },
            "admission",
        )
        .await;
    outage.wait_admitted(&requests).await;
    outage
        .wait_count(
            "keys with more than one scan",
            "SELECT count(*) FROM (SELECT 1 FROM scans GROUP BY organization_id, client_id, \
             idempotency_key HAVING count(*) > 1) twice",
            0,
        )
        .await;
    outage.finish("admission").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_confirmed_during_an_outage_is_accepted_once() {
    let mut outage = Outage::start().await;
    let worker_id = Uuid::new_v4();
    {
        let pool = Outage::pool(&outage.postgres).await;
        store::admin::register_worker(&pool, worker_id, "outage-worker", 4)
            .await
            .expect("worker registered");
        store::admin::assign_worker(
            &pool,
            outage.organization_id,
            worker_id,
            &store::audit::Change::new("test", ""),
        )
        .await
        .expect("worker assigned");
        pool.close().await;
    }
    let worker = ManualWorker::connect(outage.bus.clone(), worker_id).await;
    let hello = worker.hello(&["synthetic"]).await;
    assert!(hello.error.is_none(), "{hello:?}");
    outage
        .client
        .publish(&outage.request(0))
        .await
        .expect("request confirmed");
    let lease = worker.acquire_one().await;

    // The task's one batch inside its completion, as the SDK sends a one-batch task: one
    // message. (A batch and a completion sent apart may be held in two batches and decided in
    // either order afterwards; the completion may then be answered `batch_missing`, which a
    // worker answers by resending, as after any reordering.)
    let mut completion = worker.completion(&lease, 1);
    completion.final_batch = Some(worker.batch(&lease, 0, &findings_payload(3)));
    outage
        .outage(
            async |_: &Outage| {
                worker
                    .publish_raw(WorkerVerb::Complete, completion.encode_to_vec())
                    .await;
            },
            "ingestion",
        )
        .await;
    outage
        .wait_count(
            "completed scans",
            "SELECT count(*) FROM scans WHERE state = 'completed'",
            1,
        )
        .await;
    outage
        .wait_count("findings", "SELECT count(*) FROM findings", 3)
        .await;
    outage
        .wait_count(
            "result batches",
            "SELECT count(*) FROM worker_result_batches",
            1,
        )
        .await;
    outage.finish("ingestion").await;
}

/// PostgreSQL frozen (SIGSTOP: connections open, statements hanging, new connections timing
/// out) for longer than the whole redelivery budget, with the pool's acquire timeout longer
/// than the ack wait, as by default: no message spends a delivery. Batches are small and few,
/// so most requests are delivered while every batch in flight hangs: they wait in the
/// consumer, kept with in-progress acknowledgements, and it stops fetching.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_postgres_spends_no_delivery() {
    const REQUESTS: usize = 40;
    const MAX_DELIVER: i64 = 2;
    let outage = Outage::start_with(ACK_WAIT * 2, |consumer| {
        consumer.ack_wait = ACK_WAIT;
        consumer.max_deliver = MAX_DELIVER;
        consumer.batch_size = 4;
        consumer.batches_in_flight = 2;
    })
    .await;
    // A connection of the pool in use, so a batch hangs on a statement, not only on acquiring.
    let warm = outage.request(REQUESTS);
    outage
        .client
        .publish(&warm)
        .await
        .expect("request confirmed");
    outage
        .wait_count(
            "the first scan",
            &format!(
                "SELECT count(*) FROM scans WHERE idempotency_key = '{}'",
                warm.idempotency_key
            ),
            1,
        )
        .await;
    let requests: Vec<v1::ScanRequest> = (0..REQUESTS).map(|index| outage.request(index)).collect();
    outage.postgres.freeze();
    for request in &requests {
        outage
            .client
            .publish(request)
            .await
            .expect("JetStream confirms the request");
    }
    tokio::time::sleep(ACK_WAIT * MAX_DELIVER as u32 * 3).await;
    outage.postgres.thaw();
    outage.wait_admitted(&requests).await;
    assert_eq!(
        redeliveries("admission"),
        0.0,
        "a message was decided on a redelivery: it spent a delivery while PostgreSQL was frozen"
    );
    outage.finish("admission").await;
}

/// `palisade_consumer_held_messages{consumer="<consumer>"}` in this process's `/metrics` text.
fn held_messages(consumer: &str) -> f64 {
    let series = format!("palisade_consumer_held_messages{{consumer=\"{consumer}\"}} ");
    telemetry::metrics::encode_text()
        .lines()
        .find_map(|line| line.strip_prefix(series.as_str()))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0.0)
}

/// `palisade_redeliveries_total{consumer="<consumer>"}`: messages decided on a redelivery.
fn redeliveries(consumer: &str) -> f64 {
    let series = format!("palisade_redeliveries_total{{consumer=\"{consumer}\"}} ");
    telemetry::metrics::encode_text()
        .lines()
        .find_map(|line| line.strip_prefix(series.as_str()))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0.0)
}
