//! `palisade worker`: worker identities: register one (and issue its NATS credentials), issue
//! the one-time tokens workers enroll with, let a worker serve an organization, revoke and
//! re-enable it, show it, list them.

use runtime::CommonSettings;
use uuid::Uuid;

use crate::cli_support::{
    Json, Output, PageArgs, Why, ids_or_dash, instant, instant_or_dash, print, table,
};
use crate::exit;
use crate::nats::{
    CredentialsArgs, credentials_cutoff, issue_credentials, push_accounts, reissue_after_enable,
};

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
    /// Re-enable a revoked worker (assignments are re-enabled with `worker assign`). Every
    /// credential issued to it before is refused from now on: give --creds or --public-key for
    /// fresh ones, or issue it a token (`worker token create --worker <id>`).
    Enable {
        #[arg(long)]
        worker: Uuid,
        #[command(flatten)]
        credentials: CredentialsArgs,
        #[command(flatten)]
        why: Why,
    },
    /// One-time enrollment tokens: a worker joins with one, generating its own key pair,
    /// without the authority's keys.
    #[command(subcommand)]
    Token(TokenCommand),
    /// A worker: its registration, its organizations and the latest changes of its access
    /// (who and why).
    Show {
        worker: Uuid,
        /// How many changes to show, newest first.
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(i64).range(0..=1000))]
        changes: i64,
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Workers in id order, a page at a time: enabled or revoked, capacity, live leases, last
    /// hello, capabilities and the organizations each serves.
    List(PageArgs),
}

/// `palisade worker token …`.
#[derive(Debug, clap::Subcommand)]
pub enum TokenCommand {
    /// Issue enrollment tokens (one per line on standard output, each for one new worker id,
    /// or for --worker): give one to each worker as PALISADE_ENROLLMENT_TOKEN. Needs
    /// PALISADE_NATS_AUTHORITY (it signs the worker's account) and NATS.
    Create {
        /// An organization the worker will serve (repeat for more).
        #[arg(long = "org", required = true)]
        orgs: Vec<Uuid>,
        /// What the worker may declare in its hello: plugin names and other capabilities,
        /// comma-separated.
        #[arg(long, value_delimiter = ',', required = true)]
        capabilities: Vec<String>,
        /// How long the token may be used, e.g. 1h, 30m, 7d.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "1h")]
        expires: std::time::Duration,
        /// The worker's name (default: worker-<the first 8 characters of its id>).
        #[arg(long)]
        name: Option<String>,
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(i32).range(1..=1024))]
        capacity: i32,
        /// An existing worker enrolling again (re-enabled, or its key lost); default a new id.
        #[arg(long, conflicts_with = "count")]
        worker: Option<Uuid>,
        /// How many tokens, each for its own new worker.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1000))]
        count: u16,
        #[command(flatten)]
        why: Why,
    },
    /// Enrollment tokens, newest first (never their secrets): by default those still usable.
    List {
        /// Used, revoked and expired ones too.
        #[arg(long)]
        all: bool,
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(1..=10000))]
        limit: i64,
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Revoke an enrollment token that was not used yet.
    Revoke {
        #[arg(long)]
        token: Uuid,
        #[command(flatten)]
        why: Why,
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
        WorkerCommand::Enable {
            worker,
            credentials,
            why,
        } => enable(common, worker, &credentials, why).await,
        WorkerCommand::Token(command) => token(common, command).await,
        WorkerCommand::Show {
            worker,
            changes,
            output,
        } => {
            let pool = store::connect(&common.database).await?;
            let shown = crate::tenants::worker(&pool, worker, changes).await?;
            // Through a `serde_json::Value`: its keys in alphabetical order, as it always printed.
            print(output, Json::Pretty, &serde_json::to_value(&shown)?, |_| {
                crate::tenants::worker_text(&shown)
            })
        }
        WorkerCommand::List(page) => {
            let pool = store::connect(&common.database).await?;
            let workers = store::admin::workers(&pool, page.after, page.limit).await?;
            print_list(page.output, &workers, page.limit)
        }
    }
}

