//! The finding lifecycle (issue 12; the evidence guide): a finding's disposition is one of the
//! seven [`FindingStatus`]es, each selectable from any other. Every change names the
//! finding's expected revision (and optionally its scan's collection revision, which every
//! change to the scan's findings moves), is recorded with who, when and why in
//! `finding_history`, and is one statement. The scan's finding summary and gate are read from
//! the findings themselves in one snapshot ([`summary`]), so they follow every change at once
//! and cannot go stale. A new scan's findings start `open`: matching finding keys in other
//! scans of the target are its occurrences ([`Occurrence`]), which keep their own dispositions.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use crate::StoreError;
use crate::coverage::CoverageSummary;
use crate::sql;
use crate::states::{FindingChange, FindingStatus, ScanJobState, ScanState, Severity};

/// A page holds at most this many findings.
pub const PAGE_MAX: i64 = 500;
/// A reason is at most this many characters.
pub const REASON_CHARS_MAX: usize = 2_048;
/// An actor is 1 to this many characters.
pub const ACTOR_CHARS_MAX: usize = 256;
/// Occurrences shown with a finding.
pub const OCCURRENCES_MAX: i64 = 20;

/// One finding as people read it.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct Finding {
    pub id: Uuid,
    pub finding_key: String,
    pub plugin: String,
    pub rule_id: String,
    pub resource: String,
    pub discriminator: String,
    pub severity: String,
    pub title: String,
    pub description: String,
    pub evidence: String,
    pub cve_ids: Vec<String>,
    /// What enrichment wrote (docs/enrichment.md); `None` until it did.
    pub cve_data: Option<serde_json::Value>,
    pub status: String,
    pub status_reason: String,
    pub revision: i32,
    pub reviewed_by: String,
    pub reviewed_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A change a person asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub finding_id: Uuid,
    /// `None`: any organization (the operator's command).
    pub organization_id: Option<Uuid>,
    pub expected_revision: i32,
    /// When given, the change is refused unless the scan's findings are still at this
    /// collection revision (the page the person decided on is current).
    pub expected_collection_revision: Option<i32>,
    pub reason: String,
    pub actor: String,
}

/// What a change did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ChangeOutcome {
    /// Done: the finding's new revision (none for a deletion) and the scan's collection
    /// revision.
    Changed {
        revision: Option<i32>,
        collection_revision: i32,
    },
    /// The finding (or its scan's findings) moved on since the revision named: nothing changed.
    RevisionConflict {
        current_revision: i32,
        current_collection_revision: i32,
    },
    /// The five exclusions need a non-blank reason.
    ReasonRequired,
    /// A finding of a pending or running scan is not deleted: its job could write it again.
    ScanActive,
    NotFound,
}

/// Why a change is refused before it reaches the database.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChangeError {
    #[error("the reason is over {REASON_CHARS_MAX} characters")]
    ReasonTooLong,
    #[error("the actor must be 1 to {ACTOR_CHARS_MAX} characters (who made the change)")]
    InvalidActor,
    #[error("the reason and the actor may not hold NUL characters")]
    Nul,
}

impl Change {
    fn check(&self) -> Result<(), ChangeError> {
        if self.reason.contains('\0') || self.actor.contains('\0') {
            return Err(ChangeError::Nul);
        }
        if self.reason.chars().count() > REASON_CHARS_MAX {
            return Err(ChangeError::ReasonTooLong);
        }
        let actor = self.actor.trim();
        if actor.is_empty() || actor.chars().count() > ACTOR_CHARS_MAX {
            return Err(ChangeError::InvalidActor);
        }
        Ok(())
    }
}

