//! Lockfiles read into the registry packages they pin: `Cargo.lock` (versions 1 to 4) for
//! crates.io, `package-lock.json` / `npm-shrinkwrap.json` (lockfile versions 1 to 3) for npm.
//! Workspace members, path, git and linked packages are left out: no advisory database speaks
//! of them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Larger lockfiles are refused: the largest real `package-lock.json` files are a few MiB.
pub const LOCKFILE_BYTES_MAX: u64 = 32 * 1024 * 1024;
/// Packages read per lockfile.
pub const PACKAGES_MAX: usize = 100_000;
/// npm's own limit on a package name; crates.io's (64) is lower.
pub const PACKAGE_NAME_BYTES_MAX: usize = 214;
/// Longer version strings are not versions any registry publishes.
pub const VERSION_BYTES_MAX: usize = 128;

/// The `source` of a crate from crates.io, through its git index or its sparse index.
const CRATES_IO_SOURCES: [&str; 2] = [
    "registry+https://github.com/rust-lang/crates.io-index",
    "sparse+https://index.crates.io/",
];

/// A package registry, named as OSV names its ecosystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Ecosystem {
    CratesIo,
    Npm,
}

impl Ecosystem {
    /// The OSV `package.ecosystem` of this registry.
    pub fn osv_name(self) -> &'static str {
        match self {
            Ecosystem::CratesIo => "crates.io",
            Ecosystem::Npm => "npm",
        }
    }
}

/// A kind of lockfile, known by its file name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockfileKind {
    Cargo,
    Npm,
}

impl LockfileKind {
    /// The kind of lockfile `path` is, by its file name; `None` for any other file.
    pub fn of(path: &Path) -> Option<Self> {
        match path.file_name()?.to_str()? {
            "Cargo.lock" => Some(LockfileKind::Cargo),
            "package-lock.json" | "npm-shrinkwrap.json" => Some(LockfileKind::Npm),
            _ => None,
        }
    }
}

/// One version of one registry package.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Package {
    pub ecosystem: Ecosystem,
    pub name: String,
    pub version: String,
}

/// A lockfile and the registry packages it pins, each once, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lockfile {
    pub path: PathBuf,
    pub packages: BTreeSet<Package>,
}

/// Why a lockfile could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LockfileError {
    #[error("{path}: cannot read it: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {bytes} bytes is over the {LOCKFILE_BYTES_MAX}-byte limit for a lockfile")]
    TooLarge { path: PathBuf, bytes: u64 },
    #[error(
        "{path}: not a lockfile palisade reads (Cargo.lock, package-lock.json, npm-shrinkwrap.json)"
    )]
    UnknownKind { path: PathBuf },
    #[error("{path}: not a valid Cargo.lock: {source}")]
    Toml {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("{path}: not a valid npm lockfile: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: lockfileVersion {version} is not supported (1, 2 and 3 are)")]
    UnsupportedVersion { path: PathBuf, version: u64 },
    #[error("{path}: {why}")]
    InvalidPackage { path: PathBuf, why: String },
    #[error("{path}: lists more than {PACKAGES_MAX} packages")]
    TooManyPackages { path: PathBuf },
}

/// Reads the lockfile at `path`, of the kind its file name says.
pub fn read(path: &Path) -> Result<Lockfile, LockfileError> {
    let kind = LockfileKind::of(path).ok_or_else(|| LockfileError::UnknownKind {
        path: path.to_owned(),
    })?;
    let read_error = |source| LockfileError::Read {
        path: path.to_owned(),
        source,
    };
    let bytes = std::fs::metadata(path).map_err(read_error)?.len();
    if bytes > LOCKFILE_BYTES_MAX {
        return Err(LockfileError::TooLarge {
            path: path.to_owned(),
            bytes,
        });
    }
    let text = std::fs::read_to_string(path).map_err(read_error)?;
    parse(kind, path, &text)
}

/// Parses `text` as a lockfile of `kind`; `path` only names it in errors and findings.
pub fn parse(kind: LockfileKind, path: &Path, text: &str) -> Result<Lockfile, LockfileError> {
    let packages = match kind {
        LockfileKind::Cargo => parse_cargo(path, text)?,
        LockfileKind::Npm => parse_npm(path, text)?,
    };
    Ok(Lockfile {
        path: path.to_owned(),
        packages,
    })
}

