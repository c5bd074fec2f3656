//! Backoff between retries of a request nobody answered, and between resends of a message
//! nobody acknowledged: the one policy (`messages::retry::RetryPolicy`) with the worker's bounds.

use std::time::Duration;

use messages::retry::RetryPolicy;

/// Retries of hello or acquire after a timeout or "no responders": from 250 ms, doubling, at
/// most 10 s apart, so a restarted dispatch is noticed within 10 s; jittered, so workers that
/// lost dispatch at the same moment do not come back in step.
pub(crate) const REQUESTS: RetryPolicy =
    RetryPolicy::new(Duration::from_millis(250), Duration::from_secs(10));
