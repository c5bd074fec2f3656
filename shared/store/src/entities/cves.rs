//! The local CVE table (issue 11): CVE records from the NVD CVE API 2.0 or imported NVD JSON
//! files, the incremental sync's watermark, and the CVE data each finding is enriched with.
//!
//! Every write an enrichment job makes here names its claim ([`JobFence`]) and changes
//! nothing once a newer claim holds the job: the job's row is locked `FOR SHARE` in the
//! writing statement, so a newer claim either waits for the write to commit or the write sees
//! it and does nothing. Writing the same records again writes nothing (idempotent).

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use crate::StoreError;
use crate::sql;
use crate::states::EnrichmentJobState;

/// At most this many of a CVE's references are kept, in NVD's order.
pub const MAX_REFERENCES: usize = 32;
/// At most this many CWE ids are kept per CVE.
pub const MAX_CWE_IDS: usize = 16;
/// Descriptions are cut to this many characters.
pub const MAX_DESCRIPTION_CHARS: usize = 8_192;

/// The sync row of the NVD API (`cve_sync.source`).
pub const NVD_SYNC: &str = "nvd";

/// Where a CVE record came from (`cves.source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CveOrigin {
    /// The NVD API, by the sync or a lookup by id.
    Nvd,
    /// `palisade cve import`.
    Import,
}

impl CveOrigin {
    pub fn as_str(self) -> &'static str {
        match self {
            CveOrigin::Nvd => "nvd",
            CveOrigin::Import => "import",
        }
    }
}

/// A CVSS base score with its severity and vector.
#[derive(Debug, Clone, PartialEq)]
pub struct Cvss {
    pub score: f64,
    pub severity: String,
    pub vector: String,
}

/// One CVE as palisade keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct CveRecord {
    pub id: String,
    /// False: NVD answered that it has no such CVE.
    pub known: bool,
    pub published: Option<DateTime<Utc>>,
    pub last_modified: Option<DateTime<Utc>>,
    pub vuln_status: String,
    pub description: String,
    pub cvss_v31: Option<Cvss>,
    pub cvss_v40: Option<Cvss>,
    pub cwe_ids: Vec<String>,
    pub references: Vec<String>,
}

impl CveRecord {
    /// The record of an id NVD does not know.
    pub fn unknown(id: &str) -> Self {
        Self {
            id: id.to_owned(),
            known: false,
            published: None,
            last_modified: None,
            vuln_status: String::new(),
            description: String::new(),
            cvss_v31: None,
            cvss_v40: None,
            cwe_ids: Vec::new(),
            references: Vec::new(),
        }
    }

    /// The record in the shape `cves/upsert.sql` reads, cut to the table's bounds.
    fn row(&self) -> serde_json::Value {
        let cvss = |cvss: &Option<Cvss>| {
            cvss.as_ref().map(|cvss| {
                (
                    cvss.score,
                    cvss.severity.clone(),
                    bounded(&cvss.vector, 256),
                )
            })
        };
        let (v31_score, v31_severity, v31_vector) = split(cvss(&self.cvss_v31));
        let (v40_score, v40_severity, v40_vector) = split(cvss(&self.cvss_v40));
        serde_json::json!({
            "id": self.id,
            "known": self.known,
            "published_at": self.published.filter(storable_date).map(|at| at.to_rfc3339()),
            "last_modified_at": self
                .last_modified
                .filter(storable_date)
                .map(|at| at.to_rfc3339()),
            "vuln_status": bounded(&self.vuln_status, 64),
            "description": bounded(&self.description, MAX_DESCRIPTION_CHARS),
            "cvss_v31_score": v31_score,
            "cvss_v31_severity": v31_severity,
            "cvss_v31_vector": v31_vector,
            "cvss_v40_score": v40_score,
            "cvss_v40_severity": v40_severity,
            "cvss_v40_vector": v40_vector,
            "cwe_ids": self.cwe_ids.iter().take(MAX_CWE_IDS).collect::<Vec<_>>(),
            "reference_urls": self
                .references
                .iter()
                .take(MAX_REFERENCES)
                .map(|url| bounded(url, 2_048))
                .collect::<Vec<_>>(),
        })
    }
}

