//! Cost flat in the backlog with no vacuum from the server (issue 46): a queue whose backlog
//! stays the same while tens of thousands of tasks pass through it (admitted, leased, completed
//! by the real scripts), on a fresh database, with the server's autovacuum off for the test's
//! tables. What one round of the hot path costs (an acquire of [`MEASURED`] leases and one
//! ingestion decision completing them, in shared buffers touched, from PostgreSQL's own
//! counters of the one backend that ran it) stays flat when `store::upkeep` tends the hot
//! tables as the reaper's leader does, and grows many times over when nothing does (the shape
//! palisade had before it tended them). The grant's own buffers, from `EXPLAIN (ANALYZE,
//! BUFFERS)`, are printed beside it.

use std::collections::BTreeMap;

use store::ingest::{CompleteParams, Ingest, Message};
use store::upkeep::{self, HOT_TABLES};
use store::{LeaseClaim, PgPool, ProgressEvents};
use uuid::Uuid;

use crate::support::{Database, Request};

const PLUGIN: &str = "synthetic";
/// Scans waiting throughout: the backlog an acquire reads the front of.
const BACKLOG: usize = 5_000;
/// Scans admitted, leased and completed per round.
const ROUND: usize = 500;
/// Rounds: 40 × 500 = 20,000 tasks pass through.
const ROUNDS: usize = 40;
/// Leases of the measured round.
const MEASURED: usize = 64;

/// What tends the hot tables between rounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Upkeep {
    /// `store::upkeep` every fourth round (2,000 tasks: the default two seconds' interval at
    /// 1,000 scans/s).
    Tended,
    /// Nothing.
    None,
}

/// Buffers touched per table by one measured round.
type Blocks = BTreeMap<String, i64>;

/// The measured round's buffers with the backlog waiting, before and after the rounds.
async fn round_cost(upkeep: Upkeep) -> (Blocks, Blocks) {
    let database = Database::create_with_connections(1).await;
    stop_autovacuum(&database.pool).await;
    let organization = database.organization(None).await;
    let worker = database
        .worker(organization, ROUND as i32, &[PLUGIN])
        .await;
    let mut next = 0;
    for _ in 0..BACKLOG / ROUND {
        admit(&database, organization, &mut next, ROUND).await;
    }
    if upkeep == Upkeep::Tended {
        tend(&database.pool).await;
    }
    let before = measured_round(&database, organization, worker, &mut next).await;
    for round in 0..ROUNDS {
        admit(&database, organization, &mut next, ROUND).await;
        let claims = database.leases(worker, ROUND).await;
        complete(&database, &claims).await;
        if upkeep == Upkeep::Tended && round % 4 == 3 {
            tend(&database.pool).await;
        }
    }
    let after = measured_round(&database, organization, worker, &mut next).await;
    database.drop().await;
    (before, after)
}

/// One round of [`MEASURED`] scans: admitted, then their acquire and completion measured.
async fn measured_round(
    database: &Database,
    organization: Uuid,
    worker: Uuid,
    next: &mut usize,
) -> Blocks {
    admit(database, organization, next, MEASURED).await;
    let grant = store::testing::grant_buffers(
        &database.pool,
        worker,
        &[PLUGIN.to_owned()],
        MEASURED as i64,
    )
    .await
    .expect("explained");
    eprintln!("grant explained: {grant} buffers");
    let start = blocks(&database.pool).await;
    let claims = database.leases(worker, MEASURED).await;
    complete(database, &claims).await;
    let end = blocks(&database.pool).await;
    end.iter()
        .map(|(table, end)| (table.clone(), end - start.get(table).copied().unwrap_or(0)))
        .filter(|(_, touched)| *touched > 0)
        .collect()
}

/// Buffers touched so far per table (heap and indexes, hit or read), once the one backend's
/// counters are published.
async fn blocks(pool: &PgPool) -> Blocks {
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(pool)
        .await
        .expect("flush asked");
    // Published when the backend next goes idle.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(pool)
        .await
        .expect("snapshot cleared");
    sqlx::query_as(
        "SELECT relname::text, (coalesce(heap_blks_hit, 0) + coalesce(heap_blks_read, 0)
                + coalesce(idx_blks_hit, 0) + coalesce(idx_blks_read, 0))::int8
         FROM pg_statio_user_tables",
    )
    .fetch_all(pool)
    .await
    .expect("statistics read")
    .into_iter()
    .collect()
}

/// The server's autovacuum off for the hot tables, whatever the server's setting: the test
/// measures palisade without it.
async fn stop_autovacuum(pool: &PgPool) {
    for table in HOT_TABLES {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER TABLE {} SET (autovacuum_enabled = false)",
            table.name
        )))
        .execute(pool)
        .await
        .expect("autovacuum off for the table");
    }
}

/// What the reaper's leader does each upkeep interval, once the backend's statistics are
/// published.
async fn tend(pool: &PgPool) {
    let _ = blocks(pool).await;
    for churn in upkeep::churn(pool).await.expect("churn read") {
        if let (Some(table), Some(work)) = (churn.table(), churn.work()) {
            upkeep::tend(pool, table, work).await.expect("tended");
        }
    }
}

/// Admits `count` more one-plugin scans, each on a target of its own.
async fn admit(database: &Database, organization: Uuid, next: &mut usize, count: usize) {
    let requests: Vec<Request> = (*next..*next + count)
        .map(|index| Request::new(organization, &format!("http://target-{index}.test"), &[PLUGIN]))
        .collect();
    *next += count;
    database.admitted(&requests).await;
}

/// Completes every claim with no result batch, in one ingestion decision.
async fn complete(database: &Database, claims: &[LeaseClaim]) {
    let messages: Vec<Message<'_>> = claims
        .iter()
        .map(|claim| {
            Message::Complete(CompleteParams {
                claim,
                batch_count: 0,
                summary: "done",
                lease_next: false,
            })
        })
        .collect();
    let script = Ingest {
        subjects: &database.subjects,
        messages: &messages,
        lease_ttl: std::time::Duration::from_secs(300),
    };
    // Nothing publishes in this test: the staged events stay in the outbox.
    let (_, _staged) = store::decide_batch(&database.pool, ProgressEvents::On, &script)
        .await
        .expect("the completions are decided");
}

fn total(blocks: &Blocks) -> i64 {
    blocks.values().sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_costs_the_same_after_twenty_thousand_tasks_when_palisade_tends_its_tables() {
    let (untended_before, untended_after) = round_cost(Upkeep::None).await;
    let (before, after) = round_cost(Upkeep::Tended).await;
    eprintln!("untended: {untended_before:?}\n       → {untended_after:?}");
    eprintln!("tended:   {before:?}\n       → {after:?}");
    // Without upkeep the cost grows with every task that passed (the shape this replaced):
    // the test can see the growth it guards against.
    assert!(
        total(&untended_after) > 3 * total(&untended_before),
        "untended: {} → {} buffers",
        total(&untended_before),
        total(&untended_after)
    );
    assert!(
        total(&after) <= 3 * total(&before) / 2,
        "tended: a round touched {} buffers with {BACKLOG} scans waiting and {} after {} more \
         passed through",
        total(&before),
        total(&after),
        ROUND * ROUNDS
    );
}