/// Refusals and failures of a change.
#[derive(Debug, thiserror::Error)]
pub enum ChangeFailure {
    #[error(transparent)]
    Invalid(#[from] ChangeError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

#[derive(Debug, sqlx::FromRow)]
struct Decided {
    current_revision: i32,
    current_collection_revision: i32,
    collection_revision: Option<i32>,
}

/// Sets the finding's disposition to `status`, in one statement (module doc).
pub async fn set_status(
    pool: &PgPool,
    change: &Change,
    status: FindingStatus,
) -> Result<ChangeOutcome, ChangeFailure> {
    change.check()?;
    let reason = change.reason.trim();
    if status.needs_reason() && reason.is_empty() {
        return Ok(ChangeOutcome::ReasonRequired);
    }
    #[derive(sqlx::FromRow)]
    struct Row {
        #[sqlx(flatten)]
        decided: Decided,
        revision: Option<i32>,
    }
    let row: Option<Row> = sql::findings::SetStatus {
        finding_id: change.finding_id,
        organization_id: change.organization_id,
        expected_revision: change.expected_revision,
        expected_collection_revision: change.expected_collection_revision,
        status: status.as_str(),
        reason,
        actor: change.actor.trim(),
        set_change: FindingChange::Set.as_str(),
    }
    .query_as()
    .fetch_optional(pool)
    .await
    .map_err(StoreError::from)?;
    Ok(match row {
        None => ChangeOutcome::NotFound,
        Some(row) => decided(row.decided, row.revision),
    })
}

/// Deletes the finding (its history stays), in one statement.
pub async fn delete(pool: &PgPool, change: &Change) -> Result<ChangeOutcome, ChangeFailure> {
    change.check()?;
    #[derive(sqlx::FromRow)]
    struct Row {
        #[sqlx(flatten)]
        decided: Decided,
        scan_state: String,
    }
    let active: Vec<&str> = ScanState::ACTIVE
        .iter()
        .map(|state| state.as_str())
        .collect();
    let row: Option<Row> = sql::findings::DeleteOne {
        finding_id: change.finding_id,
        organization_id: change.organization_id,
        expected_revision: change.expected_revision,
        expected_collection_revision: change.expected_collection_revision,
        reason: change.reason.trim(),
        actor: change.actor.trim(),
        delete_change: FindingChange::Delete.as_str(),
        active_scan_states: &active,
    }
    .query_as()
    .fetch_optional(pool)
    .await
    .map_err(StoreError::from)?;
    Ok(match row {
        None => ChangeOutcome::NotFound,
        Some(row) if active.contains(&row.scan_state.as_str()) => ChangeOutcome::ScanActive,
        Some(row) => match decided(row.decided, None) {
            ChangeOutcome::Changed {
                collection_revision,
                ..
            } => ChangeOutcome::Changed {
                revision: None,
                collection_revision,
            },
            other => other,
        },
    })
}

fn decided(decided: Decided, revision: Option<i32>) -> ChangeOutcome {
    match decided.collection_revision {
        Some(collection_revision) => ChangeOutcome::Changed {
            revision,
            collection_revision,
        },
        None => ChangeOutcome::RevisionConflict {
            current_revision: decided.current_revision,
            current_collection_revision: decided.current_collection_revision,
        },
    }
}

/// Which findings of a scan a page holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Empty: every status.
    pub statuses: Vec<FindingStatus>,
    /// Empty: every severity.
    pub severities: Vec<Severity>,
}

/// A page of a scan's findings, bound to the collection revision it was read at.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Page {
    pub scan_state: String,
    pub collection_revision: i32,
    pub findings: Vec<Finding>,
    /// The `after` of the next page; `None` on the last.
    pub next_after: Option<String>,
}

/// A page of up to `limit` (1..=[`PAGE_MAX`]) findings of the scan after the finding key
/// `after` (`""` from the start), in one statement; `None`: no such scan.
pub async fn page(
    pool: &PgPool,
    organization_id: Option<Uuid>,
    scan_id: Uuid,
    filter: &Filter,
    after: &str,
    limit: i64,
) -> Result<Option<Page>, StoreError> {
    #[derive(sqlx::FromRow)]
    struct Row {
        scan_state: String,
        collection_revision: i32,
        #[sqlx(flatten)]
        finding: OptionalFinding,
    }
    let limit = limit.clamp(1, PAGE_MAX);
    let statuses: Option<Vec<&str>> = (!filter.statuses.is_empty()).then(|| {
        filter
            .statuses
            .iter()
            .map(|status| status.as_str())
            .collect()
    });
    let severities: Option<Vec<&str>> = (!filter.severities.is_empty()).then(|| {
        filter
            .severities
            .iter()
            .map(|severity| severity.as_str())
            .collect()
    });
    let rows: Vec<Row> = sql::findings::Page {
        scan_id,
        organization_id,
        statuses,
        severities,
        after_finding_key: after,
        limit,
    }
    .query_as()
    .fetch_all(pool)
    .await?;
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    let (scan_state, collection_revision) = (first.scan_state.clone(), first.collection_revision);
    let findings: Vec<Finding> = rows
        .into_iter()
        .filter_map(|row| row.finding.into_finding())
        .collect();
    let next_after = (findings.len() as i64 == limit)
        .then(|| findings.last().map(|finding| finding.finding_key.clone()))
        .flatten();
    Ok(Some(Page {
        scan_state,
        collection_revision,
        findings,
        next_after,
    }))
}

