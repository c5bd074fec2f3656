//! `GET /metrics` over real HTTP while palisade works: the queue gauges rise while no worker
//! runs and fall to zero once workers have run a load of many scans; a SIGKILLed worker's
//! lease ages past its last renewal until the reaper recovers it (one retry), a task that
//! fails terminally is counted, live workers are counted within two of the configured lease
//! TTLs; and the set of series is the same after a small load and after a large one (no ids
//! in labels).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use futures::StreamExt as _;
use runtime::metrics::MetricsSettings;
use tests::{Component, TestSystem, WorkerProcess};
use uuid::Uuid;

/// The reference worker binary, built by cargo with this test.
const WORKER: &str = env!("CARGO_BIN_EXE_test-worker");

const TASKS_DUE_PENDING: &str = "palisade_tasks_due{state=\"pending\"}";
const TASKS_DUE_RETRY_WAIT: &str = "palisade_tasks_due{state=\"retry_wait\"}";
const TASKS_DUE_OLDEST_AGE: &str = "palisade_tasks_due_oldest_age_seconds";
const TASKS_RETRY_WAIT: &str = "palisade_tasks_retry_wait";
const TASK_RETRIES: &str = "palisade_task_retries_total";
const TASKS_FAILED_TERMINAL: &str = "palisade_tasks_failed_terminal_total";
const ATTEMPTS_LIVE: &str = "palisade_attempts_live";
const LEASE_RENEWAL_AGE_MAX: &str = "palisade_lease_renewal_age_max_seconds";
const WORKERS_LIVE: &str = "palisade_workers_live";
const ADMISSION_ACKS: &str = "palisade_messages_total{consumer=\"admission\",decision=\"ack\"}";
const INGESTION_ACKS: &str = "palisade_messages_total{consumer=\"ingestion\",decision=\"ack\"}";

