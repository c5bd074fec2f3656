//! `GET /metrics` over real HTTP: the due-task gauges rise while no worker runs and fall back
//! once one has completed the scans, the acknowledgement counters grow, and the set of series
//! does not grow with the number of scans (no ids in labels).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use tests::TestSystem;
use uuid::Uuid;

const TASKS_DUE_PENDING: &str = "palisade_tasks_due{state=\"pending\"}";
const TASKS_DUE_OLDEST_AGE: &str = "palisade_tasks_due_oldest_age_seconds";
const ADMISSION_ACKS: &str = "palisade_messages_total{consumer=\"admission\",decision=\"ack\"}";
const INGESTION_ACKS: &str = "palisade_messages_total{consumer=\"ingestion\",decision=\"ack\"}";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_follow_the_queue_and_keep_a_bounded_set_of_series() {
    let system = TestSystem::spawn_with(|settings| {
        settings.http_addr = Some("127.0.0.1:0".parse().expect("address"));
    })
    .await;
    let addr = system.health_addr.expect("health endpoints served");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("HTTP client");
    let org = system.organization().await;

    let first = submit_scans(&system, org, 3).await;
    let queued = system
        .wait_for("the due-task gauges to show the queue", || async {
            let scrape = Scrape::get(&http, addr).await;
            (scrape.value(TASKS_DUE_PENDING) > 0.0 && scrape.value(TASKS_DUE_OLDEST_AGE) > 0.0)
                .then_some(scrape)
        })
        .await;
    // Submitted over request/reply: admission's durable consumer saw none of them.
    assert_eq!(queued.value(ADMISSION_ACKS), 0.0, "{}", queued.text);

    let _stats = system.reference_worker(org, 4).await;
    for scan_id in &first {
        system.wait_scan_state(scan_id, "completed").await;
    }
    // The database gauges are cached for a few seconds; wait for a refresh.
    let drained = system
        .wait_for("the due-task gauges to fall back to zero", || async {
            let scrape = Scrape::get(&http, addr).await;
            (scrape.value(TASKS_DUE_PENDING) == 0.0 && scrape.value(TASKS_DUE_OLDEST_AGE) == 0.0)
                .then_some(scrape)
        })
        .await;
    assert!(
        drained.value(INGESTION_ACKS) > queued.value(INGESTION_ACKS),
        "{}",
        drained.text
    );
    assert!(
        drained.value("palisade_last_completed_scan_age_seconds") >= 0.0,
        "{}",
        drained.text
    );
    let series_after_few = drained.series();

    for scan_id in submit_scans(&system, org, 20).await {
        system.wait_scan_state(&scan_id, "completed").await;
    }
    let after_many = Scrape::get(&http, addr).await;
    assert!(
        after_many.value(INGESTION_ACKS) > drained.value(INGESTION_ACKS),
        "{}",
        after_many.text
    );
    assert_eq!(
        after_many.series(),
        series_after_few,
        "the set of series grew with the number of scans"
    );
    system.finish().await;
}

/// Submits `n` single-task scans, each to a target of its own; returns their ids.
async fn submit_scans(system: &TestSystem, org: Uuid, n: usize) -> Vec<String> {
    let mut scan_ids = Vec::with_capacity(n);
    for _ in 0..n {
        let target = format!("synthetic://{}?duration_ms=1", Uuid::new_v4().simple());
        let reply = system
            .submit(&system.request(org, &target, &["synthetic"]))
            .await;
        assert!(reply.error.is_none(), "{reply:?}");
        scan_ids.push(reply.scan_id);
    }
    scan_ids
}

/// One `/metrics` answer.
struct Scrape {
    text: String,
}

impl Scrape {
    async fn get(http: &reqwest::Client, addr: SocketAddr) -> Self {
        let response = http
            .get(format!("http://{addr}/metrics"))
            .send()
            .await
            .expect("/metrics answers");
        assert_eq!(response.status(), 200);
        Self {
            text: response.text().await.expect("a text body"),
        }
    }

    /// The value of the series named exactly `series` (name and labels); 0 when absent.
    fn value(&self, series: &str) -> f64 {
        self.text
            .lines()
            .find_map(|line| {
                let (name, value) = line.rsplit_once(' ')?;
                (name == series).then(|| value.parse().expect("a number"))
            })
            .unwrap_or(0.0)
    }

    /// Every series (name and labels), without values.
    fn series(&self) -> BTreeSet<String> {
        self.text
            .lines()
            .filter(|line| !line.is_empty() && !line.starts_with('#'))
            .filter_map(|line| line.rsplit_once(' ').map(|(name, _)| name.to_owned()))
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_lease_ages_and_the_reaper_leader_shows() {
    let system = TestSystem::spawn_with(|settings| {
        settings.http_addr = Some("127.0.0.1:0".parse().expect("address"));
        settings.reaper.lease =
            lease::RunConfig::new(Duration::from_secs(2), Duration::from_millis(200))
                .expect("valid lease config");
    })
    .await;
    let addr = system.health_addr.expect("health endpoints served");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("HTTP client");

    // A worker that took a lease and then went silent (never renews): its lease ages.
    let scan = system.leased_scan(&["alpha"]).await;
    let first = system
        .wait_for("a live lease in the gauges", || async {
            let scrape = Scrape::get(&http, addr).await;
            (scrape.value("palisade_attempts_live") >= 1.0).then_some(scrape)
        })
        .await;
    let first_age = first.value("palisade_lease_renewal_age_max_seconds");
    system
        .wait_for("the silent lease to age", || async {
            let scrape = Scrape::get(&http, addr).await;
            (scrape.value("palisade_lease_renewal_age_max_seconds") > first_age + 1.0).then_some(())
        })
        .await;
    drop(scan);

    // The reaper shows leadership once it holds its lease.
    system.start(tests::Component::Reaper);
    system
        .wait_for("the reaper to report leadership", || async {
            let scrape = Scrape::get(&http, addr).await;
            (scrape.value("palisade_leader{lease=\"palisade-reaper\"}") == 1.0).then_some(())
        })
        .await;
    system.finish().await;
}
