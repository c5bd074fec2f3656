//! `palisade nats`: the authority that issues every NATS credential (`init`), and pushing the
//! accounts PostgreSQL records to NATS (`push`); also the credentials `worker add` and
//! `client add` issue, and the account pushes that make a revocation or a re-enabling stick.

use anyhow::Context as _;
use runtime::CommonSettings;

/// `palisade nats …`.
#[derive(Debug, clap::Subcommand)]
pub enum NatsCommand {
    /// Create the authority (operator, system account and palisade account keys) in --dir,
    /// with the server configuration that trusts it and each service's credentials.
    Init {
        #[arg(long)]
        dir: std::path::PathBuf,
        /// Where the NATS servers keep pushed account updates (the `full` resolver's
        /// directory, on each server's disk).
        #[arg(long, default_value = "/data/nats/jwt")]
        resolver_dir: std::path::PathBuf,
    },
    /// Push palisade's account and every worker's and client's account, with the revocations
    /// recorded in PostgreSQL, to NATS again (after a push that failed, to a server that was
    /// away, or after an upgrade that changed what palisade's account exports).
    Push,
}

/// Where a new identity's NATS credentials go.
#[derive(Debug, clap::Args)]
pub struct CredentialsArgs {
    /// Write a .creds file (JWT and a fresh private seed, mode 0600) here: give it to the
    /// holder as NATS_CREDS.
    #[arg(long, conflicts_with = "public_key")]
    creds: Option<std::path::PathBuf>,
    /// Issue a JWT for this user public key (U…), which the holder generated (`nk -gen user`)
    /// and keeps the seed of; prints the JWT.
    #[arg(long)]
    public_key: Option<String>,
}

/// Runs one `palisade nats` command.
pub async fn run(common: &CommonSettings, command: NatsCommand) -> anyhow::Result<()> {
    match command {
        NatsCommand::Init { dir, resolver_dir } => init(common, &dir, &resolver_dir),
        NatsCommand::Push => {
            let pool = store::connect(&common.database).await?;
            if authority()?.is_none() {
                anyhow::bail!(
                    "PALISADE_NATS_AUTHORITY is not set: name the directory `palisade nats init` wrote"
                );
            }
            push_accounts(common, &pool, None).await
        }
    }
}

/// The environment variable naming the authority's directory.
const AUTHORITY_VAR: &str = "PALISADE_NATS_AUTHORITY";

/// The authority `palisade nats init` wrote, when `PALISADE_NATS_AUTHORITY` names it.
fn authority() -> anyhow::Result<Option<identity::Authority>> {
    match runtime::env::optional_string(AUTHORITY_VAR) {
        Some(dir) => Ok(Some(identity::Authority::read(std::path::Path::new(&dir))?)),
        None => Ok(None),
    }
}

/// Issues `identity` its NATS credentials and records their public key; says so when no
/// authority is configured (an open server needs none).
pub async fn issue_credentials(
    common: &CommonSettings,
    pool: &store::PgPool,
    identity: &messages::Identity,
    holder: store::bus_identities::Holder,
    args: &CredentialsArgs,
) -> anyhow::Result<()> {
    let Some(authority) = authority()? else {
        eprintln!(
            "no NATS credentials issued: {AUTHORITY_VAR} is not set, so this identity can only use a NATS server without authentication"
        );
        return Ok(());
    };
    match (&args.creds, &args.public_key) {
        (Some(path), _) => {
            let credentials = authority.issue(&common.subjects, identity);
            store::bus_identities::record_credential(pool, &holder, &credentials.public_key)
                .await?;
            identity::write_secret(path, &credentials.file)?;
            eprintln!(
                "NATS credentials written to {} (user {}): give the file to the holder as NATS_CREDS",
                path.display(),
                credentials.public_key
            );
        }
        (None, Some(public_key)) => {
            let jwt = authority.issue_for_key(&common.subjects, identity, public_key)?;
            store::bus_identities::record_credential(pool, &holder, public_key).await?;
            println!("{jwt}");
        }
        (None, None) => anyhow::bail!(
            "{AUTHORITY_VAR} is set: give --creds <file> (a new key pair) or --public-key <U…> (a key the holder generated)"
        ),
    }
    // Its account, with a credential it replaced refused from now on.
    push_accounts(common, pool, Some(&holder)).await
}

/// Signs the NATS account of `holder` (with `None`: of every worker and client, and palisade's
/// own) from what PostgreSQL records, its refused credentials included, and pushes it to NATS,
/// when an authority is configured.
pub async fn push_accounts(
    common: &CommonSettings,
    pool: &store::PgPool,
    holder: Option<&store::bus_identities::Holder>,
) -> anyhow::Result<()> {
    let Some(authority) = authority()? else {
        eprintln!(
            "NATS not told: {AUTHORITY_VAR} is not set (an open NATS server has no accounts or credentials to revoke)"
        );
        return Ok(());
    };
    let pushed = crate::accounts::push(
        &authority,
        &common.subjects,
        &common.nats_url,
        &common.nats_tls,
        pool,
        holder,
    )
    .await?;
    eprintln!(
        "NATS has {} account(s) from PostgreSQL; it refuses {} credential(s) of them from now on, and their open connections were closed",
        pushed.accounts, pushed.refused
    );
    Ok(())
}

/// Writes a new authority, the server configuration that trusts it, and each service's (and
/// the operator's) credentials.
fn init(
    common: &CommonSettings,
    dir: &std::path::Path,
    resolver_dir: &std::path::Path,
) -> anyhow::Result<()> {
    if identity::Authority::read(dir).is_ok() {
        anyhow::bail!(
            "{} already holds an authority; issuing from a new one would orphan every credential",
            dir.display()
        );
    }
    let authority = identity::Authority::generate();
    authority.write(dir)?;
    let config = dir.join("nats-server-auth.conf");
    std::fs::write(
        &config,
        authority.server_config(&common.subjects, resolver_dir),
    )
    .with_context(|| format!("cannot write {}", config.display()))?;
    let mut identities: Vec<messages::Identity> = messages::Service::ALL
        .into_iter()
        .map(messages::Identity::Service)
        .collect();
    identities.push(messages::Identity::Operator);
    for identity in &identities {
        let name = match identity {
            messages::Identity::Service(service) => service.name(),
            _ => "operator",
        };
        let path = dir.join(format!("{name}.creds"));
        identity::write_secret(&path, &authority.issue(&common.subjects, identity).file)?;
    }
    println!(
        "authority written to {dir}: keep its *.nk seeds secret (a Kubernetes secret), never in PostgreSQL",
        dir = dir.display()
    );
    println!(
        "NATS: include {} in each server's configuration (JetStream on); it trusts this authority and keeps pushed accounts in {}",
        config.display(),
        resolver_dir.display()
    );
    println!(
        "services: NATS_CREDS={}/<service>.creds for admission, dispatch, ingestion, enrichment, reaper; the palisade command: NATS_CREDS={}/operator.creds and {AUTHORITY_VAR}={}",
        dir.display(),
        dir.display(),
        dir.display()
    );
    Ok(())
}
