//! Coverage over the bus (issue 47): the `coverage` and `diff` queries of a `FindingsRequest`
//! (reference 6.13 and 13), within the subject's organization like every findings query. The
//! reads are `store::coverage`'s, the ones `palisade scan show` and `palisade scan diff` make.

use messages::v1;
use messages::validate::invalid;
use store::PgPool;
use store::coverage::{CoverageStatus, DiffFinding, DiffRefusal};
use uuid::Uuid;
use v1::findings_reply::Answer;

use crate::findings::{answer, chain, not_found, refuse, uuid_field};

/// Entries (or findings per diff class) when the request says 0, and at most.
pub const PAGE_DEFAULT: u32 = 100;
pub const PAGE_MAX: u32 = 500;
/// An entry's evidence on the bus is cut to this many bytes, so a page of the most entries
/// stays well under a NATS message.
pub const EVIDENCE_BYTES_MAX: usize = 1_024;

/// A `coverage` query whose fields have their documented form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoverageQuery {
    pub scan_id: Uuid,
    pub statuses: Vec<CoverageStatus>,
    /// The (plugin, rule_id, resource) the page starts after.
    pub after: Option<(String, String, String)>,
    pub limit: usize,
}

/// A `diff` query whose fields have their documented form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiffQuery {
    pub base_scan_id: Uuid,
    pub scan_id: Uuid,
    pub limit: usize,
}

fn limit(name: &str, limit: u32) -> Result<usize, v1::Error> {
    match limit {
        0 => Ok(PAGE_DEFAULT as usize),
        limit if limit <= PAGE_MAX => Ok(limit as usize),
        _ => Err(invalid(format!(
            "{name} must be 1..={PAGE_MAX} (0 for {PAGE_DEFAULT})"
        ))),
    }
}

