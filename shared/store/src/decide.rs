//! The decisions: what a kind of message or request does to the scans, tasks and attempts it
//! names, one module each, with its rules as numbered steps in the module doc and its
//! statements under `sql/`.
//!
//! Who owns the transaction: the consumers' hot paths (`admit`, `ingest`, and
//! `fire::FireDue`) implement [`Script`] and run through [`decide_batch`], which opens one
//! transaction per fetched batch. `lease`, `cancel`, `recover` and `revoke` take the pool and
//! open and commit their own, one per call (a call may carry a batch). `progress` is the one
//! place a scan advances: a step inside the caller's transaction.

pub mod admit;
pub mod cancel;
pub mod fire;
pub mod ingest;
pub mod lease;
pub mod progress;
pub mod recover;
pub mod revoke;

use sqlx::{PgPool, Postgres, Transaction};

use crate::{StoreError, outbox, outbox::Staged};

/// Opens a savepoint inside `tx`: one message of a batch is decided in it, and rolled back
/// alone when that message is refused or fails.
pub async fn savepoint<'c>(
    tx: &'c mut Transaction<'_, Postgres>,
) -> Result<Transaction<'c, Postgres>, StoreError> {
    use sqlx::Acquire as _;
    Ok((&mut **tx).begin().await?)
}

/// A decision script over one fetched batch, in its two forms.
pub trait Script {
    /// One outcome per message, in the batch's order.
    type Outcomes: Send;
    /// A fixed number of statements for the whole batch; its events go to `staged`.
    fn set_wise(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        staged: &mut Staged,
    ) -> impl Future<Output = Result<Self::Outcomes, StoreError>> + Send;
    /// One message per savepoint: more statements, but a message the schema refuses fails
    /// alone.
    fn one_by_one(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        staged: &mut Staged,
    ) -> impl Future<Output = Result<Self::Outcomes, StoreError>> + Send;
}

/// The one fallback policy of every consumer: decides the batch set-wise in one transaction;
/// when a set-wise statement fails for a reason retrying cannot fix (a row the schema refuses),
/// decides it again one message per savepoint in a fresh transaction, so that the message at
/// fault is refused alone and its neighbours go through. A transient failure is returned: the
/// caller has the whole batch redelivered. The events of the committed transaction come back
/// staged, for the caller to publish.
pub async fn decide_batch<S: Script + Sync>(
    pool: &PgPool,
    progress_events: outbox::ProgressEvents,
    script: &S,
) -> Result<(S::Outcomes, Staged), StoreError> {
    let set_wise = async {
        let mut staged = Staged::new(progress_events);
        let mut tx = pool.begin().await?;
        let outcomes = script.set_wise(&mut tx, &mut staged).await?;
        tx.commit().await?;
        Ok::<_, StoreError>((outcomes, staged))
    };
    match set_wise.await {
        Err(error) if !error.is_transient() => {
            tracing::warn!(%error, "a set-wise statement failed; deciding the batch one message at a time");
            let mut staged = Staged::new(progress_events);
            let mut tx = pool.begin().await?;
            let outcomes = script.one_by_one(&mut tx, &mut staged).await?;
            tx.commit().await?;
            Ok((outcomes, staged))
        }
        outcome => outcome,
    }
}
