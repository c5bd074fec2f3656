//! Requests answered one by one and decided together (issue 24): a request is queued, and a
//! few deciders each take everything queued when they are free and decide it in one
//! transaction. Idle, a request is decided at once, alone; under load, what queued during one
//! decision is the next decision's batch, so a burst costs a few commits instead of one per
//! request, and no request waits for a batch to fill.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{Mutex, mpsc};
use tokio_util::sync::CancellationToken;

/// Runs `deciders` loops until `stop` (or until every sender of `queue` is gone), each taking
/// what is queued when it is free, at most `batch_max` at a time, and handing it to `decide`.
pub async fn decide_queued<T, F, Fut>(
    queue: mpsc::UnboundedReceiver<T>,
    deciders: usize,
    batch_max: usize,
    stop: CancellationToken,
    decide: F,
) where
    F: Fn(Vec<T>) -> Fut,
    Fut: Future<Output = ()>,
{
    let batch_max = batch_max.max(1);
    let queue = Arc::new(Mutex::new(queue));
    let decide = &decide;
    futures::future::join_all((0..deciders.max(1)).map(|_| {
        let queue = queue.clone();
        let stop = stop.clone();
        async move {
            loop {
                let mut taken = Vec::with_capacity(batch_max);
                let received = tokio::select! {
                    () = stop.cancelled() => return,
                    received = async { queue.lock().await.recv_many(&mut taken, batch_max).await } => received,
                };
                if received == 0 {
                    return;
                }
                decide(taken).await;
            }
        }
    }))
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex as StdMutex;

    #[tokio::test]
    async fn what_queued_while_a_decider_was_busy_is_its_next_batch() {
        let (sender, queue) = mpsc::unbounded_channel();
        let batches = StdMutex::new(Vec::<Vec<u32>>::new());
        let (release, released) = tokio::sync::watch::channel(false);
        let stop = CancellationToken::new();
        sender.send(0).unwrap();
        let decided = decide_queued(queue, 1, 3, stop.clone(), |taken| {
            let mut released = released.clone();
            let first = taken == [0];
            batches.lock().unwrap().push(taken);
            async move {
                if first {
                    // Busy with the first request while four more queue.
                    released.wait_for(|released| *released).await.unwrap();
                }
            }
        });
        let feed = async {
            tokio::task::yield_now().await;
            for request in 1..=4 {
                sender.send(request).unwrap();
            }
            release.send(true).unwrap();
            drop(sender);
        };
        tokio::join!(decided, feed);
        assert_eq!(
            *batches.lock().unwrap(),
            vec![vec![0], vec![1, 2, 3], vec![4]],
            "alone when idle, then what queued, at most batch_max at a time"
        );
    }
}
