//! State-space reduction: workers are interchangeable, so are tasks, batch and evaluation rows
//! are sets, and some columns are never read again. Every state is replaced by the least of
//! the states it equals up to renaming workers and reordering tasks (workers renamed in order
//! of first appearance, tasks in each order), with its batch and evaluation rows sorted and
//! its dead columns blanked. (Attempts keep their indexes, which batch and evaluation rows
//! name: an evaluation's attempt is read by a later completion's delete and by I16.)
//! The invariants name no particular worker or task and read no dead column, and the steps
//! from two states of one class lead to states of one class, so an exhaustive run over the
//! representatives checks every state.

use crate::db::{Db, Lease, TASKS_MAX, Task, WORKERS_MAX, WorkerId};

/// The representative of `db`'s class.
pub fn representative(db: Db) -> Db {
    let mut best: Option<Db> = None;
    for order in orders(db.tasks.len()) {
        let candidate = renamed(&db, order);
        if best.as_ref().is_none_or(|best| candidate < *best) {
            best = Some(candidate);
        }
    }
    best.expect("at least one order")
}

/// `db` with its tasks in `order` and its live attempts' workers renamed 0, 1, 2… in order of
/// first appearance. Columns no later step reads are blanked: the worker and lease of an
/// attempt that ended (capacity counts live attempts only, and every check reads the status
/// first).
fn renamed(db: &Db, order: &[usize]) -> Db {
    let mut names = [None::<WorkerId>; WORKERS_MAX];
    let mut named: WorkerId = 0;
    let tasks = order
        .iter()
        .map(|&index| {
            let mut task: Task = db.tasks[index];
            for attempt in &mut task.attempts {
                if !attempt.status.is_live() {
                    attempt.worker = 0;
                    attempt.lease = Lease::Expired;
                    continue;
                }
                let name = names[usize::from(attempt.worker)].get_or_insert_with(|| {
                    named += 1;
                    named - 1
                });
                attempt.worker = *name;
            }
            task.batches.sort_unstable();
            task.evaluations.sort_unstable();
            task
        })
        .collect();
    Db { tasks }
}

/// Every order of `0..n`, for the task counts the model allows.
fn orders(n: usize) -> &'static [&'static [usize]] {
    match n {
        1 => &[&[0]],
        2 => &[&[0, 1], &[1, 0]],
        3 => &[
            &[0, 1, 2],
            &[0, 2, 1],
            &[1, 0, 2],
            &[1, 2, 0],
            &[2, 0, 1],
            &[2, 1, 0],
        ],
        _ => panic!("the model holds 1 to {TASKS_MAX} tasks, not {n}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::{Attempt, AttemptStatus, TaskState};

    fn leased(worker: WorkerId) -> Task {
        let mut task = Task::new();
        task.state = TaskState::Leased;
        task.attempt_count = 1;
        task.last_attempt_number = 1;
        task.current_attempt = Some(0);
        task.attempts.push(Attempt {
            worker,
            number: 1,
            status: AttemptStatus::Leased,
            lease: Lease::Unexpired,
        });
        task
    }

    #[test]
    fn states_that_differ_in_names_only_share_a_representative() {
        let one = Db {
            tasks: [leased(1), Task::new()].into_iter().collect(),
        };
        let other = Db {
            tasks: [Task::new(), leased(0)].into_iter().collect(),
        };
        assert_ne!(one, other);
        assert_eq!(representative(one), representative(other));
    }

    #[test]
    fn states_that_differ_in_substance_keep_apart() {
        let same_worker = Db {
            tasks: [leased(0), leased(0)].into_iter().collect(),
        };
        let two_workers = Db {
            tasks: [leased(0), leased(1)].into_iter().collect(),
        };
        assert_ne!(representative(same_worker), representative(two_workers));
    }

    #[test]
    fn evaluation_rows_are_a_set_that_keeps_its_attempts() {
        use crate::db::{Evaluation, EvaluationStatus};
        let row = |attempt| Evaluation {
            attempt,
            status: EvaluationStatus::Pass,
        };
        let with = |rows: &[Evaluation]| {
            let mut task = leased(0);
            task.evaluations = rows.iter().copied().collect();
            Db {
                tasks: [task].into_iter().collect(),
            }
        };
        assert_eq!(
            representative(with(&[row(0), row(1)])),
            representative(with(&[row(1), row(0)]))
        );
        assert_ne!(
            representative(with(&[row(0)])),
            representative(with(&[row(1)]))
        );
    }

    #[test]
    fn every_order_once() {
        for n in 1..=TASKS_MAX {
            let mut all: Vec<Vec<usize>> = orders(n).iter().map(|order| order.to_vec()).collect();
            assert!(all.iter().all(|order| {
                let mut sorted = order.clone();
                sorted.sort_unstable();
                sorted == (0..n).collect::<Vec<_>>()
            }));
            all.sort();
            all.dedup();
            assert_eq!(all.len(), (1..=n).product::<usize>());
        }
    }
}
