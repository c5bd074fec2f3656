//! `palisade worker show` and `palisade org show` (issue 27, item 5): a worker or an
//! organization with its access and limits, and the latest changes of them, each with who made
//! it and why (`store::audit`).

use store::PgPool;
use uuid::Uuid;

use crate::exit;

/// `palisade worker show`: the worker, its organizations, and its latest `changes` changes.
pub async fn worker(pool: &PgPool, id: Uuid, changes: i64) -> anyhow::Result<serde_json::Value> {
    let worker = store::audit::worker(pool, id)
        .await?
        .ok_or_else(|| exit::not_found(format!("not_found: no worker {id}")))?;
    let mut shown = serde_json::to_value(&worker)?;
    shown["changes"] =
        serde_json::to_value(store::audit::recent(pool, Some(id), None, &[], changes).await?)?;
    Ok(shown)
}

/// `palisade org show`: the organization, its workers and clients, and the latest `changes`
/// changes of its limits, its assignments and its clients.
pub async fn organization(
    pool: &PgPool,
    id: Uuid,
    changes: i64,
) -> anyhow::Result<serde_json::Value> {
    let organization = store::audit::organization(pool, id)
        .await?
        .ok_or_else(|| exit::not_found(format!("not_found: no organization {id}")))?;
    let recent =
        store::audit::recent(pool, None, Some(id), &organization.client_ids, changes).await?;
    let mut shown = serde_json::to_value(&organization)?;
    shown["changes"] = serde_json::to_value(recent)?;
    Ok(shown)
}
