//! A worker's hello: records its advertised capabilities, capacity and rules, and answers the
//! organizations it serves.

use messages::{ErrorCode, v1};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::{unknown_worker, worker_disabled};
use crate::StoreError;
use crate::sql;

/// A worker's hello.
#[derive(Debug, Clone)]
pub struct HelloParams<'a> {
    pub worker_id: Uuid,
    pub software_version: &'a str,
    pub protocol_version: &'a str,
    pub capabilities: &'a [String],
    pub capacity: i32,
    /// The rules its plugins check (checked by the caller: reference 6.3).
    pub rules: &'a [v1::RuleDeclaration],
}

#[derive(Debug, Clone, PartialEq)]
pub enum HelloOutcome {
    Accepted { organization_ids: Vec<Uuid> },
    Refused(v1::Error),
}

/// Records the worker's advertised capabilities and capacity; refuses unknown or disabled
/// workers. Registration itself is an administrative act (`palisade worker add`).
pub async fn hello(pool: &PgPool, params: &HelloParams<'_>) -> Result<HelloOutcome, StoreError> {
    let mut tx = pool.begin().await?;
    let accepted: Option<(bool, bool)> = sql::workers::Hello {
        worker_id: params.worker_id,
        capabilities: params.capabilities,
        capacity: params.capacity,
        software_version: params.software_version,
        protocol_version: params.protocol_version,
        declared_rules: sqlx::types::Json(crate::coverage::declared_rules(params.rules)),
    }
    .query_as()
    .fetch_optional(&mut *tx)
    .await?;
    let outcome = match accepted {
        None => HelloOutcome::Refused(unknown_worker(params.worker_id)),
        Some((false, false)) => HelloOutcome::Refused(v1::Error::new(
            ErrorCode::InvalidField,
            format!(
                "capabilities: worker {} declares capabilities its enrollment token did not carry; declare only those (`palisade worker show`), or enroll it again with a token that carries them",
                params.worker_id
            ),
        )),
        Some((false, true)) => HelloOutcome::Refused(worker_disabled(params.worker_id)),
        Some((true, _)) => HelloOutcome::Accepted {
            organization_ids: assigned_organizations(&mut tx, params.worker_id, false).await?,
        },
    };
    tx.commit().await?;
    Ok(outcome)
}

async fn assigned_organizations(
    conn: &mut PgConnection,
    worker_id: Uuid,
    lock: bool,
) -> Result<Vec<Uuid>, StoreError> {
    let query = if lock {
        sql::organization_workers::AssignedForShare { worker_id }.query_scalar()
    } else {
        sql::organization_workers::Assigned { worker_id }.query_scalar()
    };
    Ok(query.fetch_all(conn).await?)
}
