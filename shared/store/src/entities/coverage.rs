//! Coverage (SPEC §4.3 "Coverage", I16): what each scan checked, not only what it found.
//!
//! Plugins report evaluations (ingestion writes them with the findings, `decide::ingest`);
//! workers declare in their hello which rules each plugin checks and on which kinds of
//! resource ([`DeclaredRules`], kept on the worker row); a scan job's completion copies its
//! plugin's declaration, by the worker whose attempt completed it, onto the job
//! (`scan_jobs.required_rules`). A scan's coverage is then every required (rule, resource) pair
//! with its evaluation, UNKNOWN where there is none, and every evaluation reported beyond them.

use std::collections::BTreeMap;

use messages::v1;
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::StoreError;
use crate::evidence::redact;
use crate::sql;
use crate::states::{EvaluationStatus, ScanJobState};

/// One declared rule, as stored: its id and the resource kinds it applies to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeclaredRule {
    pub rule: String,
    pub kinds: Vec<String>,
}

/// A worker's declaration by plugin, as `workers.declared_rules` keeps it (and, for one
/// plugin, `scan_jobs.required_rules` the list).
pub type DeclaredRules = BTreeMap<String, Vec<DeclaredRule>>;

/// A hello's declarations by plugin, in the order they came (the caller checked them:
/// reference 6.3).
pub fn declared_rules(rules: &[v1::RuleDeclaration]) -> DeclaredRules {
    let mut by_plugin = DeclaredRules::new();
    for declaration in rules {
        by_plugin
            .entry(declaration.plugin.clone())
            .or_default()
            .push(DeclaredRule {
                rule: declaration.rule_id.clone(),
                kinds: declaration.resource_kinds.clone(),
            });
    }
    by_plugin
}

/// What a (rule, resource) pair reads as in a scan's coverage: an evaluation's status, or
/// [`CoverageStatus::Unknown`] where a required pair has none. Ordered as aggregation ranks
/// them: the worst first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CoverageStatus {
    Fail,
    Error,
    Unknown,
    Pass,
    NotApplicable,
}

impl CoverageStatus {
    pub const ALL: [CoverageStatus; 5] = [
        Self::Fail,
        Self::Error,
        Self::Unknown,
        Self::Pass,
        Self::NotApplicable,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fail => "fail",
            Self::Error => "error",
            Self::Unknown => "unknown",
            Self::Pass => "pass",
            Self::NotApplicable => "not_applicable",
        }
    }

    fn of(status: EvaluationStatus) -> Self {
        match status {
            EvaluationStatus::Pass => Self::Pass,
            EvaluationStatus::Fail => Self::Fail,
            EvaluationStatus::Error => Self::Error,
            EvaluationStatus::NotApplicable => Self::NotApplicable,
        }
    }

    /// The aggregate of `statuses`: FAIL > ERROR > UNKNOWN > PASS > NOT_APPLICABLE; nothing at
    /// all is UNKNOWN (nothing says anything was checked).
    pub fn aggregate(statuses: impl IntoIterator<Item = CoverageStatus>) -> Self {
        statuses.into_iter().min().unwrap_or(Self::Unknown)
    }
}

impl std::fmt::Display for CoverageStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why an entry reads unknown: a required pair nobody evaluated, or a scan job whose
/// requirements cannot be known.
pub mod unknown_reason {
    /// A rule its plugin declared, on a resource of a kind it applies to, with no evaluation.
    pub const NOT_EVALUATED: &str = "not_evaluated";
    /// The plugin's scan job did not complete (it is pending, running, failed or cancelled):
    /// what it would have checked is unknown.
    pub const JOB_NOT_COMPLETED: &str = "job_not_completed";
    /// The job completed, but its worker declared no rules for the plugin and it reported no
    /// evaluation (or a build before coverage completed it): nothing says what it checked.
    pub const NO_RULES_DECLARED: &str = "no_rules_declared";
}

