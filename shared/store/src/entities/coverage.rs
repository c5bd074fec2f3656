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

/// A scan job as coverage reads it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Job {
    pub plugin: String,
    pub state: String,
    /// What its completion copied from its worker's declaration; `None` before completion.
    pub required_rules: Option<Vec<DeclaredRule>>,
}

/// A stored evaluation as coverage reads it, with the finding a failure names.
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
        let unknown = |reason: &str| Entry {
            plugin: job.plugin.clone(),
            rule_id: String::new(),
            resource: target.clone(),
            status: CoverageStatus::Unknown,
            reason_code: reason.to_owned(),
            evidence: String::new(),
            required: true,
            finding_id: None,
            finding_status: None,
        };
        if job.state != ScanJobState::Completed.as_str() {
            entries.push(unknown(unknown_reason::JOB_NOT_COMPLETED));
            continue;
        }
        let rules = job.required_rules.as_deref().unwrap_or_default();
        if rules.is_empty() && !plugins_evaluated.contains(&job.plugin) {
            entries.push(unknown(unknown_reason::NO_RULES_DECLARED));
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
                let entry = match evaluated.remove(&key) {
                    Some(evaluation) => entry(evaluation, true)?,
                    None => Entry {
                        plugin: key.0,
                        rule_id: key.1,
                        resource: key.2,
                        status: CoverageStatus::Unknown,
                        reason_code: unknown_reason::NOT_EVALUATED.to_owned(),
                        evidence: String::new(),
                        required: true,
                        finding_id: None,
                        finding_status: None,
                    },
                };
                entries.push(entry);
            }
        }
    }
    for evaluation in evaluated.into_values() {
        entries.push(entry(evaluation, false)?);
    }
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
    Ok(Coverage {
        summary: CoverageSummary::of(&entries),
        by_resource: by_resource
            .into_iter()
            .map(|(resource, statuses)| (resource, CoverageStatus::aggregate(statuses)))
            .collect(),
        entries,
    })
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
/// read it beside the findings' summary); `None`: no such scan (in `organization_id`, when
/// given).
pub async fn of_scan(
    conn: &mut PgConnection,
    organization_id: Option<Uuid>,
    scan_id: Uuid,
) -> Result<Option<(String, Coverage)>, StoreError> {
    #[derive(sqlx::FromRow)]
    struct Row {
        state: String,
        locator: String,
        jobs: serde_json::Value,
        assets: serde_json::Value,
        evaluations: serde_json::Value,
    }
    let row: Option<Row> = sql::scans::CoverageInputs {
        scan_id,
        organization_id,
    }
    .query_as()
    .fetch_optional(conn)
    .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let corrupt = |what: &str, error: serde_json::Error| {
        StoreError::Corrupt(format!("coverage of scan {scan_id}: {what}: {error}"))
    };
    let jobs: Vec<(String, String, Option<Vec<DeclaredRule>>)> =
        serde_json::from_value(row.jobs).map_err(|e| corrupt("jobs", e))?;
    let jobs: Vec<Job> = jobs
        .into_iter()
        .map(|(plugin, state, required_rules)| Job {
            plugin,
            state,
            required_rules,
        })
        .collect();
    let assets: Vec<(String, String)> =
        serde_json::from_value(row.assets).map_err(|e| corrupt("assets", e))?;
    type Row8 = (
        String,
        String,
        String,
        String,
        String,
        String,
        Option<Uuid>,
        Option<String>,
    );
    let evaluations: Vec<Row8> =
        serde_json::from_value(row.evaluations).map_err(|e| corrupt("evaluations", e))?;
    let evaluations = evaluations
        .into_iter()
        .map(
            |(
                plugin,
                rule_id,
                resource,
                status,
                reason_code,
                evidence,
                finding_id,
                finding_status,
            )| {
                Evaluated {
                    plugin,
                    rule_id,
                    resource,
                    status,
                    reason_code,
                    evidence,
                    finding_id,
                    finding_status,
                }
            },
        )
        .collect();
    let coverage = assemble(&row.locator, &jobs, &assets, evaluations)?;
    Ok(Some((row.state, coverage)))
}
