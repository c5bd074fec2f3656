//! `dependency_audit`: known-vulnerable packages in lockfiles, by a local OSV advisory
//! database. The target is `file:///path` or an absolute path: a lockfile (`Cargo.lock`,
//! `package-lock.json`, `npm-shrinkwrap.json`), or a directory searched for them (not inside
//! `node_modules`, `target` or `.git`). The database is the directory `PALISADE_OSV_DIR` names
//! ([`crate::PluginSettings::osv_dir`]); without one every task fails, permanently. It is
//! indexed at the first task and re-indexed when a file of it changes ([`osv::Database`]), so
//! a task reads only the advisories naming its packages.
//!
//! Each vulnerable package version is one finding per advisory: its `rule_id` the advisory id,
//! its resource the lockfile, its discriminator `{ecosystem}:{name}@{version}`, so the finding
//! key is stable over (lockfile, ecosystem, package, version, advisory). Its `cve_ids` are the
//! advisory's CVE ids, which enrichment looks up.
//!
//! Its rule ids come from the advisory database, so the one rule it declares ([`RULES`]) is
//! `dependency-audit-truncated`, on the target: PASS when every vulnerable package version
//! found is reported, FAIL after the informational finding (on the target) that says
//! [`FINDINGS_MAX`] stopped the audit. Each (advisory, lockfile) with findings also reads FAIL,
//! after them, naming the first: shown in the scan's coverage, not required by a declaration.
//!
//! All files are read and checked before the first finding is sent: a malformed lockfile or
//! advisory fails the task without findings. Bounded: at most [`LOCKFILES_MAX`] lockfiles,
//! [`DIRECTORY_ENTRIES_MAX`] directory entries searched, [`FINDINGS_MAX`] findings, and the
//! limits of [`lockfile`] and [`osv`].

pub mod lockfile;
pub mod osv;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use walkdir::WalkDir;
use worker::{BoxFuture, Plugin, PluginError, ResultSink, Rule, TaskInput, v1};

use lockfile::{Ecosystem, Lockfile, LockfileError, LockfileKind};
use osv::{Advisory, DatabaseError};

/// Lockfiles audited per task: a monorepo has tens, not hundreds.
pub const LOCKFILES_MAX: usize = 256;
/// Entries looked at while searching a directory for lockfiles.
pub const DIRECTORY_ENTRIES_MAX: usize = 100_000;
/// Findings reported per task; more mean a lockfile too outdated to list finding by finding.
pub const FINDINGS_MAX: usize = 10_000;
/// The severity of an advisory that rates itself nowhere: a known vulnerability, neither hidden
/// as `info` nor raised without cause.
pub const SEVERITY_UNRATED: &str = "medium";
/// A finding's title shows at most this many characters of the advisory's summary.
const TITLE_CHARS_MAX: usize = 200;
/// A finding's description shows at most this many characters of the advisory's details.
const DETAILS_CHARS_MAX: usize = 4_000;
/// The rule of the informational finding that says [`FINDINGS_MAX`] stopped the audit.
pub const TRUNCATED_RULE_ID: &str = "dependency-audit-truncated";
/// What it declares: whether the audit reported everything it found, on the target.
pub const RULES: [Rule; 1] = [Rule {
    id: TRUNCATED_RULE_ID,
    applies_to: &[messages::TARGET_RESOURCE_KIND],
}];
/// Directories a lockfile search does not enter: installed packages, build output, history.
const SKIPPED_DIRECTORIES: [&str; 3] = ["node_modules", "target", ".git"];

pub struct DependencyAudit {
    /// Indexed at the first task, re-indexed when a file of it changes.
    database: Option<Arc<osv::Database>>,
}

impl DependencyAudit {
    /// The plugin, matching against the OSV database in `osv_dir` (or failing every task when
    /// there is none).
    pub fn new(osv_dir: Option<PathBuf>) -> Self {
        Self {
            database: osv_dir.map(|directory| Arc::new(osv::Database::new(directory))),
        }
    }
}

