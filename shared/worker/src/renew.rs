//! Keeping a worker's leases alive: one renewer per session renews every lease the worker
//! holds in one message per tick, and tells each lease task when its own lease is gone
//! (refused by dispatch, or not renewed before it expired by the worker's own clock).
//!
//! A tick comes when the first held lease is due (a renew interval after its last renewal or
//! its grant; sooner while renewals fail and its expiry nears), and renews every held lease, so
//! leases granted between ticks join the next one and stay in step from then on. A dispatch
//! older than the batched renew answers only the request's first lease (its reply has no
//! `renewals`); the rest are then renewed one request each, as before the batch existed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use messages::limits::RENEW_LEASES_MAX;
use messages::{ErrorCode, WorkerVerb, v1};
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::stats::Counter;

/// Shortest wait between renewals when a lease is about to expire and renewals keep failing,
/// so the renewer never spins.
const RENEW_RETRY_DELAY_MIN: Duration = Duration::from_millis(200);
/// Single renew requests in flight at once when an old dispatch makes the renewer fall back
/// to one request per lease.
const RENEW_FALLBACK_REQUESTS_MAX: usize = 32;

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

/// The leases a worker session holds, by attempt id: what the renewer renews.
#[derive(Debug, Default)]
pub(crate) struct Renewals {
    held: Arc<Mutex<HashMap<String, Held>>>,
    /// Signalled when a lease is held, so the renewer sees a lease due before its next tick.
    joined: Notify,
}

#[derive(Debug)]
struct Held {
    lease: v1::LeaseRef,
    /// When the lease lapses without renewal, by this worker's clock (erring early: measured
    /// from before the request that granted or renewed it).
    expires_at: Instant,
    /// When it should next be renewed.
    due_at: Instant,
    lost: oneshot::Sender<LeaseLoss>,
}

/// A lease task's hold on its lease: says when the lease is gone, and stops its renewal when
/// ended or dropped.
#[derive(Debug)]
pub(crate) struct Renewal {
    attempt_id: String,
    held: Arc<Mutex<HashMap<String, Held>>>,
    lost: oneshot::Receiver<LeaseLoss>,
}

