//! What a database must be before palisade migrates it or runs on it: the PostgreSQL version
//! palisade needs ([`POSTGRES_MAJOR_MIN`]), the privilege migrating needs, and which schema
//! versions a build accepts (the compatibility window of rolling upgrades).
//!
//! **The compatibility window** (the one place it is decided, [`Comparison::runnable`]): a
//! build runs against a database that has every migration it knows applied. Migrations it does
//! not know (a newer build migrated) are accepted only if each is marked backward compatible,
//! with a row in `backward_compatible_migrations` written by the migration itself; any other
//! newer migration refuses the build, as a missing one does. So during a rolling upgrade
//! (migrate with the new build, then replace the replicas) the old replicas keep running, and
//! restart, beside additive migrations, and stop, naming both versions, beside a migration that
//! would break them. Migrating refuses a database holding migrations this build does not know,
//! marked or not ([`Comparison::migratable`]): an older build must never migrate a newer schema.
//!
//! The decisions are pure functions of what PostgreSQL reported, so they are tested for every
//! server version and schema state without a server of each; [`preflight`] gathers the facts in
//! two or three statements and decides before any change.

use std::collections::BTreeSet;

use thiserror::Error;

use crate::{MIGRATOR, PgPool, StoreError, sql};

/// The oldest PostgreSQL palisade runs on: migration 7 creates its trigger with
/// `CREATE OR REPLACE TRIGGER`, new in PostgreSQL 14. The migrate preflight refuses an older
/// server before any change; the documentation quotes this number (a test checks it does).
pub const POSTGRES_MAJOR_MIN: u32 = 14;

/// Migrations named in one message at most; the rest are counted.
const VERSIONS_NAMED_MAX: usize = 8;

/// Why palisade refuses to migrate a database, or to run on it. Each says what to do.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SchemaError {
    #[error(
        "PostgreSQL {found} is too old: palisade needs PostgreSQL {needed} or newer; upgrade the server (nothing was changed)"
    )]
    PostgresTooOld { found: String, needed: u32 },
    #[error(
        "role {role} may not create in schema {schema} of database {database}: as the schema's owner, run `GRANT CREATE ON SCHEMA {schema} TO {role}`, or migrate as a role that may (nothing was changed)"
    )]
    CreateNotGranted {
        role: String,
        schema: String,
        database: String,
    },
    #[error(
        "no schema on the search_path ({search_path}) of database {database} exists, so migrations have nowhere to create tables: create one, or set the search_path (nothing was changed)"
    )]
    NoSchema {
        search_path: String,
        database: String,
    },
    #[error(
        "database schema is at migration {applied}, newer than this build knows (its newest is {expected}; unknown: {unknown}): migrate with the build that applied them, or a newer one (nothing was changed)"
    )]
    NewerThanBuild {
        applied: i64,
        expected: i64,
        unknown: String,
    },
    #[error(
        "database schema is at migration {applied}, this build needs migration {expected} ({pending_count} pending: {pending}): run `palisade migrate` with this build first"
    )]
    Behind {
        /// `none` when nothing is applied.
        applied: String,
        expected: i64,
        pending_count: usize,
        pending: String,
    },
    #[error(
        "database schema is at migration {applied}, newer than this build knows (its newest is {expected}), and migration(s) {unmarked} are not marked backward compatible: run the build that applied them, or a newer one"
    )]
    Incompatible {
        applied: i64,
        expected: i64,
        unmarked: String,
    },
    #[error(
        "migration(s) {versions} failed part-way and are recorded as unsuccessful: repair the database by hand (see the migration's file), delete their rows from _sqlx_migrations, then run `palisade migrate` again"
    )]
    Failed { versions: String },
    #[error(
        "index {index} on {table} cannot be built: {offending} row(s) would make the build fail; {remedy}, then run `palisade migrate` again (nothing was changed)"
    )]
    IndexWouldFail {
        index: &'static str,
        table: &'static str,
        offending: i64,
        remedy: &'static str,
    },
}

/// What a database holds of palisade's migrations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AppliedSchema {
    /// Migrations recorded as finished.
    pub applied: BTreeSet<i64>,
    /// Migrations recorded as unsuccessful (sqlx calls the database dirty).
    pub failed: BTreeSet<i64>,
    /// Migrations marked backward compatible (`backward_compatible_migrations`).
    pub compatible: BTreeSet<i64>,
}

/// An [`AppliedSchema`] against the migrations a build knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Comparison {
    /// The newest migration applied, if any.
    pub applied_max: Option<i64>,
    /// The newest migration the build knows.
    pub expected: i64,
    /// Known, not applied: what `palisade migrate` would apply.
    pub pending: Vec<i64>,
    /// Applied, not known: a newer build migrated.
    pub unknown: Vec<i64>,
    /// Of `unknown`, those not marked backward compatible.
    pub unmarked: Vec<i64>,
    /// Recorded as unsuccessful.
    pub failed: Vec<i64>,
}

