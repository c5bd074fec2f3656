//! Tests of `run` on the in-memory store, behind a wrapper that injects refusals, errors and
//! lost or late answers, with tokio's clock paused so every deadline is exact.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use chrono::{DateTime, TimeDelta, Utc};
use tokio::time::sleep;

use super::*;
use crate::MemoryStore;

const TTL: Duration = Duration::from_secs(30);
const RETRY: Duration = Duration::from_secs(5);
const NAME: &str = "test-lease";

fn config() -> RunConfig {
    RunConfig::new(TTL, RETRY).unwrap()
}

/// A wall clock that follows tokio's paused clock, so leases expire as test time passes.
#[derive(Debug, Clone)]
struct TestClock {
    wall_start: DateTime<Utc>,
    start: Instant,
}

impl TestClock {
    fn new() -> Self {
        Self {
            wall_start: DateTime::from_timestamp(1_800_000_000, 0).unwrap(),
            start: Instant::now(),
        }
    }

    fn wall_at(&self, at: Instant) -> DateTime<Utc> {
        self.wall_start + TimeDelta::from_std(at - self.start).unwrap()
    }
}

impl Clock for TestClock {
    fn now(&self) -> DateTime<Utc> {
        self.wall_at(Instant::now())
    }
}

/// A [`MemoryStore`] whose answers a test can refuse, fail, lose or delay.
#[derive(Clone, Default)]
struct FaultyStore {
    inner: MemoryStore,
    faults: Arc<Faults>,
}

#[derive(Default)]
struct Faults {
    /// Acquires fail before reaching the store.
    acquire_fails: AtomicBool,
    /// Acquires land in the store but their answer never comes.
    acquire_unanswered: AtomicBool,
    /// Renewals are refused without reaching the store.
    renew_refused: AtomicBool,
    /// Renewals neither land nor answer.
    renew_hangs: AtomicBool,
    /// Random delays, errors and lost answers on every operation.
    chaos: Mutex<Option<Chaos>>,
    acquires: watch::Sender<usize>,
    /// What each release that reached the store found.
    releases: watch::Sender<Vec<Release>>,
}

/// What chaos does to one operation.
#[derive(Debug, Default)]
struct Mischief {
    delay_before: Duration,
    fail: bool,
    delay_after: Duration,
}

/// A seeded xorshift generator, so a failing chaos run can be replayed.
#[derive(Debug)]
struct Chaos {
    state: u64,
}

impl Chaos {
    fn next(&mut self) -> u64 {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        self.state
    }

    fn percent(&mut self, chance: u64) -> bool {
        self.next() % 100 < chance
    }

    fn up_to(&mut self, max: Duration) -> Duration {
        Duration::from_millis(self.next() % u64::try_from(max.as_millis()).unwrap())
    }

    fn mischief(&mut self) -> Mischief {
        Mischief {
            delay_before: if self.percent(15) {
                self.up_to(TTL)
            } else {
                Duration::ZERO
            },
            fail: self.percent(10),
            delay_after: if self.percent(15) {
                self.up_to(TTL)
            } else {
                Duration::ZERO
            },
        }
    }
}

fn injected() -> LeaseError {
    LeaseError::Store("injected failure".into())
}

impl FaultyStore {
    fn mischief(&self) -> Mischief {
        let mut chaos = self
            .faults
            .chaos
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        chaos.as_mut().map(Chaos::mischief).unwrap_or_default()
    }

    fn set(flag: &AtomicBool, on: bool) {
        flag.store(on, Ordering::SeqCst);
    }
}

impl Store for FaultyStore {
    async fn acquire(
        &self,
        name: &str,
        owner: &str,
        now: DateTime<Utc>,
        ttl: Duration,
    ) -> Result<Option<Term>, LeaseError> {
        self.faults.acquires.send_modify(|count| *count += 1);
        let mischief = self.mischief();
        let fail = mischief.fail || self.faults.acquire_fails.load(Ordering::SeqCst);
        let (inner, name, owner) = (self.inner.clone(), name.to_owned(), owner.to_owned());
        let acquired = land(mischief.delay_before, fail, async move {
            inner.acquire(&name, &owner, now, ttl).await
        })
        .await;
        if self.faults.acquire_unanswered.load(Ordering::SeqCst) {
            return std::future::pending().await;
        }
        sleep(mischief.delay_after).await;
        acquired
    }

    async fn renew(
        &self,
        name: &str,
        owner: &str,
        now: DateTime<Utc>,
        ttl: Duration,
    ) -> Result<Renewal, LeaseError> {
        if self.faults.renew_hangs.load(Ordering::SeqCst) {
            return std::future::pending().await;
        }
        if self.faults.renew_refused.load(Ordering::SeqCst) {
            return Ok(Renewal::Refused);
        }
        let mischief = self.mischief();
        let (inner, name, owner) = (self.inner.clone(), name.to_owned(), owner.to_owned());
        let renewed = land(mischief.delay_before, mischief.fail, async move {
            inner.renew(&name, &owner, now, ttl).await
        })
        .await;
        sleep(mischief.delay_after).await;
        renewed
    }

