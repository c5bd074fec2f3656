//! CVE sources (issue 11, item 3) against a local server answering like the NVD CVE API 2.0
//! (`tests::nvd::FakeNvd`): a sync spread over three 120-day windows and three pages of one,
//! through 429 with `Retry-After`, 503, a truncated body and a page slower than the timeout,
//! writes every CVE once within the rate limit and completes the job; an execution killed
//! mid-pagination is resumed from its checkpoint by another, without fetching a page before
//! it again; enriching again writes nothing; the offline import fills the local table; and a
//! dependency audit's scan ends with CVSS and CWE on its findings.

use std::time::Duration;

use chrono::{TimeDelta, Utc};
use enrichment::Execution;
use enrichment::cve::CveSource;
use messages::retry::RetryPolicy;
use tests::TestSystem;
use tests::nvd::{FakeNvd, Fault, ServedCve};
use uuid::Uuid;

const RATE_LIMIT: u32 = 3;
const RATE_WINDOW: Duration = Duration::from_secs(1);

/// An enrichment service reading the fake NVD: pages of 4, at most 3 requests a second, a
/// 500 ms timeout, quick retries.
fn service(system: &TestSystem, nvd: &FakeNvd, lease_ttl: Duration) -> enrichment::Service {
    let mut settings = system.settings.enrichment.clone();
    settings.http_addr = None;
    settings.lease_ttl = lease_ttl;
    settings.retry = RetryPolicy::new(Duration::ZERO, Duration::ZERO);
    let cve = &mut settings.cve;
    cve.source = CveSource::Nvd;
    cve.sync_interval = Some(Duration::from_secs(3_600));
    cve.nvd.base_url = nvd.url();
    cve.nvd.page_size = 4;
    cve.nvd.requests_per_window = RATE_LIMIT;
    cve.nvd.window = RATE_WINDOW;
    cve.nvd.timeout = Duration::from_millis(500);
    cve.nvd.max_retries = 4;
    cve.nvd.retry = RetryPolicy::new(Duration::from_millis(20), Duration::from_millis(100));
    enrichment::Service::from_connections(
        settings,
        runtime::Connections {
            pool: system.pool.clone(),
            bus: system.bus.clone(),
        },
    )
    .expect("an enrichment service")
}

/// `count` CVEs `CVE-2026-1000`… NVD modified over the last two days.
fn recent(count: u32) -> Vec<ServedCve> {
    let now = Utc::now();
    (0..count)
        .map(|n| {
            ServedCve::numbered(
                &format!("CVE-2026-{}", 1000 + n),
                n,
                now - TimeDelta::days(2) + TimeDelta::minutes(i64::from(n)),
            )
        })
        .collect()
}

/// The sync last ran `days` ago.
pub(crate) async fn synced_days_ago(system: &TestSystem, days: i32) {
    sqlx::query("UPDATE cve_sync SET synced_through = now() - make_interval(days => $1)")
        .bind(days)
        .execute(&system.pool)
        .await
        .expect("the watermark set back");
}

pub(crate) async fn checkpoint(system: &TestSystem, job_id: Uuid) -> serde_json::Value {
    sqlx::query_scalar("SELECT checkpoint FROM enrichment_jobs WHERE id = $1")
        .bind(job_id)
        .fetch_one(&system.pool)
        .await
        .expect("the job")
}

async fn count(system: &TestSystem, query: &'static str) -> i64 {
    sqlx::query_scalar(query)
        .fetch_one(&system.pool)
        .await
        .expect("a count")
}

/// The CVE data of the scan's first finding.
async fn cve_data(system: &TestSystem, scan_id: Uuid) -> serde_json::Value {
    sqlx::query_scalar("SELECT cve_data FROM findings WHERE scan_id = $1 ORDER BY id LIMIT 1")
        .bind(scan_id)
        .fetch_one(&system.pool)
        .await
        .expect("a finding")
}

/// `palisade_nvd_requests_total` by outcome, from this process's registry.
fn nvd_requests(outcome: &str) -> u64 {
    counter(&format!(
        "palisade_nvd_requests_total{{outcome=\"{outcome}\"}} "
    ))
}