/// A date palisade stores: years 1..=9999 (PostgreSQL's range is wider, its text form not).
fn storable_date(at: &DateTime<Utc>) -> bool {
    (1..=9_999).contains(&chrono::Datelike::year(at))
}

fn split<A, B, C>(triple: Option<(A, B, C)>) -> (Option<A>, Option<B>, Option<C>) {
    match triple {
        Some((a, b, c)) => (Some(a), Some(b), Some(c)),
        None => (None, None, None),
    }
}

/// `text` cut to `chars` characters, with any NUL replaced by U+FFFD (PostgreSQL stores no
/// NUL): a record [`CveRecord::sanitise`] was not called on is still written.
fn bounded(text: &str, chars: usize) -> String {
    text.chars()
        .map(|c| if c == '\0' { '\u{FFFD}' } else { c })
        .take(chars)
        .collect()
}

pub use messages::validate::is_cve_id;

/// The claim an enrichment job's writes name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobFence {
    pub job_id: Uuid,
    pub fencing_token: i64,
}

/// What a fenced write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// The claim holds the job: this many rows were written (the rest were unchanged).
    Rows(u64),
    /// The job was lost (a newer claim holds it, or its lease lapsed): nothing was written.
    Fenced,
}

/// Writes `records` (deduplicated by id, the latest modified kept) in one statement; fenced by
/// `fence` when given (an enrichment job's write), unfenced for an operator's import.
pub async fn upsert(
    pool: &PgPool,
    fence: Option<JobFence>,
    origin: CveOrigin,
    records: &[CveRecord],
) -> Result<Written, StoreError> {
    let mut latest: HashMap<&str, &CveRecord> = HashMap::with_capacity(records.len());
    for record in records.iter().filter(|record| is_cve_id(&record.id)) {
        let keep = latest.get(record.id.as_str()).is_none_or(|kept| {
            (record.known, record.last_modified) > (kept.known, kept.last_modified)
        });
        if keep {
            latest.insert(&record.id, record);
        }
    }
    let rows = serde_json::Value::Array(latest.values().map(|record| record.row()).collect());
    let (holds, written): (bool, i64) = sql::cves::Upsert {
        job_id: fence.map(|fence| fence.job_id),
        fencing_token: fence.map(|fence| fence.fencing_token),
        running_state: EnrichmentJobState::Running.as_str(),
        records: rows,
        source: origin.as_str(),
    }
    .query_as()
    .fetch_one(pool)
    .await?;
    Ok(if holds {
        Written::Rows(written.max(0) as u64)
    } else {
        Written::Fenced
    })
}

/// Of `ids`, those to look up: absent from the table, or unknown to NVD at a check more than
/// `recheck_unknown_after` ago, and not set aside within it; sorted. Ids without a CVE id's
/// shape are never looked up.
pub async fn misses(
    pool: &PgPool,
    ids: &[String],
    recheck_unknown_after: Duration,
) -> Result<Vec<String>, StoreError> {
    let ids: Vec<&str> = ids
        .iter()
        .map(String::as_str)
        .filter(|id| is_cve_id(id))
        .collect();
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    Ok(sql::cves::Misses {
        ids: &ids,
        retry_after_seconds: crate::seconds(recheck_unknown_after),
        set_aside_action: QuarantineAction::SetAside.as_str(),
    }
    .query_scalar()
    .fetch_all(pool)
    .await?)
}

/// A sync window a job took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncTaken {
    /// Everything modified before this is in the table; `None`: never synced.
    pub synced_through: Option<DateTime<Utc>>,
    /// The database's clock when taken: the window's end.
    pub until: DateTime<Utc>,
}

