//! What upstream sends cannot stop enrichment (issue 26, item 1), against the local NVD
//! stand-in (`tests::nvd::FakeNvd`): a record PostgreSQL refuses (a NUL in its description)
//! among thousands is stored sanitised and reported once while every job completes; a record
//! of the wrong shape is set aside and not looked up again; `palisade cve import` the same;
//! the rate limit is one window for every replica and survives a restart; a sync stops at its
//! page cap and the next goes on; a window that changes while it is paged is read again, so the
//! record that moved across a page boundary is not skipped; and a mirror behind an internal
//! authority is trusted through `PALISADE_NVD_CA`.

use std::time::Duration;

use chrono::{TimeDelta, Utc};
use enrichment::Execution;
use enrichment::cve::CveSource;
use enrichment::nvd::{self, Nvd, NvdError, NvdSettings, Query};
use messages::retry::RetryPolicy;
use tests::TestSystem;
use tests::nvd::{FakeNvd, ServedCve};
use uuid::Uuid;

use crate::cve::{checkpoint, counter, synced_days_ago};

/// An enrichment service reading `nvd` with pages of `page_size`, no rate limit to speak of.
fn service(
    system: &TestSystem,
    nvd: &FakeNvd,
    page_size: u32,
    configure: impl FnOnce(&mut enrichment::cve::CveSettings),
) -> enrichment::Service {
    let mut settings = system.settings.enrichment.clone();
    settings.http_addr = None;
    settings.lease_ttl = Duration::from_secs(60);
    settings.retry = RetryPolicy::new(Duration::ZERO, Duration::ZERO);
    let cve = &mut settings.cve;
    cve.source = CveSource::Nvd;
    cve.sync_interval = Some(Duration::from_secs(3_600));
    cve.nvd.base_url = nvd.url();
    cve.nvd.page_size = page_size;
    cve.nvd.requests_per_window = 1_000;
    cve.nvd.window = Duration::from_secs(1);
    cve.nvd.timeout = Duration::from_secs(10);
    cve.nvd.max_retries = 2;
    cve.nvd.retry = RetryPolicy::new(Duration::from_millis(10), Duration::from_millis(50));
    configure(cve);
    enrichment::Service::from_connections(
        settings,
        runtime::Connections {
            pool: system.pool.clone(),
            bus: system.bus.clone(),
        },
    )
    .expect("an enrichment service")
}

/// One pass of `enrichment` runs exactly the job `job_id`, and it completes.
async fn runs_to_completion(enrichment: &enrichment::Service, job_id: Uuid) {
    assert_eq!(
        enrichment.run_once().await.unwrap(),
        [(job_id, Execution::Completed)]
    );
}

/// `count` CVEs `CVE-2026-10000`… NVD modified over the last day, in id order.
fn served(count: u32) -> Vec<ServedCve> {
    let start = Utc::now() - TimeDelta::days(1);
    (0..count)
        .map(|n| {
            ServedCve::numbered(
                &format!("CVE-2026-{}", 10_000 + n),
                n,
                start + TimeDelta::seconds(i64::from(n)),
            )
        })
        .collect()
}

