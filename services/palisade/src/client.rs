//! `palisade client`: clients, services that submit scans for the organizations they are bound
//! to: register one (and issue its NATS credentials), revoke and re-enable it, list them.

use runtime::CommonSettings;
use uuid::Uuid;

use crate::cli_support::{Output, Why, ids_or_dash, instant, instant_or_dash};
use crate::exit;
use crate::nats::{
    CredentialsArgs, credentials_cutoff, issue_credentials, push_accounts, reissue_after_enable,
};

/// `palisade client …`.
#[derive(Debug, clap::Subcommand)]
pub enum ClientCommand {
    /// Register a client bound to organizations and issue its NATS credentials (with
    /// PALISADE_NATS_AUTHORITY set); running it again replaces its organizations and
    /// credentials.
    Add {
        /// 1..=64 characters of [A-Za-z0-9_-]: the client_id of its requests.
        #[arg(long)]
        id: String,
        #[arg(long, default_value = "")]
        name: String,
        /// An organization it may submit, cancel and read events for (repeat for more).
        #[arg(long = "org", required = true)]
        orgs: Vec<Uuid>,
        #[command(flatten)]
        credentials: CredentialsArgs,
        #[command(flatten)]
        why: Why,
    },
    /// Revoke a client: its NATS connections are closed and refused.
    Revoke {
        #[arg(long)]
        id: String,
        #[arg(long, default_value = "revoked from the command line")]
        reason: String,
        /// Who (recorded with the change; default: $USER).
        #[arg(long)]
        by: Option<String>,
    },
    /// Re-enable a revoked client. Every credential issued to it before is refused from now
    /// on: give --creds or --public-key for fresh ones (or run `client add` again).
    Enable {
        #[arg(long)]
        id: String,
        #[command(flatten)]
        credentials: CredentialsArgs,
        #[command(flatten)]
        why: Why,
    },
    /// Clients in id order, a page at a time: the organizations each is bound to, and whether
    /// it is revoked.
    List {
        /// The next page: the last id of the previous one.
        #[arg(long)]
        after: Option<String>,
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(i64).range(1..=1000))]
        limit: i64,
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
}

/// Runs one `palisade client` command.
pub async fn run(common: &CommonSettings, command: ClientCommand) -> anyhow::Result<()> {
    match command {
        ClientCommand::Add {
            id,
            name,
            orgs,
            credentials,
            why,
        } => add(common, id, &name, orgs, &credentials, why).await,
        ClientCommand::Revoke { id, reason, by } => {
            let pool = store::connect(&common.database).await?;
            let by = crate::commands::actor(by);
            let change = store::audit::Change::new(&by, &reason);
            if !store::bus_identities::revoke_client(&pool, &id, &change).await? {
                return Err(exit::not_found(format!(
                    "no client {id}: see `palisade client add`"
                )));
            }
            println!("client {id} revoked");
            push_accounts(
                common,
                &pool,
                Some(&store::bus_identities::Holder::Client(id)),
            )
            .await
        }
        ClientCommand::Enable {
            id,
            credentials,
            why,
        } => enable(common, id, &credentials, why).await,
        ClientCommand::List {
            after,
            limit,
            output,
        } => {
            let pool = store::connect(&common.database).await?;
            let clients = store::admin::clients(&pool, after.as_deref(), limit).await?;
            print_list(output, &clients, limit)
        }
    }
}

/// `palisade client list` as text or JSON.
fn print_list(
    output: Output,
    clients: &[store::admin::ClientSummary],
    limit: i64,
) -> anyhow::Result<()> {
    crate::cli_support::print_page(
        output,
        clients,
        limit,
        &format!(
            "{:<24} {:<20} {:<20} {:<20} organizations",
            "id", "name", "revoked", "created"
        ),
        |client| {
            format!(
                "{:<24} {:<20} {:<20} {:<20} {}",
                client.id,
                client.name,
                instant_or_dash(client.revoked_at.as_ref()),
                instant(&client.created_at),
                ids_or_dash(&client.organization_ids)
            )
        },
        |client| client.id.clone(),
    )
}

/// `palisade client enable`.
async fn enable(
    common: &CommonSettings,
    id: String,
    credentials: &CredentialsArgs,
    why: Why,
) -> anyhow::Result<()> {
    let pool = store::connect(&common.database).await?;
    let by = crate::commands::actor(why.by);
    let change = store::audit::Change::new(&by, why.reason.trim());
    let cutoff = credentials_cutoff();
    if !store::bus_identities::enable_client(&pool, &id, &change, cutoff).await? {
        return Err(exit::not_found(format!(
            "no client {id}: see `palisade client add`"
        )));
    }
    println!("client {id} enabled");
    let holder = store::bus_identities::Holder::Client(id.clone());
    let organizations = store::bus_identities::bus_accounts(&pool, Some(&holder))
        .await?
        .into_iter()
        .next()
        .map(|account| account.organization_ids)
        .unwrap_or_default();
    reissue_after_enable(
        common,
        &pool,
        &messages::Identity::Client {
            client_id: id.clone(),
            organizations,
        },
        holder,
        credentials,
        &format!("`palisade client enable --id {id} --creds …`"),
    )
    .await
}

/// `palisade client add`.
async fn add(
    common: &CommonSettings,
    id: String,
    name: &str,
    orgs: Vec<Uuid>,
    credentials: &CredentialsArgs,
    why: Why,
) -> anyhow::Result<()> {
    messages::subjects::token("client id", &id)?;
    let pool = store::connect(&common.database).await?;
    let by = crate::commands::actor(why.by);
    let change = store::audit::Change::new(&by, why.reason.trim());
    store::bus_identities::register_client(&pool, &id, name, &orgs, &change).await?;
    println!("client {id} acts for {} organization(s)", orgs.len());
    issue_credentials(
        common,
        &pool,
        &messages::Identity::Client {
            client_id: id.clone(),
            organizations: orgs,
        },
        store::bus_identities::Holder::Client(id),
        credentials,
    )
    .await
}
