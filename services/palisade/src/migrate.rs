//! `palisade migrate` and `palisade migrate --check`: apply the pending migrations after the
//! preflight (`store::schema`) found nothing that would stop them part-way, or only say,
//! changing nothing, whether any are pending (a CI/CD gate: the exit status says it).

use serde::Serialize;
use store::DatabaseSettings;
use store::schema::{self, Plan};

use crate::exit;

/// The answer of `palisade migrate` and `palisade migrate --check`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Answer {
    pub status: State,
    /// The newest migration applied before this command (none in a fresh database).
    pub database_version: Option<i64>,
    /// The newest migration this build knows.
    pub build_version: i64,
    /// Pending (`--check`) or applied now (`migrate`), oldest first.
    pub migrations: Vec<Migration>,
}

/// What the command found, or did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Every migration this build knows is applied.
    UpToDate,
    /// `--check`: some are not.
    Pending,
    /// `migrate` applied them.
    Migrated,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Migration {
    pub version: i64,
    pub description: String,
}

impl Answer {
    fn from_plan(status: State, plan: &Plan) -> Self {
        Self {
            status,
            database_version: plan.comparison.applied_max,
            build_version: plan.comparison.expected,
            migrations: plan
                .pending
                .iter()
                .map(|pending| Migration {
                    version: pending.version,
                    description: pending.description.clone(),
                })
                .collect(),
        }
    }

    /// The answer as text, one line per migration after the first.
    pub fn text(&self) -> String {
        let database = self
            .database_version
            .map_or_else(|| "none".to_owned(), |version| version.to_string());
        let mut text = match self.status {
            State::UpToDate => {
                format!("up to date: the database is at migration {database}, as this build")
            }
            State::Pending => format!(
                "{} migration(s) pending: the database is at migration {database}, this build at {}",
                self.migrations.len(),
                self.build_version
            ),
            State::Migrated => format!(
                "migrated from {database} to {}: {} migration(s) applied",
                self.build_version,
                self.migrations.len()
            ),
        };
        for migration in &self.migrations {
            text.push_str(&format!(
                "\n{} {}",
                migration.version, migration.description
            ));
        }
        text
    }

    /// Exit 6 when migrations are pending.
    pub fn status(&self) -> anyhow::Result<()> {
        if self.status == State::Pending {
            return Err(exit::failure(
                exit::Status::Pending,
                format!(
                    "{} migration(s) pending: run `palisade migrate`",
                    self.migrations.len()
                ),
            ));
        }
        Ok(())
    }
}

/// `palisade migrate --check`: changes nothing (a database that does not exist yet has every
/// migration pending); a database this build may not migrate is refused (exit 4), as
/// `palisade migrate` would refuse it.
pub async fn check(
    settings: &DatabaseSettings,
    requirements: &schema::Requirements,
) -> anyhow::Result<Answer> {
    if !store::database_exists(&settings.url).await? {
        let known = schema::known_versions();
        return Ok(Answer {
            status: State::Pending,
            database_version: None,
            build_version: store::expected_migration_version(),
            migrations: store::MIGRATOR
                .iter()
                .filter(|migration| known.contains(&migration.version))
                .map(|migration| Migration {
                    version: migration.version,
                    description: migration.description.to_string(),
                })
                .collect(),
        });
    }
    let pool = store::connect(settings).await?;
    let plan = schema::preflight(&pool, requirements).await;
    pool.close().await;
    let plan = plan?;
    let status = if plan.pending.is_empty() {
        State::UpToDate
    } else {
        State::Pending
    };
    Ok(Answer::from_plan(status, &plan))
}

/// `palisade migrate`: creates the database if missing, then migrates after the preflight.
pub async fn apply(
    settings: &DatabaseSettings,
    requirements: &schema::Requirements,
) -> anyhow::Result<Answer> {
    store::create_database_if_missing(&settings.url).await?;
    let pool = store::connect(settings).await?;
    let plan = store::migrate_with(&pool, requirements).await;
    pool.close().await;
    let plan = plan?;
    let status = if plan.pending.is_empty() {
        State::UpToDate
    } else {
        State::Migrated
    };
    Ok(Answer::from_plan(status, &plan))
}