/// One line of a scan's coverage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Entry {
    pub plugin: String,
    /// Empty for a job-level unknown ([`unknown_reason::JOB_NOT_COMPLETED`],
    /// [`unknown_reason::NO_RULES_DECLARED`]).
    pub rule_id: String,
    pub resource: String,
    pub status: CoverageStatus,
    pub reason_code: String,
    pub evidence: String,
    /// Whether the scan required it (a declared rule on a resource of its kinds, or a job-level
    /// unknown); an evaluation beyond the declared rules is shown and scored, not required.
    pub required: bool,
    /// For a failure: the finding it names, and that finding's disposition, if it exists.
    pub finding_id: Option<Uuid>,
    pub finding_status: Option<String>,
}

/// A scan's coverage: its entries, their counts, the aggregate status, the score, and whether
/// the required coverage is complete.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Coverage {
    pub entries: Vec<Entry>,
    pub summary: CoverageSummary,
    /// The aggregate of each resource's entries, by resource.
    pub by_resource: BTreeMap<String, CoverageStatus>,
}

/// What `scan show`, `scan gate` and `scan.completed` say of a scan's coverage.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CoverageSummary {
    /// The aggregate of every entry: FAIL > ERROR > UNKNOWN > PASS > NOT_APPLICABLE.
    pub status: CoverageStatus,
    /// Entries by status (every status present, zero or not).
    pub counts: BTreeMap<CoverageStatus, u64>,
    /// PASS over PASS + FAIL + ERROR + UNKNOWN: NOT_APPLICABLE is left out, and UNKNOWN and
    /// ERROR never count as a pass. `None` when that denominator is zero.
    pub score: Option<f64>,
    /// Required entries that are UNKNOWN or ERROR: the gate refuses while any is.
    pub required_incomplete: u64,
    /// Every required (rule, resource) pair has a PASS, FAIL or NOT_APPLICABLE evaluation.
    pub complete: bool,
}

impl CoverageSummary {
    /// The summary of `entries`.
    pub fn of(entries: &[Entry]) -> Self {
        let mut counts: BTreeMap<CoverageStatus, u64> = CoverageStatus::ALL
            .iter()
            .map(|status| (*status, 0))
            .collect();
        for entry in entries {
            *counts.entry(entry.status).or_default() += 1;
        }
        let count = |status| counts.get(&status).copied().unwrap_or(0);
        let scored = count(CoverageStatus::Pass)
            + count(CoverageStatus::Fail)
            + count(CoverageStatus::Error)
            + count(CoverageStatus::Unknown);
        let required_incomplete = entries
            .iter()
            .filter(|entry| {
                entry.required
                    && matches!(
                        entry.status,
                        CoverageStatus::Unknown | CoverageStatus::Error
                    )
            })
            .count() as u64;
        Self {
            status: CoverageStatus::aggregate(entries.iter().map(|entry| entry.status)),
            score: (scored > 0).then(|| count(CoverageStatus::Pass) as f64 / scored as f64),
            counts,
            required_incomplete,
            complete: required_incomplete == 0 && !entries.is_empty(),
        }
    }

    /// Why the required coverage is incomplete, in a sentence; `None` when it is complete.
    pub fn refusal(&self) -> Option<String> {
        if self.complete {
            return None;
        }
        if self.required_incomplete == 0 {
            return Some("coverage is empty: nothing says any rule was checked".to_owned());
        }
        Some(format!(
            "coverage incomplete: {} required rule evaluation(s) unknown or in error",
            self.required_incomplete
        ))
    }
}

/// A scan job as coverage reads it (fields in `scans/coverage_inputs.sql`'s order).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Job {
    pub plugin: String,
    pub state: String,
    /// What its completion copied from its worker's declaration; `None` before completion.
    pub required_rules: Option<Vec<DeclaredRule>>,
}

/// A stored evaluation as coverage reads it, with the finding a failure names (fields in
/// `scans/coverage_inputs.sql`'s order).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Evaluated {
    pub plugin: String,
    pub rule_id: String,
    pub resource: String,
    pub status: String,
    pub reason_code: String,
    pub evidence: String,
    pub finding_id: Option<Uuid>,
    pub finding_status: Option<String>,
}