/// The versions of the migrations this build embeds.
pub fn known_versions() -> BTreeSet<i64> {
    MIGRATOR
        .iter()
        .filter(|migration| migration.migration_type.is_up_migration())
        .map(|migration| migration.version)
        .collect()
}

impl AppliedSchema {
    pub fn compare(&self, known: &BTreeSet<i64>) -> Comparison {
        let unknown: Vec<i64> = self.applied.difference(known).copied().collect();
        Comparison {
            applied_max: self.applied.last().copied(),
            expected: known.last().copied().unwrap_or(0),
            pending: known
                .iter()
                .filter(|version| !self.applied.contains(version) && !self.failed.contains(version))
                .copied()
                .collect(),
            unmarked: unknown
                .iter()
                .filter(|version| !self.compatible.contains(version))
                .copied()
                .collect(),
            unknown,
            failed: self.failed.iter().copied().collect(),
        }
    }
}

impl Comparison {
    /// Whether a build may run against this schema: every migration it knows applied and
    /// finished, and every one it does not know marked backward compatible (the window).
    pub fn runnable(&self) -> Result<(), SchemaError> {
        self.refuse_failed()?;
        if !self.pending.is_empty() {
            return Err(self.behind());
        }
        if !self.unmarked.is_empty() {
            return Err(SchemaError::Incompatible {
                applied: self.applied_max.unwrap_or_default(),
                expected: self.expected,
                unmarked: named(&self.unmarked),
            });
        }
        Ok(())
    }

    /// Whether this build may migrate the schema: nothing it does not know applied (marked or
    /// not: an older build never migrates a newer schema), and nothing failed part-way.
    pub fn migratable(&self) -> Result<(), SchemaError> {
        self.refuse_failed()?;
        if !self.unknown.is_empty() {
            return Err(SchemaError::NewerThanBuild {
                applied: self.applied_max.unwrap_or_default(),
                expected: self.expected,
                unknown: named(&self.unknown),
            });
        }
        Ok(())
    }

    /// The refusal of a schema with migrations pending.
    pub fn behind(&self) -> SchemaError {
        SchemaError::Behind {
            applied: self
                .applied_max
                .map_or_else(|| "none".to_owned(), |version| version.to_string()),
            expected: self.expected,
            pending_count: self.pending.len(),
            pending: named(&self.pending),
        }
    }

    fn refuse_failed(&self) -> Result<(), SchemaError> {
        if self.failed.is_empty() {
            Ok(())
        } else {
            Err(SchemaError::Failed {
                versions: named(&self.failed),
            })
        }
    }
}

/// `a, b, c` with at most [`VERSIONS_NAMED_MAX`] named.
fn named(versions: &[i64]) -> String {
    let mut text: Vec<String> = versions
        .iter()
        .take(VERSIONS_NAMED_MAX)
        .map(i64::to_string)
        .collect();
    if versions.len() > VERSIONS_NAMED_MAX {
        text.push(format!("and {} more", versions.len() - VERSIONS_NAMED_MAX));
    }
    text.join(", ")
}

/// The major version of a `server_version_num` (`150020` → 15, `90624` → 9).
pub fn postgres_major(server_version_num: &str) -> Option<u32> {
    let number: u32 = server_version_num.trim().parse().ok()?;
    Some(number / 10_000)
}

/// Refuses a server older than `major_min` (or whose version cannot be read).
pub fn check_postgres(
    server_version_num: &str,
    server_version: &str,
    major_min: u32,
) -> Result<(), SchemaError> {
    match postgres_major(server_version_num) {
        Some(major) if major >= major_min => Ok(()),
        _ => Err(SchemaError::PostgresTooOld {
            found: server_version.to_owned(),
            needed: major_min,
        }),
    }
}

/// What the preflight demands; [`Default`] is what palisade needs. Tests demand more to see
/// a refusal on the one server they have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Requirements {
    pub postgres_major_min: u32,
}

impl Default for Requirements {
    fn default() -> Self {
        Self {
            postgres_major_min: POSTGRES_MAJOR_MIN,
        }
    }
}

/// One migration as `palisade migrate --check` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingMigration {
    pub version: i64,
    pub description: String,
}

/// What migrating would do, decided by [`preflight`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub comparison: Comparison,
    /// The migrations to apply, oldest first.
    pub pending: Vec<PendingMigration>,
}

