//! Counters of what a worker did, readable while it runs (for demos, tests and metrics).

use std::sync::atomic::{AtomicU64, Ordering};

/// Monotonic counters, shared between the worker and whoever holds [`crate::Worker::stats`].
#[derive(Debug, Default)]
pub struct WorkerStats {
    leases_acquired: AtomicU64,
    leases_running: AtomicU64,
    completed: AtomicU64,
    failed: AtomicU64,
    lost: AtomicU64,
    released: AtomicU64,
    abandoned: AtomicU64,
    batches_sent: AtomicU64,
    batches_resent: AtomicU64,
    renewals: AtomicU64,
    quota_refused: AtomicU64,
}

/// The counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Leases dispatch granted this worker.
    pub leases_acquired: u64,
    /// Leases being worked on now.
    pub leases_running: u64,
    /// Attempts ingestion accepted as complete.
    pub completed: u64,
    /// Attempts ingestion accepted as failed (plugin error or deadline).
    pub failed: u64,
    /// Attempts stopped because the lease was lost, expired or cancelled.
    pub lost: u64,
    /// Leases handed back on shutdown.
    pub released: u64,
    /// Attempts given up because ingestion never acknowledged or refused them as a bug;
    /// their leases expire and the reaper retries them.
    pub abandoned: u64,
    /// Result batches published (first sends).
    pub batches_sent: u64,
    /// Result batches, completions and failures sent again for want of an acknowledgement.
    pub batches_resent: u64,
    /// Successful lease renewals.
    pub renewals: u64,
    /// Publishes JetStream refused because this worker's results waiting for ingestion were at
    /// their quota (`PALISADE_QUOTA_RESULTS_WAITING`): each is published again.
    pub quota_refused: u64,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Counter {
    LeasesAcquired,
    Completed,
    Failed,
    Lost,
    Released,
    Abandoned,
    BatchesSent,
    BatchesResent,
    Renewals,
    QuotaRefused,
}

impl WorkerStats {
    pub fn snapshot(&self) -> StatsSnapshot {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        StatsSnapshot {
            leases_acquired: read(&self.leases_acquired),
            leases_running: read(&self.leases_running),
            completed: read(&self.completed),
            failed: read(&self.failed),
            lost: read(&self.lost),
            released: read(&self.released),
            abandoned: read(&self.abandoned),
            batches_sent: read(&self.batches_sent),
            batches_resent: read(&self.batches_resent),
            renewals: read(&self.renewals),
            quota_refused: read(&self.quota_refused),
        }
    }

    pub(crate) fn add(&self, counter: Counter) {
        let counter = match counter {
            Counter::LeasesAcquired => &self.leases_acquired,
            Counter::Completed => &self.completed,
            Counter::Failed => &self.failed,
            Counter::Lost => &self.lost,
            Counter::Released => &self.released,
            Counter::Abandoned => &self.abandoned,
            Counter::BatchesSent => &self.batches_sent,
            Counter::BatchesResent => &self.batches_resent,
            Counter::Renewals => &self.renewals,
            Counter::QuotaRefused => &self.quota_refused,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a lease as running until the returned guard drops.
    pub(crate) fn running(&self) -> RunningGuard<'_> {
        self.leases_running.fetch_add(1, Ordering::Relaxed);
        RunningGuard { stats: self }
    }
}

pub(crate) struct RunningGuard<'a> {
    stats: &'a WorkerStats,
}

impl Drop for RunningGuard<'_> {
    fn drop(&mut self) {
        self.stats.leases_running.fetch_sub(1, Ordering::Relaxed);
    }
}
