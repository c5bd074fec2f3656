//! A local HTTP server that answers like the NVD CVE API 2.0 (`/rest/json/cves/2.0`), for
//! enrichment's tests: CVEs by `cveId`, or modified in a `lastModStartDate`/`lastModEndDate`
//! window (refused beyond 120 days, as NVD does), paged by `startIndex` and `resultsPerPage`.
//! It keeps every request it was sent, and answers a request for a given page with the
//! faults queued for it first: a status with `Retry-After`, a truncated body, a slow answer,
//! or a hang until the test lets go. A CVE can be modified right after a page is served, as
//! NVD modifies records while a client pages.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, NaiveDateTime, Utc};
use tokio::time::Instant;

/// A CVE the server knows, as NVD's JSON.
#[derive(Debug, Clone)]
pub struct ServedCve {
    pub id: String,
    pub last_modified: DateTime<Utc>,
    pub json: serde_json::Value,
}

impl ServedCve {
    /// A CVE with a CVSS v3.1 and a v4.0 score derived from `n`, and a CWE id.
    pub fn numbered(id: &str, n: u32, last_modified: DateTime<Utc>) -> Self {
        let modified = last_modified.format("%Y-%m-%dT%H:%M:%S%.3f").to_string();
        let score = f64::from(n % 10) + 0.5;
        Self {
            id: id.to_owned(),
            last_modified,
            json: serde_json::json!({"cve": {
                "id": id,
                "sourceIdentifier": "test@example.com",
                "published": "2024-01-02T03:04:05.678",
                "lastModified": modified,
                "vulnStatus": "Analyzed",
                "descriptions": [{"lang": "en", "value": format!("{id}: a test vulnerability")}],
                "metrics": {
                    "cvssMetricV31": [{"source": "nvd@nist.gov", "type": "Primary", "cvssData": {
                        "version": "3.1", "baseScore": score, "baseSeverity": "HIGH",
                        "vectorString": "CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:H/I:H/A:H"}}],
                    "cvssMetricV40": [{"source": "nvd@nist.gov", "type": "Primary", "cvssData": {
                        "version": "4.0", "baseScore": score, "baseSeverity": "HIGH",
                        "vectorString": "CVSS:4.0/AV:N/AC:L/AT:N/PR:N/UI:N/VC:H/VI:H/VA:H/SC:N/SI:N/SA:N"}}]
                },
                "weaknesses": [{"source": "nvd@nist.gov", "type": "Primary",
                    "description": [{"lang": "en", "value": format!("CWE-{}", 700 + n)}]}],
                "references": [{"url": format!("https://example.com/advisories/{id}")}]
            }}),
        }
    }
}

/// How one answer goes wrong.
#[derive(Debug, Clone)]
pub enum Fault {
    /// This status, with `Retry-After: <seconds>` when given.
    Status(u16, Option<u64>),
    /// The page cut in half.
    Truncated,
    /// The page, after this long.
    Slow(Duration),
    /// No answer until [`FakeNvd::release`] (a page the client waits on while it is killed).
    Hang,
}

/// What the server was asked.
#[derive(Debug, Clone)]
pub struct Request {
    pub at: Instant,
    pub cve_id: Option<String>,
    pub start_index: u64,
    pub window: Option<(DateTime<Utc>, DateTime<Utc>)>,
    /// The fault it was answered with, if any.
    pub fault: Option<String>,
    pub api_key: Option<String>,
}

/// CVEs modified after one serving of a page: (id, new lastModified).
type Modifications = Vec<(String, DateTime<Utc>)>;

#[derive(Default)]
struct Inner {
    cves: Vec<ServedCve>,
    /// Faults for the window query's page at a start index, answered in order.
    page_faults: HashMap<u64, VecDeque<Fault>>,
    /// CVEs modified (id, new lastModified) once the window query's page at a start index
    /// has been served: one batch per serving, in order.
    modified_after: HashMap<u64, VecDeque<Modifications>>,
    /// JSON strings replaced in every body by text that is not JSON (`"marker"` → `NaN`).
    corruptions: Vec<(String, String)>,
    requests: Vec<Request>,
}