    async fn release(
        &self,
        name: &str,
        owner: &str,
        now: DateTime<Utc>,
    ) -> Result<Release, LeaseError> {
        let mischief = self.mischief();
        let (inner, faults) = (self.inner.clone(), self.faults.clone());
        let (name, owner) = (name.to_owned(), owner.to_owned());
        let released = land(mischief.delay_before, mischief.fail, async move {
            let released = inner.release(&name, &owner, now).await;
            if let Ok(outcome) = released {
                faults
                    .releases
                    .send_modify(|outcomes| outcomes.push(outcome));
            }
            released
        })
        .await;
        sleep(mischief.delay_after).await;
        released
    }
}

/// Sends `operation` on its way: after `delay` it fails or lands in the store, whether or not
/// the caller still waits for the answer, as a statement already sent to PostgreSQL does.
async fn land<T: Send + 'static>(
    delay: Duration,
    fail: bool,
    operation: impl Future<Output = Result<T, LeaseError>> + Send + 'static,
) -> Result<T, LeaseError> {
    let landing = tokio::spawn(async move {
        sleep(delay).await;
        if fail {
            return Err(injected());
        }
        operation.await
    });
    landing.await.expect("the landing task does not panic")
}

/// Counts the works running at once, over every candidate sharing it.
#[derive(Debug, Clone, Default)]
struct Holders {
    running: Arc<AtomicUsize>,
    running_max: Arc<AtomicUsize>,
    terms: Arc<AtomicUsize>,
}

impl Holders {
    fn enter(&self) {
        let running = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.running_max.fetch_max(running, Ordering::SeqCst);
        self.terms.fetch_add(1, Ordering::SeqCst);
    }