impl Plugin for DependencyAudit {
    fn name(&self) -> &'static str {
        "dependency_audit"
    }

    fn rules(&self) -> &'static [Rule] {
        &RULES
    }

    fn run<'a>(
        &'a self,
        task: TaskInput,
        sink: ResultSink,
        cancel: CancellationToken,
    ) -> BoxFuture<'a, Result<String, PluginError>> {
        Box::pin(async move {
            let root = crate::target::local_path(&task.target)?;
            let database = self.database.clone().ok_or_else(|| {
                PluginError::permanent(
                    "advisory_database_missing",
                    "this worker has no advisory database: set PALISADE_OSV_DIR to a directory of OSV JSON advisories and restart it",
                )
            })?;
            let target = task.target.clone();
            let report = crate::target::run_blocking("audit", &cancel, move |cancel| {
                audit(&root, &target, &database, cancel)
            })
            .await?;
            let summary = report.summary();
            let evaluations = report.evaluations(&task.target);
            for finding in report.findings {
                sink.finding(finding).await?;
            }
            for evaluation in evaluations {
                sink.evaluation(evaluation).await?;
            }
            Ok(summary)
        })
    }
}

/// What one audit found.
#[derive(Debug, Default, PartialEq)]
struct Report {
    findings: Vec<v1::Finding>,
    n_lockfiles: usize,
    n_packages: usize,
    n_advisories: usize,
    /// [`FINDINGS_MAX`] stopped the audit; an informational finding says so.
    truncated: bool,
}

impl Report {
    /// FAIL for each (advisory, lockfile) found, and `dependency-audit-truncated` on `target`.
    fn evaluations(&self, target: &str) -> Vec<v1::Evaluation> {
        let mut evaluations = crate::coverage::failed(&self.findings);
        if !self.truncated {
            evaluations.push(
                v1::Evaluation::pass(TRUNCATED_RULE_ID, target).with_evidence(format!(
                    "{} lockfiles, {} packages",
                    self.n_lockfiles, self.n_packages
                )),
            );
        }
        evaluations
    }

    fn summary(&self) -> String {
        let n_vulnerable = self.findings.len() - usize::from(self.truncated);
        format!(
            "{n_vulnerable} advisories on package versions in {} lockfiles ({} packages, {} advisories that name them){}",
            self.n_lockfiles,
            self.n_packages,
            self.n_advisories,
            if self.truncated {
                ", stopped at a limit"
            } else {
                ""
            }
        )
    }
}

/// Reads the lockfiles under `root` (which the target `target` names) and the advisories
/// naming their packages, and matches them. Blocking: runs on the blocking pool.
fn audit(
    root: &Path,
    target: &str,
    database: &osv::Database,
    cancel: &CancellationToken,
) -> Result<Report, PluginError> {
    let lockfiles = read_lockfiles(root, cancel)?;
    let names: BTreeSet<(Ecosystem, String)> = lockfiles
        .iter()
        .flat_map(|lockfile| &lockfile.packages)
        .map(|package| (package.ecosystem, package.name.clone()))
        .collect();
    let advisories = if names.is_empty() {
        vec![]
    } else {
        database.load(&names, cancel).map_err(database_error)?
    };
    let mut report = Report {
        n_lockfiles: lockfiles.len(),
        n_packages: lockfiles
            .iter()
            .map(|lockfile| lockfile.packages.len())
            .sum(),
        n_advisories: advisories.len(),
        ..Report::default()
    };
    'lockfiles: for lockfile in &lockfiles {
        for finding in findings(lockfile, &advisories) {
            if report.findings.len() == FINDINGS_MAX {
                report.truncated = true;
                break 'lockfiles;
            }
            report.findings.push(finding);
        }
    }
    if report.truncated {
        report.findings.push(v1::Finding {
            rule_id: TRUNCATED_RULE_ID.into(),
            resource: target.to_owned(),
            severity: "info".into(),
            title: "Dependency audit stopped at a limit".into(),
            description: format!(
                "The audit reports at most {FINDINGS_MAX} findings; some vulnerable packages are not listed."
            ),
            ..Default::default()
        });
    }
    Ok(report)
}

/// The lockfile `root` is, or the lockfiles in the directory `root`, read, in path order
/// (also the `sbom` plugin's input). Blocking.
pub fn read_lockfiles(
    root: &Path,
    cancel: &CancellationToken,
) -> Result<Vec<Lockfile>, PluginError> {
    find_lockfiles(root, cancel)?
        .iter()
        .map(|path| lockfile::read(path))
        .collect::<Result<Vec<_>, _>>()
        .map_err(lockfile_error)
}

