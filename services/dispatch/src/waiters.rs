//! The queue of waiting acquires (long-polls) of one dispatch replica. A `task.ready` wakes
//! the longest-waiting acquire whose worker may take the task, not every waiting acquire: one
//! database round per ready task instead of one per waiting worker. A woken waiter goes to the
//! back of the queue, so the next ready task wakes the next one. A hint that carries no task
//! (the reaper's `dispatch.wakeup`: retries became due) wakes them all. A waiter woken while
//! it is querying keeps the wake-up and queries again at once; polling stays the fallback for
//! a lost hint.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use store::lease::Eligibility;
use tokio::sync::Notify;
use uuid::Uuid;

/// The waiting acquires of this replica, oldest first.
#[derive(Default)]
pub struct Waiters {
    queue: Mutex<VecDeque<Entry>>,
    next_id: std::sync::atomic::AtomicU64,
}

struct Entry {
    id: u64,
    eligibility: Eligibility,
    wake: Arc<Notify>,
}

/// One acquire's place in the queue; leaves it when dropped.
pub struct Waiter<'w> {
    waiters: &'w Waiters,
    id: u64,
    wake: Arc<Notify>,
}

impl Waiters {
    /// Queues an acquire for a worker eligible as `eligibility`.
    pub fn join(&self, eligibility: Eligibility) -> Waiter<'_> {
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let wake = Arc::new(Notify::new());
        self.lock().push_back(Entry {
            id,
            eligibility,
            wake: wake.clone(),
        });
        Waiter {
            waiters: self,
            id,
            wake,
        }
    }

    /// A task of `organization_id` needing `required` is ready: wakes the longest-waiting
    /// eligible acquire and moves it to the back. Returns whether one was woken.
    pub fn task_ready(&self, organization_id: Uuid, required: &[String]) -> bool {
        let mut queue = self.lock();
        let Some(position) = queue
            .iter()
            .position(|entry| entry.eligibility.admits(organization_id, required))
        else {
            return false;
        };
        let entry = queue.remove(position).expect("position is in the queue");
        entry.wake.notify_one();
        queue.push_back(entry);
        true
    }

    /// Something became due that no event announced: every waiting acquire looks again.
    pub fn wake_all(&self) {
        for entry in self.lock().iter() {
            entry.wake.notify_one();
        }
    }

    /// How many acquires are waiting.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Entry>> {
        self.queue
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Waiter<'_> {
    /// Resolves when this acquire is woken (at once if it was woken since it last waited).
    pub async fn woken(&self) {
        self.wake.notified().await;
    }

    /// The worker's eligibility as the latest acquire round read it.
    pub fn update(&self, eligibility: Eligibility) {
        if let Some(entry) = self
            .waiters
            .lock()
            .iter_mut()
            .find(|entry| entry.id == self.id)
        {
            entry.eligibility = eligibility;
        }
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        self.waiters.lock().retain(|entry| entry.id != self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eligible(organization_id: Uuid, capabilities: &[&str]) -> Eligibility {
        Eligibility {
            organization_ids: vec![organization_id],
            capabilities: capabilities.iter().map(|c| (*c).to_owned()).collect(),
        }
    }

    /// Whether the waiter holds a wake-up now. `task_ready` and `wake_all` wake synchronously
    /// (a wake-up is a permit stored in the waiter's `Notify`), so one poll answers exactly: no
    /// timeout to outwait, and a wake-up that arrives late counts as none.
    fn was_woken(waiter: &Waiter<'_>) -> bool {
        use futures::FutureExt as _;
        waiter.woken().now_or_never().is_some()
    }

    #[test]
    fn a_ready_task_wakes_one_eligible_waiter_in_turn() {
        let waiters = Waiters::default();
        let organization = Uuid::now_v7();
        let other = Uuid::now_v7();
        let first = waiters.join(eligible(organization, &["a"]));
        let wrong_org = waiters.join(eligible(other, &["a"]));
        let second = waiters.join(eligible(organization, &["a", "b"]));
        let required = ["a".to_owned()];

        assert!(waiters.task_ready(organization, &required));
        assert!(was_woken(&first));
        assert!(!was_woken(&second), "one task wakes one waiter");
        assert!(!was_woken(&wrong_org));

        // The first went to the back: the next task wakes the second.
        assert!(waiters.task_ready(organization, &required));
        assert!(was_woken(&second));
        assert!(!was_woken(&first));

        // Nobody can run a task needing `c`.
        assert!(!waiters.task_ready(organization, &["c".to_owned()]));
        assert!(!waiters.task_ready(Uuid::now_v7(), &required));
    }

    #[test]
    fn a_wake_up_while_querying_is_kept_and_a_hint_wakes_everyone() {
        let waiters = Waiters::default();
        let organization = Uuid::now_v7();
        let waiter = waiters.join(eligible(organization, &["a"]));
        // Woken before it waits (it was querying): the wake-up is not lost.
        waiters.task_ready(organization, &["a".to_owned()]);
        assert!(was_woken(&waiter));

        let other = waiters.join(eligible(Uuid::now_v7(), &["z"]));
        waiters.wake_all();
        assert!(was_woken(&waiter));
        assert!(was_woken(&other));
        drop(other);
        assert_eq!(waiters.len(), 1);
        drop(waiter);
        assert_eq!(waiters.len(), 0);
    }
}
