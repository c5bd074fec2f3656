//! Wall clocks for lease decisions: the system's, and a manual one tests set and advance.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

/// The wall clock whose `now` a lease operation is decided with. Replicas' clocks must agree
/// to well within TTL/6, the margin a holder keeps before its lease could pass on.
pub trait Clock: Send + Sync {
    fn now(&self) -> DateTime<Utc>;
}

/// The operating system's clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock that stands still until a test sets or advances it. Clones share one time.
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<Mutex<DateTime<Utc>>>,
}

impl ManualClock {
    pub fn new(start: DateTime<Utc>) -> Self {
        Self {
            now: Arc::new(Mutex::new(start)),
        }
    }

    pub fn set(&self, now: DateTime<Utc>) {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner) = now;
    }

    /// Moves the clock forward by `by` (saturating at chrono's range).
    pub fn advance(&self, by: Duration) {
        let by = TimeDelta::from_std(by).unwrap_or(TimeDelta::MAX);
        let mut now = self.now.lock().unwrap_or_else(PoisonError::into_inner);
        *now = now
            .checked_add_signed(by)
            .unwrap_or(DateTime::<Utc>::MAX_UTC);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told_and_clones_share_it() {
        let start = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        let clock = ManualClock::new(start);
        let shared = clock.clone();
        assert_eq!(clock.now(), start);
        shared.advance(Duration::from_millis(1_500));
        assert_eq!(clock.now(), start + TimeDelta::milliseconds(1_500));
        clock.set(start);
        assert_eq!(shared.now(), start);
    }
}