/// A finding's columns from a `LEFT JOIN`: all `None` when the page was empty.
#[derive(sqlx::FromRow)]
struct OptionalFinding {
    id: Option<Uuid>,
    finding_key: Option<String>,
    plugin: Option<String>,
    rule_id: Option<String>,
    resource: Option<String>,
    discriminator: Option<String>,
    severity: Option<String>,
    title: Option<String>,
    description: Option<String>,
    evidence: Option<String>,
    cve_ids: Option<Vec<String>>,
    cve_data: Option<serde_json::Value>,
    status: Option<String>,
    status_reason: Option<String>,
    revision: Option<i32>,
    reviewed_by: Option<String>,
    reviewed_at: Option<DateTime<Utc>>,
    created_at: Option<DateTime<Utc>>,
    updated_at: Option<DateTime<Utc>>,
}

impl OptionalFinding {
    fn into_finding(self) -> Option<Finding> {
        Some(Finding {
            id: self.id?,
            finding_key: self.finding_key?,
            plugin: self.plugin?,
            rule_id: self.rule_id?,
            resource: self.resource?,
            discriminator: self.discriminator?,
            severity: self.severity?,
            title: self.title?,
            description: self.description?,
            evidence: self.evidence?,
            cve_ids: self.cve_ids?,
            cve_data: self.cve_data,
            status: self.status?,
            status_reason: self.status_reason?,
            revision: self.revision?,
            reviewed_by: self.reviewed_by?,
            reviewed_at: self.reviewed_at,
            created_at: self.created_at?,
            updated_at: self.updated_at?,
        })
    }
}

/// One change in a finding's history.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct HistoryEntry {
    pub action: String,
    pub revision: i32,
    pub from_status: String,
    pub to_status: String,
    pub reason: String,
    pub actor: String,
    pub changed_at: DateTime<Utc>,
}

/// The same finding key in a scan of the same target.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct Occurrence {
    pub id: Uuid,
    pub scan_id: Uuid,
    pub status: String,
    pub revision: i32,
    pub scan_state: String,
    pub scanned_at: DateTime<Utc>,
}

/// A finding with its history and its occurrences.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Detail {
    pub scan_id: Uuid,
    pub collection_revision: i32,
    #[serde(flatten)]
    pub finding: Finding,
    pub history: Vec<HistoryEntry>,
    pub occurrences: Vec<Occurrence>,
}

/// One finding, its history (oldest first) and its occurrences in the target's scans
/// (newest first, this one included); `None`: no such finding.
pub async fn show(
    pool: &PgPool,
    organization_id: Option<Uuid>,
    finding_id: Uuid,
) -> Result<Option<Detail>, StoreError> {
    #[derive(sqlx::FromRow)]
    struct Row {
        scan_id: Uuid,
        organization_id: Uuid,
        target_id: Uuid,
        collection_revision: i32,
        #[sqlx(flatten)]
        finding: Finding,
    }
    let row: Option<Row> = sql::findings::ShowOne {
        finding_id,
        organization_id,
    }
    .query_as()
    .fetch_optional(pool)
    .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let history = sql::finding_history::OfFinding { finding_id }
        .query_as()
        .fetch_all(pool)
        .await?;
    let occurrences = sql::findings::Occurrences {
        organization_id: row.organization_id,
        finding_key: &row.finding.finding_key,
        target_id: row.target_id,
        limit: OCCURRENCES_MAX,
    }
    .query_as()
    .fetch_all(pool)
    .await?;
    Ok(Some(Detail {
        scan_id: row.scan_id,
        collection_revision: row.collection_revision,
        finding: row.finding,
        history,
        occurrences,
    }))
}

/// A scan's finding summary and gate: different answers (the evidence guide) — the scan's
/// state (did it end, and how), whether it is complete (every plugin completed with its
/// evidence published), whether its required coverage is complete (every required rule
/// evaluated, none in error: [`crate::coverage`]), and whether the gate passes (both complete,
/// and no finding counted toward the gate at or above the threshold). Dispositions change
/// what the findings count, never the coverage.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    pub scan_state: String,
    pub collection_revision: i32,
    pub complete: bool,
    pub plugins: i64,
    pub plugins_complete: i64,
    /// Findings by status, and by severity.
    pub by_status: BTreeMap<String, i64>,
    pub by_severity: BTreeMap<String, i64>,
    /// The gate's count (`open` and `needs_review`) by severity.
    pub gate_counted: BTreeMap<String, i64>,
    /// Shown but not counted (`gate_exempt`, `accepted_risk`), and suppressed.
    pub gate_exempt: i64,
    pub suppressed: i64,
    pub threshold: String,
    /// Counted findings at or above the threshold.
    pub blocking: i64,
    pub coverage: CoverageSummary,
    pub gate_passed: bool,
    /// Why the gate does not pass, in a sentence naming each reason; `None` when it passes.
    pub gate_refusal: Option<String>,
}

