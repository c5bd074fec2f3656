//! Serving terms (ADR-117 §2): campaign, run the work while the lease is held, renew, and step
//! down fail-closed before the store could hand the lease to a successor.
//!
//! Every local deadline is measured on the monotonic clock from the instant a request was
//! sent, never from when its answer arrived: the store computed the expiry from a `now` read
//! just before sending, so the lease cannot lapse before `sent + ttl`. The holder trusts it only
//! until `sent + ttl − ttl/6`, keeping TTL/6 for clock skew between replicas and for the work
//! to stop.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::{JoinError, JoinHandle};
use tokio::time::{Instant, sleep_until, timeout, timeout_at};
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};
use tracing::Instrument as _;

use crate::{Clock, LeaseError, Release, Renewal, Store, TTL_MAX, Term};

/// How a lease is held: its TTL and how often a non-holder campaigns.
///
/// Everything else derives from the TTL: an acquire or release is given TTL/3 to answer, the
/// holder renews every TTL/3, and it trusts a proven renewal for TTL − TTL/6.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunConfig {
    ttl: Duration,
    retry: Duration,
}

impl RunConfig {
    /// SPEC §5: a 30 s lease, renewed every 10 s.
    pub const TTL_DEFAULT: Duration = Duration::from_secs(30);
    /// A clean stop hands the lease over within one retry interval.
    pub const RETRY_DEFAULT: Duration = Duration::from_secs(5);
    /// The TTL/6 margin must dwarf the stores' millisecond precision and timer granularity.
    pub const TTL_MIN: Duration = Duration::from_millis(120);

    /// Checks the bounds once, so [`run`] never meets a configuration it cannot serve.
    pub fn new(ttl: Duration, retry: Duration) -> Result<Self, LeaseError> {
        if !(Self::TTL_MIN..=TTL_MAX).contains(&ttl) {
            return Err(LeaseError::InvalidTtl {
                ttl,
                min: Self::TTL_MIN,
                max: TTL_MAX,
            });
        }
        if retry.is_zero() || retry > TTL_MAX {
            return Err(LeaseError::InvalidRetry {
                retry,
                max: TTL_MAX,
            });
        }
        Ok(Self { ttl, retry })
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    pub fn retry(&self) -> Duration {
        self.retry
    }

    /// How long an acquire or a release may take. Never the retry interval: an attempt that
    /// outlived a third of the TTL would leave too little of the term it might win.
    fn answer_timeout(&self) -> Duration {
        self.ttl / 3
    }

    fn renew_interval(&self) -> Duration {
        self.ttl / 3
    }

    /// How long after sending a proven request the holder still acts on it.
    fn trust_window(&self) -> Duration {
        self.ttl - self.ttl / 6
    }

    /// The pause before retrying a renewal that failed (not refused): about three more tries
    /// fit between the scheduled renewal and the end of the trust window.
    fn renew_retry_interval(&self) -> Duration {
        self.ttl / 12
    }

    /// How long past the trust window a stepping-down term waits for its work before aborting
    /// it: half the margin, so the work is gone before the lease can pass on.
    fn stop_grace(&self) -> Duration {
        self.ttl / 12
    }
}

impl Default for RunConfig {
    fn default() -> Self {
        Self::new(Self::TTL_DEFAULT, Self::RETRY_DEFAULT).expect("defaults are in range")
    }
}

/// What the work of one term is given: the term as won, and a token that is cancelled when
/// the term ends (refused or unproven renewal, or shutdown). The work must stop promptly then;
/// work still running when the lease could pass on is aborted.
#[derive(Debug, Clone)]
pub struct TermGuard {
    term: Term,
    token: CancellationToken,
}

impl TermGuard {
    /// The term as acquired: `started_at` tells a fresh term from a sticky one.
    pub fn term(&self) -> &Term {
        &self.term
    }

