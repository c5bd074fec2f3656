//! Backoff between retries of a request nobody answered, and between resends of a message
//! nobody acknowledged.

use std::time::Duration;

/// First delay before retrying hello or acquire after a timeout or "no responders".
pub(crate) const RETRY_DELAY_BASE: Duration = Duration::from_millis(250);
/// Longest delay between such retries: a restarted dispatch is noticed within this.
pub(crate) const RETRY_DELAY_MAX: Duration = Duration::from_secs(10);

/// The exponential delay before retry number `failures` (1 after the first failure), capped at
/// `max`, without jitter.
pub(crate) fn exponential(base: Duration, failures: u32, max: Duration) -> Duration {
    let exponent = failures.saturating_sub(1).min(20);
    base.saturating_mul(1 << exponent).min(max)
}

/// [`exponential`] with full jitter, so workers that lost dispatch at the same moment do not
/// come back in step.
pub(crate) fn jittered(base: Duration, failures: u32, max: Duration) -> Duration {
    let ceiling = exponential(base, failures, max);
    ceiling.mul_f64(rand::random::<f64>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap() {
        let base = Duration::from_millis(100);
        let max = Duration::from_secs(1);
        let delays: Vec<_> = (1..=6).map(|n| exponential(base, n, max)).collect();
        let millis: Vec<_> = delays.iter().map(Duration::as_millis).collect();
        assert_eq!(millis, [100, 200, 400, 800, 1_000, 1_000]);
        assert_eq!(exponential(base, 0, max), base);
        assert_eq!(exponential(base, u32::MAX, max), max);
        for n in 1..=6 {
            assert!(jittered(base, n, max) <= exponential(base, n, max));
        }
    }
}
