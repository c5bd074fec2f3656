//! Benchmark (not a test): how long from a worker's death (SIGKILL, mid-task) to its task's
//! completion on another worker, against the configured lease TTL. Reports each round and
//! min / median / max, with the settings that bound it.
//!
//! `cargo bench -p tests --bench failover -- [rounds] [lease_ttl_ms]` (defaults 5, 5000).
//! Needs PostgreSQL and NATS like the system tests (DATABASE_URL / NATS_URL or local).

use std::time::{Duration, Instant};

use tests::{Component, TestSystem, WorkerProcess};
use uuid::Uuid;

const WORKER: &str = env!("CARGO_BIN_EXE_test-worker");
/// The synthetic plugin's run time: the part of failover that is the task's own work.
const TASK_MS: u64 = 1_000;

#[tokio::main]
async fn main() {
    let mut args = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with("--"));
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    let ttl_ms: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(5_000);
    let renew_ms = ttl_ms / 3;
    let system = TestSystem::spawn_with(|settings| {
        settings.dispatch.lease = runtime::LeaseSettings::new(
            Duration::from_millis(ttl_ms),
            Duration::from_millis(renew_ms),
        )
        .unwrap();
        settings.reaper.interval = Duration::from_millis(250);
        settings.reaper.retry = store::RetryPolicy {
            base: Duration::from_millis(500),
            cap: Duration::from_secs(5),
        };
        settings.ingestion.retry = settings.reaper.retry;
    })
    .await;
    system.start(Component::Reaper);
    println!(
        "failover: lease TTL {ttl_ms} ms, renew every {renew_ms} ms, reaper sweep every 250 ms, \
         retry backoff ≤ 500 ms (first retry, full jitter), task run time {TASK_MS} ms, {rounds} rounds"
    );
    println!(
        "{:>5} {:>14} {:>16}",
        "round", "to re-lease", "to completion"
    );
    let mut to_completion = Vec::new();
    for round in 1..=rounds {
        let organization_id = system.organization().await;
        let mut doomed = WorkerProcess::start(&system, WORKER, organization_id, 1).await;
        let target = format!("synthetic://failover?duration_ms={TASK_MS}&findings=2");
        let reply = system
            .submit(&system.request(organization_id, &target, &["synthetic"]))
            .await;
        let scan_id = Uuid::parse_str(&reply.scan_id).unwrap();
        system
            .wait_for("the lease", || async {
                let attempts = store::testing::attempts_of_scan(&system.pool, scan_id)
                    .await
                    .unwrap();
                attempts
                    .iter()
                    .any(|(_, worker, _)| *worker == doomed.worker_id)
                    .then_some(())
            })
            .await;
        let _survivor = WorkerProcess::start(&system, WORKER, organization_id, 1).await;
        // The survivor is connected and waiting before the kill, as in a running fleet.
        system
            .wait_for("the survivor to say hello", || async {
                store::testing::workers_seen(&system.pool, organization_id)
                    .await
                    .unwrap()
                    .eq(&2)
                    .then_some(())
            })
            .await;
        doomed.kill().await;
        let killed = Instant::now();
        let mut released_after = None;
        loop {
            let attempts = store::testing::attempts_of_scan(&system.pool, scan_id)
                .await
                .unwrap();
            if released_after.is_none() && attempts.len() > 1 {
                released_after = Some(killed.elapsed());
            }
            if system.scan_state(&reply.scan_id).await == "completed" {
                break;
            }
            assert!(
                killed.elapsed() < Duration::from_millis(ttl_ms * 4 + 30_000),
                "no failover"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let completed_after = killed.elapsed();
        to_completion.push(completed_after);
        println!(
            "{round:>5} {:>11} ms {:>13} ms",
            released_after.unwrap_or_default().as_millis(),
            completed_after.as_millis()
        );
    }
    to_completion.sort();
    let ms = |d: Duration| d.as_millis();
    println!(
        "death to completion elsewhere: min {} ms, median {} ms, max {} ms (TTL {ttl_ms} ms + sweep + backoff + {TASK_MS} ms of work)",
        ms(to_completion[0]),
        ms(to_completion[to_completion.len() / 2]),
        ms(to_completion[to_completion.len() - 1])
    );
    system.finish().await;
}