/// Short leases so a killed worker's lease is recovered within seconds.
const LEASE_TTL: Duration = Duration::from_secs(2);
const RENEW_INTERVAL: Duration = Duration::from_millis(500);
/// The large load: 450 tasks, about 6 s of work on two cores.
const LOAD_SCANS: usize = 150;
/// The large load may take this long on a busy machine before the test fails.
const LOAD_TIME_MAX: Duration = Duration::from_secs(60);
/// Every load scan runs the whole asset-discovery profile against a local web app.
const PROFILE: [&str; 3] = ["tcp_connect", "http_headers", "synthetic"];
/// Fails at once and for good: one terminal failure, no retry.
const FAILING_TARGET: &str = "synthetic://fails?fail=1&retryable=false";
/// Runs long enough to be killed mid-task; its retry fails for good.
const DOOMED_TARGET: &str = "synthetic://doomed?duration_ms=3000&fail=1&retryable=false";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_follow_a_load_a_killed_worker_and_terminal_failures() {
    let system = TestSystem::spawn_with(|settings| {
        settings.http_addr = Some("127.0.0.1:0".parse().expect("address"));
        settings.dispatch.lease =
            runtime::LeaseSettings::new(LEASE_TTL, RENEW_INTERVAL).expect("valid lease settings");
        // The live-worker window follows the configured TTL; gauges refresh often.
        settings.common.metrics = MetricsSettings {
            refresh_age_max: Duration::from_millis(100),
            ..MetricsSettings::for_lease_ttl(LEASE_TTL)
        };
        settings.reaper.lease =
            lease::RunConfig::new(Duration::from_secs(2), Duration::from_millis(200))
                .expect("valid lease config");
    })
    .await;
    system.start(Component::Reaper);
    let metrics = Metrics::new(system.health_addr.expect("health endpoints served"));
    let web_app = tests::start_web_app().await;
    let org = system.organization().await;
    // Every series exists from the start (zero until something happens), once each consumer
    // has registered: the consumers start in their own tasks, so wait for the scrape that
    // shows them all.
    let expected = [
        TASKS_DUE_PENDING,
        TASKS_DUE_RETRY_WAIT,
        TASKS_DUE_OLDEST_AGE,
        TASKS_RETRY_WAIT,
        TASK_RETRIES,
        TASKS_FAILED_TERMINAL,
        ATTEMPTS_LIVE,
        LEASE_RENEWAL_AGE_MAX,
        WORKERS_LIVE,
        ADMISSION_ACKS,
        INGESTION_ACKS,
    ];
    metrics
        .wait_for(&system, "every series in a scrape", |scrape| {
            expected.iter().all(|series| scrape.has(series))
        })
        .await;

    // A small load and no worker: the queue shows and ages.
    let mut small = load_targets(web_app, "small", 3);
    small.push(FAILING_TARGET.to_owned());
    submit_scans(&system, org, &small).await;
    let queued = metrics
        .wait_for(
            &system,
            "the due-task gauges to show the small queue",
            |scrape| {
                scrape.value(TASKS_DUE_PENDING) == 4.0 && scrape.value(TASKS_DUE_OLDEST_AGE) > 0.0
            },
        )
        .await;
    // The backlog by organization, plugin and state (bounded: the largest groups by name).
    let backlog = |plugin: &str| {
        format!(
            "palisade_backlog_tasks{{organization=\"{org}\",plugin=\"{plugin}\",state=\"pending\"}}"
        )
    };
    metrics
        .wait_for(
            &system,
            "the backlog by organization and plugin",
            |scrape| {
                scrape.value(&backlog(PROFILE[0])) == 3.0
                    && scrape.value(&backlog("synthetic")) == 1.0
            },
        )
        .await;
    // Submitted over request/reply: admission's durable consumer saw none of them.
    assert_eq!(queued.value(ADMISSION_ACKS), 0.0, "{}", queued.text);
    assert_eq!(queued.value(WORKERS_LIVE), 0.0, "{}", queued.text);
    let queued_age = queued.value(TASKS_DUE_OLDEST_AGE);
    metrics
        .wait_for(&system, "the queue's age to rise", |scrape| {
            scrape.value(TASKS_DUE_PENDING) == 4.0
                && scrape.value(TASKS_DUE_OLDEST_AGE) > queued_age + 0.3
        })
        .await;

    // A worker runs it: the queue drains, the failure is counted, nothing is retried.
    let first_worker = system.stoppable_reference_worker(org, 8).await;
    let drained = metrics
        .wait_for(&system, "the small load to drain", |scrape| {
            scrape.is_idle() && scrape.value(TASKS_FAILED_TERMINAL) == 1.0
        })
        .await;
    assert_eq!(
        store::admin::scan_counts(&system.pool).await.unwrap(),
        (4, 3)
    );
    assert_eq!(drained.value(TASK_RETRIES), 0.0, "{}", drained.text);
    assert!(drained.value(WORKERS_LIVE) >= 1.0, "{}", drained.text);
    assert!(
        drained.value(INGESTION_ACKS) > queued.value(INGESTION_ACKS),
        "{}",
        drained.text
    );
    // A scan completed: the age is a real one (−1 before the first; absent would read 0).
    assert!(
        drained.has("palisade_last_completed_scan_age_seconds")
            && drained.value("palisade_last_completed_scan_age_seconds") >= 0.0,
        "{}",
        drained.text
    );
    let series_after_small_load = drained.series();
    first_worker.stop().await;

    // The large load, and a slow scan of another organization, still with no worker: the
    // queue grows and ages, and the stopped worker leaves the live count within two TTLs.
    let other_org = system.organization().await;
    let doomed = system
        .submit(&system.request(other_org, DOOMED_TARGET, &["synthetic"]))
        .await;
    assert!(doomed.error.is_none(), "{doomed:?}");
    submit_scans(&system, org, &load_targets(web_app, "large", LOAD_SCANS)).await;
    let queue_depth = (LOAD_SCANS + 1) as f64;
    let loaded = metrics
        .wait_for(
            &system,
            "the due-task gauges to show the large queue",
            |scrape| scrape.value(TASKS_DUE_PENDING) == queue_depth,
        )
        .await;
    let loaded_age = loaded.value(TASKS_DUE_OLDEST_AGE);
    let unattended = metrics
        .wait_for(
            &system,
            "the queue to age with no live worker (two lease TTLs after the stop)",
            |scrape| {
                scrape.value(TASKS_DUE_PENDING) == queue_depth
                    && scrape.value(TASKS_DUE_OLDEST_AGE) > loaded_age + 0.3
                    && scrape.value(WORKERS_LIVE) == 0.0
            },
        )
        .await;
    assert_eq!(unattended.value(ATTEMPTS_LIVE), 0.0, "{}", unattended.text);

    // A worker of the other organization takes the slow scan, renews, and is killed.
    let mut doomed_worker = WorkerProcess::start(&system, WORKER, other_org, 1).await;
    let doomed_scan = Uuid::parse_str(&doomed.scan_id).unwrap();
    let doomed_attempt = system
        .wait_for(
            "the slow task to be leased to the doomed worker",
            || async {
                store::testing::attempts_of_scan(&system.pool, doomed_scan)
                    .await
                    .unwrap()
                    .into_iter()
                    .find(|(_, worker, status)| {
                        *worker == doomed_worker.worker_id
                            && matches!(status.as_str(), "leased" | "running")
                    })
                    .map(|(attempt, _, _)| attempt)
            },
        )
        .await;
    system
        .wait_for("the doomed worker to renew its lease", || async {
            store::testing::attempt_renewed(&system.pool, doomed_attempt)
                .await
                .unwrap()
                .then_some(())
        })
        .await;
    doomed_worker.kill().await;
    // A renewing worker's lease is never older than its renew interval; a dead one's grows.
    let stale = metrics
        .wait_for(
            &system,
            "the killed worker's lease to age past its renewals",
            |scrape| {
                scrape.value(ATTEMPTS_LIVE) == 1.0
                    && scrape.value(LEASE_RENEWAL_AGE_MAX) > 2.0 * RENEW_INTERVAL.as_secs_f64()
            },
        )
        .await;
    assert_eq!(stale.value(TASK_RETRIES), 0.0, "{}", stale.text);
    let recovered = metrics
        .wait_for(
            &system,
            "the reaper to recover the killed worker's lease",
            |scrape| {
                scrape.value(TASK_RETRIES) == 1.0
                    && scrape.value(TASKS_RETRY_WAIT) == 1.0
                    && scrape.value(ATTEMPTS_LIVE) == 0.0
                    && scrape.value(LEASE_RENEWAL_AGE_MAX) == 0.0
            },
        )
        .await;
    assert_eq!(
        store::testing::attempt_status(&system.pool, doomed_attempt)
            .await
            .unwrap(),
        "expired"
    );
    assert_eq!(
        recovered.value(TASKS_FAILED_TERMINAL),
        1.0,
        "{}",
        recovered.text
    );

    // Workers run the large load and the slow scan's retry, which fails for good.
    let survivor = WorkerProcess::start(&system, WORKER, org, 16).await;
    store::admin::assign_worker(
        &system.pool,
        other_org,
        survivor.worker_id,
        &store::audit::Change::new("test", ""),
    )
    .await
    .unwrap();
    system
        .wait_for_within("the large load to complete", LOAD_TIME_MAX, || async {
            let (_, completed) = store::admin::scan_counts(&system.pool).await.unwrap();
            (completed == 3 + LOAD_SCANS as i64).then_some(())
        })
        .await;
    system.wait_scan_state(&doomed.scan_id, "failed").await;
    let done = metrics
        .wait_for(&system, "the large load to drain", |scrape| {
            scrape.is_idle() && scrape.value(TASKS_FAILED_TERMINAL) == 2.0
        })
        .await;
    assert_eq!(done.value(TASK_RETRIES), 1.0, "{}", done.text);
    assert_eq!(done.value(WORKERS_LIVE), 1.0, "{}", done.text);
    assert!(
        done.value(INGESTION_ACKS) > drained.value(INGESTION_ACKS),
        "{}",
        done.text
    );
    let series_after_large_load = done.series();
    assert_eq!(
        series_after_large_load,
        series_after_small_load,
        "the set of series changed with the number of scans: new {:?}, gone {:?}",
        series_after_large_load
            .difference(&series_after_small_load)
            .collect::<Vec<_>>(),
        series_after_small_load
            .difference(&series_after_large_load)
            .collect::<Vec<_>>()
    );
    system.finish().await;
}