/// The job `fence` takes the sync of `source` when it is due (never synced, or synced through
/// more than `interval` ago) and no other live job holds it; `None` when not taken.
pub async fn take_sync(
    pool: &PgPool,
    fence: JobFence,
    source: &str,
    interval: Duration,
) -> Result<Option<SyncTaken>, StoreError> {
    let taken: Option<(Option<DateTime<Utc>>, DateTime<Utc>)> = sql::cve_sync::Take {
        job_id: fence.job_id,
        fencing_token: fence.fencing_token,
        running_state: EnrichmentJobState::Running.as_str(),
        source,
        sync_interval_seconds: crate::seconds(interval),
    }
    .query_as()
    .fetch_optional(pool)
    .await?;
    Ok(taken.map(|(synced_through, until)| SyncTaken {
        synced_through,
        until,
    }))
}

/// The job `fence` synced `source` through `through`: the watermark moves there (never back)
/// and the job lets the sync go. `Fenced` when the claim was lost (nothing moved).
pub async fn finish_sync(
    pool: &PgPool,
    fence: JobFence,
    source: &str,
    through: DateTime<Utc>,
) -> Result<Written, StoreError> {
    let moved: Option<Option<DateTime<Utc>>> = sql::cve_sync::Finish {
        job_id: fence.job_id,
        fencing_token: fence.fencing_token,
        running_state: EnrichmentJobState::Running.as_str(),
        source,
        synced_through: through,
    }
    .query_scalar()
    .fetch_optional(pool)
    .await?;
    Ok(match moved {
        Some(_) => Written::Rows(1),
        None => Written::Fenced,
    })
}

/// What writing a scan's findings their CVE data did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FindingsWritten {
    /// `findings` CVE findings, of which `written` changed (the rest already held their data).
    Written { findings: u64, written: u64 },
    /// The job was lost: nothing was written.
    Fenced,
}

/// Writes each CVE finding of the job's scan its CVE data from the table, fenced, in one
/// statement.
pub async fn write_findings(pool: &PgPool, fence: JobFence) -> Result<FindingsWritten, StoreError> {
    let (holds, findings, written): (bool, i64, i64) = sql::findings::WriteCveData {
        job_id: fence.job_id,
        fencing_token: fence.fencing_token,
        running_state: EnrichmentJobState::Running.as_str(),
    }
    .query_as()
    .fetch_one(pool)
    .await?;
    Ok(if holds {
        FindingsWritten::Written {
            findings: findings.max(0) as u64,
            written: written.max(0) as u64,
        }
    } else {
        FindingsWritten::Fenced
    })
}

pub use crate::states::QuarantineAction;

/// An upstream record stored sanitised or set aside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quarantined {
    /// The record's CVE id, or `sha256:<hex>` of its JSON when it has no readable id.
    pub key: String,
    pub cve_id: Option<String>,
    pub action: QuarantineAction,
    /// What was wrong with it.
    pub reason: String,
}

impl CveRecord {
    /// Makes the record storable: PostgreSQL refuses a NUL in `text` and `jsonb`, so each is
    /// replaced by U+FFFD; a date outside the years 1..=9999 is dropped. `None` when nothing
    /// needed changing, else what was changed (a [`Quarantined`] entry's reason).
    pub fn sanitise(&mut self) -> Option<String> {
        let mut changed: Vec<&str> = Vec::new();
        let mut clean = |field: &'static str, text: &mut String| {
            if text.contains('\0') {
                *text = text.replace('\0', "\u{FFFD}");
                if !changed.contains(&field) {
                    changed.push(field);
                }
            }
        };
        clean("vuln_status", &mut self.vuln_status);
        clean("description", &mut self.description);
        for cvss in [&mut self.cvss_v31, &mut self.cvss_v40]
            .into_iter()
            .flatten()
        {
            clean("cvss", &mut cvss.severity);
            clean("cvss", &mut cvss.vector);
        }
        for cwe in &mut self.cwe_ids {
            clean("cwe_ids", cwe);
        }
        for url in &mut self.references {
            clean("references", url);
        }
        let mut reasons = Vec::new();
        if !changed.is_empty() {
            reasons.push(format!("NUL characters replaced in {}", changed.join(", ")));
        }
        let mut dropped = Vec::new();
        if self.published.as_ref().is_some_and(|at| !storable_date(at)) {
            self.published = None;
            dropped.push("published");
        }
        if self
            .last_modified
            .as_ref()
            .is_some_and(|at| !storable_date(at))
        {
            self.last_modified = None;
            dropped.push("lastModified");
        }
        if !dropped.is_empty() {
            reasons.push(format!(
                "{} outside the years 1-9999 dropped",
                dropped.join(", ")
            ));
        }
        (!reasons.is_empty()).then(|| reasons.join("; "))
    }
}

