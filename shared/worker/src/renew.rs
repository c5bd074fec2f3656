//! Keeping a lease alive: renew on a timer, and report when it is gone (refused by dispatch,
//! or not renewed before it expired by the worker's own clock).

use std::sync::Arc;
use std::time::Duration;

use messages::{ErrorCode, WorkerVerb, v1};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::stats::Counter;

/// Shortest wait between renewals when a lease is about to expire and renewals keep failing,
/// so the renewer never spins.
const RENEW_RETRY_DELAY_MIN: Duration = Duration::from_millis(200);

/// Why a lease ended while its task was running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseLoss {
    /// Dispatch says the attempt is no longer the task's live one.
    Lost,
    /// Dispatch says the task was cancelled.
    Cancelled,
    /// No renewal succeeded before the lease's expiry: it is presumed lost.
    Expired,
}

impl LeaseLoss {
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseLoss::Lost => "lease_lost",
            LeaseLoss::Cancelled => "cancel_requested",
            LeaseLoss::Expired => "lease_expired",
        }
    }
}

/// Renews `lease` until `done` fires (returns `None`) or the lease is gone (returns why).
/// `expires_at` is when the lease lapses without renewal, measured from before the request
/// that granted it, so the worker's view errs on the early side.
pub(crate) async fn renew_until_lost(
    ctx: Arc<Context>,
    lease: v1::LeaseRef,
    mut expires_at: Instant,
    done: CancellationToken,
) -> Option<LeaseLoss> {
    let interval = ctx.session.renew_interval;
    let timeout = ctx.config.request_timeout.min(interval);
    let request = v1::RenewRequest {
        schema_version: messages::SCHEMA_VERSION,
        worker_id: ctx.worker_id.clone(),
        lease: Some(lease),
    };
    loop {
        let now = Instant::now();
        if now >= expires_at {
            return Some(LeaseLoss::Expired);
        }
        // Retry sooner when a failed renewal has eaten into the lease.
        let wait = interval
            .min((expires_at - now) / 2)
            .max(RENEW_RETRY_DELAY_MIN);
        tokio::select! {
            () = done.cancelled() => return None,
            () = tokio::time::sleep(wait) => {}
        }
        let sent_at = Instant::now();
        let reply = ctx
            .request::<v1::RenewReply>(WorkerVerb::Renew, &request, timeout)
            .await;
        match reply {
            Ok(v1::RenewReply {
                error: None,
                lease_expires_in_ms,
            }) => {
                expires_at = sent_at + Duration::from_millis(lease_expires_in_ms.into());
                ctx.stats.add(Counter::Renewals);
                tracing::debug!(lease_expires_in_ms, "lease renewed");
            }
            Ok(v1::RenewReply {
                error: Some(error), ..
            }) => match error.error_code() {
                Some(ErrorCode::LeaseLost) => return Some(LeaseLoss::Lost),
                Some(ErrorCode::CancelRequested) => return Some(LeaseLoss::Cancelled),
                _ => {
                    tracing::warn!(code = %error.code, message = %error.message, "renew refused, retrying");
                }
            },
            Err(error) => {
                tracing::warn!(error = %telemetry::chain(&error), "renew unanswered, retrying")
            }
        }
    }
}