#[derive(Clone)]
struct Shared {
    inner: Arc<Mutex<Inner>>,
    released: Arc<tokio::sync::Notify>,
    asked: Arc<tokio::sync::Notify>,
}

/// The running server; stopped when dropped.
pub struct FakeNvd {
    shared: Shared,
    url: String,
    _stop: tokio_util::sync::DropGuard,
}

impl FakeNvd {
    pub async fn start(cves: Vec<ServedCve>) -> Self {
        let mut cves = cves;
        cves.sort_by(|a, b| a.id.cmp(&b.id));
        let shared = Shared {
            inner: Arc::new(Mutex::new(Inner {
                cves,
                ..Default::default()
            })),
            released: Arc::new(tokio::sync::Notify::new()),
            asked: Arc::new(tokio::sync::Notify::new()),
        };
        let app = axum::Router::new()
            .route("/rest/json/cves/2.0", axum::routing::get(answer))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a free port");
        let url = format!(
            "http://{}/rest/json/cves/2.0",
            listener.local_addr().expect("an address")
        );
        let stop = tokio_util::sync::CancellationToken::new();
        let stopped = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move { stopped.cancelled().await })
                .await;
        });
        Self {
            shared,
            url,
            _stop: stop.drop_guard(),
        }
    }

    /// The base URL to configure (`PALISADE_NVD_BASE_URL`).
    pub fn url(&self) -> reqwest::Url {
        self.url.parse().expect("a URL")
    }

    /// Queues `faults` for the window query's page at `start_index`: its next requests are
    /// answered with them, one each, before it is served.
    pub fn fail_page(&self, start_index: u64, faults: impl IntoIterator<Item = Fault>) {
        self.shared
            .inner
            .lock()
            .expect("not poisoned")
            .page_faults
            .entry(start_index)
            .or_default()
            .extend(faults);
    }

    /// Modifies CVE `id` (its `lastModified` becomes `at`) right after the window query's page
    /// at `start_index` is served next after those already queued for it: each call is one
    /// more serving.
    pub fn modify_after_page(&self, start_index: u64, id: &str, at: DateTime<Utc>) {
        self.shared
            .inner
            .lock()
            .expect("not poisoned")
            .modified_after
            .entry(start_index)
            .or_default()
            .push_back(vec![(id.to_owned(), at)]);
    }

    /// Serves the JSON string `"marker"` as `raw` wherever a body holds it, so that a record
    /// can be made to hold what is not JSON (`NaN`, an invalid escape).
    pub fn corrupt(&self, marker: &str, raw: &str) {
        self.shared
            .inner
            .lock()
            .expect("not poisoned")
            .corruptions
            .push((format!("{marker:?}"), raw.to_owned()));
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<Request> {
        self.shared
            .inner
            .lock()
            .expect("not poisoned")
            .requests
            .clone()
    }

    /// Waits until a request for the window query's page at `start_index` has arrived.
    pub async fn asked_for_page(&self, start_index: u64) {
        loop {
            let asked = self.shared.asked.notified();
            if self
                .requests()
                .iter()
                .any(|request| request.window.is_some() && request.start_index == start_index)
            {
                return;
            }
            asked.await;
        }
    }

    /// Lets every hanging request go (answered 503).
    pub fn release(&self) {
        self.shared.released.notify_waiters();
    }
}

#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Params {
    cve_id: Option<String>,
    last_mod_start_date: Option<String>,
    last_mod_end_date: Option<String>,
    #[serde(default)]
    start_index: u64,
    results_per_page: Option<u64>,
}