/// A scan's coverage from its parts: every required (rule, resource) pair of each completed
/// job (its declared rules × the scan's resources of their kinds: the assets it discovered and
/// its target, `target` being [`messages::TARGET_RESOURCE_KIND`]), read from its evaluation or
/// UNKNOWN; every evaluation beyond them; and one UNKNOWN for each job whose requirements
/// cannot be known. Pure: the read is [`of_scan`].
pub fn assemble(
    target: &str,
    jobs: &[Job],
    assets: &[(String, String)],
    evaluations: Vec<Evaluated>,
) -> Result<Coverage, StoreError> {
    let target = redact(target);
    let mut resources: Vec<(&str, &str)> = assets
        .iter()
        .map(|(kind, value)| (kind.as_str(), value.as_str()))
        .collect();
    resources.push((messages::TARGET_RESOURCE_KIND, target.as_str()));
    let mut evaluated: BTreeMap<(String, String, String), Evaluated> = BTreeMap::new();
    let mut plugins_evaluated = std::collections::BTreeSet::new();
    for evaluation in evaluations {
        plugins_evaluated.insert(evaluation.plugin.clone());
        let key = (
            evaluation.plugin.clone(),
            evaluation.rule_id.clone(),
            evaluation.resource.clone(),
        );
        evaluated.insert(key, evaluation);
    }
    let mut entries = Vec::new();
    for job in jobs {
        let job_unknown = |reason: &str| unknown(&job.plugin, "", &target, reason);
        if job.state != ScanJobState::Completed.as_str() {
            entries.push(job_unknown(unknown_reason::JOB_NOT_COMPLETED));
            continue;
        }
        let rules = job.required_rules.as_deref().unwrap_or_default();
        if rules.is_empty() && !plugins_evaluated.contains(&job.plugin) {
            entries.push(job_unknown(unknown_reason::NO_RULES_DECLARED));
        }
        for rule in rules {
            for (kind, resource) in &resources {
                if !rule.kinds.iter().any(|k| k == kind) {
                    continue;
                }
                let key = (
                    job.plugin.clone(),
                    rule.rule.clone(),
                    (*resource).to_owned(),
                );
                entries.push(match evaluated.remove(&key) {
                    Some(evaluation) => entry(evaluation, true)?,
                    None => unknown(&key.0, &key.1, &key.2, unknown_reason::NOT_EVALUATED),
                });
            }
        }
    }
    for evaluation in evaluated.into_values() {
        entries.push(entry(evaluation, false)?);
    }
    Ok(Coverage::of(entries))
}

/// A required entry nobody evaluated, for `reason`.
fn unknown(plugin: &str, rule_id: &str, resource: &str, reason: &str) -> Entry {
    Entry {
        plugin: plugin.to_owned(),
        rule_id: rule_id.to_owned(),
        resource: resource.to_owned(),
        status: CoverageStatus::Unknown,
        reason_code: reason.to_owned(),
        evidence: String::new(),
        required: true,
        finding_id: None,
        finding_status: None,
    }
}

impl Coverage {
    /// `entries` sorted by (plugin, rule, resource), summarized and aggregated per resource.
    fn of(mut entries: Vec<Entry>) -> Self {
        entries.sort_by(|a, b| {
            (&a.plugin, &a.rule_id, &a.resource).cmp(&(&b.plugin, &b.rule_id, &b.resource))
        });
        let mut by_resource: BTreeMap<String, Vec<CoverageStatus>> = BTreeMap::new();
        for entry in &entries {
            by_resource
                .entry(entry.resource.clone())
                .or_default()
                .push(entry.status);
        }
        Self {
            summary: CoverageSummary::of(&entries),
            by_resource: by_resource
                .into_iter()
                .map(|(resource, statuses)| (resource, CoverageStatus::aggregate(statuses)))
                .collect(),
            entries,
        }
    }
}

fn entry(evaluation: Evaluated, required: bool) -> Result<Entry, StoreError> {
    let status = EvaluationStatus::parse(&evaluation.status)
        .ok_or_else(|| StoreError::Corrupt(format!("evaluation status {:?}", evaluation.status)))?;
    Ok(Entry {
        plugin: evaluation.plugin,
        rule_id: evaluation.rule_id,
        resource: evaluation.resource,
        status: CoverageStatus::of(status),
        reason_code: evaluation.reason_code,
        evidence: evaluation.evidence,
        required,
        finding_id: evaluation.finding_id,
        finding_status: evaluation.finding_status,
    })
}