/// Adds the findings counted by (status, severity) to `summary`: by status, by severity, and
/// toward the gate at `threshold`, shown or suppressed as each disposition says.
fn count_findings(
    summary: &mut Summary,
    counts: Vec<(String, String, i64)>,
    threshold: Severity,
) -> Result<(), StoreError> {
    for (status_text, severity_text, n) in counts {
        *summary.by_status.entry(status_text.clone()).or_default() += n;
        *summary
            .by_severity
            .entry(severity_text.clone())
            .or_default() += n;
        let status = FindingStatus::parse(&status_text)
            .ok_or_else(|| StoreError::Corrupt(format!("finding status {status_text:?}")))?;
        let severity = Severity::parse(&severity_text)
            .ok_or_else(|| StoreError::Corrupt(format!("finding severity {severity_text:?}")))?;
        if status.counts_toward_gate() {
            *summary.gate_counted.entry(severity_text).or_default() += n;
            if severity >= threshold {
                summary.blocking += n;
            }
        } else if status.suppresses() {
            summary.suppressed += n;
        } else {
            summary.gate_exempt += n;
        }
    }
    Ok(())
}

/// Why `summary`'s gate does not pass: each reason, joined; `None` when it passes.
fn gate_refusal(summary: &Summary) -> Option<String> {
    let mut reasons = Vec::new();
    if !summary.complete {
        reasons.push(format!(
            "the scan is incomplete ({}, {} of {} plugins complete)",
            summary.scan_state, summary.plugins_complete, summary.plugins
        ));
    }
    if let Some(coverage) = summary.coverage.refusal() {
        reasons.push(coverage);
    }
    if summary.blocking > 0 {
        reasons.push(format!(
            "{} blocking finding(s) at or above {}",
            summary.blocking, summary.threshold
        ));
    }
    (!reasons.is_empty()).then(|| reasons.join("; "))
}

/// The scan's summary and its gate at `threshold`, from one snapshot; `None`: no such scan.
pub async fn summary(
    pool: &PgPool,
    organization_id: Option<Uuid>,
    scan_id: Uuid,
    threshold: Severity,
) -> Result<Option<Summary>, StoreError> {
    #[derive(sqlx::FromRow)]
    struct Row {
        state: String,
        findings_revision: i32,
        plugins: i64,
        plugins_complete: i64,
        counts: serde_json::Value,
    }
    // One snapshot for the findings and the coverage.
    let mut tx = pool.begin().await?;
    sql::query(sql::database::READ_ONE_SNAPSHOT)
        .execute(&mut *tx)
        .await?;
    let row: Option<Row> = sql::scans::FindingSummary {
        scan_id,
        organization_id,
        completed_job_state: ScanJobState::Completed.as_str(),
    }
    .query_as()
    .fetch_optional(&mut *tx)
    .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let coverage = crate::coverage::summaries(&mut tx, organization_id, &[scan_id])
        .await?
        .remove(&scan_id)
        .ok_or_else(|| StoreError::Corrupt(format!("scan {scan_id} vanished in a snapshot")))?;
    tx.commit().await?;
    let counts: Vec<(String, String, i64)> = serde_json::from_value(row.counts)
        .map_err(|error| StoreError::Corrupt(format!("finding counts: {error}")))?;
    let mut summary = Summary {
        complete: row.state == ScanState::Completed.as_str()
            && row.plugins > 0
            && row.plugins_complete == row.plugins,
        scan_state: row.state,
        collection_revision: row.findings_revision,
        plugins: row.plugins,
        plugins_complete: row.plugins_complete,
        by_status: BTreeMap::new(),
        by_severity: BTreeMap::new(),
        gate_counted: BTreeMap::new(),
        gate_exempt: 0,
        suppressed: 0,
        threshold: threshold.as_str().to_owned(),
        blocking: 0,
        coverage,
        gate_passed: false,
        gate_refusal: None,
    };
    count_findings(&mut summary, counts, threshold)?;
    summary.gate_refusal = gate_refusal(&summary);
    summary.gate_passed = summary.gate_refusal.is_none();
    Ok(Some(summary))
}