    /// Completes when the term ends.
    pub fn ended(&self) -> WaitForCancellationFuture<'_> {
        self.token.cancelled()
    }

    pub fn is_ended(&self) -> bool {
        self.token.is_cancelled()
    }

    /// The term's token, to hand to tasks the work spawns (child tokens end with it).
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }
}

/// One candidate for one lease name, observable while it runs.
pub struct Election<S, C> {
    store: S,
    clock: C,
    name: String,
    owner: String,
    config: RunConfig,
    is_leader: watch::Sender<bool>,
}

impl<S: Store, C: Clock> Election<S, C> {
    pub fn new(
        store: S,
        clock: C,
        name: impl Into<String>,
        owner: impl Into<String>,
        config: RunConfig,
    ) -> Self {
        Self {
            store,
            clock,
            name: name.into(),
            owner: owner.into(),
            config,
            is_leader: watch::Sender::new(false),
        }
    }

    /// True from just before the work of a term starts until just after it stopped.
    pub fn watch(&self) -> watch::Receiver<bool> {
        self.is_leader.subscribe()
    }

    /// Campaigns and serves terms until `shutdown` is cancelled; see [`run`].
    pub async fn run<F, Fut>(self, mut work: F, shutdown: CancellationToken)
    where
        F: FnMut(TermGuard) -> Fut + Send,
        Fut: Future<Output = ()> + Send + 'static,
    {
        // Names the lease and owner in every log line of the campaign and its terms; never
        // exported (it lives as long as the process): what a term does starts traces of its own.
        let span = tracing::info_span!(target: telemetry::UNTRACED, "lease", lease = %self.name, owner = %self.owner);
        self.campaign(&mut work, &shutdown).instrument(span).await;
    }