/// A scan's coverage, read in one statement on `conn` (run it in the caller's snapshot to
/// read it beside the findings' summary): its state and coverage; `None`: no such scan (in
/// `organization_id`, when given).
pub async fn of_scan(
    conn: &mut PgConnection,
    organization_id: Option<Uuid>,
    scan_id: Uuid,
) -> Result<Option<(String, Coverage)>, StoreError> {
    Ok(read(conn, organization_id, &[scan_id], true)
        .await?
        .remove(&scan_id))
}

/// The coverage summary of each of `scan_ids` that exists (in `organization_id`, when given),
/// read in one statement on `conn` without the evaluations' evidence.
pub async fn summaries(
    conn: &mut PgConnection,
    organization_id: Option<Uuid>,
    scan_ids: &[Uuid],
) -> Result<BTreeMap<Uuid, CoverageSummary>, StoreError> {
    Ok(read(conn, organization_id, scan_ids, false)
        .await?
        .into_iter()
        .map(|(scan_id, (_, coverage))| (scan_id, coverage.summary))
        .collect())
}

/// The coverage of each of `scan_ids` that exists (in `organization_id`, when given), with its
/// state, read in one statement on `conn`; entries' evidence empty unless `with_evidence`.
async fn read(
    conn: &mut PgConnection,
    organization_id: Option<Uuid>,
    scan_ids: &[Uuid],
    with_evidence: bool,
) -> Result<BTreeMap<Uuid, (String, Coverage)>, StoreError> {
    #[derive(sqlx::FromRow)]
    struct Row {
        scan_id: Uuid,
        state: String,
        locator: String,
        jobs: serde_json::Value,
        assets: serde_json::Value,
        evaluations: serde_json::Value,
    }
    let rows: Vec<Row> = sql::scans::CoverageInputs {
        scan_ids,
        organization_id,
        with_evidence,
    }
    .query_as()
    .fetch_all(conn)
    .await?;
    let mut coverages = BTreeMap::new();
    for row in rows {
        let coverage = inputs(row.scan_id, row.jobs, row.assets, row.evaluations).and_then(
            |(jobs, assets, evaluations)| assemble(&row.locator, &jobs, &assets, evaluations),
        )?;
        coverages.insert(row.scan_id, (row.state, coverage));
    }
    Ok(coverages)
}

/// `scans/coverage_inputs.sql`'s aggregates decoded: each job and evaluation is a JSON array
/// of its fields in declaration order, which serde reads into the struct directly.
#[allow(clippy::type_complexity)]
fn inputs(
    scan_id: Uuid,
    jobs: serde_json::Value,
    assets: serde_json::Value,
    evaluations: serde_json::Value,
) -> Result<(Vec<Job>, Vec<(String, String)>, Vec<Evaluated>), StoreError> {
    let corrupt = |what: &str, error: serde_json::Error| {
        StoreError::Corrupt(format!("coverage of scan {scan_id}: {what}: {error}"))
    };
    let jobs = serde_json::from_value(jobs).map_err(|e| corrupt("jobs", e))?;
    let assets = serde_json::from_value(assets).map_err(|e| corrupt("assets", e))?;
    let evaluations = serde_json::from_value(evaluations).map_err(|e| corrupt("evaluations", e))?;
    Ok((jobs, assets, evaluations))
}