/// `palisade worker list` as text or JSON.
fn print_list(
    output: crate::cli_support::Output,
    workers: &[store::admin::WorkerSummary],
    limit: i64,
) -> anyhow::Result<()> {
    crate::cli_support::print_page(
        output,
        workers,
        limit,
        &format!(
            "{:<36} {:<20} {:<8} {:>8} {:>6} {:<20} {:<28} organizations",
            "id", "name", "state", "capacity", "leases", "last hello", "capabilities"
        ),
        |worker| {
            format!(
                "{:<36} {:<20} {:<8} {:>8} {:>6} {:<20} {:<28} {}",
                worker.id,
                worker.name,
                if worker.enabled { "enabled" } else { "revoked" },
                worker.capacity,
                worker.live_leases,
                instant_or_dash(worker.last_seen_at.as_ref()),
                if worker.capabilities.is_empty() {
                    "-".to_owned()
                } else {
                    worker.capabilities.join(",")
                },
                ids_or_dash(&worker.organization_ids)
            )
        },
        |worker| worker.id.to_string(),
    )
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
async fn enable(
    common: &CommonSettings,
    worker: Uuid,
    credentials: &CredentialsArgs,
    why: Why,
) -> anyhow::Result<()> {
    let pool = store::connect(&common.database).await?;
    let by = crate::commands::actor(why.by);
    let change = store::audit::Change::new(&by, why.reason.trim());
    let cutoff = credentials_cutoff();
    if !store::revoke::enable_worker(&pool, worker, &change, cutoff).await? {
        return Err(exit::not_found(format!("no worker {worker}")));
    }
    println!("worker {worker} enabled");
    reissue_after_enable(
        common,
        &pool,
        &messages::Identity::Worker { worker_id: worker },
        store::bus_identities::Holder::Worker(worker),
        credentials,
        &format!(
            "`palisade worker token create --worker {worker} --org … --capabilities …`, or --creds / --public-key here"
        ),
    )
    .await
}

/// `palisade worker token …`.
async fn token(common: &CommonSettings, command: TokenCommand) -> anyhow::Result<()> {
    match command {
        TokenCommand::Create {
            orgs,
            capabilities,
            expires,
            name,
            capacity,
            worker,
            count,
            why,
        } => {
            let request = TokenRequest {
                orgs,
                capabilities: capabilities
                    .iter()
                    .map(|capability| capability.trim().to_owned())
                    .filter(|capability| !capability.is_empty())
                    .collect(),
                expires,
                name,
                capacity,
            };
            create_tokens(common, &request, worker, count, why).await
        }
        TokenCommand::List { all, limit, output } => {
            let pool = store::connect(&common.database).await?;
            let tokens = store::enrollment::list_tokens(&pool, all, limit).await?;
            print(output, Json::Pretty, &tokens, |tokens| tokens_text(tokens))
        }
        TokenCommand::Revoke { token, why } => {
            let pool = store::connect(&common.database).await?;
            let by = crate::commands::actor(why.by);
            let change = store::audit::Change::new(&by, why.reason.trim());
            if !store::enrollment::revoke_token(&pool, token, &change).await? {
                return Err(exit::not_found(format!(
                    "no unused token {token}: see `palisade worker token list --all`"
                )));
            }
            println!("token {token} revoked");
            Ok(())
        }
    }
}

/// `palisade worker token list` as text: a table, a token a line.
fn tokens_text(tokens: &[store::enrollment::TokenView]) -> String {
    let now = chrono::Utc::now();
    table(
        &format!(
            "{:<36} {:<36} {:<20} {:<8} {:<20} {:<16} {:<28} organizations",
            "id", "worker", "name", "state", "expires", "issued by", "capabilities"
        ),
        tokens.iter().map(|token| {
            let state = if token.used_at.is_some() {
                "used"
            } else if token.revoked_at.is_some() {
                "revoked"
            } else if token.expires_at <= now {
                "expired"
            } else {
                "usable"
            };
            format!(
                "{:<36} {:<36} {:<20} {:<8} {:<20} {:<16} {:<28} {}",
                token.id,
                token.worker_id,
                token.worker_name,
                state,
                instant(&token.expires_at),
                token.issued_by,
                token.capabilities.join(","),
                ids_or_dash(&token.organization_ids)
            )
        }),
    )
}

/// What each token of one `worker token create` carries.
#[derive(Debug, Clone)]
pub struct TokenRequest {
    pub orgs: Vec<Uuid>,
    /// Non-empty, each trimmed.
    pub capabilities: Vec<String>,
    pub expires: std::time::Duration,
    /// Default: `worker-<the first 8 characters of its id>`.
    pub name: Option<String>,
    pub capacity: i32,
}

/// `palisade worker token create`: for each token, the record in PostgreSQL, the worker's
/// account pushed to NATS, then the token printed.
async fn create_tokens(
    common: &CommonSettings,
    request: &TokenRequest,
    worker: Option<Uuid>,
    count: u16,
    why: Why,
) -> anyhow::Result<()> {
    let (dir, authority) = crate::nats::authority_dir()?;
    if authority.enroller().is_none() {
        return Err(identity::IdentityError::NoEnrollmentKey {
            dir,
            file: identity::ENROLLMENT_SEED,
        }
        .into());
    }
    anyhow::ensure!(
        !request.capabilities.is_empty(),
        "--capabilities is empty: name what the worker may run (e.g. tcp_connect,http_headers)"
    );
    let pool = store::connect(&common.database).await?;
    let by = crate::commands::actor(why.by);
    let change = store::audit::Change::new(&by, why.reason.trim());
    if worker.is_some() {
        // A worker re-enabled this second refuses credentials issued in it.
        crate::nats::past(credentials_cutoff()).await;
    }
    for _ in 0..count {
        let worker_id = worker.unwrap_or_else(Uuid::new_v4);
        let token = issue_token(common, &pool, &authority, request, worker_id, &change).await?;
        println!("{}", token.encode());
        eprintln!(
            "token {} for worker {worker_id} ({} organization(s), capabilities {}), usable once until {}",
            token.token_id,
            token.organization_ids.len(),
            token.capabilities.join(","),
            chrono::DateTime::from_timestamp_millis(token.expires_at_unix_ms)
                .map_or_else(|| "?".to_owned(), |at| at.to_rfc3339()),
        );
    }
    Ok(())
}

/// One enrollment token for `worker_id`: recorded in PostgreSQL, the worker's account pushed
/// to NATS (listing the enrollment key, scoped to the worker's permissions), and the token's
/// user signed, expiring with it.
pub async fn issue_token(
    common: &CommonSettings,
    pool: &store::PgPool,
    authority: &identity::Authority,
    request: &TokenRequest,
    worker_id: Uuid,
    change: &store::audit::Change<'_>,
) -> anyhow::Result<identity::enrollment::EnrollmentToken> {
    let capabilities = &request.capabilities;
    let identity = messages::Identity::Worker { worker_id };
    let token_id = Uuid::new_v4();
    let secret = identity::enrollment::EnrollmentToken::new_secret();
    let digest = identity::enrollment::secret_digest(&secret);
    let default_name = format!("worker-{}", &worker_id.simple().to_string()[..8]);
    let account = authority.account_of(&identity);
    let new = store::enrollment::NewToken {
        token_id,
        worker_id,
        worker_name: request.name.as_deref().unwrap_or(&default_name),
        capacity: request.capacity,
        secret_sha256: &digest,
        organization_ids: &request.orgs,
        capabilities,
        account_public_key: &account,
        ttl: request.expires,
    };
    let expires_at = match store::enrollment::create_token(pool, &new, change).await? {
        store::enrollment::CreateOutcome::Created { expires_at } => expires_at,
        store::enrollment::CreateOutcome::UnknownOrganizations(unknown) => {
            return Err(exit::not_found(format!(
                "no organization {}: see `palisade org add`",
                unknown
                    .iter()
                    .map(Uuid::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    };
    // The account must be on the servers before the token's user can connect.
    crate::accounts::push(
        authority,
        &common.subjects,
        &common.nats_url,
        &common.nats_tls,
        pool,
        Some(&store::bus_identities::Holder::Worker(worker_id)),
    )
    .await?;
    let user = authority.enrollment_user(&common.subjects, worker_id, expires_at.timestamp());
    Ok(identity::enrollment::EnrollmentToken {
        worker_id,
        token_id,
        secret,
        organization_ids: request.orgs.clone(),
        capabilities: capabilities.clone(),
        expires_at_unix_ms: expires_at.timestamp_millis(),
        creds: user.file,
    })
}
