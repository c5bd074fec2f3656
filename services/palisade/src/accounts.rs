//! The NATS accounts of workers and clients, signed from what PostgreSQL records (a client's
//! organizations, every identity's refused credentials) and pushed to the servers: what
//! `worker add`, `client add`, the revocations and `nats push` run, and the system tests with
//! them.

use identity::{Authority, Revoked, SignedAccount};
use messages::{Identity, Subjects};
use store::PgPool;
use store::bus_identities::{BusAccount, Holder};

/// What a push sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pushed {
    pub accounts: usize,
    /// Credentials those accounts refuse.
    pub refused: usize,
}

/// Signs the account of `holder` (with `None`: of every worker and client holding a
/// credential, and palisade's own, which refuses every worker and client key it signed before
/// each had an account of its own) and pushes it to the NATS servers at `url`.
pub async fn push(
    authority: &Authority,
    subjects: &Subjects,
    url: &str,
    tls: &bus::NatsTls,
    pool: &PgPool,
    holder: Option<&Holder>,
) -> anyhow::Result<Pushed> {
    let mut accounts = Vec::new();
    let mut refused = 0;
    if holder.is_none() {
        let legacy: Vec<Revoked> = store::bus_identities::keys_in_palisade_account(pool)
            .await?
            .into_iter()
            .map(Revoked::key)
            .collect();
        refused += legacy.len();
        accounts.push(authority.palisade_account(subjects, &legacy));
    }
    for recorded in store::bus_identities::bus_accounts(pool, holder).await? {
        refused += recorded.refused.len();
        accounts.extend(sign(authority, subjects, recorded));
    }
    authority.push(url, tls, &accounts).await?;
    Ok(Pushed {
        accounts: accounts.len(),
        refused,
    })
}

/// The account of one recorded worker or client.
fn sign(authority: &Authority, subjects: &Subjects, recorded: BusAccount) -> Option<SignedAccount> {
    let identity = match recorded.holder {
        Holder::Worker(worker_id) => Identity::Worker { worker_id },
        Holder::Client(client_id) => Identity::Client {
            client_id,
            organizations: recorded.organization_ids,
        },
    };
    let mut revoked: Vec<Revoked> = recorded.refused.into_iter().map(Revoked::key).collect();
    // Revoking ends the account: every user, also one minted later with its key.
    if recorded.revoked {
        revoked.push(Revoked::every_user());
    } else if let Some(after) = recorded.credentials_issued_after {
        revoked.push(Revoked::every_user_issued_by(after.timestamp()));
    }
    authority.identity_account(subjects, &identity, &revoked)
}