/// The `[[package]]` tables of a `Cargo.lock`; every version of the format has them.
#[derive(Debug, Deserialize)]
struct CargoLock {
    #[serde(default)]
    package: Vec<CargoPackage>,
}

#[derive(Debug, Deserialize)]
struct CargoPackage {
    name: String,
    version: String,
    /// Absent for workspace members and path dependencies.
    source: Option<String>,
}

fn parse_cargo(path: &Path, text: &str) -> Result<BTreeSet<Package>, LockfileError> {
    let lock: CargoLock = toml::from_str(text).map_err(|source| LockfileError::Toml {
        path: path.to_owned(),
        source,
    })?;
    let mut packages = Collected::new(path);
    for package in lock.package {
        let from_crates_io = package
            .source
            .as_deref()
            .is_some_and(|source| CRATES_IO_SOURCES.contains(&source));
        if from_crates_io {
            packages.add(Ecosystem::CratesIo, package.name, package.version)?;
        }
    }
    Ok(packages.into_set())
}

/// The parts of an npm lockfile that name packages: `packages` (versions 2 and 3) or the
/// `dependencies` tree (version 1; version 2 has both and `packages` wins).
#[derive(Debug, Deserialize)]
struct NpmLock {
    #[serde(rename = "lockfileVersion")]
    lockfile_version: Option<u64>,
    packages: Option<BTreeMap<String, NpmPackage>>,
    dependencies: Option<BTreeMap<String, NpmDependency>>,
}

/// An entry of `packages`, keyed by its path: `""` (the root), `node_modules/a`,
/// `node_modules/a/node_modules/@scope/b`, or a workspace member's directory.
#[derive(Debug, Deserialize)]
struct NpmPackage {
    name: Option<String>,
    version: Option<String>,
    /// A symbolic link to a workspace member or a local directory.
    #[serde(default)]
    link: bool,
}

/// An entry of a version 1 `dependencies` tree.
#[derive(Debug, Deserialize)]
struct NpmDependency {
    version: Option<String>,
    dependencies: Option<BTreeMap<String, NpmDependency>>,
}

/// The lockfile versions whose format this module reads.
const NPM_LOCKFILE_VERSIONS: std::ops::RangeInclusive<u64> = 1..=3;

fn parse_npm(path: &Path, text: &str) -> Result<BTreeSet<Package>, LockfileError> {
    let lock: NpmLock = serde_json::from_str(text).map_err(|source| LockfileError::Json {
        path: path.to_owned(),
        source,
    })?;
    // npm 5 and 6 always wrote `lockfileVersion: 1`; a file without one is read as version 1.
    let version = lock.lockfile_version.unwrap_or(1);
    if !NPM_LOCKFILE_VERSIONS.contains(&version) {
        return Err(LockfileError::UnsupportedVersion {
            path: path.to_owned(),
            version,
        });
    }
    let mut packages = Collected::new(path);
    if let Some(entries) = lock.packages {
        for (key, entry) in entries {
            // The root (`""`) and workspace members are not under `node_modules/`.
            let Some((_, name_in_path)) = key.rsplit_once("node_modules/") else {
                continue;
            };
            if entry.link {
                continue;
            }
            let Some(version) = entry.version else {
                continue;
            };
            let name = entry.name.unwrap_or_else(|| name_in_path.to_owned());
            packages.add(Ecosystem::Npm, name, version)?;
        }
        return Ok(packages.into_set());
    }
    // Version 1: a tree of nested `dependencies`, walked with an explicit stack (serde_json's
    // recursion limit already bounds its depth) and bounded by the package count.
    let mut stack: Vec<(String, NpmDependency)> =
        lock.dependencies.unwrap_or_default().into_iter().collect();
    while let Some((name, dependency)) = stack.pop() {
        if let Some(children) = dependency.dependencies {
            stack.extend(children);
        }
        let Some(version) = dependency.version else {
            continue;
        };
        // Local and git dependencies carry a specifier (`file:../lib`, `github:user/repo#ref`)
        // instead of a registry version.
        if version.contains(':') {
            continue;
        }
        packages.add(Ecosystem::Npm, name, version)?;
    }
    Ok(packages.into_set())
}

