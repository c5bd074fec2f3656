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
    /// Add the enrollment key (enrollment.nk) to an authority written before enrollment
    /// existed, then push every account so workers' accounts list it; give the file to
    /// dispatch as PALISADE_NATS_ENROLLMENT_KEY.
    EnrollmentKey,
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

impl CredentialsArgs {
    /// Whether a credential was asked for.
    pub fn given(&self) -> bool {
        self.creds.is_some() || self.public_key.is_some()
    }
}

/// When a re-enabled identity's credentials start to count: this second, by this command's
/// clock. Every credential of its account issued at or before it is refused from then on, so
/// fresh ones are signed only once it has passed ([`past`]).
pub fn credentials_cutoff() -> chrono::DateTime<chrono::Utc> {
    let now = chrono::Utc::now();
    chrono::DateTime::from_timestamp(now.timestamp(), 0).unwrap_or(now)
}

/// Waits until a credential signed now is issued after `cutoff` (JWTs count whole seconds).
pub async fn past(cutoff: chrono::DateTime<chrono::Utc>) {
    let after = cutoff + chrono::Duration::seconds(1);
    if let Ok(wait) = (after - chrono::Utc::now()).to_std() {
        tokio::time::sleep(wait).await;
    }
}

/// After re-enabling `holder` (its earlier credentials refused): issues fresh
/// ones when `credentials` asks for them, else pushes its account and says how to.
pub async fn reissue_after_enable(
    common: &CommonSettings,
    pool: &store::PgPool,
    identity: &messages::Identity,
    holder: store::bus_identities::Holder,
    credentials: &CredentialsArgs,
    how: &str,
) -> anyhow::Result<()> {
    if credentials.given() {
        past(credentials_cutoff()).await;
        return issue_credentials(common, pool, identity, holder, credentials).await;
    }
    push_accounts(common, pool, Some(&holder)).await?;
    if runtime::env::optional_string(AUTHORITY_VAR).is_some() {
        eprintln!(
            "every credential issued to it before now is refused: give it fresh ones ({how})"
        );
    }
    Ok(())
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
        NatsCommand::EnrollmentKey => {
            let (dir, mut authority) = authority_dir()?;
            if authority.add_enrollment_key(&dir)? {
                eprintln!(
                    "enrollment key written to {}",
                    dir.join(identity::ENROLLMENT_SEED).display()
                );
            } else {
                eprintln!(
                    "{} already holds an enrollment key",
                    dir.join(identity::ENROLLMENT_SEED).display()
                );
            }
            let pool = store::connect(&common.database).await?;
            push_accounts(common, &pool, None).await?;
            eprintln!(
                "give {} to dispatch as PALISADE_NATS_ENROLLMENT_KEY",
                dir.join(identity::ENROLLMENT_SEED).display()
            );
            Ok(())
        }
    }
}

/// The authority and its directory; an error saying how to set it when unset.
pub fn authority_dir() -> anyhow::Result<(std::path::PathBuf, identity::Authority)> {
    let dir = runtime::env::optional_string(AUTHORITY_VAR).ok_or_else(|| {
        anyhow::anyhow!(
            "{AUTHORITY_VAR} is not set: name the directory `palisade nats init` wrote (the authority signs the worker's account)"
        )
    })?;
    let dir = std::path::PathBuf::from(dir);
    let authority = identity::Authority::read(&dir)?;
    Ok((dir, authority))
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
    println!(
        "dispatch: PALISADE_NATS_ENROLLMENT_KEY={}/{} (it signs workers' credentials when they enroll with a token; nothing else needs it)",
        dir.display(),
        identity::ENROLLMENT_SEED
    );
    Ok(())
}
