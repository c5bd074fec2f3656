//! A client of the NVD CVE API 2.0 (`/rest/json/cves/2.0`): pages of at most 2,000 followed
//! by `startIndex`, the optional `apiKey` header, one rate limit for every job of every
//! replica, kept in PostgreSQL so a restart does not reset it (`store::rate_limits`; NVD
//! publishes about 5 requests per rolling 30 seconds without a key, 50 with one), and 403, 429
//! and 5xx answers, timeouts, broken connections and unreadable bodies retried with the
//! jittered backoff or the `Retry-After` NVD asked for (seconds or an HTTP date), a bounded
//! number of times. The base URL is configuration, so a mirror or a test server can stand in.

pub mod format;

use std::time::{Duration, SystemTime};

use chrono::{DateTime, Utc};
use messages::retry::RetryPolicy;
use runtime::{SettingsError, env};
use store::PgPool;
use store::rate_limits::{self, Taken};

use crate::metrics;
pub use format::Page;

/// NVD's public endpoint.
pub const DEFAULT_BASE_URL: &str = "https://services.nvd.nist.gov/rest/json/cves/2.0";
/// The largest page NVD serves.
pub const MAX_PAGE_SIZE: u32 = 2_000;
/// The longest date range of one `lastModStartDate`/`lastModEndDate` query.
pub const MAX_WINDOW_DAYS: i64 = 120;
/// A `Retry-After` longer than this is waited for only this long.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// How the NVD API is reached.
#[derive(Clone)]
pub struct NvdSettings {
    /// `PALISADE_NVD_BASE_URL`, default [`DEFAULT_BASE_URL`].
    pub base_url: reqwest::Url,
    /// `PALISADE_NVD_API_KEY`, sent as the `apiKey` header; never logged.
    pub api_key: Option<String>,
    /// Requests per window, shared by every replica (`PALISADE_NVD_REQUESTS_PER_WINDOW`,
    /// default 5, or 50 with a key).
    pub requests_per_window: u32,
    /// The rolling window (`PALISADE_NVD_WINDOW_MS`, default 30000).
    pub window: Duration,
    /// One request's timeout, the body included (`PALISADE_NVD_TIMEOUT_MS`, default 30000).
    pub timeout: Duration,
    /// Retries of one request before the execution fails (`PALISADE_NVD_MAX_RETRIES`, 0..=20,
    /// default 5).
    pub max_retries: u32,
    /// The backoff between them when NVD gave no `Retry-After` (`PALISADE_NVD_RETRY_BASE_MS`,
    /// default 2000, `PALISADE_NVD_RETRY_CAP_MS`, default 60000).
    pub retry: RetryPolicy,
    /// `resultsPerPage` (`PALISADE_NVD_PAGE_SIZE`, 1..=2000, default 2000).
    pub page_size: u32,
    /// `PALISADE_NVD_CA`: a PEM file of authorities to trust besides the web's roots, for a
    /// mirror behind an internal CA.
    pub ca: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for NvdSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvdSettings")
            .field("base_url", &self.base_url.as_str())
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("requests_per_window", &self.requests_per_window)
            .field("window", &self.window)
            .field("timeout", &self.timeout)
            .field("max_retries", &self.max_retries)
            .field("retry", &self.retry)
            .field("page_size", &self.page_size)
            .field("ca", &self.ca)
            .finish()
    }
}

impl NvdSettings {
    pub fn from_env() -> Result<Self, SettingsError> {
        let base = env::string("PALISADE_NVD_BASE_URL", DEFAULT_BASE_URL);
        let base_url = reqwest::Url::parse(&base)
            .ok()
            .filter(|url| matches!(url.scheme(), "http" | "https"))
            .ok_or_else(|| SettingsError::Invalid {
                name: "PALISADE_NVD_BASE_URL",
                value: base.clone(),
                reason: "must be an http(s) URL such as https://services.nvd.nist.gov/rest/json/cves/2.0".into(),
            })?;
        let api_key = env::optional_string("PALISADE_NVD_API_KEY");
        let default_rate = if api_key.is_some() { 50 } else { 5 };
        Ok(Self {
            base_url,
            requests_per_window: env::parse_in(
                "PALISADE_NVD_REQUESTS_PER_WINDOW",
                default_rate,
                1..=1_000,
            )?,
            api_key,
            window: Duration::from_millis(env::parse_in(
                "PALISADE_NVD_WINDOW_MS",
                30_000_u64,
                1..=3_600_000,
            )?),
            timeout: Duration::from_millis(env::parse_in(
                "PALISADE_NVD_TIMEOUT_MS",
                30_000_u64,
                1..=600_000,
            )?),
            max_retries: env::parse_in("PALISADE_NVD_MAX_RETRIES", 5_u32, 0..=20)?,
            retry: runtime::retry_policy_from_vars(
                ("PALISADE_NVD_RETRY_BASE_MS", 2_000),
                ("PALISADE_NVD_RETRY_CAP_MS", 60_000),
            )?,
            page_size: env::parse_in("PALISADE_NVD_PAGE_SIZE", MAX_PAGE_SIZE, 1..=MAX_PAGE_SIZE)?,
            ca: env::optional_string("PALISADE_NVD_CA").map(std::path::PathBuf::from),
        })
    }
}