    fn leave(&self) {
        self.running.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A work that holds until its term ends, counted in `holders`.
fn counted_work(holders: Holders) -> impl FnMut(TermGuard) -> BoxedWork + Send {
    move |guard| {
        let holders = holders.clone();
        Box::pin(async move {
            holders.enter();
            guard.ended().await;
            holders.leave();
        })
    }
}

type BoxedWork = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// A candidate running in its own task, with its leadership watch and shutdown token.
struct Candidate {
    is_leader: watch::Receiver<bool>,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

impl Candidate {
    fn spawn<F, Fut>(store: FaultyStore, clock: TestClock, owner: &str, work: F) -> Self
    where
        F: FnMut(TermGuard) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let election = Election::new(store, clock, NAME, owner, config());
        let is_leader = election.watch();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(election.run(work, shutdown.clone()));
        Self {
            is_leader,
            shutdown,
            task,
        }
    }

    async fn wait_leader(&mut self, leader: bool) -> Instant {
        self.is_leader
            .wait_for(|is_leader| *is_leader == leader)
            .await
            .unwrap();
        Instant::now()
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.unwrap();
    }
}

#[test]
fn config_is_validated() {
    assert!(matches!(
        RunConfig::new(RunConfig::TTL_MIN - Duration::from_millis(1), RETRY),
        Err(LeaseError::InvalidTtl { .. })
    ));
    assert!(matches!(
        RunConfig::new(TTL_MAX + Duration::from_millis(1), RETRY),
        Err(LeaseError::InvalidTtl { .. })
    ));
    assert!(matches!(
        RunConfig::new(TTL, Duration::ZERO),
        Err(LeaseError::InvalidRetry { .. })
    ));
    let config = RunConfig::default();
    assert_eq!(config.ttl(), Duration::from_secs(30));
    assert_eq!(config.renew_interval(), Duration::from_secs(10));
    assert_eq!(config.answer_timeout(), Duration::from_secs(10));
    assert_eq!(config.trust_window(), Duration::from_secs(25));
    assert!(config.stop_grace() < config.ttl() - config.trust_window());
}

#[test]
fn run_is_send() {
    fn assert_send<T: Send>(_: &T) {}
    let shutdown = CancellationToken::new();
    let running = run(
        MemoryStore::new(),
        crate::SystemClock,
        NAME,
        "owner",
        config(),
        |guard: TermGuard| async move { guard.ended().await },
        shutdown,
    );
    assert_send(&running);
}

#[tokio::test(start_paused = true)]
async fn wins_a_free_lease_renews_it_and_releases_it_at_shutdown() {
    let (store, clock) = (FaultyStore::default(), TestClock::new());
    let holders = Holders::default();
    let mut candidate = Candidate::spawn(
        store.clone(),
        clock.clone(),
        "a",
        counted_work(holders.clone()),
    );
    let won_at = candidate.wait_leader(true).await;
    assert_eq!(holders.running.load(Ordering::SeqCst), 1);
    // Held across many renewals with the same term.
    sleep(TTL * 4).await;
    assert!(*candidate.is_leader.borrow());
    assert_eq!(holders.terms.load(Ordering::SeqCst), 1);
    let sticky = store
        .inner
        .acquire(NAME, "a", clock.now(), TTL)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(sticky.started_at, clock.wall_at(won_at));

    candidate.stop().await;
    assert_eq!(holders.running.load(Ordering::SeqCst), 0);
    let taken = store.inner.acquire(NAME, "b", clock.now(), TTL).await;
    assert!(
        taken.unwrap().is_some(),
        "the lease was released at shutdown"
    );
}

#[tokio::test(start_paused = true)]
async fn steps_down_when_a_renewal_is_refused() {
    let (store, clock) = (FaultyStore::default(), TestClock::new());
    let holders = Holders::default();
    let mut candidate = Candidate::spawn(
        store.clone(),
        clock.clone(),
        "a",
        counted_work(holders.clone()),
    );
    let won_at = candidate.wait_leader(true).await;
    FaultyStore::set(&store.faults.renew_refused, true);
    let stepped_down_at = candidate.wait_leader(false).await;
    assert_eq!(
        stepped_down_at - won_at,
        config().renew_interval(),
        "the first refused renewal ends the term"
    );
    assert_eq!(holders.running.load(Ordering::SeqCst), 0);
    assert!(
        store.faults.releases.borrow().is_empty(),
        "a refused lease is not released"
    );
    candidate.stop().await;
}

#[tokio::test(start_paused = true)]
async fn steps_down_before_the_lease_can_pass_when_renewals_hang() {
    let (store, clock) = (FaultyStore::default(), TestClock::new());
    let won = Arc::new(Mutex::new(None));
    let mut candidate = Candidate::spawn(store.clone(), clock.clone(), "a", {
        let won = won.clone();
        move |guard: TermGuard| {
            *won.lock().unwrap() = Some(guard.term().clone());
            async move { guard.ended().await }
        }
    });
    let won_at = candidate.wait_leader(true).await;
    FaultyStore::set(&store.faults.renew_hangs, true);
    let stepped_down_at = candidate.wait_leader(false).await;
    assert_eq!(
        stepped_down_at - won_at,
        TTL - TTL / 6,
        "no renewal proven within TTL - TTL/6 of the acquire being sent"
    );
    // No renewal landed, so the store's expiry is still the acquired one.
    let term = won.lock().unwrap().clone().expect("a term was won");
    assert!(
        clock.wall_at(stepped_down_at) < term.expires_at,
        "stepped down at {} for a lease expiring at {}",
        clock.wall_at(stepped_down_at),
        term.expires_at
    );
    candidate.stop().await;
}

#[tokio::test(start_paused = true)]
async fn work_that_ignores_its_cancellation_is_aborted_before_the_lease_can_pass() {
    let (store, clock) = (FaultyStore::default(), TestClock::new());
    let dropped_at = Arc::new(Mutex::new(None));
    let mut candidate = Candidate::spawn(store.clone(), clock.clone(), "a", {
        let dropped_at = dropped_at.clone();
        move |_guard: TermGuard| {
            let stopped = RecordDrop(dropped_at.clone());
            async move {
                let _stopped = stopped;
                std::future::pending::<()>().await;
            }
        }
    });
    let won_at = candidate.wait_leader(true).await;
    FaultyStore::set(&store.faults.renew_hangs, true);
    candidate.wait_leader(false).await;
    let dropped_at = dropped_at.lock().unwrap().expect("the work was aborted");
    assert!(
        dropped_at <= won_at + TTL - TTL / 12,
        "aborted {:?} after winning",
        dropped_at - won_at
    );
    candidate.stop().await;
}

/// Records when it is dropped: when an aborted work's future goes away.
struct RecordDrop(Arc<Mutex<Option<Instant>>>);

impl Drop for RecordDrop {
    fn drop(&mut self) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    }
}

#[tokio::test(start_paused = true)]
async fn an_unanswered_acquire_is_followed_by_a_release() {
    let (store, clock) = (FaultyStore::default(), TestClock::new());
    FaultyStore::set(&store.faults.acquire_unanswered, true);
    let holders = Holders::default();
    let candidate = Candidate::spawn(
        store.clone(),
        clock.clone(),
        "a",
        counted_work(holders.clone()),
    );
    let mut releases = store.faults.releases.subscribe();
    // Copied out: holding the watch's read guard would block the candidate's next release.
    let releases = releases
        .wait_for(|outcomes| !outcomes.is_empty())
        .await
        .unwrap()
        .clone();
    assert_eq!(
        releases[0],
        Release::Released,
        "the acquire that landed unanswered was released"
    );
    assert_eq!(holders.terms.load(Ordering::SeqCst), 0);
    candidate.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_failing_store_elects_nobody_until_it_answers() {
    let (store, clock) = (FaultyStore::default(), TestClock::new());
    FaultyStore::set(&store.faults.acquire_fails, true);
    let holders = Holders::default();
    let mut candidate = Candidate::spawn(
        store.clone(),
        clock.clone(),
        "a",
        counted_work(holders.clone()),
    );
    let mut acquires = store.faults.acquires.subscribe();
    acquires.wait_for(|count| *count >= 5).await.unwrap();
    assert_eq!(holders.terms.load(Ordering::SeqCst), 0);
    assert!(!*candidate.is_leader.borrow());

    let healed_at = Instant::now();
    FaultyStore::set(&store.faults.acquire_fails, false);
    let won_at = candidate.wait_leader(true).await;
    assert!(won_at - healed_at <= RETRY);
    candidate.stop().await;
}

#[tokio::test(start_paused = true)]
async fn hands_over_within_one_retry_interval_after_shutdown() {
    let (store, clock) = (FaultyStore::default(), TestClock::new());
    let holders = Holders::default();
    let mut first = Candidate::spawn(
        store.clone(),
        clock.clone(),
        "a",
        counted_work(holders.clone()),
    );
    first.wait_leader(true).await;
    let mut second = Candidate::spawn(
        store.clone(),
        clock.clone(),
        "b",
        counted_work(holders.clone()),
    );
    // Let the second candidate campaign and lose a few times.
    let mut acquires = store.faults.acquires.subscribe();
    acquires.wait_for(|count| *count >= 4).await.unwrap();
    assert!(!*second.is_leader.borrow());

    let stopped_at = Instant::now();
    first.stop().await;
    let won_at = second.wait_leader(true).await;
    assert!(
        won_at - stopped_at <= RETRY,
        "took over after {:?}",
        won_at - stopped_at
    );
    assert_eq!(holders.running_max.load(Ordering::SeqCst), 1);
    second.stop().await;
}

#[tokio::test(start_paused = true)]
async fn work_that_returns_releases_the_lease_and_campaigns_again() {
    let (store, clock) = (FaultyStore::default(), TestClock::new());
    let terms = Arc::new(AtomicUsize::new(0));
    let mut candidate = Candidate::spawn(store.clone(), clock.clone(), "a", {
        let terms = terms.clone();
        move |guard: TermGuard| {
            let term = terms.fetch_add(1, Ordering::SeqCst);
            async move {
                if term > 0 {
                    guard.ended().await;
                }
            }
        }
    });
    let mut releases = store.faults.releases.subscribe();
    releases
        .wait_for(|outcomes| outcomes == &[Release::Released])
        .await
        .unwrap();
    let released_at = Instant::now();
    let won_again_at = candidate.wait_leader(true).await;
    assert_eq!(terms.load(Ordering::SeqCst), 2);
    assert_eq!(won_again_at - released_at, RETRY);
    candidate.stop().await;
}

/// I9 on the work: under random delays, errors, lost answers and refusals, and works that
/// sometimes return, no two candidates ever run their work at once.
#[tokio::test(start_paused = true)]
async fn work_never_runs_in_two_candidates_at_once() {
    const CANDIDATES: usize = 3;
    const SIMULATED: Duration = Duration::from_secs(48 * 60 * 60);
    let (store, clock) = (FaultyStore::default(), TestClock::new());
    *store.faults.chaos.lock().unwrap() = Some(Chaos {
        state: 0x9e37_79b9_7f4a_7c15,
    });
    let holders = Holders::default();
    let candidates: Vec<_> = (0..CANDIDATES)
        .map(|index| {
            let holders = holders.clone();
            Candidate::spawn(
                store.clone(),
                clock.clone(),
                &format!("owner-{index}"),
                move |guard: TermGuard| {
                    let holders = holders.clone();
                    // Every third term's work returns on its own after a while.
                    let returns_early = holders.terms.load(Ordering::SeqCst) % 3 == 0;
                    async move {
                        holders.enter();
                        tokio::select! {
                            () = guard.ended() => {}
                            () = sleep(TTL * 2), if returns_early => {}
                        }
                        holders.leave();
                    }
                },
            )
        })
        .collect();
    sleep(SIMULATED).await;
    for candidate in candidates {
        candidate.stop().await;
    }
    let terms = holders.terms.load(Ordering::SeqCst);
    assert!(
        terms >= 50,
        "only {terms} terms: chaos too mild to prove much"
    );
    assert_eq!(holders.running_max.load(Ordering::SeqCst), 1);
    assert_eq!(holders.running.load(Ordering::SeqCst), 0);
}
