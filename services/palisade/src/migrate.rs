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
    /// Whether palisade's NATS streams were provisioned (`migrate` with `NATS_URL` set);
    /// none for `--check`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub streams: Option<Streams>,
}

/// What `migrate` did with palisade's NATS streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Streams {
    /// `NATS_URL` not set: the services provision them when they start.
    NotChecked,
    /// Created, or updated to this build's configuration, and they fit the server.
    Provisioned,
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
            streams: None,
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
        text.push_str(match self.streams {
            None => "",
            Some(Streams::Provisioned) => "\nNATS streams: provisioned, and they fit the server",
            Some(Streams::NotChecked) => {
                "\nNATS streams: not checked (NATS_URL is not set; the services provision them when they start)"
            }
        });
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
            streams: None,
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

/// `palisade migrate` with `NATS_URL` set: creates palisade's streams, or updates them to this
/// build's configuration, as the operator (`NATS_CREDS`), so that a server that cannot hold
/// them is named now (exit 4, with the numbers and the setting), not by services that do not
/// start.
pub async fn provision_streams(common: &runtime::CommonSettings) -> anyhow::Result<Streams> {
    use anyhow::Context as _;
    if std::env::var_os("NATS_URL").is_none() {
        return Ok(Streams::NotChecked);
    }
    let bus = crate::commands::operator_bus(common)
        .await
        .context("NATS_URL is set, so `palisade migrate` provisions palisade's streams, as the operator (NATS_CREDS): connecting failed")?;
    match bus.provision(&common.streams).await {
        Ok(()) => Ok(Streams::Provisioned),
        Err(error @ bus::BusError::Provision { .. }) => Err(exit::refused(format!(
            "the database is migrated, but palisade's NATS streams are not: {error}"
        ))),
        Err(error) => Err(anyhow::Error::new(error)
            .context("the database is migrated, but palisade's NATS streams are not")),
    }
}