    /// One acquire attempt per retry interval; a won attempt is served before the next.
    async fn campaign<F, Fut>(&self, work: &mut F, shutdown: &CancellationToken)
    where
        F: FnMut(TermGuard) -> Fut + Send,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let mut store_failing = false;
        // Bounded by `shutdown`: each pass waits a retry interval or serves a term.
        loop {
            let sent = Instant::now();
            let mut next_attempt = sent + self.config.retry;
            match self.attempt(shutdown).await {
                Attempt::Won(term) => {
                    if std::mem::take(&mut store_failing) {
                        tracing::info!("lease store answers again");
                    }
                    if shutdown.is_cancelled() {
                        self.release(shutdown).await;
                        return;
                    }
                    if self.serve(term, sent, work, shutdown).await == TermEnd::Shutdown {
                        return;
                    }
                    // Campaign again one retry interval after stepping down, so a replica
                    // already campaigning gets the lease this one released.
                    next_attempt = Instant::now() + self.config.retry;
                }
                Attempt::Held => {
                    if std::mem::take(&mut store_failing) {
                        tracing::info!("lease store answers again");
                    }
                }
                Attempt::Failed(error) => {
                    if !std::mem::replace(&mut store_failing, true) {
                        tracing::warn!(error = %telemetry::chain(&error), "lease store failed; nobody is elected here until it answers");
                    }
                }
                Attempt::Shutdown => return,
            }
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                () = sleep_until(next_attempt) => {}
            }
        }
    }

    /// One acquire, bounded by TTL/3. An attempt left unanswered (timed out or cut short by
    /// shutdown) may still have landed, so it is followed by a release.
    async fn attempt(&self, shutdown: &CancellationToken) -> Attempt {
        let now = self.clock.now();
        let acquire = self
            .store
            .acquire(&self.name, &self.owner, now, self.config.ttl);
        let answered = tokio::select! {
            biased;
            () = shutdown.cancelled() => None,
            answered = timeout(self.config.answer_timeout(), acquire) => Some(answered),
        };
        match answered {
            None => {
                self.release(shutdown).await;
                Attempt::Shutdown
            }
            Some(Err(_elapsed)) => {
                self.release(shutdown).await;
                Attempt::Failed(LeaseError::Store(
                    format!(
                        "acquire unanswered within {:?}",
                        self.config.answer_timeout()
                    )
                    .into(),
                ))
            }
            Some(Ok(Err(error))) => Attempt::Failed(error),
            Some(Ok(Ok(None))) => Attempt::Held,
            Some(Ok(Ok(Some(term)))) => {
                assert_eq!(term.name, self.name, "the store granted another lease");
                assert_eq!(term.owner, self.owner, "the store granted another owner");
                Attempt::Won(term)
            }
        }
    }

    /// Runs the work of a won term, renewing, until the term ends; then stops the work and
    /// releases the lease unless the store already refused it.
    async fn serve<F, Fut>(
        &self,
        term: Term,
        acquire_sent: Instant,
        work: &mut F,
        shutdown: &CancellationToken,
    ) -> TermEnd
    where
        F: FnMut(TermGuard) -> Fut + Send,
        Fut: Future<Output = ()> + Send + 'static,
    {
        tracing::info!(
            term_started_at = %term.started_at,
            expires_at = %term.expires_at,
            "won lease"
        );
        let token = shutdown.child_token();
        self.is_leader.send_replace(true);
        let mut handle = tokio::spawn(work(TermGuard {
            term,
            token: token.clone(),
        }));
        let mut trusted_until = acquire_sent + self.config.trust_window();
        let (end, joined) = self
            .hold(&mut handle, acquire_sent, &mut trusted_until, shutdown)
            .await;
        token.cancel();
        let joined = match joined {
            Some(joined) => joined,
            None => self.stop(handle, trusted_until).await,
        };
        self.is_leader.send_replace(false);
        if let Err(error) = joined
            && error.is_panic()
        {
            tracing::error!(error = %telemetry::chain(&error), "lease work panicked");
        }
        match end {
            TermEnd::Shutdown => tracing::info!("stepped down: shutting down"),
            TermEnd::WorkReturned => tracing::info!("stepped down: the work returned"),
            TermEnd::Refused => tracing::warn!("lost lease: renewal refused"),
            TermEnd::Unproven => tracing::warn!(
                trust_window = ?self.config.trust_window(),
                "stepped down: no renewal proven within the trust window"
            ),
        }
        if end != TermEnd::Refused {
            self.release(shutdown).await;
        }
        end
    }

    /// Renews every TTL/3 while the work runs, moving `trusted_until` with each proven
    /// renewal; returns why the term ended, with the work's result when it ended by returning.
    async fn hold(
        &self,
        handle: &mut JoinHandle<()>,
        acquire_sent: Instant,
        trusted_until: &mut Instant,
        shutdown: &CancellationToken,
    ) -> (TermEnd, Option<Result<(), JoinError>>) {
        let mut next_renewal = acquire_sent + self.config.renew_interval();
        let mut renewal_failing = false;
        // Bounded by the trust window: a pass either proves a renewal, which moves it, or
        // waits a renew retry interval that brings the end of the window closer.
        loop {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return (TermEnd::Shutdown, None),
                joined = &mut *handle => return (TermEnd::WorkReturned, Some(joined)),
                () = sleep_until(*trusted_until) => return (TermEnd::Unproven, None),
                () = sleep_until(next_renewal) => {}
            }
            let sent = Instant::now();
            let now = self.clock.now();
            let renew = self
                .store
                .renew(&self.name, &self.owner, now, self.config.ttl);
            // An answer after the trust window proves nothing: the term has ended by then.
            let answered = tokio::select! {
                biased;
                () = shutdown.cancelled() => return (TermEnd::Shutdown, None),
                joined = &mut *handle => return (TermEnd::WorkReturned, Some(joined)),
                answered = timeout_at(*trusted_until, renew) => answered,
            };
            match answered {
                Err(_elapsed) => return (TermEnd::Unproven, None),
                Ok(Ok(Renewal::Refused)) => return (TermEnd::Refused, None),
                Ok(Ok(Renewal::Renewed { .. })) => {
                    if std::mem::take(&mut renewal_failing) {
                        tracing::info!("lease renewed again");
                    }
                    *trusted_until = sent + self.config.trust_window();
                    next_renewal = sent + self.config.renew_interval();
                }
                Ok(Err(error)) => {
                    if !std::mem::replace(&mut renewal_failing, true) {
                        tracing::warn!(error = %telemetry::chain(&error), "lease renewal failed; retrying within the trust window");
                    }
                    next_renewal = Instant::now() + self.config.renew_retry_interval();
                }
            }
        }
    }

    /// Waits for the cancelled work until just past the trust window, then aborts it, so it
    /// never acts once the lease could belong to another.
    async fn stop(
        &self,
        mut handle: JoinHandle<()>,
        trusted_until: Instant,
    ) -> Result<(), JoinError> {
        let stop_by = trusted_until.max(Instant::now()) + self.config.stop_grace();
        match timeout_at(stop_by, &mut handle).await {
            Ok(joined) => joined,
            Err(_elapsed) => {
                tracing::warn!("lease work ignored its cancellation; aborting it");
                handle.abort();
                handle.await
            }
        }
    }

    /// Gives the lease up so the next holder need not wait for the expiry. Waits for the
    /// answer, however long, until `shutdown` (then TTL/3 more at most): the next acquire must
    /// not be sent while this release could still land and delete the lease it wins. A release
    /// that fails leaves the lease to expire.
    async fn release(&self, shutdown: &CancellationToken) {
        let now = self.clock.now();
        let release = self.store.release(&self.name, &self.owner, now);
        tokio::pin!(release);
        let answered = tokio::select! {
            biased;
            answered = &mut release => Ok(answered),
            () = shutdown.cancelled() => timeout(self.config.answer_timeout(), release).await,
        };
        match answered {
            Ok(Ok(Release::Released)) => tracing::info!("released lease"),
            Ok(Ok(Release::Lost)) => {}
            Ok(Err(error)) => {
                tracing::warn!(error = %telemetry::chain(&error), "failed to release lease; it expires on its own")
            }
            Err(_elapsed) => {
                tracing::warn!("lease release unanswered at shutdown; it expires on its own")
            }
        }
    }
}

