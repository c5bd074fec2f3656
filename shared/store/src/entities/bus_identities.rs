//! Identities on the bus: clients bound to organizations, and the public keys of the NATS
//! credentials issued to workers and clients, from which the revocation list NATS enforces is
//! rebuilt (`identity::Authority::push`). No private key is ever stored.

use sqlx::PgPool;
use uuid::Uuid;

use crate::StoreError;
use crate::audit::Change;
use crate::sql;
use crate::states::AdminAction;

/// Who holds a credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    Worker(Uuid),
    Client(String),
}

impl Holder {
    fn ids(&self) -> (Option<Uuid>, Option<&str>) {
        match self {
            Holder::Worker(id) => (Some(*id), None),
            Holder::Client(id) => (None, Some(id.as_str())),
        }
    }
}

/// Records a credential issued to `holder`; the holder's earlier credentials are refused from
/// now on (a rotation), in the same transaction.
pub async fn record_credential(
    pool: &PgPool,
    holder: &Holder,
    public_key: &str,
) -> Result<(), StoreError> {
    let mut tx = pool.begin().await?;
    record_credential_in(&mut tx, holder, public_key).await?;
    tx.commit().await?;
    Ok(())
}

/// [`record_credential`] in the caller's transaction.
pub(crate) async fn record_credential_in(
    conn: &mut sqlx::PgConnection,
    holder: &Holder,
    public_key: &str,
) -> Result<(), StoreError> {
    let (worker_id, client_id) = holder.ids();
    sql::nats_users::RetireOthers {
        worker_id,
        client_id,
    }
    .query()
    .execute(&mut *conn)
    .await?;
    sql::nats_users::Record {
        public_key,
        worker_id,
        client_id,
    }
    .query()
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// A worker or client as its own NATS account is signed: who it is (with a client's
/// organizations, whose subjects the account imports) and the keys NATS must refuse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BusAccount {
    pub holder: Holder,
    pub organization_ids: Vec<Uuid>,
    pub refused: Vec<String>,
    /// Revoked: the account refuses every user, whoever signs it.
    pub revoked: bool,
    /// Re-enabled at this time: every user issued at or before it is refused.
    pub credentials_issued_after: Option<chrono::DateTime<chrono::Utc>>,
}

/// The NATS accounts of every worker and client holding a credential, or of `holder` alone
/// (none when it holds no credential).
pub async fn bus_accounts(
    pool: &PgPool,
    holder: Option<&Holder>,
) -> Result<Vec<BusAccount>, StoreError> {
    let (worker_id, client_id) = holder.map_or((None, None), Holder::ids);
    /// worker_id, client_id, organization_ids, refused, revoked, credentials_issued_after.
    type Row = (
        Option<Uuid>,
        Option<String>,
        Vec<Uuid>,
        Vec<String>,
        bool,
        Option<chrono::DateTime<chrono::Utc>>,
    );
    let rows: Vec<Row> = sql::nats_users::Accounts {
        worker_id,
        client_id,
    }
    .query_as()
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .filter_map(
            |(worker_id, client_id, organization_ids, refused, revoked, issued_after)| {
                let holder = match (worker_id, client_id) {
                    (Some(worker_id), _) => Holder::Worker(worker_id),
                    (None, Some(client_id)) => Holder::Client(client_id),
                    (None, None) => return None,
                };
                Some(BusAccount {
                    holder,
                    organization_ids,
                    refused,
                    revoked,
                    credentials_issued_after: issued_after,
                })
            },
        )
        .collect())
}

/// The worker and client keys issued before each identity had an account of its own (signed
/// by palisade's account, with that time's permissions), which palisade's account refuses.
pub async fn keys_in_palisade_account(pool: &PgPool) -> Result<Vec<String>, StoreError> {
    Ok(sql::query_scalar(sql::nats_users::IN_PALISADE_ACCOUNT)
        .fetch_all(pool)
        .await?)
}

/// Registers a client bound to `organization_ids` (idempotent by id).
pub async fn register_client(
    pool: &PgPool,
    id: &str,
    name: &str,
    organization_ids: &[Uuid],
    change: &Change<'_>,
) -> Result<(), StoreError> {
    sql::clients::Register {
        id,
        name,
        organization_ids,
        change_id: change.id(),
        who: change.by,
        why: change.reason,
        client_registered_action: AdminAction::ClientRegistered.as_str(),
    }
    .query_scalar::<String>()
    .fetch_one(pool)
    .await?;
    Ok(())
}

/// Revokes a client; false when there is none.
pub async fn revoke_client(
    pool: &PgPool,
    id: &str,
    change: &Change<'_>,
) -> Result<bool, StoreError> {
    let revoked: Option<String> = sql::clients::Revoke {
        client_id: id,
        reason: change.reason,
        change_id: change.id(),
        who: change.by,
        client_revoked_action: AdminAction::ClientRevoked.as_str(),
    }
    .query_scalar()
    .fetch_optional(pool)
    .await?;
    Ok(revoked.is_some())
}

/// Enables a revoked client again; false when there is none. Every credential of its account
/// issued at or before `credentials_issued_after` is refused from then on (once its account is
/// pushed): it needs fresh ones.
pub async fn enable_client(
    pool: &PgPool,
    id: &str,
    change: &Change<'_>,
    credentials_issued_after: chrono::DateTime<chrono::Utc>,
) -> Result<bool, StoreError> {
    let enabled: Option<String> = sql::clients::Enable {
        client_id: id,
        change_id: change.id(),
        who: change.by,
        why: change.reason,
        client_enabled_action: AdminAction::ClientEnabled.as_str(),
        credentials_issued_after,
    }
    .query_scalar()
    .fetch_optional(pool)
    .await?;
    Ok(enabled.is_some())
}
