//! Enrichment's counters on `/metrics`, registered in the process-wide registry the first
//! time one is used: executions by how they ended, NVD requests by outcome, and lookups in the
//! local CVE table (hits and misses, for its hit ratio). Every label value is a constant here.

use std::sync::LazyLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use crate::Execution;

/// How one NVD request ended, as the `outcome` label.
pub mod nvd_outcomes {
    pub const OK: &str = "ok";
    /// 429.
    pub const RATE_LIMITED: &str = "rate_limited";
    /// 403 (NVD answers it when its limit is exceeded, too).
    pub const FORBIDDEN: &str = "forbidden";
    /// 5xx.
    pub const UNAVAILABLE: &str = "unavailable";
    /// Any other status: not retried.
    pub const REFUSED: &str = "refused";
    pub const TIMEOUT: &str = "timeout";
    /// A body that is not an NVD page (truncated, HTML, …).
    pub const MALFORMED: &str = "malformed";
    /// No answer (connection refused or broken).
    pub const ERROR: &str = "error";
    pub const ALL: [&str; 8] = [
        OK,
        RATE_LIMITED,
        FORBIDDEN,
        UNAVAILABLE,
        REFUSED,
        TIMEOUT,
        MALFORMED,
        ERROR,
    ];
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

struct Metrics {
    executions: Family<OutcomeLabels, Counter>,
    nvd_requests: Family<OutcomeLabels, Counter>,
    lookups: Family<ResultLabels, Counter>,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(|| {
    let metrics = Metrics {
        executions: Family::default(),
        nvd_requests: Family::default(),
        lookups: Family::default(),
    };
    for outcome in ["completed", "retrying", "failed", "lost"] {
        let _ = metrics.executions.get_or_create(&OutcomeLabels { outcome });
    }
    for outcome in nvd_outcomes::ALL {
        let _ = metrics
            .nvd_requests
            .get_or_create(&OutcomeLabels { outcome });
    }
    for result in ["hit", "miss"] {
        let _ = metrics.lookups.get_or_create(&ResultLabels { result });
    }
    let mut registry = bus::metrics::registry();
    registry.register(
        "enrichment_executions",
        "Executions of enrichment jobs by how they ended: completed, retrying (failed, retried \
         after the backoff), failed (for good: executions spent or not retryable), lost (taken \
         over, or the lease lapsed)",
        metrics.executions.clone(),
    );
    registry.register(
        "nvd_requests",
        "Requests to the NVD CVE API by outcome: ok, rate_limited, forbidden, unavailable, \
         refused, timeout, malformed, error",
        metrics.nvd_requests.clone(),
    );
    registry.register(
        "cve_lookups",
        "CVE ids of enrichment jobs looked up in the local CVE table: hit (it held them) or \
         miss (looked up at the source)",
        metrics.lookups.clone(),
    );
    metrics
});

/// Registers the counters (at zero) before the first job, so a scrape shows them at once.
pub fn register() {
    LazyLock::force(&METRICS);
}

pub(crate) fn execution(outcome: Execution) {
    let outcome = match outcome {
        Execution::Completed => "completed",
        Execution::Retrying => "retrying",
        Execution::Failed => "failed",
        Execution::Lost => "lost",
    };
    METRICS
        .executions
        .get_or_create(&OutcomeLabels { outcome })
        .inc();
}

pub(crate) fn nvd_request(outcome: &'static str) {
    METRICS
        .nvd_requests
        .get_or_create(&OutcomeLabels { outcome })
        .inc();
}

pub(crate) fn lookups(hits: u64, misses: u64) {
    METRICS
        .lookups
        .get_or_create(&ResultLabels { result: "hit" })
        .inc_by(hits);
    METRICS
        .lookups
        .get_or_create(&ResultLabels { result: "miss" })
        .inc_by(misses);
}