impl CoverageSummary {
    /// As `CoverageSummary` travels (reference 13).
    pub fn to_wire(&self) -> v1::CoverageSummary {
        v1::CoverageSummary {
            status: self.status.as_str().to_owned(),
            counts: self
                .counts
                .iter()
                .map(|(status, n)| {
                    (
                        status.as_str().to_owned(),
                        u32::try_from(*n).unwrap_or(u32::MAX),
                    )
                })
                .collect(),
            score: self.score,
            required_incomplete: u32::try_from(self.required_incomplete).unwrap_or(u32::MAX),
            complete: self.complete,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TARGET: &str = "https://app.test";

    fn job(plugin: &str, state: ScanJobState, rules: &[(&str, &[&str])]) -> Job {
        Job {
            plugin: plugin.into(),
            state: state.as_str().into(),
            required_rules: (state == ScanJobState::Completed).then(|| {
                rules
                    .iter()
                    .map(|(rule, kinds)| DeclaredRule {
                        rule: (*rule).into(),
                        kinds: kinds.iter().map(|k| (*k).into()).collect(),
                    })
                    .collect()
            }),
        }
    }

    fn evaluated(plugin: &str, rule: &str, resource: &str, status: EvaluationStatus) -> Evaluated {
        Evaluated {
            plugin: plugin.into(),
            rule_id: rule.into(),
            resource: resource.into(),
            status: status.as_str().into(),
            reason_code: if status.needs_reason() { "why" } else { "" }.into(),
            evidence: String::new(),
            finding_id: None,
            finding_status: None,
        }
    }

    fn status_of(coverage: &Coverage, rule: &str, resource: &str) -> (CoverageStatus, bool) {
        let entry = coverage
            .entries
            .iter()
            .find(|e| e.rule_id == rule && e.resource == resource)
            .unwrap_or_else(|| panic!("no entry for {rule} on {resource}: {coverage:?}"));
        (entry.status, entry.required)
    }

    #[test]
    fn aggregation_ranks_fail_error_unknown_pass_not_applicable() {
        use CoverageStatus::*;
        assert_eq!(CoverageStatus::aggregate([Pass, NotApplicable]), Pass);
        assert_eq!(
            CoverageStatus::aggregate([Pass, Unknown, NotApplicable]),
            Unknown
        );
        assert_eq!(CoverageStatus::aggregate([Unknown, Error, Pass]), Error);
        assert_eq!(CoverageStatus::aggregate([Error, Fail, Unknown]), Fail);
        assert_eq!(CoverageStatus::aggregate([NotApplicable]), NotApplicable);
        assert_eq!(CoverageStatus::aggregate([]), Unknown);
    }

    /// I16: UNKNOWN and ERROR never count as a pass; NOT_APPLICABLE is out of the score.
    #[test]
    fn the_score_counts_unknown_and_error_against_and_leaves_not_applicable_out() {
        use EvaluationStatus::*;
        let jobs = [job(
            "p",
            ScanJobState::Completed,
            &[
                ("a", &["target"]),
                ("b", &["target"]),
                ("c", &["target"]),
                ("d", &["target"]),
                ("e", &["target"]),
            ],
        )];
        let evaluations = vec![
            evaluated("p", "a", TARGET, Pass),
            evaluated("p", "b", TARGET, Error),
            evaluated("p", "c", TARGET, NotApplicable),
            evaluated("p", "d", TARGET, Pass),
            // "e" is required and never evaluated: unknown.
        ];
        let coverage = assemble(TARGET, &jobs, &[], evaluations).unwrap();
        assert_eq!(
            status_of(&coverage, "e", TARGET),
            (CoverageStatus::Unknown, true)
        );
        let summary = &coverage.summary;
        assert_eq!(summary.score, Some(2.0 / 4.0), "{summary:?}");
        assert_eq!(summary.required_incomplete, 2);
        assert!(!summary.complete);
        assert_eq!(summary.status, CoverageStatus::Error);
        assert!(summary.refusal().unwrap().contains("2 required"));
    }

    #[test]
    fn a_rule_is_required_on_every_resource_of_its_kinds() {
        use EvaluationStatus::*;
        let jobs = [job(
            "web",
            ScanJobState::Completed,
            &[
                ("hsts", &["http_service"]),
                ("reach", &["target", "tcp_service"]),
            ],
        )];
        let assets = vec![
            ("http_service".to_owned(), "http://a:80".to_owned()),
            ("http_service".to_owned(), "http://b:80".to_owned()),
            ("tcp_service".to_owned(), "a:22".to_owned()),
        ];
        let evaluations = vec![
            evaluated("web", "hsts", "http://a:80", Fail),
            evaluated("web", "reach", TARGET, Pass),
            evaluated("web", "reach", "a:22", Pass),
            // Not declared: shown and scored, never required.
            evaluated("web", "extra", "http://a:80", Error),
        ];
        let coverage = assemble(TARGET, &jobs, &assets, evaluations).unwrap();
        assert_eq!(
            status_of(&coverage, "hsts", "http://a:80"),
            (CoverageStatus::Fail, true)
        );
        assert_eq!(
            status_of(&coverage, "hsts", "http://b:80"),
            (CoverageStatus::Unknown, true)
        );
        assert_eq!(
            status_of(&coverage, "extra", "http://a:80"),
            (CoverageStatus::Error, false)
        );
        assert_eq!(
            coverage.entries.len(),
            5,
            "hsts ×2, reach ×2, extra: {coverage:?}"
        );
        assert_eq!(coverage.summary.required_incomplete, 1, "only hsts on b");
        assert_eq!(coverage.by_resource["http://a:80"], CoverageStatus::Fail);
        assert_eq!(coverage.by_resource["a:22"], CoverageStatus::Pass);
        // With b evaluated, the required coverage is complete though a failure stands and an
        // undeclared rule errs.
        let mut evaluations = vec![evaluated("web", "hsts", "http://b:80", NotApplicable)];
        evaluations.extend([
            evaluated("web", "hsts", "http://a:80", Fail),
            evaluated("web", "reach", TARGET, Pass),
            evaluated("web", "reach", "a:22", Pass),
        ]);
        let coverage = assemble(TARGET, &jobs, &assets, evaluations).unwrap();
        assert!(coverage.summary.complete, "{coverage:?}");
        assert_eq!(coverage.summary.status, CoverageStatus::Fail);
    }

    #[test]
    fn a_job_that_did_not_complete_or_declared_nothing_reads_unknown() {
        use EvaluationStatus::*;
        let jobs = [
            job("done", ScanJobState::Completed, &[("a", &["target"])]),
            job("failed", ScanJobState::Failed, &[]),
            job("silent", ScanJobState::Completed, &[]),
            job("undeclared", ScanJobState::Completed, &[]),
        ];
        let evaluations = vec![
            evaluated("done", "a", TARGET, Pass),
            // A failed job's evaluations are shown, its coverage still unknown.
            evaluated("failed", "x", TARGET, Pass),
            // Declared nothing but evaluated: what it reported is its coverage.
            evaluated("undeclared", "y", TARGET, Pass),
        ];
        let coverage = assemble(TARGET, &jobs, &[], evaluations).unwrap();
        let reasons: Vec<(&str, &str)> = coverage
            .entries
            .iter()
            .filter(|e| e.status == CoverageStatus::Unknown)
            .map(|e| (e.plugin.as_str(), e.reason_code.as_str()))
            .collect();
        assert_eq!(
            reasons,
            [
                ("failed", unknown_reason::JOB_NOT_COMPLETED),
                ("silent", unknown_reason::NO_RULES_DECLARED)
            ]
        );
        assert_eq!(coverage.summary.required_incomplete, 2);
        assert!(!coverage.summary.complete);
    }

    #[test]
    fn nothing_checked_is_not_complete() {
        let coverage = assemble(TARGET, &[], &[], Vec::new()).unwrap();
        assert!(!coverage.summary.complete);
        assert_eq!(coverage.summary.score, None);
        assert!(coverage.summary.refusal().is_some());
    }

    #[test]
    fn a_target_with_a_secret_is_matched_as_evaluations_store_it() {
        let target = "https://user:hunter2hunter2@app.test/?token=AKIAABCDEFGHIJKLMNOP";
        let redacted = redact(target);
        assert_ne!(
            redacted, target,
            "the test needs a target redaction changes"
        );
        let jobs = [job("p", ScanJobState::Completed, &[("a", &["target"])])];
        let evaluations = vec![evaluated("p", "a", &redacted, EvaluationStatus::Pass)];
        let coverage = assemble(target, &jobs, &[], evaluations).unwrap();
        assert!(coverage.summary.complete, "{coverage:?}");
    }
}

/// A finding as a diff lists it: which of the two scans holds it (by id) and what it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiffFinding {
    pub finding_key: String,
    pub plugin: String,
    pub rule_id: String,
    pub resource: String,
    pub severity: String,
    pub title: String,
    /// In the base scan, when it is there.
    pub base_finding_id: Option<Uuid>,
    /// In the later scan, when it is there; its own disposition, never the base's.
    pub finding_id: Option<Uuid>,
    pub status: String,
}

/// What changed between two scans of one target (`palisade scan diff`, the `diff` query):
/// every finding of either in exactly one class.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Diff {
    pub target: String,
    /// The later scan ended completed: only then can a finding be no longer seen.
    pub scan_complete: bool,
    /// In the later scan only.
    pub new: Vec<DiffFinding>,
    /// In both (the later scan's disposition, not inherited).
    pub still_present: Vec<DiffFinding>,
    /// In the base only, and the later, completed scan evaluated its rule on its resource as
    /// PASS.
    pub no_longer_seen: Vec<DiffFinding>,
    /// In the base only, and nothing says it was fixed: the later scan did not complete, or did
    /// not evaluate the rule there, or its evaluation was not a pass.
    pub unknown: Vec<DiffFinding>,
}