/// `n` distinct targets on the local web app (one active scan per target).
fn load_targets(web_app: SocketAddr, name: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|index| format!("http://{web_app}/{name}/{index}"))
        .collect()
}

/// Submits a scan per target, the load profile for web targets and `synthetic` alone for
/// synthetic ones, a few at a time.
async fn submit_scans(system: &TestSystem, org: Uuid, targets: &[String]) {
    futures::stream::iter(targets)
        .for_each_concurrent(16, |target| async move {
            let plugins: &[&str] = if target.starts_with("synthetic://") {
                &["synthetic"]
            } else {
                &PROFILE
            };
            let reply = system.submit(&system.request(org, target, plugins)).await;
            assert!(reply.error.is_none(), "{reply:?}");
        })
        .await;
}

/// Scrapes one process's `/metrics`.
struct Metrics {
    http: reqwest::Client,
    addr: SocketAddr,
}

impl Metrics {
    fn new(addr: SocketAddr) -> Self {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .expect("HTTP client");
        Self { http, addr }
    }

    /// Scrapes until `holds`, failing the test after the harness's deadline.
    async fn wait_for(
        &self,
        system: &TestSystem,
        what: &str,
        holds: impl Fn(&Scrape) -> bool,
    ) -> Scrape {
        system
            .wait_for(what, || async {
                let scrape = Scrape::get(&self.http, self.addr).await;
                holds(&scrape).then_some(scrape)
            })
            .await
    }
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

    /// Whether the series named exactly `series` (name and labels) is there.
    fn has(&self, series: &str) -> bool {
        self.series().contains(series)
    }