impl Renewals {
    /// Renews `lease`, which lapses at `expires_at`, from the next tick on, until the returned
    /// [`Renewal`] is ended or dropped.
    pub fn hold(&self, lease: v1::LeaseRef, expires_at: Instant, interval: Duration) -> Renewal {
        let (sender, receiver) = oneshot::channel();
        let attempt_id = lease.attempt_id.clone();
        let held = Held {
            due_at: due_at(Instant::now(), expires_at, interval),
            lease,
            expires_at,
            lost: sender,
        };
        let previous = self.lock().insert(attempt_id.clone(), held);
        assert!(
            previous.is_none(),
            "attempt {attempt_id} is held by two lease tasks"
        );
        self.joined.notify_one();
        Renewal {
            attempt_id,
            held: self.held.clone(),
            lost: receiver,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
        self.held
            .lock()
            .expect("no panic while holding the lease map")
    }

    /// When the first held lease is due; `None` when none is held.
    fn next_due(&self) -> Option<Instant> {
        self.lock().values().map(|held| held.due_at).min()
    }

    /// Tells the task of every lease past its expiry that it is lost, and returns the others.
    fn expire_and_list(&self, now: Instant) -> Vec<v1::LeaseRef> {
        let mut held = self.lock();
        let expired: Vec<String> = held
            .iter()
            .filter(|(_, lease)| lease.expires_at <= now)
            .map(|(attempt_id, _)| attempt_id.clone())
            .collect();
        for attempt_id in expired {
            let lease = held.remove(&attempt_id).expect("listed above");
            let _ = lease.lost.send(LeaseLoss::Expired);
        }
        held.values().map(|lease| lease.lease.clone()).collect()
    }

    /// Applies dispatch's answer about the lease of `attempt_id`, renewed with a request sent
    /// at `sent_at`; a lease whose task ended meanwhile is left alone.
    fn settle(
        &self,
        ctx: &Context,
        attempt_id: &str,
        sent_at: Instant,
        answer: Answer,
        interval: Duration,
    ) {
        let mut held = self.lock();
        let Some(lease) = held.get_mut(attempt_id) else {
            return;
        };
        let now = Instant::now();
        let loss = match answer {
            Answer::Renewed {
                lease_expires_in_ms,
            } => {
                lease.expires_at = sent_at + Duration::from_millis(lease_expires_in_ms.into());
                ctx.stats.add(Counter::Renewals);
                tracing::debug!(attempt_id, lease_expires_in_ms, "lease renewed");
                None
            }
            Answer::Refused(error) => match error.error_code() {
                Some(ErrorCode::LeaseLost) => Some(LeaseLoss::Lost),
                Some(ErrorCode::CancelRequested) => Some(LeaseLoss::Cancelled),
                _ => {
                    tracing::warn!(attempt_id, code = %error.code, message = %error.message, "renew refused, retrying");
                    None
                }
            },
            Answer::Unanswered => None,
        };
        match loss {
            Some(loss) => {
                let lease = held.remove(attempt_id).expect("found above");
                let _ = lease.lost.send(loss);
            }
            // Retry sooner when a failed renewal has eaten into the lease.
            None => lease.due_at = due_at(now, lease.expires_at, interval),
        }
    }
}

/// When a lease that lapses at `expires_at` is next renewed: a renew interval from `now`, or
/// halfway to its expiry when that is sooner, but never sooner than the retry minimum.
fn due_at(now: Instant, expires_at: Instant, interval: Duration) -> Instant {
    now + interval
        .min(expires_at.saturating_duration_since(now) / 2)
        .max(RENEW_RETRY_DELAY_MIN)
}

impl Renewal {
    /// Why the lease is gone; waits until it is. Cancel-safe.
    pub async fn lost(&mut self) -> LeaseLoss {
        match (&mut self.lost).await {
            Ok(loss) => loss,
            Err(_) => {
                // The renewer runs until every lease task has ended, and never panics by
                // design; without it the lease cannot be trusted either way.
                tracing::error!("lease renewer stopped unexpectedly");
                LeaseLoss::Expired
            }
        }
    }

    /// Stops renewing the lease: its task no longer needs it.
    pub fn end(&self) {
        self.held
            .lock()
            .expect("no panic while holding the lease map")
            .remove(&self.attempt_id);
    }
}

impl Drop for Renewal {
    fn drop(&mut self) {
        self.end();
    }
}

/// What dispatch said about one lease.
#[derive(Debug, Clone)]
enum Answer {
    Renewed {
        lease_expires_in_ms: u32,
    },
    Refused(v1::Error),
    /// No reply, or one this build cannot use.
    Unanswered,
}

impl Answer {
    fn of(error: Option<v1::Error>, lease_expires_in_ms: u32) -> Self {
        match error {
            None => Answer::Renewed {
                lease_expires_in_ms,
            },
            Some(error) => Answer::Refused(error),
        }
    }

