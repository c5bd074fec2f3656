//! `palisade worker`: worker identities: register one (and issue its NATS credentials), let it
//! serve an organization, revoke and re-enable it, show it.

use runtime::CommonSettings;
use uuid::Uuid;

use crate::cli_support::Why;
use crate::exit;
use crate::nats::{CredentialsArgs, issue_credentials, push_accounts};

/// `palisade worker …`.
#[derive(Debug, clap::Subcommand)]
pub enum WorkerCommand {
    /// Register a worker identity; prints its id (give it to the worker as PALISADE_WORKER_ID).
    /// With PALISADE_NATS_AUTHORITY set, also issues its NATS credentials (to --creds, or a
    /// JWT for the --public-key it generated); running it again for an --id replaces them.
    Add {
        #[arg(long)]
        name: String,
        #[arg(long, default_value_t = 4)]
        capacity: i32,
        #[arg(long)]
        id: Option<Uuid>,
        #[command(flatten)]
        credentials: CredentialsArgs,
    },
    /// Let a worker serve an organization.
    Assign {
        #[arg(long)]
        worker: Uuid,
        #[arg(long)]
        org: Uuid,
        #[command(flatten)]
        why: Why,
    },
    /// Revoke a worker (or, with --org, one assignment): no new lease from now on. Its
    /// active leases are voided and their tasks re-offered, unless --let-finish.
    Revoke {
        #[arg(long)]
        worker: Uuid,
        #[arg(long)]
        org: Option<Uuid>,
        #[arg(long)]
        let_finish: bool,
        #[arg(long, default_value = "revoked from the command line")]
        reason: String,
        /// Who (recorded with the change; default: $USER).
        #[arg(long)]
        by: Option<String>,
    },
    /// Re-enable a revoked worker (assignments are re-enabled with `worker assign`).
    Enable {
        #[arg(long)]
        worker: Uuid,
        #[command(flatten)]
        why: Why,
    },
    /// A worker: its registration, its organizations and the latest changes of its access
    /// (who and why), as JSON.
    Show {
        worker: Uuid,
        /// How many changes to show, newest first.
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(i64).range(0..=1000))]
        changes: i64,
    },
}

/// Runs one `palisade worker` command.
pub async fn run(common: &CommonSettings, command: WorkerCommand) -> anyhow::Result<()> {
    match command {
        WorkerCommand::Add {
            name,
            capacity,
            id,
            credentials,
        } => {
            let pool = store::connect(&common.database).await?;
            let id = id.unwrap_or_else(Uuid::new_v4);
            store::admin::register_worker(&pool, id, &name, capacity).await?;
            println!("{id}");
            issue_credentials(
                common,
                &pool,
                &messages::Identity::Worker { worker_id: id },
                store::bus_identities::Holder::Worker(id),
                &credentials,
            )
            .await
        }
        WorkerCommand::Assign { worker, org, why } => {
            let pool = store::connect(&common.database).await?;
            let by = crate::commands::actor(why.by);
            let change = store::audit::Change::new(&by, why.reason.trim());
            store::admin::assign_worker(&pool, org, worker, &change).await?;
            println!("worker {worker} now serves organization {org}");
            Ok(())
        }
        WorkerCommand::Revoke {
            worker,
            org,
            let_finish,
            reason,
            by,
        } => revoke(common, worker, org, let_finish, &reason, by).await,
        WorkerCommand::Enable { worker, why } => enable(common, worker, why).await,
        WorkerCommand::Show { worker, changes } => {
            let pool = store::connect(&common.database).await?;
            let shown = crate::tenants::worker(&pool, worker, changes).await?;
            println!("{}", serde_json::to_string_pretty(&shown)?);
            Ok(())
        }
    }
}

/// `palisade worker revoke`.
async fn revoke(
    common: &CommonSettings,
    worker: Uuid,
    org: Option<Uuid>,
    let_finish: bool,
    reason: &str,
    by: Option<String>,
) -> anyhow::Result<()> {
    let pool = store::connect(&common.database).await?;
    let by = crate::commands::actor(by);
    let change = store::audit::Change::new(&by, reason);
    let active = if let_finish {
        store::revoke::ActiveLeases::LetFinish
    } else {
        store::revoke::ActiveLeases::Cancel
    };
    let outcome = match org {
        Some(org) => {
            store::revoke::revoke_assignment(&pool, &common.subjects, org, worker, &change, active)
                .await?
        }
        None => {
            store::revoke::revoke_worker(&pool, &common.subjects, worker, &change, active).await?
        }
    };
    match outcome {
        store::revoke::RevokeOutcome::Revoked { leases_cancelled } => {
            println!("revoked; {leases_cancelled} active leases voided and their tasks re-offered");
            if org.is_some() {
                // It still serves its other organizations: its bus access stays.
                Ok(())
            } else {
                push_accounts(
                    common,
                    &pool,
                    Some(&store::bus_identities::Holder::Worker(worker)),
                )
                .await
            }
        }
        store::revoke::RevokeOutcome::NotFound => Err(exit::not_found(
            "no such worker (or assignment): see `palisade worker add` / `worker assign`",
        )),
    }
}

/// `palisade worker enable`.
async fn enable(common: &CommonSettings, worker: Uuid, why: Why) -> anyhow::Result<()> {
    let pool = store::connect(&common.database).await?;
    let by = crate::commands::actor(why.by);
    let change = store::audit::Change::new(&by, why.reason.trim());
    if !store::revoke::enable_worker(&pool, worker, &change).await? {
        return Err(exit::not_found(format!("no worker {worker}")));
    }
    println!("worker {worker} enabled");
    push_accounts(
        common,
        &pool,
        Some(&store::bus_identities::Holder::Worker(worker)),
    )
    .await
}