async fn scalar<T>(system: &TestSystem, query: &'static str) -> T
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + Unpin,
{
    sqlx::query_scalar(query)
        .fetch_one(&system.pool)
        .await
        .expect("a value")
}

/// The acceptance of item 1: a mirror serving 3,000 CVEs, one with a NUL in its description
/// and one of the wrong shape. Today's code wrote each page as one `jsonb`, PostgreSQL refused
/// the page with the NUL, and every job failed `database_unavailable`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_postgres_refuses_among_thousands_is_quarantined_and_every_job_completes() {
    let system = TestSystem::spawn().await;
    let mut cves = served(3_000);
    cves[1_234].json["cve"]["descriptions"][0]["value"] = "before\u{0}after".into();
    cves[2_345].json["cve"]["metrics"]["cvssMetricV31"][0]["cvssData"]["baseScore"] = "high".into();
    let nvd = FakeNvd::start(cves).await;
    synced_days_ago(&system, 2).await;
    let (scan_a, job_a) = system
        .scan_to_enrich(&["CVE-2026-11234", "CVE-2026-10001"])
        .await;
    let enrichment = service(&system, &nvd, 500, |_| {});
    runs_to_completion(&enrichment, job_a).await;
    let done = checkpoint(&system, job_a).await;
    assert_eq!(done["phase"], "done", "{done}");
    assert_eq!(done["quarantined"], 2, "{done}");
    assert_eq!(
        scalar::<i64>(&system, "SELECT count(*) FROM cves WHERE known").await,
        2_999,
        "every record but the unreadable one"
    );
    assert_eq!(
        scalar::<String>(
            &system,
            "SELECT description FROM cves WHERE id = 'CVE-2026-11234'"
        )
        .await,
        "before\u{FFFD}after"
    );
    let data: serde_json::Value =
        sqlx::query_scalar("SELECT cve_data FROM findings WHERE scan_id = $1 ORDER BY id LIMIT 1")
            .bind(scan_a)
            .fetch_one(&system.pool)
            .await
            .unwrap();
    assert_eq!(data[0]["status"], "known");
    assert_eq!(data[0]["description"], "before\u{FFFD}after");

    // Reported: in `palisade cve status`, on /metrics, once each.
    let status = store::cves::status(&system.pool, 20).await.unwrap();
    assert_eq!(status.quarantined, 2, "{status:?}");
    let by_id: Vec<(Option<&str>, &str)> = status
        .recent_quarantined
        .iter()
        .map(|entry| (entry.cve_id.as_deref(), entry.action.as_str()))
        .collect();
    assert!(
        by_id.contains(&(Some("CVE-2026-11234"), "sanitised")),
        "{by_id:?}"
    );
    assert!(
        by_id.contains(&(Some("CVE-2026-12345"), "set_aside")),
        "{by_id:?}"
    );
    let reasons: Vec<&str> = status
        .recent_quarantined
        .iter()
        .map(|entry| entry.reason.as_str())
        .collect();
    assert!(
        reasons.iter().any(|reason| reason.contains("NUL")),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|reason| reason.contains("unreadable")),
        "{reasons:?}"
    );
    assert_eq!(
        counter("palisade_cve_records_quarantined_total{action=\"sanitised\"} "),
        1
    );
    assert_eq!(
        counter("palisade_cve_records_quarantined_total{action=\"set_aside\"} "),
        1
    );

    // The next job, whose CVE is the unreadable one: it completes, the sync is not due, the
    // set-aside id is not looked up again (it would read the same record), and the finding
    // says what the table holds: nothing.
    let requests = nvd.requests().len();
    let (scan_b, job_b) = system.scan_to_enrich(&["CVE-2026-12345"]).await;
    runs_to_completion(&enrichment, job_b).await;
    assert_eq!(nvd.requests().len(), requests, "nothing fetched");
    let data: serde_json::Value =
        sqlx::query_scalar("SELECT cve_data FROM findings WHERE scan_id = $1 ORDER BY id LIMIT 1")
            .bind(scan_b)
            .fetch_one(&system.pool)
            .await
            .unwrap();
    assert_eq!(data[0]["status"], "missing");

    // A later sync over the same records counts them again without reporting them again.
    synced_days_ago(&system, 2).await;
    let (_, job_c) = system.scan_to_enrich(&["CVE-2026-10002"]).await;
    runs_to_completion(&enrichment, job_c).await;
    assert_eq!(
        scalar::<i64>(
            &system,
            "SELECT sum(times_seen)::bigint FROM cve_quarantine"
        )
        .await,
        4
    );
    assert_eq!(
        counter("palisade_cve_records_quarantined_total{action=\"sanitised\"} "),
        1,
        "logged and counted once"
    );
    system.finish().await;
}