/// The facts [`preflight`] decides on.
#[derive(Debug, sqlx::FromRow)]
struct Facts {
    server_version_num: String,
    server_version: String,
    role_name: String,
    database_name: String,
    schema_name: Option<String>,
    search_path: String,
    may_create: bool,
    has_migrations_table: bool,
    has_compatibility_table: bool,
}

/// Checks, without changing anything, that this build may migrate the database and says what
/// it would apply: the server is new enough, nothing newer than this build (or failed
/// part-way) is applied, and, when there is anything to apply, the role may create in the
/// schema the migrations create in.
pub async fn preflight(pool: &PgPool, requirements: &Requirements) -> Result<Plan, StoreError> {
    let facts: Facts = sql::query_as(sql::database::PREFLIGHT)
        .fetch_one(pool)
        .await?;
    check_postgres(
        &facts.server_version_num,
        &facts.server_version,
        requirements.postgres_major_min,
    )?;
    let schema = read_with(pool, &facts).await?;
    let comparison = schema.compare(&known_versions());
    comparison.migratable()?;
    if !comparison.pending.is_empty() {
        let Some(schema_name) = facts.schema_name else {
            return Err(SchemaError::NoSchema {
                search_path: facts.search_path,
                database: facts.database_name,
            }
            .into());
        };
        if !facts.may_create {
            return Err(SchemaError::CreateNotGranted {
                role: facts.role_name,
                schema: schema_name,
                database: facts.database_name,
            }
            .into());
        }
    }
    let pending = MIGRATOR
        .iter()
        .filter(|migration| comparison.pending.contains(&migration.version))
        .map(|migration| PendingMigration {
            version: migration.version,
            description: migration.description.to_string(),
        })
        .collect();
    Ok(Plan {
        comparison,
        pending,
    })
}

/// What the database holds of palisade's migrations (nothing, for a fresh database).
pub async fn read(pool: &PgPool) -> Result<AppliedSchema, StoreError> {
    let facts: Facts = sql::query_as(sql::database::PREFLIGHT)
        .fetch_one(pool)
        .await?;
    read_with(pool, &facts).await
}

async fn read_with(pool: &PgPool, facts: &Facts) -> Result<AppliedSchema, StoreError> {
    let mut schema = AppliedSchema::default();
    if !facts.has_migrations_table {
        return Ok(schema);
    }
    let rows: Vec<(i64, bool)> = sql::query_as(sql::database::APPLIED_MIGRATIONS)
        .fetch_all(pool)
        .await?;
    for (version, success) in rows {
        if success {
            schema.applied.insert(version);
        } else {
            schema.failed.insert(version);
        }
    }
    if facts.has_compatibility_table {
        let marked: Vec<i64> = sql::query_scalar(sql::backward_compatible_migrations::LIST)
            .fetch_all(pool)
            .await?;
        schema.compatible = marked.into_iter().collect();
    }
    Ok(schema)
}