/// Reference 6.13: `coverage.scan_id` a UUID, `statuses` among the five, `after` empty or a
/// previous page's `next_after`, `limit` 0..=500.
pub fn parse_coverage(query: v1::ScanCoverage) -> Result<CoverageQuery, v1::Error> {
    let statuses = query
        .statuses
        .iter()
        .map(|status| {
            CoverageStatus::ALL
                .into_iter()
                .find(|known| known.as_str() == status)
                .ok_or_else(|| {
                    invalid(format!(
                        "coverage.statuses: {status:?} is not one of pass, fail, error, \
                         not_applicable, unknown"
                    ))
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let after = if query.after.is_empty() {
        None
    } else {
        Some(serde_json::from_str(&query.after).map_err(|_| {
            invalid("coverage.after must be empty or a page's next_after, as it was sent")
        })?)
    };
    Ok(CoverageQuery {
        scan_id: uuid_field("coverage.scan_id", &query.scan_id)?,
        statuses,
        after,
        limit: limit("coverage.limit", query.limit)?,
    })
}

/// Reference 6.13: both ids UUIDs, `limit` 0..=500.
pub fn parse_diff(query: v1::ScanDiff) -> Result<DiffQuery, v1::Error> {
    Ok(DiffQuery {
        base_scan_id: uuid_field("diff.base_scan_id", &query.base_scan_id)?,
        scan_id: uuid_field("diff.scan_id", &query.scan_id)?,
        limit: limit("diff.limit", query.limit)?,
    })
}

fn entry(entry: &store::coverage::Entry) -> v1::CoverageEntry {
    v1::CoverageEntry {
        plugin: entry.plugin.clone(),
        rule_id: entry.rule_id.clone(),
        resource: entry.resource.clone(),
        status: entry.status.as_str().to_owned(),
        reason_code: entry.reason_code.clone(),
        evidence: {
            let mut evidence = entry.evidence.clone();
            messages::limits::truncate_at_char_boundary(&mut evidence, EVIDENCE_BYTES_MAX);
            evidence
        },
        required: entry.required,
        finding_id: entry
            .finding_id
            .map(|id| id.to_string())
            .unwrap_or_default(),
        finding_status: entry.finding_status.clone().unwrap_or_default(),
    }
}

/// One page of a scan's coverage entries, with the summary of them all.
pub async fn decide_coverage(
    pool: &PgPool,
    organization: Option<Uuid>,
    query: CoverageQuery,
) -> Result<v1::FindingsReply, String> {
    let mut conn = pool.acquire().await.map_err(|e| e.to_string())?;
    let Some((state, coverage)) = store::coverage::of_scan(&mut conn, organization, query.scan_id)
        .await
        .map_err(chain)?
    else {
        return Ok(not_found("scan"));
    };
    let key =
        |e: &store::coverage::Entry| (e.plugin.clone(), e.rule_id.clone(), e.resource.clone());
    let mut matching = coverage
        .entries
        .iter()
        .filter(|e| query.statuses.is_empty() || query.statuses.contains(&e.status))
        .filter(|e| query.after.as_ref().is_none_or(|after| key(e) > *after));
    let page: Vec<&store::coverage::Entry> = matching.by_ref().take(query.limit).collect();
    let next_after = match (matching.next(), page.last()) {
        (Some(_), Some(last)) => serde_json::to_string(&key(last)).map_err(|e| e.to_string())?,
        _ => String::new(),
    };
    Ok(answer(Answer::Coverage(v1::CoveragePage {
        scan_id: query.scan_id.to_string(),
        scan_state: state,
        summary: Some(coverage.summary.to_wire()),
        entries: page.into_iter().map(entry).collect(),
        next_after,
    })))
}

fn diff_findings(findings: &[DiffFinding], limit: usize) -> (u32, Vec<v1::DiffFinding>) {
    let listed = findings
        .iter()
        .take(limit)
        .map(|finding| v1::DiffFinding {
            finding_key: finding.finding_key.clone(),
            plugin: finding.plugin.clone(),
            rule_id: finding.rule_id.clone(),
            resource: finding.resource.clone(),
            severity: finding.severity.clone(),
            title: finding.title.clone(),
            base_finding_id: finding
                .base_finding_id
                .map(|id| id.to_string())
                .unwrap_or_default(),
            finding_id: finding
                .finding_id
                .map(|id| id.to_string())
                .unwrap_or_default(),
            status: finding.status.clone(),
        })
        .collect();
    (u32::try_from(findings.len()).unwrap_or(u32::MAX), listed)
}

/// What changed between two scans of one target.
pub async fn decide_diff(
    pool: &PgPool,
    organization: Option<Uuid>,
    query: DiffQuery,
) -> Result<v1::FindingsReply, String> {
    let mut conn = pool.acquire().await.map_err(|e| e.to_string())?;
    let diff = store::coverage::diff(&mut conn, organization, query.base_scan_id, query.scan_id)
        .await
        .map_err(chain)?;
    let diff = match diff {
        Ok(diff) => diff,
        Err(DiffRefusal::NotFound) => return Ok(not_found("scan")),
        Err(DiffRefusal::OtherTargets) => {
            return Ok(refuse(invalid(
                "diff: the two scans scan different targets; compare scans of one target",
            )));
        }
        Err(DiffRefusal::NotLater) => {
            return Ok(refuse(invalid(
                "diff: scan_id was admitted before base_scan_id; name the older scan as the base",
            )));
        }
    };
    let (new_count, new_findings) = diff_findings(&diff.new, query.limit);
    let (still_present_count, still_present) = diff_findings(&diff.still_present, query.limit);
    let (no_longer_seen_count, no_longer_seen) = diff_findings(&diff.no_longer_seen, query.limit);
    let (unknown_count, unknown) = diff_findings(&diff.unknown, query.limit);
    Ok(answer(Answer::Diff(v1::DiffResult {
        base_scan_id: query.base_scan_id.to_string(),
        scan_id: query.scan_id.to_string(),
        scan_complete: diff.scan_complete,
        new_count,
        new_findings,
        still_present_count,
        still_present,
        no_longer_seen_count,
        no_longer_seen,
        unknown_count,
        unknown,
    })))
}
