//! The in-memory lease store: the twin of [`crate::PgStore`] for tests and single-process
//! deployments, where it elects the one process.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::{LeaseError, Release, Renewal, Store, Term, term_bounds, truncate_to_millis};

/// Leases in a map behind one mutex, so each operation is atomic as one SQL statement is.
/// Clones share the map. The map holds one entry per lease name in use (names are constants
/// in [`crate::names`]), and a release removes its entry.
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    leases: Arc<Mutex<HashMap<String, Held>>>,
}

/// A lease row: who holds `name`, since when, until when.
#[derive(Debug, Clone)]
struct Held {
    owner: String,
    started_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn with_leases<T>(&self, decide: impl FnOnce(&mut HashMap<String, Held>) -> T) -> T {
        // No code under this lock panics, so a poisoned map is still consistent.
        let mut leases = self.leases.lock().unwrap_or_else(PoisonError::into_inner);
        decide(&mut leases)
    }
}

impl Store for MemoryStore {
    async fn acquire(
        &self,
        name: &str,
        owner: &str,
        now: DateTime<Utc>,
        ttl: Duration,
    ) -> Result<Option<Term>, LeaseError> {
        let (now, expires_at) = term_bounds(now, ttl)?;
        let fresh = Held {
            owner: owner.to_owned(),
            started_at: now,
            expires_at,
        };
        let granted = self.with_leases(|leases| match leases.entry(name.to_owned()) {
            Entry::Vacant(vacant) => Some(vacant.insert(fresh).clone()),
            Entry::Occupied(mut occupied) => {
                let held = occupied.get_mut();
                let expired = held.expires_at <= now;
                if held.owner == owner && !expired {
                    held.expires_at = held.expires_at.max(expires_at);
                    Some(held.clone())
                } else if expired {
                    *held = fresh;
                    Some(held.clone())
                } else {
                    None
                }
            }
        });
        Ok(granted.map(|held| Term {
            name: name.to_owned(),
            owner: held.owner,
            started_at: held.started_at,
            expires_at: held.expires_at,
        }))
    }

    async fn renew(
        &self,
        name: &str,
        owner: &str,
        now: DateTime<Utc>,
        ttl: Duration,
    ) -> Result<Renewal, LeaseError> {
        let (now, expires_at) = term_bounds(now, ttl)?;
        Ok(self.with_leases(|leases| match leases.get_mut(name) {
            Some(held) if held.owner == owner && held.expires_at > now => {
                held.expires_at = held.expires_at.max(expires_at);
                Renewal::Renewed {
                    expires_at: held.expires_at,
                }
            }
            _ => Renewal::Refused,
        }))
    }

    async fn release(
        &self,
        name: &str,
        owner: &str,
        now: DateTime<Utc>,
    ) -> Result<Release, LeaseError> {
        let now = truncate_to_millis(now);
        Ok(self.with_leases(|leases| match leases.get(name) {
            Some(held) if held.owner == owner && held.expires_at > now => {
                leases.remove(name);
                Release::Released
            }
            _ => Release::Lost,
        }))
    }
}