/// What to ask NVD for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Query {
    /// CVEs modified in `[start, end]` (at most [`MAX_WINDOW_DAYS`]).
    Modified {
        start: DateTime<Utc>,
        end: DateTime<Utc>,
    },
    /// One CVE by id.
    Id(String),
}

/// Why the client cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum NvdSetupError {
    #[error(
        "PALISADE_NVD_CA {path:?} is not a PEM file of certificates ({reason}): point it at the authorities of the mirror, or unset it"
    )]
    Ca {
        path: std::path::PathBuf,
        reason: String,
    },
    #[error("cannot build the NVD API client: {0}")]
    Client(#[source] reqwest::Error),
}

/// Why NVD gave no page.
#[derive(Debug, thiserror::Error)]
pub enum NvdError {
    /// Still failing after every retry: worth another execution later.
    #[error("the NVD API did not answer usably after {attempts} attempts; the last: {last}")]
    Unavailable { attempts: u32, last: String },
    /// An answer retrying cannot change (400, 404, …): the base URL or the query is wrong.
    #[error("the NVD API refused the request with HTTP {status}; check PALISADE_NVD_BASE_URL")]
    Refused { status: u16 },
    /// The shared rate limit could not be read or counted.
    #[error("cannot count the request against the NVD rate limit: {0}")]
    Limit(#[source] store::StoreError),
}

/// One request's failure, and whether (and when) to try again.
struct Failure {
    outcome: &'static str,
    detail: String,
    retry_after: Option<Duration>,
    /// `Err(status)`: retrying cannot help; NVD answered `status`.
    retryable: Result<(), u16>,
}

/// The NVD API client; one per process, shared by all its jobs.
#[derive(Debug)]
pub struct Nvd {
    http: reqwest::Client,
    settings: NvdSettings,
    /// Where the rate limit is counted.
    pool: PgPool,
    /// This process's requests wait for the shared limit one at a time, in order (tokio's
    /// mutex is fair).
    queue: tokio::sync::Mutex<()>,
}

impl Nvd {
    pub fn new(settings: NvdSettings, pool: PgPool) -> Result<Self, NvdSetupError> {
        let mut http = reqwest::Client::builder()
            .timeout(settings.timeout)
            .user_agent(concat!("palisade-enrichment/", env!("CARGO_PKG_VERSION")));
        if let Some(path) = &settings.ca {
            let unreadable = |reason: String| NvdSetupError::Ca {
                path: path.clone(),
                reason,
            };
            let pem = std::fs::read(path).map_err(|error| unreadable(error.to_string()))?;
            let authorities = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|error| unreadable(error.to_string()))?;
            if authorities.is_empty() {
                return Err(unreadable("it holds no certificate".into()));
            }
            for authority in authorities {
                http = http.add_root_certificate(authority);
            }
        }
        let http = http.build().map_err(NvdSetupError::Client)?;
        Ok(Self {
            http,
            settings,
            pool,
            queue: tokio::sync::Mutex::new(()),
        })
    }

    /// Waits until the shared limit lets a request start, and counts it.
    async fn start_request(&self) -> Result<(), NvdError> {
        let _turn = self.queue.lock().await;
        loop {
            match rate_limits::take(
                &self.pool,
                rate_limits::NVD,
                self.settings.requests_per_window,
                self.settings.window,
            )
            .await
            .map_err(NvdError::Limit)?
            {
                Taken::Started => return Ok(()),
                Taken::Wait(wait) => tokio::time::sleep(wait).await,
            }
        }
    }

