//! Retry backoff: bounded exponential with full jitter (SPEC §5).

use std::time::Duration;

use rand::Rng;

/// How a failed attempt is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Delay scale for the first retry.
    pub base: Duration,
    /// No delay exceeds this.
    pub cap: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            base: Duration::from_secs(5),
            cap: Duration::from_secs(300),
        }
    }
}

impl RetryPolicy {
    /// Upper bound of the delay after the `attempts_spent`-th attempt failed:
    /// `min(cap, base × 2^(attempts_spent − 1))`.
    pub fn delay_max(&self, attempts_spent: u32) -> Duration {
        let exponent = attempts_spent.saturating_sub(1).min(30);
        self.base
            .checked_mul(1_u32 << exponent)
            .map_or(self.cap, |delay| delay.min(self.cap))
    }

    /// A delay drawn uniformly from `[0, delay_max]` (full jitter).
    pub fn delay(&self, attempts_spent: u32, rng: &mut impl Rng) -> Duration {
        let max_ms = self.delay_max(attempts_spent).as_millis() as u64;
        Duration::from_millis(rng.random_range(0..=max_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delay_doubles_up_to_the_cap() {
        let policy = RetryPolicy::default();
        assert_eq!(policy.delay_max(1), Duration::from_secs(5));
        assert_eq!(policy.delay_max(2), Duration::from_secs(10));
        assert_eq!(policy.delay_max(3), Duration::from_secs(20));
        assert_eq!(policy.delay_max(7), Duration::from_secs(300));
        assert_eq!(policy.delay_max(1_000), Duration::from_secs(300));
    }

    #[test]
    fn jittered_delay_stays_in_bounds() {
        let policy = RetryPolicy::default();
        let mut rng = rand::rng();
        for attempts in 1..10 {
            for _ in 0..100 {
                assert!(policy.delay(attempts, &mut rng) <= policy.delay_max(attempts));
            }
        }
    }
}