fn date(text: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(text)
        .map(|at| at.to_utc())
        .ok()
        .or_else(|| {
            NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%M:%S%.f")
                .ok()
                .map(|at| at.and_utc())
        })
}

async fn answer(
    State(shared): State<Shared>,
    headers: HeaderMap,
    Query(params): Query<Params>,
) -> Response {
    let window = match (&params.last_mod_start_date, &params.last_mod_end_date) {
        (Some(start), Some(end)) => match (date(start), date(end)) {
            (Some(start), Some(end)) => Some((start, end)),
            _ => return StatusCode::BAD_REQUEST.into_response(),
        },
        (None, None) => None,
        _ => return StatusCode::BAD_REQUEST.into_response(),
    };
    if window.is_some_and(|(start, end)| end - start > chrono::TimeDelta::days(120)) {
        return (StatusCode::NOT_FOUND, "range over 120 days").into_response();
    }
    let page_size = params.results_per_page.unwrap_or(2_000).min(2_000) as usize;
    let (fault, body) = {
        let mut inner = shared.inner.lock().expect("not poisoned");
        let fault = window
            .and_then(|_| inner.page_faults.get_mut(&params.start_index))
            .and_then(VecDeque::pop_front);
        let matching: Vec<&ServedCve> = inner
            .cves
            .iter()
            .filter(|cve| match (&params.cve_id, window) {
                (Some(id), _) => cve.id == *id,
                (None, Some((start, end))) => {
                    cve.last_modified >= start && cve.last_modified <= end
                }
                (None, None) => true,
            })
            .collect();
        let start = (params.start_index as usize).min(matching.len());
        let page: Vec<serde_json::Value> = matching[start..]
            .iter()
            .take(page_size)
            .map(|cve| cve.json.clone())
            .collect();
        let body = serde_json::json!({
            "resultsPerPage": page.len(),
            "startIndex": params.start_index,
            "totalResults": matching.len(),
            "format": "NVD_CVE",
            "version": "2.0",
            "timestamp": "2026-12-01T00:00:00.000",
            "vulnerabilities": page,
        })
        .to_string();
        let body = inner
            .corruptions
            .iter()
            .fold(body, |body, (marker, raw)| body.replace(marker, raw));
        if window.is_some() && fault.is_none() {
            for (id, at) in inner
                .modified_after
                .get_mut(&params.start_index)
                .and_then(VecDeque::pop_front)
                .unwrap_or_default()
            {
                if let Some(cve) = inner.cves.iter_mut().find(|cve| cve.id == id) {
                    cve.last_modified = at;
                    cve.json["cve"]["lastModified"] =
                        at.format("%Y-%m-%dT%H:%M:%S%.3f").to_string().into();
                }
            }
        }
        inner.requests.push(Request {
            at: Instant::now(),
            cve_id: params.cve_id.clone(),
            start_index: params.start_index,
            window,
            fault: fault.as_ref().map(|fault| format!("{fault:?}")),
            api_key: headers
                .get("apiKey")
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned),
        });
        (fault, body)
    };
    shared.asked.notify_waiters();
    match fault {
        None => ([("content-type", "application/json")], body).into_response(),
        Some(Fault::Status(status, retry_after)) => {
            let mut response = StatusCode::from_u16(status)
                .expect("a status")
                .into_response();
            if let Some(seconds) = retry_after {
                response.headers_mut().insert(
                    "retry-after",
                    seconds.to_string().parse().expect("a header"),
                );
            }
            response
        }
        Some(Fault::Truncated) => {
            let half = body[..body.len() / 2].to_owned();
            ([("content-type", "application/json")], half).into_response()
        }
        Some(Fault::Slow(delay)) => {
            tokio::time::sleep(delay).await;
            ([("content-type", "application/json")], body).into_response()
        }
        Some(Fault::Hang) => {
            shared.released.notified().await;
            StatusCode::SERVICE_UNAVAILABLE.into_response()
        }
    }
}