/// The value on the line of this process's registry that starts with `line` (0 when absent).
pub(crate) fn counter(line: &str) -> u64 {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &telemetry::metrics::registry())
        .expect("encoded");
    text.lines()
        .find_map(|row| row.strip_prefix(line))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_through_every_fault_writes_each_cve_once_within_the_rate_limit() {
    let system = TestSystem::spawn().await;
    let old = ServedCve::numbered("CVE-2020-0001", 1, Utc::now() - TimeDelta::days(400));
    let mut served = recent(10);
    served.push(old);
    let nvd = FakeNvd::start(served).await;
    // Synced 300 days ago: three 120-day windows, the last holding the ten CVEs, three pages.
    synced_days_ago(&system, 300).await;
    nvd.fail_page(0, [Fault::Status(429, Some(1))]);
    nvd.fail_page(4, [Fault::Status(503, None), Fault::Truncated]);
    nvd.fail_page(8, [Fault::Slow(Duration::from_millis(1_500))]);
    // Two of the findings' CVEs come with the sync; one only by id (NVD modified it long
    // ago); one NVD does not know.
    let ids = [
        "CVE-2026-1003",
        "CVE-2026-1007",
        "CVE-2020-0001",
        "CVE-2099-9999",
    ];
    let (scan_id, job_id) = system.scan_to_enrich(&ids).await;

    let enrichment = service(&system, &nvd, Duration::from_secs(30));
    assert_eq!(
        enrichment.run_once().await.unwrap(),
        [(job_id, Execution::Completed)]
    );

    // Every CVE written once: the ten, the one looked up by id, and the unknown one.
    let done = checkpoint(&system, job_id).await;
    assert_eq!(done["phase"], "done");
    assert_eq!(done["written"], 12, "{done}");
    assert_eq!(done["looked_up"], 2, "{done}");
    assert_eq!(done["findings"], 2, "{done}");
    assert_eq!(
        count(&system, "SELECT count(*) FROM cves WHERE known").await,
        11
    );
    assert_eq!(
        count(
            &system,
            "SELECT count(*) FROM cves WHERE id = 'CVE-2099-9999' AND NOT known"
        )
        .await,
        1
    );
    assert_eq!(
        count(
            &system,
            "SELECT count(*) FROM cve_sync WHERE synced_through > now() - interval '1 minute' \
             AND holder_job_id IS NULL"
        )
        .await,
        1,
        "the watermark moved to the sync's end and the job let go"
    );

    // The requests: windows of at most 120 days (the server refuses longer ones), each page
    // of the last served once after its faults, never more than the limit in a window.
    let requests = nvd.requests();
    let windows: Vec<_> = requests
        .iter()
        .filter_map(|request| request.window)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(windows.len(), 3, "{windows:?}");
    let last = *windows.last().unwrap();
    let served: Vec<u64> = requests
        .iter()
        .filter(|request| request.window == Some(last) && request.fault.is_none())
        .map(|request| request.start_index)
        .collect();
    assert_eq!(served, [0, 4, 8]);
    let faults: Vec<&str> = requests
        .iter()
        .filter_map(|request| request.fault.as_deref())
        .collect();
    assert_eq!(faults.len(), 4, "{faults:?}");
    for (earlier, later) in requests
        .iter()
        .zip(requests.iter().skip(RATE_LIMIT as usize))
    {
        // Arrival times, which the network may bunch a little: a tenth of the window spare.
        assert!(
            later.at - earlier.at >= RATE_WINDOW - RATE_WINDOW / 10,
            "more than {RATE_LIMIT} requests within {RATE_WINDOW:?}"
        );
    }
    let after_429 = requests
        .iter()
        .position(|request| request.fault.as_deref() == Some("Status(429, Some(1))"))
        .expect("the 429 was answered");
    assert!(requests[after_429 + 1].at - requests[after_429].at >= Duration::from_secs(1));
    let by_id: Vec<&str> = requests
        .iter()
        .filter_map(|request| request.cve_id.as_deref())
        .collect();
    assert_eq!(by_id, ["CVE-2020-0001", "CVE-2099-9999"]);
    for (outcome, expected) in [
        ("rate_limited", 1),
        ("unavailable", 1),
        ("malformed", 1),
        ("timeout", 1),
    ] {
        assert_eq!(nvd_requests(outcome), expected, "{outcome}");
    }

    // What each finding carries, in its CVE ids' order.
    let data = cve_data(&system, scan_id).await;
    let entries = data.as_array().expect("one entry per CVE id");
    assert_eq!(entries.len(), 4);
    let first = &entries[0];
    assert_eq!(first["id"], "CVE-2026-1003");
    assert_eq!(first["status"], "known");
    assert_eq!(first["cvss_v31"]["score"], 3.5);
    assert_eq!(first["cvss_v31"]["severity"], "HIGH");
    assert!(
        first["cvss_v31"]["vector"]
            .as_str()
            .unwrap()
            .starts_with("CVSS:3.1/")
    );
    assert!(
        first["cvss_v40"]["vector"]
            .as_str()
            .unwrap()
            .starts_with("CVSS:4.0/")
    );
    assert_eq!(first["cwe_ids"], serde_json::json!(["CWE-703"]));
    assert_eq!(first["published"], "2024-01-02T03:04:05.678Z");
    assert_eq!(first["description"], "CVE-2026-1003: a test vulnerability");
    assert_eq!(
        first["references"],
        serde_json::json!(["https://example.com/advisories/CVE-2026-1003"])
    );
    assert_eq!(entries[2]["id"], "CVE-2020-0001");
    assert_eq!(entries[2]["status"], "known");
    assert_eq!(
        entries[3],
        serde_json::json!({"id": "CVE-2099-9999", "status": "unknown"})
    );

    // Enriching again: the sync is not due and every id is known, so nothing is fetched, and
    // the findings already hold the same data.
    sqlx::query("UPDATE enrichment_jobs SET state = 'pending', checkpoint = '{}' WHERE id = $1")
        .bind(job_id)
        .execute(&system.pool)
        .await
        .unwrap();
    assert_eq!(
        enrichment.run_once().await.unwrap(),
        [(job_id, Execution::Completed)]
    );
    let again = checkpoint(&system, job_id).await;
    assert_eq!(
        (&again["written"], &again["findings_written"]),
        (&0.into(), &0.into())
    );
    assert_eq!(
        nvd.requests().len(),
        requests.len(),
        "nothing fetched again"
    );
    assert_eq!(cve_data(&system, scan_id).await, data);
    system.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_execution_killed_mid_pagination_is_resumed_from_its_checkpoint() {
    let system = TestSystem::spawn().await;
    let nvd = FakeNvd::start(recent(12)).await;
    synced_days_ago(&system, 3).await;
    // The third page never comes: the process is killed waiting for it.
    nvd.fail_page(8, [Fault::Hang]);
    let (scan_id, job_id) = system.scan_to_enrich(&["CVE-2026-1011"]).await;

    let first = service(&system, &nvd, Duration::from_secs(30));
    let running = tokio::spawn(async move { first.run_once().await });
    nvd.asked_for_page(8).await;
    running.abort();
    assert!(running.await.unwrap_err().is_cancelled());
    let killed_at = nvd.requests().len();
    let progress = checkpoint(&system, job_id).await;
    assert_eq!(progress["phase"], "sync");
    assert_eq!(progress["sync"]["start_index"], 8, "{progress}");
    assert_eq!(progress["written"], 8, "{progress}");

    // Its lease lapses; the reaper returns the job and another process takes it.
    sqlx::query("UPDATE enrichment_jobs SET lease_expires_at = now() - interval '1 second'")
        .execute(&system.pool)
        .await
        .unwrap();
    let recovered = system.sweep_enrichment().await;
    assert_eq!(recovered.retried, [job_id]);
    let second = service(&system, &nvd, Duration::from_secs(30));
    assert_eq!(
        second.run_once().await.unwrap(),
        [(job_id, Execution::Completed)]
    );

    // Counted: after the kill, only the page at the checkpoint was fetched.
    let resumed: Vec<u64> = nvd.requests()[killed_at..]
        .iter()
        .filter(|request| request.window.is_some())
        .map(|request| request.start_index)
        .collect();
    assert_eq!(resumed, [8]);
    let done = checkpoint(&system, job_id).await;
    assert_eq!(done["written"], 12, "{done}");
    assert_eq!(count(&system, "SELECT count(*) FROM cves").await, 12);
    assert_eq!(cve_data(&system, scan_id).await[0]["status"], "known");
    nvd.release();
    system.finish().await;
}

#[tokio::test]
async fn the_offline_import_fills_the_local_table_that_the_local_source_enriches_from() {
    let system = TestSystem::spawn().await;
    let feed = |cves: &[ServedCve]| {
        serde_json::json!({
            "resultsPerPage": cves.len(), "startIndex": 0, "totalResults": cves.len(),
            "format": "NVD_CVE", "version": "2.0", "timestamp": "2026-12-01T00:00:00.000",
            "vulnerabilities": cves.iter().map(|cve| cve.json.clone()).collect::<Vec<_>>(),
        })
        .to_string()
    };
    let cves = recent(5);
    let folder = tempfile::tempdir().unwrap();
    std::fs::write(folder.path().join("nvdcve-2.0-2026.json"), feed(&cves[..3])).unwrap();
    let gzipped = std::fs::File::create(folder.path().join("nvdcve-2.0-modified.json.gz")).unwrap();
    let mut encoder = flate2::write::GzEncoder::new(gzipped, flate2::Compression::default());
    std::io::Write::write_all(&mut encoder, feed(&cves[2..]).as_bytes()).unwrap();
    encoder.finish().unwrap();
    std::fs::write(folder.path().join("notes.txt"), "not a feed").unwrap();

    // As `palisade cve import <folder>` does: a line per file, then the summary.
    let mut lines = Vec::new();
    let summary =
        palisade::commands::import_cves(&system.pool, folder.path(), |line| lines.push(line))
            .await
            .unwrap();
    // The second file repeats one CVE of the first: as new already, not written again.
    assert_eq!(
        summary,
        serde_json::json!({"files": 2, "records": 6, "written": 5, "quarantined": 0})
    );
    assert_eq!(lines.len(), 2);
    assert!(
        lines[1].starts_with("[2/2] ")
            && lines[1].ends_with("nvdcve-2.0-modified.json.gz: 3 CVE records, 2 written"),
        "{lines:?}"
    );
    assert_eq!(
        count(
            &system,
            "SELECT count(*) FROM cves WHERE source = 'import' AND known"
        )
        .await,
        5
    );
    let files = enrichment::import::files(folder.path()).unwrap();
    let again = enrichment::import::import_file(&system.pool, &files[0])
        .await
        .unwrap();
    assert_eq!(again.written, 0, "importing again writes nothing");
    let broken = folder.path().join("broken.json");
    std::fs::write(&broken, &feed(&cves)[..40]).unwrap();
    let error = enrichment::import::import_file(&system.pool, &broken)
        .await
        .unwrap_err();
    assert!(error.to_string().contains("broken.json"), "{error}");

    // The test system's enrichment reads the local table alone.
    let (scan_id, job_id) = system
        .scan_to_enrich(&["CVE-2026-1004", "CVE-2026-4444"])
        .await;
    let mut settings = system.settings.enrichment.clone();
    settings.http_addr = None;
    assert_eq!(settings.cve.source, CveSource::Local);
    let enrichment = enrichment::Service::from_connections(
        settings,
        runtime::Connections {
            pool: system.pool.clone(),
            bus: system.bus.clone(),
        },
    )
    .unwrap();
    assert_eq!(
        enrichment.run_once().await.unwrap(),
        [(job_id, Execution::Completed)]
    );
    let data = cve_data(&system, scan_id).await;
    assert_eq!(data[0]["cvss_v31"]["score"], 4.5);
    assert_eq!(
        data[1],
        serde_json::json!({"id": "CVE-2026-4444", "status": "missing"})
    );
    system.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dependency_audit_scan_ends_with_cvss_and_cwe_from_the_nvd_server() {
    let advisories = ["CVE-2099-0001", "CVE-2099-0002"];
    let now = Utc::now();
    let nvd = FakeNvd::start(
        advisories
            .iter()
            .enumerate()
            .map(|(n, id)| ServedCve::numbered(id, n as u32 + 7, now - TimeDelta::days(900)))
            .collect(),
    )
    .await;
    let base_url = nvd.url();
    let system = TestSystem::spawn_with(|settings| {
        let cve = &mut settings.enrichment.cve;
        cve.source = CveSource::Nvd;
        cve.nvd.base_url = base_url;
        cve.nvd.timeout = Duration::from_secs(5);
        cve.nvd.requests_per_window = 50;
        cve.nvd.api_key = Some("test-api-key".into());
    })
    .await;
    system.start(tests::Component::Enrichment);
    let organization = system.organization().await;
    let _stats = system.reference_worker(organization, 2).await;
    let scan_id = system.completed_dependency_audit(organization).await;
    system
        .wait_for("the scan's enrichment to complete", || async {
            let state: String =
                sqlx::query_scalar("SELECT state FROM enrichment_jobs WHERE scan_id = $1")
                    .bind(scan_id)
                    .fetch_one(&system.pool)
                    .await
                    .ok()?;
            (state == "completed").then_some(())
        })
        .await;
    let data: Vec<serde_json::Value> = sqlx::query_scalar(
        "SELECT jsonb_array_elements(cve_data) FROM findings WHERE scan_id = $1",
    )
    .bind(scan_id)
    .fetch_all(&system.pool)
    .await
    .unwrap();
    assert!(!data.is_empty());
    for entry in &data {
        assert_eq!(entry["status"], "known", "{entry}");
        assert!(entry["cvss_v31"]["score"].as_f64().is_some(), "{entry}");
        assert!(entry["cvss_v40"]["score"].as_f64().is_some(), "{entry}");
        assert!(
            entry["cwe_ids"][0].as_str().unwrap().starts_with("CWE-"),
            "{entry}"
        );
    }
    let mut named: Vec<&str> = data
        .iter()
        .filter_map(|entry| entry["id"].as_str())
        .collect();
    named.sort();
    named.dedup();
    assert_eq!(named, advisories);
    let requests = nvd.requests();
    assert!(!requests.is_empty());
    assert!(
        requests
            .iter()
            .all(|request| request.api_key.as_deref() == Some("test-api-key")),
        "every request carries the apiKey header"
    );
    system.finish().await;
}
