//! The reaper under its leader lease (I9), with real processes: three replicas, exactly one
//! sweeping at a time; kill the leader and another takes over within TTL + one retry.

use std::sync::{Arc, Mutex};

use tests::TestSystem;
use tokio::io::{AsyncBufReadExt as _, BufReader};

const SERVICE: &str = env!("CARGO_BIN_EXE_test-service");
// Long enough that a loaded 2-core machine never stalls a healthy leader past TTL − TTL/6.
const LEASE_TTL_MS: u64 = 3_000;
const LEASE_RETRY_MS: u64 = 500;
const SWEEP_INTERVAL_MS: u64 = 100;

/// (replica, started_ms, finished_ms) of every sweep seen so far.
type Sweeps = Arc<Mutex<Vec<(usize, u128, Option<u128>)>>>;

async fn spawn_replica(system: &TestSystem, index: usize, sweeps: Sweeps) -> tokio::process::Child {
    let mut child = tokio::process::Command::new(SERVICE)
        .arg("reaper")
        .env("DATABASE_URL", &system.settings.common.database.url)
        .envs(
            system
                .nats
                .child_env(&messages::Identity::Service(messages::Service::Reaper))
                .await,
        )
        .env("PALISADE_SUBJECT_PREFIX", system.subjects.prefix())
        .env("PALISADE_REAPER_INTERVAL_MS", SWEEP_INTERVAL_MS.to_string())
        .env("PALISADE_REAPER_LEASE_TTL_MS", LEASE_TTL_MS.to_string())
        .env("PALISADE_REAPER_LEASE_RETRY_MS", LEASE_RETRY_MS.to_string())
        // Each replica serves its own health endpoints, on a free port (never the default).
        .env("PALISADE_HTTP_ADDR", "127.0.0.1:0")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("test-service reaper starts");
    let stdout = child.stdout.take().expect("piped stdout");
    tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let mut words = line.split_whitespace().skip(1);
            let (Some(event), Some(millis)) = (
                words.next(),
                words.next().and_then(|m| m.parse::<u128>().ok()),
            ) else {
                continue;
            };
            let mut sweeps = sweeps.lock().unwrap();
            match event {
                "started" => sweeps.push((index, millis, None)),
                _ => {
                    if let Some(open) = sweeps
                        .iter_mut()
                        .rev()
                        .find(|(replica, _, end)| *replica == index && end.is_none())
                    {
                        open.2 = Some(millis);
                    }
                }
            }
        }
    });
    child
}

fn assert_one_at_a_time(sweeps: &[(usize, u128, Option<u128>)]) {
    for (i, (replica_a, start_a, end_a)) in sweeps.iter().enumerate() {
        for (replica_b, start_b, end_b) in &sweeps[i + 1..] {
            if replica_a == replica_b {
                continue;
            }
            let end_a = end_a.unwrap_or(u128::MAX);
            let end_b = end_b.unwrap_or(u128::MAX);
            assert!(
                end_a <= *start_b || end_b <= *start_a,
                "replicas {replica_a} and {replica_b} swept at the same time: {start_a}..{end_a} and {start_b}..{end_b}"
            );
        }
    }
}

#[tokio::test]
async fn three_reaper_replicas_sweep_one_at_a_time_and_a_killed_leader_is_replaced() {
    let system = TestSystem::spawn().await;
    let sweeps: Sweeps = Arc::default();
    let mut replicas = Vec::new();
    for index in 0..3 {
        replicas.push(spawn_replica(&system, index, sweeps.clone()).await);
    }

    // Let them campaign and sweep for a while.
    system
        .wait_for("some sweeps", || async {
            (sweeps.lock().unwrap().len() >= 20).then_some(())
        })
        .await;
    let leader = {
        let sweeps = sweeps.lock().unwrap();
        assert_one_at_a_time(&sweeps);
        let leaders: std::collections::BTreeSet<usize> =
            sweeps.iter().map(|(replica, ..)| *replica).collect();
        assert_eq!(
            leaders.len(),
            1,
            "the lease is sticky: one replica swept ({leaders:?})"
        );
        sweeps[0].0
    };

    // Kill the leader without a release: another takes over once the lease expires.
    replicas[leader].kill().await.expect("SIGKILL");
    let killed_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    // A sweep the kill interrupted ended with the process.
    for (replica, _, end) in sweeps.lock().unwrap().iter_mut() {
        if *replica == leader && end.is_none() {
            *end = Some(killed_at);
        }
    }
    let takeover = system
        .wait_for("another replica to sweep", || async {
            sweeps
                .lock()
                .unwrap()
                .iter()
                .find(|(replica, start, _)| *replica != leader && *start > killed_at)
                .map(|(_, start, _)| *start)
        })
        .await;
    let bound = u128::from(LEASE_TTL_MS + LEASE_RETRY_MS + SWEEP_INTERVAL_MS) + 1_000;
    assert!(
        takeover - killed_at <= bound,
        "takeover after {} ms, bound {bound} ms (TTL + retry + one interval + 1 s slack)",
        takeover - killed_at
    );
    system
        .wait_for("more sweeps after the takeover", || async {
            let sweeps = sweeps.lock().unwrap();
            (sweeps
                .iter()
                .filter(|(_, start, _)| *start > takeover)
                .count()
                >= 10)
                .then_some(())
        })
        .await;
    let mut sweeps = sweeps.lock().unwrap().clone();
    // (again: a line the dead leader printed may have been read only after the kill)
    for (replica, _, end) in sweeps.iter_mut() {
        if *replica == leader && end.is_none() {
            *end = Some(killed_at);
        }
    }
    assert_one_at_a_time(&sweeps);
    for replica in &mut replicas {
        let _ = replica.kill().await;
    }
    drop(replicas);
    system.finish().await;
}