/// The lockfile `root` is, or the lockfiles in the directory `root`, in path order.
fn find_lockfiles(root: &Path, cancel: &CancellationToken) -> Result<Vec<PathBuf>, PluginError> {
    if !root.is_dir() {
        if LockfileKind::of(root).is_none() {
            return Err(PluginError::permanent(
                "unsupported_target",
                format!(
                    "{} is not a lockfile dependency_audit reads (Cargo.lock, package-lock.json, npm-shrinkwrap.json) nor a directory",
                    root.display()
                ),
            ));
        }
        return Ok(vec![root.to_owned()]);
    }
    let walk = WalkDir::new(root)
        .follow_links(false)
        .sort_by_file_name()
        .into_iter()
        .filter_entry(|entry| {
            !(entry.depth() > 0
                && entry.file_type().is_dir()
                && SKIPPED_DIRECTORIES
                    .iter()
                    .any(|skipped| entry.file_name() == *skipped))
        });
    let mut found = vec![];
    for (index, entry) in walk.enumerate() {
        if cancel.is_cancelled() {
            return Err(PluginError::retryable("cancelled", "cancelled"));
        }
        if index == DIRECTORY_ENTRIES_MAX {
            return Err(PluginError::permanent(
                "target_too_large",
                format!(
                    "{} holds more than {DIRECTORY_ENTRIES_MAX} entries outside node_modules, target and .git: name a lockfile or a smaller directory",
                    root.display()
                ),
            ));
        }
        let entry = match entry {
            Ok(entry) => entry,
            Err(error) => {
                tracing::debug!(error = %telemetry::chain(&error), "unreadable entry skipped");
                continue;
            }
        };
        if entry.file_type().is_file() && LockfileKind::of(entry.path()).is_some() {
            if found.len() == LOCKFILES_MAX {
                return Err(PluginError::permanent(
                    "target_too_large",
                    format!(
                        "{} holds more than {LOCKFILES_MAX} lockfiles: name a smaller directory",
                        root.display()
                    ),
                ));
            }
            found.push(entry.into_path());
        }
    }
    Ok(found)
}

/// One finding per package version of `lockfile` and advisory affecting it, in package order,
/// then advisory order.
fn findings(lockfile: &Lockfile, advisories: &[Advisory]) -> Vec<v1::Finding> {
    let mut findings = vec![];
    for package in &lockfile.packages {
        for advisory in advisories {
            let Some(hit) = advisory.affects(package) else {
                continue;
            };
            let summary = advisory
                .summary
                .as_deref()
                .or_else(|| advisory.details.as_deref()?.lines().next())
                .map(str::trim)
                .filter(|summary| !summary.is_empty())
                .unwrap_or("known vulnerability");
            let remedy = match &hit.fixed {
                Some(fixed) => format!("fixed in {fixed}"),
                None => "no fixed version is known".to_owned(),
            };
            let details = advisory.details.as_deref().unwrap_or_default();
            findings.push(v1::Finding {
                rule_id: advisory.id.clone(),
                resource: lockfile.path.display().to_string(),
                discriminator: format!(
                    "{}:{}@{}",
                    package.ecosystem.osv_name(),
                    package.name,
                    package.version
                ),
                severity: advisory.palisade_severity().into(),
                title: text(
                    &format!("{} {}: {summary}", package.name, package.version),
                    TITLE_CHARS_MAX,
                ),
                description: text(
                    &format!(
                        "{} affects {} {} ({}); {remedy}. Upgrade it, or the package that depends on it.\n\n{details}",
                        advisory.id,
                        package.name,
                        package.version,
                        package.ecosystem.osv_name()
                    ),
                    DETAILS_CHARS_MAX,
                ),
                evidence: format!(
                    "{} pins {} {}; {} {remedy}",
                    lockfile.path.display(),
                    package.name,
                    package.version,
                    advisory.id
                ),
                cve_ids: advisory.cve_ids(),
            });
        }
    }
    findings
}

/// `text` without NUL characters (ingestion refuses them) and cut to `chars_max` characters.
fn text(text: &str, chars_max: usize) -> String {
    text.chars()
        .filter(|c| *c != '\0')
        .take(chars_max)
        .collect::<String>()
        .trim_end()
        .to_owned()
}

fn lockfile_error(error: LockfileError) -> PluginError {
    PluginError::permanent("invalid_lockfile", telemetry::chain(&error).to_string())
}

fn database_error(error: DatabaseError) -> PluginError {
    match error {
        DatabaseError::Cancelled => PluginError::retryable("cancelled", "cancelled"),
        // A database being replaced under the worker may read again; the rest needs an operator.
        DatabaseError::Read { .. } | DatabaseError::Walk { .. } => PluginError::retryable(
            "advisory_database_unreadable",
            telemetry::chain(&error).to_string(),
        ),
        _ => PluginError::permanent(
            "invalid_advisory",
            format!(
                "{}; fix or remove it in PALISADE_OSV_DIR",
                telemetry::chain(&error)
            ),
        ),
    }
}

#[cfg(test)]
mod tests;