/// Campaigns for `name` as `owner` and runs `work` during each term won, until `shutdown` is
/// cancelled (ADR-117 §2). Use [`Election`] to watch leadership while it runs.
///
/// - A non-holder tries to acquire every `config.retry()`, each attempt bounded by TTL/3; an
///   unanswered attempt is followed by a release, because its write may have landed.
/// - A store error elects nobody: the work does not start.
/// - The holder renews every TTL/3. The term ends when a renewal is refused, or when none has
///   been proven within TTL − TTL/6 of being sent; the work's token is cancelled and the work
///   awaited (aborted if it is still running when the lease could pass on).
/// - When the work returns, or on shutdown, the lease is released on the way out, so a rolling
///   restart hands over within one retry interval. After a term ends without shutdown the
///   candidate campaigns again one retry interval later.
pub async fn run<S, C, F, Fut>(
    store: S,
    clock: C,
    name: &str,
    owner: &str,
    config: RunConfig,
    work: F,
    shutdown: CancellationToken,
) where
    S: Store,
    C: Clock,
    F: FnMut(TermGuard) -> Fut + Send,
    Fut: Future<Output = ()> + Send + 'static,
{
    Election::new(store, clock, name, owner, config)
        .run(work, shutdown)
        .await;
}

/// The outcome of one acquire attempt.
enum Attempt {
    Won(Term),
    Held,
    Failed(LeaseError),
    Shutdown,
}

/// Why a term ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TermEnd {
    Shutdown,
    WorkReturned,
    Refused,
    Unproven,
}

#[cfg(test)]
mod tests;