    pub fn settings(&self) -> &NvdSettings {
        &self.settings
    }

    /// The page of `query` starting at `start_index`, retried as the module says.
    pub async fn page(&self, query: &Query, start_index: u64) -> Result<Page, NvdError> {
        let mut params: Vec<(&str, String)> = match query {
            Query::Modified { start, end } => vec![
                ("lastModStartDate", format::api_date(*start)),
                ("lastModEndDate", format::api_date(*end)),
            ],
            Query::Id(id) => vec![("cveId", id.clone())],
        };
        params.push(("resultsPerPage", self.settings.page_size.to_string()));
        params.push(("startIndex", start_index.to_string()));
        let mut attempts = 0;
        loop {
            attempts += 1;
            self.start_request().await?;
            let failure = match self.once(&params).await {
                Ok(page) => {
                    metrics::nvd_request(metrics::nvd_outcomes::OK);
                    return Ok(page);
                }
                Err(failure) => failure,
            };
            metrics::nvd_request(failure.outcome);
            if let Err(status) = failure.retryable {
                return Err(NvdError::Refused { status });
            }
            if attempts > self.settings.max_retries {
                return Err(NvdError::Unavailable {
                    attempts,
                    last: failure.detail,
                });
            }
            let wait = failure
                .retry_after
                .map(|after| after.min(MAX_RETRY_AFTER))
                .unwrap_or_else(|| self.settings.retry.jittered(attempts));
            tracing::info!(
                outcome = failure.outcome,
                detail = %failure.detail,
                attempt = attempts,
                wait_ms = wait.as_millis() as u64,
                "NVD request failed; trying again"
            );
            tokio::time::sleep(wait).await;
        }
    }

    async fn once(&self, params: &[(&str, String)]) -> Result<Page, Failure> {
        let mut request = self.http.get(self.settings.base_url.clone()).query(params);
        if let Some(key) = &self.settings.api_key {
            request = request.header("apiKey", key);
        }
        let transport = |error: reqwest::Error| Failure {
            outcome: if error.is_timeout() {
                metrics::nvd_outcomes::TIMEOUT
            } else {
                metrics::nvd_outcomes::ERROR
            },
            // Without the URL: a mirror's may carry credentials.
            detail: telemetry::chain(&error.without_url()).to_string(),
            retry_after: None,
            retryable: Ok(()),
        };
        let response = request.send().await.map_err(transport)?;
        let status = response.status();
        if !status.is_success() {
            let retry_after = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| retry_after(value, SystemTime::now()));
            let (outcome, retryable) = match status.as_u16() {
                429 => (metrics::nvd_outcomes::RATE_LIMITED, Ok(())),
                403 => (metrics::nvd_outcomes::FORBIDDEN, Ok(())),
                500..=599 => (metrics::nvd_outcomes::UNAVAILABLE, Ok(())),
                other => (metrics::nvd_outcomes::REFUSED, Err(other)),
            };
            return Err(Failure {
                outcome,
                detail: format!("HTTP {status}"),
                retry_after,
                retryable,
            });
        }
        let body = response.bytes().await.map_err(transport)?;
        format::parse(&body).map_err(|error| Failure {
            outcome: metrics::nvd_outcomes::MALFORMED,
            detail: error.to_string(),
            retry_after: None,
            retryable: Ok(()),
        })
    }
}

/// A `Retry-After` value as a wait: delay-seconds, or an HTTP date (RFC 9110 §10.2.3; a date
/// already past is no wait). `None` when it is neither.
fn retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_read_as_seconds_or_as_an_http_date() {
        let now = httpdate::parse_http_date("Wed, 02 Dec 2026 10:00:00 GMT").unwrap();
        assert_eq!(retry_after("7", now), Some(Duration::from_secs(7)));
        assert_eq!(retry_after(" 0 ", now), Some(Duration::ZERO));
        assert_eq!(
            retry_after("Wed, 02 Dec 2026 10:01:30 GMT", now),
            Some(Duration::from_secs(90))
        );
        assert_eq!(
            retry_after("Wed, 02 Dec 2026 09:59:00 GMT", now),
            Some(Duration::ZERO),
            "a date already past is no wait"
        );
        assert_eq!(retry_after("soon", now), None);
        assert_eq!(retry_after("-3", now), None);
    }
}
