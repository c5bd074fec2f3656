//! A local advisory database in the OSV format (<https://ossf.github.io/osv-schema/>): a
//! directory of JSON files, one advisory each, as the RustSec and GitHub advisory exports are
//! laid out, and whether an advisory affects a package version.
//!
//! Versions are compared as semantic versions, which crates.io and npm versions are. A version
//! that does not parse as one matches only an advisory's explicit `versions` list, and a range
//! with an event that does not parse is skipped: neither panics nor guesses.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use walkdir::WalkDir;

use super::lockfile::{Ecosystem, Package};

/// Advisory files read per task: the GitHub advisory database holds about a quarter of this.
pub const ADVISORY_FILES_MAX: usize = 1_000_000;
/// Larger advisory files are refused: real ones are a few KiB, the largest a few hundred.
pub const ADVISORY_BYTES_MAX: u64 = 4 * 1024 * 1024;
/// CVE ids taken from one advisory's aliases.
pub const CVE_IDS_MAX: usize = 32;
/// Directories of an advisory database that hold no advisories.
const SKIPPED_DIRECTORIES: [&str; 1] = [".git"];

/// An OSV advisory, with the fields matching and findings use.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Advisory {
    pub id: String,
    pub summary: Option<String>,
    pub details: Option<String>,
    pub aliases: Option<Vec<String>>,
    /// When set, the advisory was withdrawn and affects nothing.
    pub withdrawn: Option<String>,
    pub severity: Option<Vec<Severity>>,
    #[serde(default)]
    pub affected: Vec<Affected>,
    pub database_specific: Option<serde_json::Value>,
}

/// A severity score: for `CVSS_V3` and `CVSS_V4`, a vector string.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Severity {
    #[serde(rename = "type")]
    pub kind: String,
    pub score: String,
}

/// The versions of one package an advisory affects.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Affected {
    pub package: Option<AffectedPackage>,
    #[serde(default)]
    pub ranges: Vec<Range>,
    #[serde(default)]
    pub versions: Vec<String>,
    pub database_specific: Option<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct AffectedPackage {
    pub ecosystem: String,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Range {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub events: Vec<Event>,
}

/// One event of a range: exactly one field is set in a valid advisory.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Event {
    pub introduced: Option<String>,
    pub fixed: Option<String>,
    pub last_affected: Option<String>,
}

/// How a version relates to an advisory: affected, with the first fixed version above it if
/// the advisory names one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    pub fixed: Option<String>,
}

/// Why the advisory database could not be read.
#[derive(Debug, thiserror::Error)]
pub enum DatabaseError {
    #[error("advisory database {path}: cannot read it: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("advisory database {path}: cannot walk it: {source}")]
    Walk {
        path: PathBuf,
        #[source]
        source: walkdir::Error,
    },
    #[error("advisory {path}: {bytes} bytes is over the {ADVISORY_BYTES_MAX}-byte limit")]
    TooLarge { path: PathBuf, bytes: u64 },
    #[error("advisory {path}: not an OSV advisory: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("advisory {path}: id {id:?} is empty, over {max} bytes or holds control characters")]
    InvalidId {
        path: PathBuf,
        id: String,
        max: usize,
    },
    #[error("advisory database {path}: more than {ADVISORY_FILES_MAX} files")]
    TooManyFiles { path: PathBuf },
    #[error("the advisory database read was cancelled")]
    Cancelled,
}

/// One file of a database as surveyed: its path, size and modification time.
type Stamp = (PathBuf, u64, Option<std::time::SystemTime>);

/// An advisory database directory, indexed once and re-indexed only when a file changed.
///
/// Every task surveys the directory (a walk and a `stat` per file: recursively, `*.json`,
/// `.git` skipped, symbolic links inside it not followed). While the survey is the one the
/// index was built from (same paths, sizes and modification times), the index says which files
/// name the task's packages, and only those are read again. Otherwise every file is parsed to
/// rebuild the index, so one malformed advisory fails the read whatever it names.
#[derive(Debug)]
pub struct Database {
    directory: PathBuf,
    index: std::sync::Mutex<Option<std::sync::Arc<Index>>>,
    /// Advisory files parsed so far, for the tests.
    parsed: std::sync::atomic::AtomicUsize,
}

