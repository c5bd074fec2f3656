//! The one backoff policy of palisade ([reference, retry rules](../../../docs/protocol/reference.md#9-retry-rules)):
//! bounded exponential, `min(cap, base × 2ⁿ⁻¹)` before retry number n, drawn with full jitter
//! where many parties would otherwise retry in step. Every retry loop uses it: task retries
//! (`retry_wait`), redelivery delays of the consumers, the worker SDK's request retries and
//! resends, the outbox relay after failed passes.

use std::time::Duration;

use rand::Rng;

/// How something that failed is tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The delay (the jitter's bound) before the first retry.
    pub base: Duration,
    /// No delay exceeds this.
    pub cap: Duration,
}

impl Default for RetryPolicy {
    /// Task retries: 5 s, doubling to 5 minutes.
    fn default() -> Self {
        Self {
            base: Duration::from_secs(5),
            cap: Duration::from_secs(300),
        }
    }
}

impl RetryPolicy {
    pub const fn new(base: Duration, cap: Duration) -> Self {
        Self { base, cap }
    }

    /// The delay before retry number `failures` (1 after the first failure; 0 is treated as
    /// 1), without jitter: `min(cap, base × 2^(failures − 1))`.
    pub fn delay_max(&self, failures: u32) -> Duration {
        let exponent = failures.saturating_sub(1).min(30);
        self.base
            .checked_mul(1_u32 << exponent)
            .map_or(self.cap, |delay| delay.min(self.cap))
    }

    /// A delay drawn uniformly from `[0, delay_max(failures)]` (full jitter).
    pub fn delay(&self, failures: u32, rng: &mut impl Rng) -> Duration {
        let max_ms = self.delay_max(failures).as_millis() as u64;
        Duration::from_millis(rng.random_range(0..=max_ms))
    }

    /// [`RetryPolicy::delay`] with the thread's generator.
    pub fn jittered(&self, failures: u32) -> Duration {
        self.delay(failures, &mut rand::rng())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delay_doubles_up_to_the_cap() {
        let policy = RetryPolicy::default();
        assert_eq!(policy.delay_max(0), Duration::from_secs(5));
        assert_eq!(policy.delay_max(1), Duration::from_secs(5));
        assert_eq!(policy.delay_max(2), Duration::from_secs(10));
        assert_eq!(policy.delay_max(3), Duration::from_secs(20));
        assert_eq!(policy.delay_max(7), Duration::from_secs(300));
        assert_eq!(policy.delay_max(u32::MAX), Duration::from_secs(300));
    }

    #[test]
    fn jittered_delay_stays_in_bounds() {
        let policy = RetryPolicy::new(Duration::from_millis(100), Duration::from_secs(1));
        for failures in 1..10 {
            for _ in 0..100 {
                assert!(policy.jittered(failures) <= policy.delay_max(failures));
            }
        }
    }
}