/// Why two scans cannot be compared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiffRefusal {
    /// Either scan is missing (in the organization, when one is given).
    NotFound,
    /// They scan different targets.
    OtherTargets,
    /// The later one was admitted first.
    NotLater,
}

/// A finding as `findings/diff_inputs.sql` aggregates it: key, plugin, rule, resource,
/// severity, title, id, disposition.
type FindingRow = (String, String, String, String, String, String, Uuid, String);

/// Every finding of `base` and `later` in one class; `fixed` says whether the later scan
/// passed a (plugin, rule, resource) and ended completed.
fn classify(
    target: String,
    base: Vec<FindingRow>,
    later: Vec<FindingRow>,
    fixed: impl Fn(&str, &str, &str) -> bool,
    scan_complete: bool,
) -> Diff {
    let as_diff = |row: FindingRow, base_finding_id: Option<Uuid>, finding_id: Option<Uuid>| {
        let (finding_key, plugin, rule_id, resource, severity, title, _, status) = row;
        DiffFinding {
            finding_key,
            plugin,
            rule_id,
            resource,
            severity,
            title,
            base_finding_id,
            finding_id,
            status,
        }
    };
    let base_ids: BTreeMap<String, Uuid> = base.iter().map(|f| (f.0.clone(), f.6)).collect();
    let later_keys: std::collections::HashSet<String> = later.iter().map(|f| f.0.clone()).collect();
    let mut diff = Diff {
        target,
        scan_complete,
        new: Vec::new(),
        still_present: Vec::new(),
        no_longer_seen: Vec::new(),
        unknown: Vec::new(),
    };
    for finding in later {
        let id = finding.6;
        match base_ids.get(&finding.0).copied() {
            Some(base_id) => diff
                .still_present
                .push(as_diff(finding, Some(base_id), Some(id))),
            None => diff.new.push(as_diff(finding, None, Some(id))),
        }
    }
    for finding in base.into_iter().filter(|f| !later_keys.contains(&f.0)) {
        let no_longer_seen = fixed(&finding.1, &finding.2, &finding.3);
        let id = finding.6;
        let entry = as_diff(finding, Some(id), None);
        if no_longer_seen {
            diff.no_longer_seen.push(entry);
        } else {
            diff.unknown.push(entry);
        }
    }
    diff
}