    /// The lease is gone, by dispatch's word.
    fn is_loss(&self) -> bool {
        matches!(self, Answer::Refused(error) if matches!(
            error.error_code(),
            Some(ErrorCode::LeaseLost | ErrorCode::CancelRequested)
        ))
    }
}

/// Renews the session's leases until `stop`: a tick whenever the first held lease is due,
/// each tick one request for every held lease (more only past [`RENEW_LEASES_MAX`], which a
/// worker's capacity never exceeds).
pub(crate) async fn run(ctx: Arc<Context>, stop: CancellationToken) {
    let interval = ctx.session.renew_interval;
    let timeout = ctx.config.request_timeout.min(interval);
    let renewals = &ctx.renewals;
    loop {
        let next = renewals
            .next_due()
            .unwrap_or_else(|| Instant::now() + interval);
        tokio::select! {
            () = stop.cancelled() => return,
            // A lease joined: it may be due before `next`.
            () = renewals.joined.notified() => continue,
            () = tokio::time::sleep_until(next) => {}
        }
        let leases = renewals.expire_and_list(Instant::now());
        for batch in leases.chunks(RENEW_LEASES_MAX) {
            let sent_at = Instant::now();
            let answers = renew_batch(&ctx, batch, timeout).await;
            for (lease, answer) in batch.iter().zip(answers) {
                renewals.settle(&ctx, &lease.attempt_id, sent_at, answer, interval);
            }
        }
    }
}

/// Renews `leases` (1..=[`RENEW_LEASES_MAX`]) in one request; one answer per lease, in order.
async fn renew_batch(ctx: &Context, leases: &[v1::LeaseRef], timeout: Duration) -> Vec<Answer> {
    let (first, more) = leases.split_first().expect("at least one lease");
    let request = v1::RenewRequest {
        schema_version: messages::SCHEMA_VERSION,
        worker_id: ctx.worker_id.clone(),
        lease: Some(first.clone()),
        more_leases: more.to_vec(),
    };
    let reply = match ctx
        .request::<v1::RenewReply>(WorkerVerb::Renew, &request, timeout)
        .await
    {
        Ok(reply) => reply,
        Err(error) => {
            tracing::warn!(error = %telemetry::chain(&error), leases = leases.len(), "renew unanswered, retrying");
            return vec![Answer::Unanswered; leases.len()];
        }
    };
    if !reply.renewals.is_empty() {
        let answered_in_order = reply.renewals.len() == leases.len()
            && reply
                .renewals
                .iter()
                .zip(leases)
                .all(|(renewal, lease)| renewal.attempt_id == lease.attempt_id);
        if !answered_in_order {
            tracing::error!(
                leases = leases.len(),
                renewals = reply.renewals.len(),
                "dispatch answered a renew with renewals that do not match its leases, retrying"
            );
            return vec![Answer::Unanswered; leases.len()];
        }
        return reply
            .renewals
            .into_iter()
            .map(|renewal| Answer::of(renewal.error, renewal.lease_expires_in_ms))
            .collect();
    }
    // No `renewals`: the top-level fields answer `lease` alone, or refuse the whole request.
    let first_answer = Answer::of(reply.error, reply.lease_expires_in_ms);
    if more.is_empty() {
        return vec![first_answer];
    }
    if matches!(first_answer, Answer::Refused(_)) && !first_answer.is_loss() {
        // The request as a whole was refused (or failed): every lease retries.
        return vec![first_answer; leases.len()];
    }
    // A dispatch that predates the batch renewed (or refused) `lease` and ignored the rest.
    tracing::debug!(
        leases = more.len(),
        "dispatch renews one lease per request, renewing the rest one by one"
    );
    let requests: Vec<_> = more
        .iter()
        .map(|lease| renew_one(ctx, lease, timeout))
        .collect();
    let rest: Vec<Answer> = futures::stream::iter(requests)
        .buffered(RENEW_FALLBACK_REQUESTS_MAX)
        .collect()
        .await;
    std::iter::once(first_answer).chain(rest).collect()
}

/// Renews one lease with the single renew every dispatch understands.
async fn renew_one(ctx: &Context, lease: &v1::LeaseRef, timeout: Duration) -> Answer {
    let request = v1::RenewRequest {
        schema_version: messages::SCHEMA_VERSION,
        worker_id: ctx.worker_id.clone(),
        lease: Some(lease.clone()),
        more_leases: Vec::new(),
    };
    match ctx
        .request::<v1::RenewReply>(WorkerVerb::Renew, &request, timeout)
        .await
    {
        Ok(reply) => Answer::of(reply.error, reply.lease_expires_in_ms),
        Err(error) => {
            tracing::warn!(attempt_id = %lease.attempt_id, error = %telemetry::chain(&error), "renew unanswered, retrying");
            Answer::Unanswered
        }
    }
}