#[derive(Debug)]
struct Index {
    survey: Vec<Stamp>,
    /// Each package named by a non-withdrawn advisory, and the files that name it.
    files: std::collections::HashMap<(Ecosystem, String), Vec<PathBuf>>,
}

impl Database {
    pub fn new(directory: PathBuf) -> Self {
        Self {
            directory,
            index: std::sync::Mutex::new(None),
            parsed: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Advisory files parsed since this database was opened.
    pub fn files_parsed(&self) -> usize {
        self.parsed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The advisories, not withdrawn, that name one of `packages`, in path order.
    pub fn load(
        &self,
        packages: &BTreeSet<(Ecosystem, String)>,
        cancel: &CancellationToken,
    ) -> Result<Vec<Advisory>, DatabaseError> {
        let survey = survey(&self.directory, cancel)?;
        let current = self
            .index
            .lock()
            .expect("not poisoned")
            .clone()
            .filter(|index| index.survey == survey);
        let index = match current {
            Some(index) => index,
            None => {
                let index = std::sync::Arc::new(self.build(survey, cancel)?);
                *self.index.lock().expect("not poisoned") = Some(index.clone());
                index
            }
        };
        let paths: BTreeSet<&PathBuf> = packages
            .iter()
            .filter_map(|package| index.files.get(package))
            .flatten()
            .collect();
        let mut advisories = Vec::with_capacity(paths.len());
        for path in paths {
            let advisory = self.read(path)?;
            if advisory.withdrawn.is_none() && advisory.names_any(packages) {
                advisories.push(advisory);
            }
        }
        Ok(advisories)
    }

    fn build(
        &self,
        survey: Vec<Stamp>,
        cancel: &CancellationToken,
    ) -> Result<Index, DatabaseError> {
        let mut files: std::collections::HashMap<(Ecosystem, String), Vec<PathBuf>> =
            std::collections::HashMap::new();
        for (path, _, _) in &survey {
            if cancel.is_cancelled() {
                return Err(DatabaseError::Cancelled);
            }
            let advisory = self.read(path)?;
            if advisory.withdrawn.is_some() {
                continue;
            }
            for package in advisory.named() {
                let named = files.entry(package).or_default();
                if named.last() != Some(path) {
                    named.push(path.clone());
                }
            }
        }
        Ok(Index { survey, files })
    }

    fn read(&self, path: &Path) -> Result<Advisory, DatabaseError> {
        self.parsed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        read(path)
    }
}

/// The database's `*.json` files with their sizes and modification times, in path order.
fn survey(directory: &Path, cancel: &CancellationToken) -> Result<Vec<Stamp>, DatabaseError> {
    let walk = WalkDir::new(directory)
        .follow_links(false)
        .sort_by_file_name()
        .into_iter()
        .filter_entry(|entry| {
            !(entry.file_type().is_dir()
                && SKIPPED_DIRECTORIES
                    .iter()
                    .any(|skipped| entry.file_name() == *skipped))
        });
    let mut survey = Vec::new();
    for entry in walk {
        if cancel.is_cancelled() {
            return Err(DatabaseError::Cancelled);
        }
        let entry = entry.map_err(|source| DatabaseError::Walk {
            path: directory.to_owned(),
            source,
        })?;
        let is_json = entry.path().extension().is_some_and(|ext| ext == "json");
        if !entry.file_type().is_file() || !is_json {
            continue;
        }
        if survey.len() == ADVISORY_FILES_MAX {
            return Err(DatabaseError::TooManyFiles {
                path: directory.to_owned(),
            });
        }
        let metadata = entry.metadata().map_err(|source| DatabaseError::Walk {
            path: entry.path().to_owned(),
            source,
        })?;
        survey.push((
            entry.path().to_owned(),
            metadata.len(),
            metadata.modified().ok(),
        ));
    }
    Ok(survey)
}

/// Reads and checks one advisory file.
pub fn read(path: &Path) -> Result<Advisory, DatabaseError> {
    let read_error = |source| DatabaseError::Read {
        path: path.to_owned(),
        source,
    };
    let bytes = std::fs::metadata(path).map_err(read_error)?.len();
    if bytes > ADVISORY_BYTES_MAX {
        return Err(DatabaseError::TooLarge {
            path: path.to_owned(),
            bytes,
        });
    }
    let text = std::fs::read_to_string(path).map_err(read_error)?;
    parse(path, &text)
}

/// Parses one advisory; `path` only names it in errors.
pub fn parse(path: &Path, text: &str) -> Result<Advisory, DatabaseError> {
    let advisory: Advisory = serde_json::from_str(text).map_err(|source| DatabaseError::Json {
        path: path.to_owned(),
        source,
    })?;
    // The id becomes the finding's `rule_id`, which ingestion bounds.
    let max = messages::limits::IDENTIFIER_BYTES_MAX;
    if advisory.id.is_empty()
        || advisory.id.len() > max
        || advisory.id.chars().any(char::is_control)
    {
        return Err(DatabaseError::InvalidId {
            path: path.to_owned(),
            id: advisory.id,
            max,
        });
    }
    Ok(advisory)
}

impl Advisory {
    /// Whether the advisory affects `package`, and if so the first fixed version above it.
    /// A withdrawn advisory affects nothing.
    pub fn affects(&self, package: &Package) -> Option<Hit> {
        if self.withdrawn.is_some() {
            return None;
        }
        let version = semver::Version::parse(&package.version).ok();
        let mut hit: Option<Hit> = None;
        for affected in self.affected.iter().filter(|affected| {
            affected.package.as_ref().is_some_and(|named| {
                named.ecosystem == package.ecosystem.osv_name() && named.name == package.name
            })
        }) {
            let listed = affected.versions.contains(&package.version);
            let in_range = version
                .as_ref()
                .and_then(|version| affected.range_hit(version));
            match (listed, in_range) {
                (_, Some(range_hit)) => {
                    hit = Some(Hit {
                        fixed: lowest(hit.and_then(|hit| hit.fixed), range_hit.fixed),
                    });
                }
                (true, None) => hit = Some(hit.unwrap_or(Hit { fixed: None })),
                (false, None) => {}
            }
        }
        hit
    }

    /// The advisory's id and aliases that are CVE ids, each once, in order.
    pub fn cve_ids(&self) -> Vec<String> {
        let mut cve_ids: Vec<String> = vec![];
        let aliases = self.aliases.iter().flatten();
        for id in std::iter::once(&self.id).chain(aliases) {
            if messages::validate::is_cve_id(id) && !cve_ids.contains(id) {
                cve_ids.push(id.clone());
            }
            if cve_ids.len() == CVE_IDS_MAX {
                break;
            }
        }
        cve_ids
    }

    /// palisade's severity for this advisory: its database's rating (`database_specific.severity`,
    /// as the GitHub database gives it), else the highest CVSS v3 or v4 rating, else `info` for
    /// an informational advisory (RustSec's `unmaintained`, `unsound`), else
    /// [`super::SEVERITY_UNRATED`].
    pub fn palisade_severity(&self) -> &'static str {
        let rated = self
            .database_specific
            .as_ref()
            .and_then(|specific| specific.get("severity")?.as_str())
            .and_then(|rating| match rating.to_ascii_lowercase().as_str() {
                "low" => Some("low"),
                "moderate" | "medium" => Some("medium"),
                "high" => Some("high"),
                "critical" => Some("critical"),
                _ => None,
            });
        if let Some(severity) = rated {
            return severity;
        }
        let cvss = self
            .severity
            .iter()
            .flatten()
            .filter(|score| score.kind.starts_with("CVSS_V"))
            .filter_map(|score| score.score.parse::<cvss::Cvss>().ok())
            .map(|cvss| cvss.severity())
            .max();
        if let Some(severity) = cvss {
            return match severity {
                cvss::Severity::None => "info",
                cvss::Severity::Low => "low",
                cvss::Severity::Medium => "medium",
                cvss::Severity::High => "high",
                cvss::Severity::Critical => "critical",
            };
        }
        let informational = self.affected.iter().any(|affected| {
            affected
                .database_specific
                .as_ref()
                .and_then(|specific| specific.get("informational"))
                .is_some_and(|informational| informational.is_string())
        });
        if informational {
            "info"
        } else {
            super::SEVERITY_UNRATED
        }
    }

    fn names_any(&self, packages: &BTreeSet<(Ecosystem, String)>) -> bool {
        self.named()
            .iter()
            .any(|package| packages.contains(package))
    }

    /// The packages of the ecosystems palisade reads that the advisory names.
    fn named(&self) -> Vec<(Ecosystem, String)> {
        self.affected
            .iter()
            .filter_map(|affected| affected.package.as_ref())
            .filter_map(|named| {
                [Ecosystem::CratesIo, Ecosystem::Npm]
                    .into_iter()
                    .find(|ecosystem| ecosystem.osv_name() == named.ecosystem)
                    .map(|ecosystem| (ecosystem, named.name.clone()))
            })
            .collect()
    }
}

impl Affected {
    /// The hit of the first `SEMVER` or `ECOSYSTEM` range that contains `version`.
    fn range_hit(&self, version: &semver::Version) -> Option<Hit> {
        self.ranges
            .iter()
            .filter(|range| matches!(range.kind.as_str(), "SEMVER" | "ECOSYSTEM"))
            .find_map(|range| range.hit(version))
    }
}

/// An event's version: `introduced: "0"` is before every version.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Point {
    Zero,
    At(semver::Version),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EventKind {
    Introduced,
    Fixed,
    LastAffected,
}

impl Range {
    /// Whether `version` lies in the range, by OSV's evaluation: the events sorted by version,
    /// `introduced` opens an affected interval, `fixed` closes it before its version and
    /// `last_affected` after its version. `None` also when an event does not parse.
    fn hit(&self, version: &semver::Version) -> Option<Hit> {
        let mut events = Vec::with_capacity(self.events.len());
        for event in &self.events {
            let (kind, text) = match (&event.introduced, &event.fixed, &event.last_affected) {
                (Some(text), None, None) => (EventKind::Introduced, text),
                (None, Some(text), None) => (EventKind::Fixed, text),
                (None, None, Some(text)) => (EventKind::LastAffected, text),
                // `limit` (git ranges only) and malformed events.
                _ => continue,
            };
            let point = if kind == EventKind::Introduced && text == "0" {
                Point::Zero
            } else {
                Point::At(semver::Version::parse(text).ok()?)
            };
            events.push((point, kind, text));
        }
        events.sort_by(|left, right| left.0.cmp(&right.0));
        let here = Point::At(version.clone());
        let mut affected = false;
        for (point, kind, _) in &events {
            match kind {
                EventKind::Introduced if *point <= here => affected = true,
                EventKind::Fixed if *point <= here => affected = false,
                EventKind::LastAffected if *point < here => affected = false,
                _ => {}
            }
        }
        if !affected {
            return None;
        }
        let fixed = events
            .iter()
            .find(|(point, kind, _)| *kind == EventKind::Fixed && *point > here)
            .map(|(_, _, text)| (*text).clone());
        Some(Hit { fixed })
    }
}

/// The lower of two fixed versions, by semver where both parse.
fn lowest(left: Option<String>, right: Option<String>) -> Option<String> {
    match (left, right) {
        (Some(left), Some(right)) => {
            let parsed = (
                semver::Version::parse(&left),
                semver::Version::parse(&right),
            );
            match parsed {
                (Ok(l), Ok(r)) if r < l => Some(right),
                _ => Some(left),
            }
        }
        (left, right) => left.or(right),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crate_version(name: &str, version: &str) -> Package {
        Package {
            ecosystem: Ecosystem::CratesIo,
            name: name.into(),
            version: version.into(),
        }
    }

    fn advisory(json: serde_json::Value) -> Advisory {
        parse(Path::new("/db/a.json"), &json.to_string()).unwrap()
    }

    fn ranged(events: serde_json::Value) -> Advisory {
        advisory(serde_json::json!({
            "id": "RUSTSEC-2099-0100",
            "affected": [{
                "package": {"ecosystem": "crates.io", "name": "demo"},
                "ranges": [{"type": "SEMVER", "events": events}],
            }],
        }))
    }

    fn affected(advisory: &Advisory, version: &str) -> Option<Option<String>> {
        advisory
            .affects(&crate_version("demo", version))
            .map(|hit| hit.fixed)
    }

    #[test]
    fn introduced_and_fixed_bound_a_half_open_interval() {
        let advisory = ranged(serde_json::json!([{"introduced": "0"}, {"fixed": "1.2.0"}]));
        assert_eq!(affected(&advisory, "0.1.0"), Some(Some("1.2.0".into())));
        assert_eq!(affected(&advisory, "1.1.9"), Some(Some("1.2.0".into())));
        assert_eq!(
            affected(&advisory, "1.2.0-rc.1"),
            Some(Some("1.2.0".into()))
        );
        assert_eq!(
            affected(&advisory, "1.2.0"),
            None,
            "the fixed version is safe"
        );
        assert_eq!(affected(&advisory, "2.0.0"), None);
    }

    #[test]
    fn several_intervals_in_one_range() {
        // Affected in 1.x below 1.4.2 and in 2.x below 2.0.3, as a backported fix reads.
        let advisory = ranged(serde_json::json!([
            {"introduced": "2.0.0"}, {"fixed": "2.0.3"},
            {"introduced": "1.0.0"}, {"fixed": "1.4.2"},
        ]));
        assert_eq!(affected(&advisory, "0.9.0"), None);
        assert_eq!(affected(&advisory, "1.4.1"), Some(Some("1.4.2".into())));
        assert_eq!(affected(&advisory, "1.5.0"), None);
        assert_eq!(affected(&advisory, "2.0.2"), Some(Some("2.0.3".into())));
        assert_eq!(affected(&advisory, "2.0.3"), None);
    }

    #[test]
    fn last_affected_includes_its_version() {
        let advisory =
            ranged(serde_json::json!([{"introduced": "1.0.0"}, {"last_affected": "1.3.0"}]));
        assert_eq!(affected(&advisory, "1.3.0"), Some(None));
        assert_eq!(affected(&advisory, "1.3.1"), None);
        assert_eq!(affected(&advisory, "0.9.0"), None);
    }

    #[test]
    fn an_open_range_affects_every_later_version() {
        let advisory = ranged(serde_json::json!([{"introduced": "0.0.0-0"}]));
        assert_eq!(affected(&advisory, "0.0.1"), Some(None));
        assert_eq!(affected(&advisory, "99.0.0"), Some(None));
    }

    #[test]
    fn explicit_versions_match_exactly_even_when_not_semver() {
        let advisory = advisory(serde_json::json!({
            "id": "GHSA-aaaa-bbbb-cccc",
            "affected": [{
                "package": {"ecosystem": "crates.io", "name": "demo"},
                "versions": ["1.0.0", "1.0"],
            }],
        }));
        assert_eq!(affected(&advisory, "1.0.0"), Some(None));
        assert_eq!(
            affected(&advisory, "1.0"),
            Some(None),
            "not semver, but listed"
        );
        assert_eq!(affected(&advisory, "1.0.1"), None);
    }

    #[test]
    fn unparsable_versions_fall_back_to_the_list_without_panicking() {
        let advisory = ranged(serde_json::json!([{"introduced": "0"}, {"fixed": "2.0.0"}]));
        assert_eq!(affected(&advisory, "1.0"), None, "not semver, not listed");
        assert_eq!(affected(&advisory, "latest"), None);
        let bad_event = ranged(serde_json::json!([{"introduced": "1.x"}, {"fixed": "2.0.0"}]));
        assert_eq!(
            affected(&bad_event, "1.5.0"),
            None,
            "a range that does not parse is skipped"
        );
    }

    #[test]
    fn only_its_package_and_ecosystem_and_range_types_match() {
        let advisory = ranged(serde_json::json!([{"introduced": "0"}]));
        assert!(advisory.affects(&crate_version("other", "1.0.0")).is_none());
        let npm = Package {
            ecosystem: Ecosystem::Npm,
            ..crate_version("demo", "1.0.0")
        };
        assert!(advisory.affects(&npm).is_none());
        let git = advisory_with_range_type("GIT");
        assert!(git.affects(&crate_version("demo", "1.0.0")).is_none());
        let ecosystem = advisory_with_range_type("ECOSYSTEM");
        assert!(ecosystem.affects(&crate_version("demo", "1.0.0")).is_some());
    }

    fn advisory_with_range_type(kind: &str) -> Advisory {
        advisory(serde_json::json!({
            "id": "GHSA-aaaa-bbbb-cccc",
            "affected": [{
                "package": {"ecosystem": "crates.io", "name": "demo"},
                "ranges": [{"type": kind, "events": [{"introduced": "0"}]}],
            }],
        }))
    }

    #[test]
    fn withdrawn_advisories_affect_nothing() {
        let mut advisory = ranged(serde_json::json!([{"introduced": "0"}]));
        advisory.withdrawn = Some("2099-01-01T00:00:00Z".into());
        assert!(advisory.affects(&crate_version("demo", "1.0.0")).is_none());
    }

    #[test]
    fn cve_ids_come_from_the_id_and_aliases() {
        let advisory = advisory(serde_json::json!({
            "id": "CVE-2099-0005",
            "aliases": ["GHSA-aaaa-bbbb-cccc", "CVE-2099-0006", "CVE-2099-0005", "cve-2099-0007", "CVE-99-1"],
        }));
        assert_eq!(advisory.cve_ids(), ["CVE-2099-0005", "CVE-2099-0006"]);
        assert!(
            advisory
                .cve_ids()
                .iter()
                .all(|id| messages::validate::is_cve_id(id))
        );
    }

    #[test]
    fn severity_from_the_database_then_cvss_then_informational() {
        let github = advisory(serde_json::json!({
            "id": "GHSA-aaaa-bbbb-cccc",
            "database_specific": {"severity": "MODERATE"},
            "severity": [{"type": "CVSS_V3", "score": "CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:H/I:H/A:H"}],
        }));
        assert_eq!(github.palisade_severity(), "medium");
        let cvss = advisory(serde_json::json!({
            "id": "RUSTSEC-2099-0001",
            "severity": [
                {"type": "CVSS_V3", "score": "CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:H/I:H/A:H"},
                {"type": "CVSS_V3", "score": "not a vector"},
            ],
        }));
        assert_eq!(cvss.palisade_severity(), "critical");
        let informational = advisory(serde_json::json!({
            "id": "RUSTSEC-2099-0002",
            "affected": [{"database_specific": {"informational": "unmaintained"}}],
        }));
        assert_eq!(informational.palisade_severity(), "info");
        let unrated = advisory(serde_json::json!({"id": "RUSTSEC-2099-0003"}));
        assert_eq!(
            unrated.palisade_severity(),
            crate::dependency_audit::SEVERITY_UNRATED
        );
    }

    #[test]
    fn malformed_advisories_are_errors_naming_the_file() {
        let path = Path::new("/db/RUSTSEC-2099-0009.json");
        for (text, expected) in [
            ("{", "not an OSV advisory"),
            ("{\"summary\": \"no id\"}", "not an OSV advisory"),
            ("{\"id\": \"X\", \"affected\": {}}", "not an OSV advisory"),
            ("{\"id\": \"\"}", "is empty"),
        ] {
            let message = parse(path, text).unwrap_err().to_string();
            assert!(message.contains(&path.display().to_string()), "{message}");
            assert!(message.contains(expected), "{message}");
        }
    }
}