/// Records quarantined records (each counted again when seen before); returns those recorded
/// for the first time, for the caller to log once.
pub async fn quarantine(
    pool: &PgPool,
    origin: CveOrigin,
    records: &[Quarantined],
) -> Result<Vec<Quarantined>, StoreError> {
    if records.is_empty() {
        return Ok(Vec::new());
    }
    let mut latest: HashMap<&str, &Quarantined> = HashMap::with_capacity(records.len());
    for record in records {
        latest.insert(&record.key, record);
    }
    let rows = serde_json::Value::Array(
        latest
            .values()
            .map(|record| {
                serde_json::json!({
                    "record_key": bounded(&record.key, 128),
                    "cve_id": record.cve_id,
                    "action": record.action.as_str(),
                    "reason": bounded(&record.reason, 1_024),
                })
            })
            .collect(),
    );
    let recorded: Vec<(String, bool)> = sql::cve_quarantine::Record {
        records: rows,
        source: origin.as_str(),
    }
    .query_as()
    .fetch_all(pool)
    .await?;
    Ok(recorded
        .into_iter()
        .filter(|(_, first_seen)| *first_seen)
        .filter_map(|(key, _)| latest.get(key.as_str()).map(|record| (*record).clone()))
        .collect())
}

/// A quarantined record as `palisade cve status` lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QuarantineEntry {
    pub record_key: String,
    pub cve_id: Option<String>,
    pub action: String,
    pub reason: String,
    pub source: String,
    pub first_seen_at: DateTime<Utc>,
    pub last_seen_at: DateTime<Utc>,
    pub times_seen: i64,
}

/// The local CVE table and its sync, as `palisade cve status` shows them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CveStatus {
    pub known: i64,
    pub unknown: i64,
    pub imported: i64,
    pub synced_through: Option<DateTime<Utc>>,
    pub sync_holder_job_id: Option<Uuid>,
    pub sync_updated_at: DateTime<Utc>,
    /// Every quarantined record.
    pub quarantined: i64,
    /// The most recently seen of them.
    pub recent_quarantined: Vec<QuarantineEntry>,
}

/// The table's size, the NVD sync's watermark and the `recent` quarantined records last seen.
pub async fn status(pool: &PgPool, recent: i64) -> Result<CveStatus, StoreError> {
    type Sync = (
        i64,
        i64,
        i64,
        Option<DateTime<Utc>>,
        Option<Uuid>,
        DateTime<Utc>,
    );
    let (known, unknown, imported, synced_through, holder, updated): Sync = sql::cves::Status {
        sync_source: NVD_SYNC,
        import_origin: CveOrigin::Import.as_str(),
    }
    .query_as()
    .fetch_one(pool)
    .await?;
    type Row = (
        String,
        Option<String>,
        String,
        String,
        String,
        DateTime<Utc>,
        DateTime<Utc>,
        i64,
        i64,
    );
    let rows: Vec<Row> = sql::cve_quarantine::Recent { limit: recent }
        .query_as()
        .fetch_all(pool)
        .await?;
    let quarantined = rows.first().map_or(0, |row| row.8);
    Ok(CveStatus {
        known,
        unknown,
        imported,
        synced_through,
        sync_holder_job_id: holder,
        sync_updated_at: updated,
        quarantined,
        recent_quarantined: rows
            .into_iter()
            .map(
                |(record_key, cve_id, action, reason, source, first, last, times, _)| {
                    QuarantineEntry {
                        record_key,
                        cve_id,
                        action,
                        reason,
                        source,
                        first_seen_at: first,
                        last_seen_at: last,
                        times_seen: times,
                    }
                },
            )
            .collect(),
    })
}
