//! The dispatch replicas this worker hears on `<prefix>.v1.dispatch.ready`, so that an
//! unanswered hello or acquire is sent again at once when a replica starts or falls silent:
//! a replica that died holding this worker's long-poll never answers it, and the worker
//! cannot know which replica holds it (`docs/protocol/worker.md`, "Prompt recovery").

use std::collections::HashMap;
use std::time::Duration;

use messages::v1;
use prost::Message as _;
use tokio::time::Instant;

/// A replica counts as silent once nothing was heard from it for this many heartbeats: two
/// missed, with half a heartbeat of slack for delivery jitter.
const SILENT_AFTER_HEARTBEATS: f64 = 2.5;

/// What a `dispatch.ready` message or the passing of time means for waiting requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// Nothing a waiting request should act on.
    None,
    /// A replica not heard before announced itself (or a dispatch that does not say who it
    /// is announced its start).
    Started,
    /// A replica that was heard missed its heartbeats.
    Silent,
}

/// The replicas heard, with when each was last heard and how often it promised to speak.
#[derive(Debug, Default)]
pub(crate) struct Dispatchers {
    heard: HashMap<String, Heard>,
}

#[derive(Debug, Clone, Copy)]
struct Heard {
    last: Instant,
    heartbeat: Duration,
}

impl Heard {
    fn silent_at(&self) -> Instant {
        self.last + self.heartbeat.mul_f64(SILENT_AFTER_HEARTBEATS)
    }
}

impl Dispatchers {
    /// A `dispatch.ready` arrived at `now`. A payload that names no replica or promises no
    /// heartbeat (a dispatch that announces its start once) always counts as a start.
    pub(crate) fn heard(&mut self, payload: &[u8], now: Instant) -> Change {
        let Ok(ready) = v1::DispatchReady::decode(payload) else {
            return Change::Started;
        };
        if ready.instance_id.is_empty() || ready.heartbeat_ms == 0 {
            return Change::Started;
        }
        let heard = Heard {
            last: now,
            heartbeat: Duration::from_millis(u64::from(ready.heartbeat_ms)),
        };
        match self.heard.insert(ready.instance_id, heard) {
            Some(_) => Change::None,
            None => Change::Started,
        }
    }

    /// Forgets every replica silent at `now`; [`Change::Silent`] when there was one.
    pub(crate) fn forget_silent(&mut self, now: Instant) -> Change {
        let before = self.heard.len();
        self.heard.retain(|_, heard| heard.silent_at() > now);
        if self.heard.len() < before {
            Change::Silent
        } else {
            Change::None
        }
    }

    /// When the next heard replica turns silent unless it speaks first.
    pub(crate) fn next_silence(&self) -> Option<Instant> {
        self.heard.values().map(Heard::silent_at).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready(instance_id: &str, heartbeat_ms: u32) -> Vec<u8> {
        v1::DispatchReady {
            instance_id: instance_id.into(),
            heartbeat_ms,
        }
        .encode_to_vec()
    }

    #[test]
    fn a_new_replica_is_a_start_and_its_heartbeats_are_not() {
        let mut dispatchers = Dispatchers::default();
        let now = Instant::now();
        assert_eq!(dispatchers.heard(&ready("a", 1000), now), Change::Started);
        assert_eq!(dispatchers.heard(&ready("a", 1000), now), Change::None);
        assert_eq!(dispatchers.heard(&ready("b", 1000), now), Change::Started);
    }

    #[test]
    fn an_announcement_without_identity_or_heartbeat_is_always_a_start() {
        let mut dispatchers = Dispatchers::default();
        let now = Instant::now();
        for payload in [Vec::new(), ready("", 1000), ready("a", 0), vec![0xff, 0xff]] {
            assert_eq!(dispatchers.heard(&payload, now), Change::Started);
            assert_eq!(dispatchers.heard(&payload, now), Change::Started);
        }
        assert_eq!(dispatchers.next_silence(), None);
    }

    #[test]
    fn a_replica_that_misses_two_heartbeats_is_silent_once() {
        let mut dispatchers = Dispatchers::default();
        let start = Instant::now();
        dispatchers.heard(&ready("a", 1000), start);
        dispatchers.heard(&ready("b", 1000), start);
        // `b` keeps speaking, `a` stops.
        dispatchers.heard(&ready("b", 1000), start + Duration::from_secs(2));
        assert_eq!(
            dispatchers.next_silence(),
            Some(start + Duration::from_millis(2500))
        );
        assert_eq!(
            dispatchers.forget_silent(start + Duration::from_millis(2400)),
            Change::None
        );
        assert_eq!(
            dispatchers.forget_silent(start + Duration::from_millis(2500)),
            Change::Silent
        );
        assert_eq!(
            dispatchers.forget_silent(start + Duration::from_millis(2600)),
            Change::None
        );
        // `a` back (a new process would have a new id; the same one counts as a start too).
        assert_eq!(
            dispatchers.heard(&ready("a", 1000), start + Duration::from_secs(3)),
            Change::Started
        );
    }

    mod hostile {
        use super::*;
        use messages::testing::{any_bytes, cases, hostile_text};
        use proptest::prelude::*;

        /// What arrives on `dispatch.ready`: any bytes, or announcements with any fields.
        fn payload() -> impl Strategy<Value = Vec<u8>> {
            prop_oneof![
                any_bytes(),
                (hostile_text(), any::<u32>())
                    .prop_map(|(id, heartbeat_ms)| ready(&id, heartbeat_ms)),
            ]
        }

        proptest! {
            #![proptest_config(cases(256))]

            /// Whatever arrives, and whenever: no panic, one entry per replica heard, and a
            /// replica is forgotten once its own silence has passed.
            #[test]
            fn hostile_dispatch_ready_never_panics(
                arrivals in proptest::collection::vec((payload(), 0..10_000u64), 0..32),
            ) {
                let mut dispatchers = Dispatchers::default();
                let start = Instant::now();
                let mut now = start;
                for (payload, after_ms) in &arrivals {
                    now += Duration::from_millis(*after_ms);
                    dispatchers.heard(payload, now);
                    dispatchers.forget_silent(now);
                    if let Some(silence) = dispatchers.next_silence() {
                        prop_assert!(silence > now);
                    }
                }
                prop_assert!(dispatchers.heard.len() <= arrivals.len());
                let latest = dispatchers.heard.values().map(Heard::silent_at).max();
                if let Some(latest) = latest {
                    dispatchers.forget_silent(latest);
                    prop_assert!(dispatchers.heard.is_empty());
                }
            }
        }
    }
}