    /// Nothing waits, nothing is leased, nothing is backing off.
    fn is_idle(&self) -> bool {
        [
            TASKS_DUE_PENDING,
            TASKS_DUE_RETRY_WAIT,
            TASKS_DUE_OLDEST_AGE,
            TASKS_RETRY_WAIT,
            ATTEMPTS_LIVE,
            LEASE_RENEWAL_AGE_MAX,
        ]
        .iter()
        .all(|series| self.value(series) == 0.0)
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

/// The reaper's leader tends a hot table whose dead row versions passed the threshold (issue
/// 46): it vacuums the table, shows its dead rows, and counts the vacuum on `/metrics`;
/// PostgreSQL records the vacuum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reaper_leader_vacuums_a_hot_table_that_churned() {
    let system = TestSystem::spawn_with(|settings| {
        settings.http_addr = Some("127.0.0.1:0".parse().expect("address"));
        settings.reaper.upkeep_interval = Some(Duration::from_millis(200));
        settings.reaper.lease =
            lease::RunConfig::new(Duration::from_secs(2), Duration::from_millis(200))
                .expect("valid lease config");
    })
    .await;
    let metrics = Metrics::new(system.health_addr.expect("health endpoints served"));
    let org = system.organization().await;
    let worker = system.manual_worker(org, 1).await;
    // A snapshot older than the churn keeps its dead versions from being pruned away (and
    // PostgreSQL's count of them from dropping below the threshold) by whichever read of the
    // page comes first, the reaper's own sweeps included; vacuum runs all the same.
    let mut horizon = system.pool.begin().await.expect("begin");
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut *horizon)
        .await
        .expect("repeatable read");
    sqlx::query("SELECT count(*) FROM workers")
        .execute(&mut *horizon)
        .await
        .expect("the snapshot taken");
    // A worker's row rewritten as every acquire rewrites it, past the threshold.
    let rewrites = store::upkeep::DEAD_ROWS_MIN + 100;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DO $$ BEGIN FOR i IN 1..{rewrites} LOOP \
         UPDATE workers SET last_seen_at = now() WHERE id = '{}'; END LOOP; END $$",
        worker.id
    )))
    .execute(&system.pool)
    .await
    .expect("the worker's row rewritten");

    system.start(Component::Reaper);
    let vacuums = |scrape: &Scrape| {
        ["vacuum", "vacuum_analyze"]
            .iter()
            .map(|work| {
                scrape.value(&format!(
                    "palisade_table_upkeep_total{{table=\"workers\",work=\"{work}\"}}"
                ))
            })
            .sum::<f64>()
    };
    let tended = metrics
        .wait_for(
            &system,
            "the reaper to vacuum the workers table",
            |scrape| vacuums(scrape) >= 1.0,
        )
        .await;
    assert!(
        tended.has("palisade_table_dead_rows{table=\"worker_tasks\"}"),
        "{}",
        tended.text
    );
    let vacuumed: bool = sqlx::query_scalar(
        "SELECT last_vacuum IS NOT NULL FROM pg_stat_user_tables WHERE relname = 'workers'",
    )
    .fetch_one(&system.pool)
    .await
    .expect("statistics read");
    assert!(vacuumed, "PostgreSQL records the vacuum");
    horizon.rollback().await.expect("rollback");
    system.finish().await;
}

/// Issue 48, item 6: `palisade_request_seconds` (the dashboard's "Request p99") counted an
/// acquire's long-poll, so an idle worker's acquire read as a 1.5 s request and its exemplar
/// led to an idle wait. The wait is left out now; the acquire's own work stays in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquires_long_poll_wait_is_not_request_time() {
    const WAIT: Duration = Duration::from_millis(1_500);
    let system = TestSystem::spawn().await;
    let organization = system.organization().await;
    let worker = system.manual_worker(organization, 1).await;
    assert!(worker.hello(&["alpha"]).await.error.is_none());
    let started = std::time::Instant::now();
    let reply = worker
        .acquire(Uuid::new_v4(), 1, WAIT.as_millis() as u32)
        .await;
    assert!(
        reply.error.is_none() && reply.leases.is_empty(),
        "{reply:?}"
    );
    assert!(
        started.elapsed() >= WAIT,
        "the acquire waited its long-poll"
    );
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &telemetry::metrics::registry())
        .expect("encoded");
    let series = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(&format!("{name}{{server=\"dispatch.acquire\"}} ")))
            .and_then(|value| value.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{name} of dispatch.acquire in:\n{text}"))
    };
    assert_eq!(series("palisade_request_seconds_count"), 1.0);
    let seconds = series("palisade_request_seconds_sum");
    assert!(
        seconds < WAIT.as_secs_f64() / 3.0,
        "the acquire's {seconds} s include its long-poll of {WAIT:?}"
    );
    system.finish().await;
}