/// Packages read so far from one lockfile, each checked and counted once.
struct Collected<'a> {
    path: &'a Path,
    packages: BTreeSet<Package>,
    n_entries: usize,
}

impl<'a> Collected<'a> {
    fn new(path: &'a Path) -> Self {
        Self {
            path,
            packages: BTreeSet::new(),
            n_entries: 0,
        }
    }

    fn add(
        &mut self,
        ecosystem: Ecosystem,
        name: String,
        version: String,
    ) -> Result<(), LockfileError> {
        self.n_entries += 1;
        if self.n_entries > PACKAGES_MAX {
            return Err(LockfileError::TooManyPackages {
                path: self.path.to_owned(),
            });
        }
        let invalid = |why: String| LockfileError::InvalidPackage {
            path: self.path.to_owned(),
            why,
        };
        if !is_plain_text(&name, PACKAGE_NAME_BYTES_MAX) {
            return Err(invalid(format!(
                "package name {name:?} is empty, over {PACKAGE_NAME_BYTES_MAX} bytes or holds whitespace or control characters"
            )));
        }
        if !is_plain_text(&version, VERSION_BYTES_MAX) {
            return Err(invalid(format!(
                "package {name} has version {version:?}, which is empty, over {VERSION_BYTES_MAX} bytes or holds whitespace or control characters"
            )));
        }
        self.packages.insert(Package {
            ecosystem,
            name,
            version,
        });
        Ok(())
    }

    fn into_set(self) -> BTreeSet<Package> {
        self.packages
    }
}