/// `palisade cve import` of a file holding the same two records imports every other record
/// and reports the two; today's code stopped at the NUL and imported nothing of the file.
#[tokio::test]
async fn an_import_keeps_every_record_but_the_unreadable_and_reports_both() {
    let system = TestSystem::spawn().await;
    let mut cves = served(600);
    cves[10].json["cve"]["descriptions"][0]["value"] = "\u{0}".into();
    cves[20].json["cve"]["references"] = serde_json::json!([{"url": 7}]);
    let feed = serde_json::json!({
        "resultsPerPage": cves.len(), "startIndex": 0, "totalResults": cves.len(),
        "format": "NVD_CVE", "version": "2.0", "timestamp": "2026-12-01T00:00:00.000",
        "vulnerabilities": cves.iter().map(|cve| cve.json.clone()).collect::<Vec<_>>(),
    });
    // Issue 48, item 1: and a record that is not JSON at all (a `\q` escape), which today's
    // code let fail the whole file.
    let feed = feed
        .to_string()
        .replace(r#""CVE-2026-10030: a test vulnerability""#, r#""a \q b""#);
    let folder = tempfile::tempdir().unwrap();
    std::fs::write(folder.path().join("nvdcve-2.0-2026.json"), feed).unwrap();
    let mut lines = Vec::new();
    let summary =
        palisade::commands::import_cves(&system.pool, folder.path(), |line| lines.push(line))
            .await
            .unwrap();
    assert_eq!(
        summary,
        serde_json::json!({"files": 1, "records": 598, "written": 598, "quarantined": 3})
    );
    assert!(
        lines[0].ends_with("3 quarantined (see palisade cve status)"),
        "{lines:?}"
    );
    let status = store::cves::status(&system.pool, 20).await.unwrap();
    assert_eq!(
        (status.quarantined, status.imported),
        (3, 598),
        "{status:?}"
    );
    let not_json = status
        .recent_quarantined
        .iter()
        .find(|entry| entry.record_key == "CVE-2026-10030")
        .expect("the record that is not JSON, named by the id it starts with");
    assert!(
        not_json.reason.contains(
            "nvdcve-2.0-2026.json: record 31 of 600 on the page at startIndex 0: unreadable"
        ),
        "{not_json:?}"
    );
    assert!(
        status
            .recent_quarantined
            .iter()
            .all(|entry| entry.source == "import")
    );
    system.finish().await;
}

/// Issue 48, item 1: a record that is not JSON at all — a bare `NaN` score, a `\q` escape —
/// failed its whole page, then every later sync at that page (`nvd_unavailable`). Now each is
/// set aside with where it was (named by its id where that much reads), and the rest of its
/// page is kept. Item 3: a record whose id cannot be read either, when it answers a lookup by
/// id, is set aside under the id looked up (its finding says `missing`, never `unknown`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_that_is_not_json_is_set_aside_with_its_place_and_its_page_kept() {
    let system = TestSystem::spawn().await;
    let mut cves = served(600);
    cves[100].json["cve"]["metrics"]["cvssMetricV31"][0]["cvssData"]["baseScore"] =
        "NAN-HERE".into();
    cves[300].json["cve"]["descriptions"][0]["value"] = "ESCAPE-HERE".into();
    cves[400].json["cve"]["id"] = "ID-HERE".into();
    let nvd = FakeNvd::start(cves).await;
    nvd.corrupt("NAN-HERE", "NaN");
    nvd.corrupt("ESCAPE-HERE", r#""a \q b""#);
    nvd.corrupt("ID-HERE", r#""CVE-2026-10400\q""#);
    synced_days_ago(&system, 2).await;
    let (scan, job) = system
        .scan_to_enrich(&["CVE-2026-10300", "CVE-2026-10400", "CVE-2026-10001"])
        .await;
    let enrichment = service(&system, &nvd, 200, |_| {});
    runs_to_completion(&enrichment, job).await;
    let done = checkpoint(&system, job).await;
    assert_eq!(done["phase"], "done", "{done}");
    assert_eq!(
        scalar::<i64>(&system, "SELECT count(*) FROM cves").await,
        597,
        "every record but the three, none recorded unknown"
    );
    let quarantined: Vec<(String, String)> =
        sqlx::query_as("SELECT record_key, reason FROM cve_quarantine ORDER BY record_key")
            .fetch_all(&system.pool)
            .await
            .unwrap();
    let keys: Vec<&str> = quarantined.iter().map(|(key, _)| key.as_str()).collect();
    assert_eq!(keys.len(), 4, "{quarantined:?}");
    assert_eq!(
        keys[..3],
        ["CVE-2026-10100", "CVE-2026-10300", "CVE-2026-10400"],
        "{quarantined:?}"
    );
    assert!(keys[3].starts_with("sha256:"), "{quarantined:?}");
    let reason = |key: &str| {
        quarantined
            .iter()
            .find(|(named, _)| named == key)
            .map(|(_, reason)| reason.as_str())
            .unwrap()
    };
    assert!(
        reason("CVE-2026-10100").starts_with("the NVD window ")
            && reason("CVE-2026-10100")
                .contains(": record 101 of 200 on the page at startIndex 0: unreadable"),
        "{quarantined:?}"
    );
    assert!(
        reason(keys[3]).contains(": record 1 of 200 on the page at startIndex 400: unreadable"),
        "{quarantined:?}"
    );
    assert!(
        reason("CVE-2026-10400").starts_with("the NVD answer for CVE-2026-10400: record 1 of 1"),
        "{quarantined:?}"
    );
    let looked_up: Vec<String> = nvd
        .requests()
        .into_iter()
        .filter_map(|request| request.cve_id)
        .collect();
    assert_eq!(
        looked_up,
        ["CVE-2026-10400"],
        "a record set aside by its id is not asked for again"
    );
    let data: Vec<serde_json::Value> =
        sqlx::query_scalar("SELECT cve_data FROM findings WHERE scan_id = $1")
            .bind(scan)
            .fetch_all(&system.pool)
            .await
            .unwrap();
    let mut statuses: Vec<(String, String)> = data
        .iter()
        .flat_map(|entries| entries.as_array().into_iter().flatten())
        .map(|entry| (entry["id"].to_string(), entry["status"].to_string()))
        .collect();
    statuses.sort();
    statuses.dedup();
    assert_eq!(
        statuses,
        [
            (r#""CVE-2026-10001""#.into(), r#""known""#.into()),
            (r#""CVE-2026-10300""#.into(), r#""missing""#.into()),
            (r#""CVE-2026-10400""#.into(), r#""missing""#.into()),
        ]
    );
    system.finish().await;
}

/// Issue 48, item 2: a window whose records keep changing while it is paged was read again
/// three times, then paged on, and the watermark moved past it: a record that moved across a
/// page boundary was skipped for good, with nothing logged above INFO. Now the sync pages on
/// but keeps the watermark at the window's start (WARN, a metric, the checkpoint says so), and
/// the next sync reads the window again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_that_never_settles_keeps_the_watermark_at_its_start() {
    let system = TestSystem::spawn().await;
    let nvd = FakeNvd::start(served(16)).await;
    synced_days_ago(&system, 2).await;
    let before: chrono::DateTime<Utc> =
        scalar(&system, "SELECT synced_through FROM cve_sync").await;
    // Each of the first four servings of the first page modifies one more record: the window
    // changes on every read, its three rereads included.
    for n in 0..4 {
        let id = format!("CVE-2026-{}", 10_000 + n);
        nvd.modify_after_page(0, &id, Utc::now() + TimeDelta::minutes(5));
    }
    let enrichment = service(&system, &nvd, 4, |_| {});
    let (_, job) = system.scan_to_enrich(&["CVE-2026-10015"]).await;
    runs_to_completion(&enrichment, job).await;
    let done = checkpoint(&system, job).await;
    assert_eq!(done["sync_unsettled"], true, "{done}");
    assert_eq!(counter("palisade_nvd_windows_reread_total "), 3);
    assert_eq!(counter("palisade_nvd_windows_unsettled_total "), 1);
    let after: chrono::DateTime<Utc> = scalar(&system, "SELECT synced_through FROM cve_sync").await;
    assert_eq!(
        after, before,
        "the watermark stays before the unsettled window"
    );

    // The next sync reads the window again; settled now, it moves the watermark on.
    synced_days_ago(&system, 2).await;
    let (_, job) = system.scan_to_enrich(&["CVE-2026-10015"]).await;
    runs_to_completion(&enrichment, job).await;
    let done = checkpoint(&system, job).await;
    assert!(done.get("sync_unsettled").is_none(), "{done}");
    let settled: chrono::DateTime<Utc> =
        scalar(&system, "SELECT synced_through FROM cve_sync").await;
    assert!(settled > Utc::now() - TimeDelta::minutes(5), "{settled}");
    assert_eq!(
        scalar::<i64>(&system, "SELECT count(*) FROM cves").await,
        16,
        "nothing skipped"
    );
    system.finish().await;
}

/// Two replicas and a restart share one window: NVD saw 7 requests in 30 s against a limit of
/// 5 across a restart with today's per-process limiter, and two replicas each spent the whole
/// budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_and_a_restart_share_one_rate_window() {
    const LIMIT: u32 = 3;
    const WINDOW: Duration = Duration::from_millis(1_000);
    let system = TestSystem::spawn().await;
    let nvd = FakeNvd::start(served(5)).await;
    let settings = NvdSettings {
        base_url: nvd.url(),
        api_key: None,
        requests_per_window: LIMIT,
        window: WINDOW,
        timeout: Duration::from_secs(5),
        max_retries: 0,
        retry: RetryPolicy::new(Duration::from_millis(1), Duration::from_millis(1)),
        page_size: nvd::MAX_PAGE_SIZE,
        ca: None,
    };
    let ask = |client: std::sync::Arc<Nvd>, n: u32| async move {
        for i in 0..n {
            let id = format!("CVE-2026-{}", 10_000 + i % 5);
            client.page(&Query::Id(id), 0).await.expect("a page");
        }
    };
    let first = std::sync::Arc::new(Nvd::new(settings.clone(), system.pool.clone()).unwrap());
    let second = std::sync::Arc::new(Nvd::new(settings.clone(), system.pool.clone()).unwrap());
    tokio::join!(ask(first.clone(), 4), ask(second, 4));
    // A restart: the first replica's client gone, a new one asks at once.
    drop(first);
    let restarted = std::sync::Arc::new(Nvd::new(settings, system.pool.clone()).unwrap());
    ask(restarted, 2).await;

    let requests = nvd.requests();
    assert_eq!(requests.len(), 10);
    for (earlier, later) in requests.iter().zip(requests.iter().skip(LIMIT as usize)) {
        // Arrival times, which the network may bunch a little: a tenth of the window spare.
        assert!(
            later.at - earlier.at >= WINDOW - WINDOW / 10,
            "more than {LIMIT} requests within {WINDOW:?}: {:?}",
            requests
                .iter()
                .map(|r| r.at - requests[0].at)
                .collect::<Vec<_>>()
        );
    }
    system.finish().await;
}

/// A mirror reporting more than a sync may fetch: the sync stops at its page cap, the job
/// completes, the watermark stays at the window being paged, and the next sync goes on from
/// it. Today's code followed a huge total indefinitely.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_stops_at_its_page_cap_and_the_next_goes_on() {
    let system = TestSystem::spawn().await;
    let nvd = FakeNvd::start(served(20)).await;
    synced_days_ago(&system, 2).await;
    let before: chrono::DateTime<Utc> =
        scalar(&system, "SELECT synced_through FROM cve_sync").await;
    let enrichment = service(&system, &nvd, 4, |cve| cve.sync_max_pages = 3);
    let (_, job) = system.scan_to_enrich(&["CVE-2026-10019"]).await;
    runs_to_completion(&enrichment, job).await;
    let done = checkpoint(&system, job).await;
    assert_eq!(done["sync_capped"], true, "{done}");
    let window_requests = |nvd: &FakeNvd| {
        nvd.requests()
            .iter()
            .filter(|request| request.window.is_some())
            .count()
    };
    assert_eq!(window_requests(&nvd), 3, "three pages, no more");
    let after: chrono::DateTime<Utc> = scalar(&system, "SELECT synced_through FROM cve_sync").await;
    assert!(
        after <= before,
        "the watermark does not pass the window it stopped in"
    );
    assert_eq!(
        scalar::<Option<Uuid>>(&system, "SELECT holder_job_id FROM cve_sync").await,
        None,
        "the job let the sync go"
    );
    assert_eq!(counter("palisade_nvd_syncs_capped_total "), 1);

    // The next sync (due again) fetches from the same window; with the cap raised it ends.
    synced_days_ago(&system, 2).await;
    let enrichment = service(&system, &nvd, 4, |cve| cve.sync_max_pages = 10);
    let (_, job) = system.scan_to_enrich(&["CVE-2026-10019"]).await;
    runs_to_completion(&enrichment, job).await;
    let done = checkpoint(&system, job).await;
    assert!(done.get("sync_capped").is_none(), "{done}");
    assert_eq!(
        scalar::<i64>(&system, "SELECT count(*) FROM cves").await,
        20
    );
    system.finish().await;
}

/// NVD pages by position. A record on the first page modified while the window is paged
/// leaves it, every later record moves one place forward, and the record first on the second
/// page moves onto the first, already fetched: today's code skipped it (no later sync reads
/// it, since it was not modified). The total changed, so the window is read again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_modified_while_paged_is_read_again_and_nothing_is_skipped() {
    let system = TestSystem::spawn().await;
    let nvd = FakeNvd::start(served(12)).await;
    synced_days_ago(&system, 2).await;
    // CVE-2026-10001 modified after the first page (four records) was served.
    nvd.modify_after_page(0, "CVE-2026-10001", Utc::now() + TimeDelta::minutes(5));
    let enrichment = service(&system, &nvd, 4, |_| {});
    let (_, job) = system.scan_to_enrich(&["CVE-2026-10004"]).await;
    runs_to_completion(&enrichment, job).await;
    let ids: Vec<String> = sqlx::query_scalar("SELECT id FROM cves ORDER BY id")
        .fetch_all(&system.pool)
        .await
        .unwrap();
    assert!(
        ids.iter().any(|id| id == "CVE-2026-10004"),
        "the record that moved across the page boundary: {ids:?}"
    );
    assert_eq!(ids.len(), 12, "{ids:?}");
    let pages: Vec<u64> = nvd
        .requests()
        .iter()
        .filter(|request| request.window.is_some())
        .map(|request| request.start_index)
        .collect();
    assert_eq!(pages, [0, 4, 0, 4, 8], "read again from the first page");
    assert_eq!(counter("palisade_nvd_windows_reread_total "), 1);
    let done = checkpoint(&system, job).await;
    assert_eq!(done["phase"], "done", "{done}");
    system.finish().await;
}

fn settings(base_url: &str, ca: Option<std::path::PathBuf>) -> NvdSettings {
    NvdSettings {
        base_url: base_url.parse().unwrap(),
        api_key: None,
        requests_per_window: 100,
        window: Duration::from_secs(1),
        timeout: Duration::from_secs(5),
        max_retries: 0,
        retry: RetryPolicy::new(Duration::from_millis(1), Duration::from_millis(1)),
        page_size: nvd::MAX_PAGE_SIZE,
        ca,
    }
}

/// A mirror behind an internal authority: trusted with `PALISADE_NVD_CA`, refused without.
#[tokio::test]
async fn a_mirror_behind_an_internal_authority_is_trusted_through_its_ca_file() {
    let system = TestSystem::spawn().await;
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![leaf.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    )
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let body = r#"{"resultsPerPage":0,"startIndex":0,"totalResults":0,"vulnerabilities":[]}"#;
        while let Ok((stream, _)) = listener.accept().await {
            let Ok(mut stream) = acceptor.accept(stream).await else {
                continue;
            };
            let mut request = vec![0; 4096];
            let _ = stream.read(&mut request).await;
            let response = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
        }
    });
    let folder = tempfile::tempdir().unwrap();
    let ca_file = folder.path().join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let url = format!("https://localhost:{port}/rest/json/cves/2.0");
    let query = Query::Id("CVE-2021-44228".into());

    let trusting = Nvd::new(settings(&url, Some(ca_file)), system.pool.clone()).unwrap();
    let page = trusting.page(&query, 0).await.unwrap();
    assert_eq!(page.total_results, 0);
    let plain = Nvd::new(settings(&url, None), system.pool.clone()).unwrap();
    assert!(matches!(
        plain.page(&query, 0).await,
        Err(NvdError::Unavailable { attempts: 1, .. })
    ));
    let empty = folder.path().join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    let error = Nvd::new(settings(&url, Some(empty)), system.pool.clone()).unwrap_err();
    assert!(error.to_string().contains("PALISADE_NVD_CA"), "{error}");
    system.finish().await;
}

/// What is left of item 1's "the error code says what happened": data PostgreSQL refuses is
/// told apart from PostgreSQL being unavailable (enrichment fails such a job `data_refused`,
/// not retried, where it said `database_unavailable` three times).
#[tokio::test]
async fn data_postgres_refuses_is_told_apart_from_postgres_unavailable() {
    let system = TestSystem::spawn().await;
    let error = sqlx::query("SELECT $1::text")
        .bind("a\u{0}b")
        .execute(&system.pool)
        .await
        .expect_err("PostgreSQL stores no NUL in text");
    let error = store::StoreError::from(error);
    assert!(error.is_data_refused(), "{error:?}");
    assert!(
        !error.is_unavailable() && !error.is_transient(),
        "{error:?}"
    );
    system.finish().await;
}