/// [`Diff`] of `base_scan_id` and the later `scan_id`, of one target, read in one statement.
pub async fn diff(
    conn: &mut PgConnection,
    organization_id: Option<Uuid>,
    base_scan_id: Uuid,
    scan_id: Uuid,
) -> Result<Result<Diff, DiffRefusal>, StoreError> {
    #[derive(sqlx::FromRow)]
    struct Row {
        same_target: bool,
        later: bool,
        state: String,
        locator: String,
        base_findings: serde_json::Value,
        findings: serde_json::Value,
        evaluations: serde_json::Value,
    }
    let row: Option<Row> = sql::findings::DiffInputs {
        base_scan_id,
        scan_id,
        organization_id,
    }
    .query_as()
    .fetch_optional(conn)
    .await?;
    let Some(row) = row else {
        return Ok(Err(DiffRefusal::NotFound));
    };
    if !row.same_target {
        return Ok(Err(DiffRefusal::OtherTargets));
    }
    if !row.later {
        return Ok(Err(DiffRefusal::NotLater));
    }
    let corrupt = |what: &str, error: serde_json::Error| {
        StoreError::Corrupt(format!(
            "diff of {base_scan_id} and {scan_id}: {what}: {error}"
        ))
    };
    let base: Vec<FindingRow> =
        serde_json::from_value(row.base_findings).map_err(|e| corrupt("base findings", e))?;
    let later: Vec<FindingRow> =
        serde_json::from_value(row.findings).map_err(|e| corrupt("findings", e))?;
    let evaluations: Vec<(String, String, String, String)> =
        serde_json::from_value(row.evaluations).map_err(|e| corrupt("evaluations", e))?;
    let passed: std::collections::HashSet<(String, String, String)> = evaluations
        .into_iter()
        .filter(|(_, _, _, status)| status == EvaluationStatus::Pass.as_str())
        .map(|(plugin, rule, resource, _)| (plugin, rule, resource))
        .collect();
    let scan_complete = row.state == crate::states::ScanState::Completed.as_str();
    let fixed = |plugin: &str, rule: &str, resource: &str| {
        scan_complete && passed.contains(&(plugin.to_owned(), rule.to_owned(), resource.to_owned()))
    };
    let diff = classify(redact(&row.locator), base, later, fixed, scan_complete);
    Ok(Ok(diff))
}