/// Non-empty, at most `bytes_max` bytes, without whitespace or control characters.
fn is_plain_text(text: &str, bytes_max: usize) -> bool {
    !text.is_empty()
        && text.len() <= bytes_max
        && !text.chars().any(|c| c.is_control() || c.is_whitespace())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn testdata(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/dependency_audit")
            .join(name)
    }

    fn names(lockfile: &Lockfile) -> Vec<(Ecosystem, &str, &str)> {
        lockfile
            .packages
            .iter()
            .map(|package| {
                (
                    package.ecosystem,
                    package.name.as_str(),
                    package.version.as_str(),
                )
            })
            .collect()
    }

    #[test]
    fn cargo_lock_gives_its_crates_io_packages() {
        let lockfile = read(&testdata("rust/Cargo.lock")).unwrap();
        use Ecosystem::CratesIo;
        assert_eq!(
            names(&lockfile),
            [
                (CratesIo, "hyper", "0.14.10"),
                (CratesIo, "smallvec", "1.6.0"),
                (CratesIo, "time", "0.1.43"),
                (CratesIo, "tokio", "1.38.0"),
            ],
            "the workspace member, the path and the git dependency are left out"
        );
    }

    #[test]
    fn every_cargo_lock_version_parses() {
        // Version 1 has no `version` key and a `[metadata]` table of checksums; version 4
        // says `version = 4`. Both list `[[package]]` tables.
        let v1 = r#"
[[package]]
name = "app"
version = "0.1.0"
dependencies = ["time 0.1.43 (registry+https://github.com/rust-lang/crates.io-index)"]

[[package]]
name = "time"
version = "0.1.43"
source = "registry+https://github.com/rust-lang/crates.io-index"

[metadata]
"checksum time 0.1.43 (registry+https://github.com/rust-lang/crates.io-index)" = "ca8a50ef2360fbd1eeb0ecd46795a87a19024eb4b53c5dc916ca1fd95fe62438"
"#;
        let v4 = r#"
version = 4

[[package]]
name = "time"
version = "0.1.43"
source = "sparse+https://index.crates.io/"
checksum = "ca8a50ef2360fbd1eeb0ecd46795a87a19024eb4b53c5dc916ca1fd95fe62438"
"#;
        for text in [v1, v4] {
            let lockfile = parse(LockfileKind::Cargo, Path::new("/x/Cargo.lock"), text).unwrap();
            assert_eq!(names(&lockfile), [(Ecosystem::CratesIo, "time", "0.1.43")]);
        }
    }

    #[test]
    fn package_lock_v3_gives_nested_and_scoped_packages() {
        let lockfile = read(&testdata("web/package-lock.json")).unwrap();
        use Ecosystem::Npm;
        assert_eq!(
            names(&lockfile),
            [
                (Npm, "@example/left-pad", "1.1.0"),
                (Npm, "lodash", "4.17.20"),
                (Npm, "lodash", "4.17.21"),
                (Npm, "minimist", "1.2.5"),
                (Npm, "pkg-renamed", "2.0.0"),
            ],
            "the root, the workspace member and its link are left out; a `name` field wins over the path"
        );
    }

    #[test]
    fn package_lock_v1_walks_the_dependency_tree() {
        let lockfile = read(&testdata("legacy/package-lock.json")).unwrap();
        use Ecosystem::Npm;
        assert_eq!(
            names(&lockfile),
            [
                (Npm, "lodash", "4.17.20"),
                (Npm, "minimist", "0.0.8"),
                (Npm, "mkdirp", "0.5.1"),
            ],
            "the file: dependency is left out"
        );
    }

    #[test]
    fn package_lock_v2_reads_packages_not_the_legacy_tree() {
        // Version 2 keeps a version 1 tree for old npm releases; `packages` is the truth.
        let text = r#"{
            "lockfileVersion": 2,
            "packages": {"": {"name": "app"}, "node_modules/a": {"version": "1.0.0"}},
            "dependencies": {"a": {"version": "1.0.0"}, "stale": {"version": "9.9.9"}}
        }"#;
        let lockfile = parse(LockfileKind::Npm, Path::new("/x/package-lock.json"), text).unwrap();
        assert_eq!(names(&lockfile), [(Ecosystem::Npm, "a", "1.0.0")]);
    }

    #[test]
    fn lockfiles_are_known_by_their_file_name() {
        for (name, kind) in [
            ("Cargo.lock", Some(LockfileKind::Cargo)),
            ("package-lock.json", Some(LockfileKind::Npm)),
            ("npm-shrinkwrap.json", Some(LockfileKind::Npm)),
            ("package.json", None),
            ("yarn.lock", None),
            ("Cargo.toml", None),
        ] {
            assert_eq!(
                LockfileKind::of(&Path::new("/repo").join(name)),
                kind,
                "{name}"
            );
        }
    }

    #[test]
    fn malformed_lockfiles_are_errors_naming_the_file() {
        let cargo = Path::new("/repo/Cargo.lock");
        let npm = Path::new("/repo/package-lock.json");
        let cases: [(LockfileKind, &Path, &str, &str); 6] = [
            (
                LockfileKind::Cargo,
                cargo,
                "[[package]\nname =",
                "not a valid Cargo.lock",
            ),
            (
                LockfileKind::Cargo,
                cargo,
                "[[package]]\nname = \"x\"\n",
                "not a valid Cargo.lock",
            ),
            (
                LockfileKind::Npm,
                npm,
                "{\"lockfileVersion\": 3, \"packages\": [",
                "not a valid npm lockfile",
            ),
            (LockfileKind::Npm, npm, "[]", "not a valid npm lockfile"),
            (
                LockfileKind::Npm,
                npm,
                "{\"lockfileVersion\": 9}",
                "lockfileVersion 9 is not supported",
            ),
            (
                LockfileKind::Npm,
                npm,
                "{\"lockfileVersion\": 3, \"packages\": {\"node_modules/a\": {\"version\": \"1.0.0 evil\"}}}",
                "holds whitespace or control characters",
            ),
        ];
        for (kind, path, text, expected) in cases {
            let message = parse(kind, path, text).unwrap_err().to_string();
            assert!(
                message.starts_with(&path.display().to_string()),
                "{message}"
            );
            assert!(message.contains(expected), "{message}");
        }
        let unknown = read(Path::new("/repo/yarn.lock")).unwrap_err();
        assert!(matches!(unknown, LockfileError::UnknownKind { .. }));
    }
}
