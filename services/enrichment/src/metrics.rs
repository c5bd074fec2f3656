//! Enrichment's counters on `/metrics`, registered in the process-wide registry the first
//! time one is used: executions by how they ended, NVD requests by outcome, lookups in the
//! local CVE table (hits and misses, for its hit ratio), upstream records quarantined by
//! action, syncs stopped at their page cap and windows read again. Every label value is a
//! constant here.

use std::sync::LazyLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use store::cves::QuarantineAction;

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

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabels {
    action: &'static str,
}

struct Metrics {
    executions: Family<OutcomeLabels, Counter>,
    nvd_requests: Family<OutcomeLabels, Counter>,
    lookups: Family<ResultLabels, Counter>,
    quarantined: Family<ActionLabels, Counter>,
    syncs_capped: Counter,
    windows_reread: Counter,
    windows_unsettled: Counter,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(|| {
    let metrics = Metrics {
        executions: Family::default(),
        nvd_requests: Family::default(),
        lookups: Family::default(),
        quarantined: Family::default(),
        syncs_capped: Counter::default(),
        windows_reread: Counter::default(),
        windows_unsettled: Counter::default(),
    };
    for action in [QuarantineAction::Sanitised, QuarantineAction::SetAside] {
        let _ = metrics.quarantined.get_or_create(&ActionLabels {
            action: action.as_str(),
        });
    }
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
    let mut registry = telemetry::metrics::registry();
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
    registry.register(
        "cve_records_quarantined",
        "Upstream CVE records (NVD API or imported files) palisade could not keep as served, \
         counted the first time each is seen, by action: sanitised (stored with a NUL replaced \
         or an impossible date dropped) or set_aside (unreadable, not stored); palisade cve \
         status lists them",
        metrics.quarantined.clone(),
    );
    registry.register(
        "nvd_syncs_capped",
        "NVD syncs that stopped at PALISADE_NVD_SYNC_MAX_PAGES pages (the next sync goes on)",
        metrics.syncs_capped.clone(),
    );
    registry.register(
        "nvd_windows_reread",
        "NVD sync windows read again from their first page because their totalResults changed \
         while they were paged",
        metrics.windows_reread.clone(),
    );
    registry.register(
        "nvd_windows_unsettled",
        "NVD sync windows that still changed after being read again three times: the sync paged \
         on, and the watermark stayed at the window's start so that the next sync reads it again",
        metrics.windows_unsettled.clone(),
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

pub(crate) fn quarantined(action: QuarantineAction) {
    METRICS
        .quarantined
        .get_or_create(&ActionLabels {
            action: action.as_str(),
        })
        .inc();
}

pub(crate) fn sync_capped() {
    METRICS.syncs_capped.inc();
}

pub(crate) fn window_reread() {
    METRICS.windows_reread.inc();
}

pub(crate) fn window_unsettled() {
    METRICS.windows_unsettled.inc();
}