/// A finding of a target's latest scan with its occurrences across the target's scans.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct Occurrences {
    pub id: Uuid,
    pub finding_key: String,
    pub plugin: String,
    pub rule_id: String,
    pub resource: String,
    pub severity: String,
    pub title: String,
    /// Its own disposition, in this scan.
    pub status: String,
    pub first_seen_unix_ms: i64,
    pub last_seen_unix_ms: i64,
    /// How many of the target's scans reported it.
    pub scans: i64,
}

/// One of a target's scans, newest first.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TargetScan {
    pub id: Uuid,
    pub state: String,
    pub created_at_unix_ms: i64,
    pub coverage: CoverageSummary,
}

/// A target, its latest scans with their coverage, and the findings of the latest completed
/// one with their occurrences (`palisade target show`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TargetHistory {
    pub id: Uuid,
    pub organization_id: Uuid,
    pub locator: String,
    pub scans: Vec<TargetScan>,
    /// The latest completed scan's, if there is one.
    pub latest_completed: Option<Uuid>,
    pub findings: Vec<Occurrences>,
}

/// Each target named `locator` (in `organization_id`, when given) with its latest `scans_max`
/// scans, their coverage, and its latest completed scan's findings with their occurrences.
pub async fn target_history(
    conn: &mut PgConnection,
    organization_id: Option<Uuid>,
    locator: &str,
    scans_max: i64,
) -> Result<Vec<TargetHistory>, StoreError> {
    let rows: Vec<(Uuid, Uuid, String, serde_json::Value)> = sql::targets::History {
        locator,
        organization_id,
        scans_max,
    }
    .query_as()
    .fetch_all(&mut *conn)
    .await?;
    let mut targets = Vec::with_capacity(rows.len());
    for (id, organization_id, locator, scans) in rows {
        let scans: Vec<(Uuid, String, i64)> = serde_json::from_value(scans)
            .map_err(|error| StoreError::Corrupt(format!("scans of target {id}: {error}")))?;
        let ids: Vec<Uuid> = scans.iter().map(|scan| scan.0).collect();
        let mut coverages = summaries(conn, Some(organization_id), &ids).await?;
        let latest_completed = scans
            .iter()
            .find(|(_, state, _)| state == crate::states::ScanState::Completed.as_str())
            .map(|scan| scan.0);
        let findings = match latest_completed {
            None => Vec::new(),
            Some(scan_id) => {
                sql::findings::OccurrenceSpans { scan_id }
                    .query_as()
                    .fetch_all(&mut *conn)
                    .await?
            }
        };
        let scans = scans
            .into_iter()
            .filter_map(|(id, state, created_at_unix_ms)| {
                Some(TargetScan {
                    id,
                    state,
                    created_at_unix_ms,
                    coverage: coverages.remove(&id)?,
                })
            })
            .collect();
        targets.push(TargetHistory {
            id,
            organization_id,
            locator: redact(&locator),
            scans,
            latest_completed,
            findings,
        });
    }
    Ok(targets)
}