/// Whether this build may run against the database ([`Comparison::runnable`]); the
/// comparison, for a caller that says more when the schema is newer.
pub async fn check_runnable(pool: &PgPool) -> Result<Comparison, StoreError> {
    let comparison = read(pool).await?.compare(&known_versions());
    comparison.runnable()?;
    Ok(comparison)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(versions: &[i64]) -> BTreeSet<i64> {
        versions.iter().copied().collect()
    }

    fn schema(applied: &[i64], compatible: &[i64]) -> AppliedSchema {
        AppliedSchema {
            applied: set(applied),
            failed: BTreeSet::new(),
            compatible: set(compatible),
        }
    }

    #[test]
    fn the_server_version_decides_by_its_major() {
        assert_eq!(postgres_major("150020"), Some(15));
        assert_eq!(postgres_major("140000"), Some(14));
        assert_eq!(postgres_major("130012"), Some(13));
        assert_eq!(postgres_major("90624"), Some(9));
        assert_eq!(postgres_major("not a number"), None);
        for accepted in ["140000", "140011", "150020", "170002"] {
            assert_eq!(check_postgres(accepted, "x", POSTGRES_MAJOR_MIN), Ok(()));
        }
        for refused in ["130012", "120019", "90624", ""] {
            let error = check_postgres(refused, "13.12 (Debian)", POSTGRES_MAJOR_MIN).unwrap_err();
            let message = error.to_string();
            assert!(
                message.contains("13.12 (Debian)")
                    && message.contains(&format!("PostgreSQL {POSTGRES_MAJOR_MIN} or newer")),
                "{message}"
            );
        }
    }

    #[test]
    fn a_build_runs_on_the_schema_it_knows_and_on_newer_marked_migrations_only() {
        let known = set(&[1, 2, 3]);
        assert_eq!(schema(&[1, 2, 3], &[]).compare(&known).runnable(), Ok(()));
        // Rolling upgrade: a newer build added 4 and marked it; 5 is not marked.
        assert_eq!(
            schema(&[1, 2, 3, 4], &[4]).compare(&known).runnable(),
            Ok(())
        );
        let refused = schema(&[1, 2, 3, 4, 5], &[4]).compare(&known).runnable();
        let Err(error @ SchemaError::Incompatible { .. }) = refused else {
            panic!("{refused:?}");
        };
        let message = error.to_string();
        assert!(
            message.contains("at migration 5") && message.contains("its newest is 3"),
            "names both versions: {message}"
        );
        assert!(
            message.contains("migration(s) 5 are not marked"),
            "{message}"
        );
        // Older: 3 pending.
        let behind = schema(&[1, 2], &[]).compare(&known);
        assert_eq!(behind.pending, [3]);
        let message = behind.runnable().unwrap_err().to_string();
        assert!(
            message.contains("at migration 2") && message.contains("needs migration 3"),
            "{message}"
        );
        let fresh = schema(&[], &[]).compare(&known);
        assert_eq!(fresh.pending, [1, 2, 3]);
        assert!(
            fresh
                .runnable()
                .unwrap_err()
                .to_string()
                .contains("at migration none")
        );
        // A gap (a branch's migration merged below the newest applied) is pending too.
        assert_eq!(schema(&[1, 3], &[]).compare(&known).pending, [2]);
    }

    #[test]
    fn a_build_never_migrates_a_schema_newer_than_itself() {
        let known = set(&[1, 2, 3]);
        assert_eq!(schema(&[1, 2], &[]).compare(&known).migratable(), Ok(()));
        assert_eq!(schema(&[1, 2, 3], &[]).compare(&known).migratable(), Ok(()));
        for compatible in [&[][..], &[4]] {
            let error = schema(&[1, 2, 3, 4], compatible)
                .compare(&known)
                .migratable()
                .unwrap_err();
            assert!(
                matches!(
                    error,
                    SchemaError::NewerThanBuild {
                        applied: 4,
                        expected: 3,
                        ..
                    }
                ),
                "{error:?}"
            );
        }
    }

    #[test]
    fn a_migration_that_failed_part_way_stops_everything() {
        let known = set(&[1, 2]);
        let mut dirty = schema(&[1], &[]);
        dirty.failed.insert(2);
        let comparison = dirty.compare(&known);
        assert!(comparison.pending.is_empty(), "a failed one is not pending");
        assert!(matches!(
            comparison.runnable(),
            Err(SchemaError::Failed { .. })
        ));
        assert!(matches!(
            comparison.migratable(),
            Err(SchemaError::Failed { .. })
        ));
    }

    #[test]
    fn long_lists_are_cut() {
        let versions: Vec<i64> = (1..=10).collect();
        assert_eq!(named(&versions), "1, 2, 3, 4, 5, 6, 7, 8, and 2 more");
    }

    /// The migrations directory, read as files.
    fn migration_files() -> Vec<(i64, String)> {
        let folder = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../migrations");
        let mut files: Vec<(i64, String)> = crate::source_files(&folder, &["sql"])
            .into_iter()
            .map(|path| {
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                let version = name.split('_').next().unwrap().parse().unwrap();
                (version, std::fs::read_to_string(&path).unwrap())
            })
            .collect();
        files.sort();
        files
    }

    #[test]
    fn a_migration_marks_only_itself_backward_compatible() {
        let marker = "INSERT INTO backward_compatible_migrations";
        let mut marked = 0;
        for (version, text) in migration_files() {
            let Some((_, after)) = text.split_once(marker) else {
                continue;
            };
            let values = after
                .split_once("VALUES (")
                .map(|(_, values)| values)
                .unwrap_or_default();
            let digits: String = values.chars().take_while(char::is_ascii_digit).collect();
            assert_eq!(
                digits,
                version.to_string(),
                "migration {version} marks a version other than its own"
            );
            marked += 1;
        }
        assert!(marked >= 1, "found the migration that marks itself");
    }

    #[test]
    fn the_documentation_states_the_minimum_postgres_this_code_needs() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let stated = format!("PostgreSQL {POSTGRES_MAJOR_MIN} or newer");
        for document in ["README.md", "docs/operations.md"] {
            let text = std::fs::read_to_string(root.join(document)).unwrap();
            assert!(text.contains(&stated), "{document} does not say {stated:?}");
        }
        // Migration 7's trigger is why; a newer need must raise the constant.
        let trigger = migration_files()
            .iter()
            .any(|(_, text)| text.contains("CREATE OR REPLACE TRIGGER"));
        assert!(trigger && POSTGRES_MAJOR_MIN >= 14);
    }
}
