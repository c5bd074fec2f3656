//! Cost flat in the backlog with no vacuum from the server (issue 46): a queue whose backlog
//! stays the same while tens of thousands of tasks pass through it (admitted, leased, completed
//! by the real scripts), with the server's autovacuum off for the test's tables. What an
//! acquire reads to find its tasks (the buffers of its scans of the queue's indexes, from
//! `EXPLAIN (ANALYZE, BUFFERS)` of the grant statement) stays flat when `store::upkeep` tends the
//! hot tables as the reaper's leader does, and grows many times over when nothing does (the
//! shape palisade had before it tended them): every task that left the queue leaves a dead
//! entry at the front of the due-task index, where every acquire starts reading.

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

/// The queue-index buffers of an acquire of [`MEASURED`] with the backlog waiting, before and
/// after the rounds.
async fn acquire_cost(upkeep: Upkeep) -> (i64, i64) {
    let database = Database::create().await;
    stop_autovacuum(&database.pool).await;
    let organization = database.organization(None).await;
    let worker = database.worker(organization, ROUND as i32, &[PLUGIN]).await;
    let mut next = 0;
    for _ in 0..BACKLOG / ROUND {
        admit(&database, organization, &mut next, ROUND).await;
    }
    if upkeep == Upkeep::Tended {
        tend(&database.pool, next, 0).await;
    }
    let before = queue_buffers(&database.pool, worker).await;
    for round in 0..ROUNDS {
        admit(&database, organization, &mut next, ROUND).await;
        let claims = database.leases(worker, ROUND).await;
        complete(&database, &claims).await;
        if upkeep == Upkeep::Tended && round % 4 == 3 {
            tend(&database.pool, next, (round + 1) * ROUND).await;
        }
    }
    let after = queue_buffers(&database.pool, worker).await;
    database.drop().await;
    (before, after)
}

async fn queue_buffers(pool: &PgPool, worker: Uuid) -> i64 {
    store::testing::grant_queue_buffers(pool, worker, &[PLUGIN.to_owned()], MEASURED as i64)
        .await
        .expect("explained")
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

/// What the reaper's leader does each upkeep interval, once PostgreSQL's statistics show the
/// `admitted` tasks and the `completed` ones (each updated twice: its lease and its end). A
/// backend publishes them within seconds of its commits; the reaper's reading lags the same way.
async fn tend(pool: &PgPool, admitted: usize, completed: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (inserted, updated): (i64, i64) = sqlx::query_as(
            "SELECT n_tup_ins, n_tup_upd FROM pg_stat_user_tables WHERE relname = 'worker_tasks'",
        )
        .fetch_one(pool)
        .await
        .expect("statistics read");
        if inserted >= admitted as i64 && updated >= 2 * completed as i64 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "PostgreSQL's statistics show {inserted} of {admitted} tasks and {updated} of {} \
             updates after 30 s",
            2 * completed
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    for churn in upkeep::churn(pool).await.expect("churn read") {
        if let (Some(table), Some(work)) = (churn.table(), churn.work()) {
            upkeep::tend(pool, table, work).await.expect("tended");
        }
    }
}

/// Admits `count` more one-plugin scans, each on a target of its own.
async fn admit(database: &Database, organization: Uuid, next: &mut usize, count: usize) {
    let requests: Vec<Request> = (*next..*next + count)
        .map(|index| {
            Request::new(
                organization,
                &format!("http://target-{index}.test"),
                &[PLUGIN],
            )
        })
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_reads_the_same_after_twenty_thousand_tasks_when_palisade_tends_its_tables() {
    let (untended_before, untended_after) = acquire_cost(Upkeep::None).await;
    let (before, after) = acquire_cost(Upkeep::Tended).await;
    eprintln!(
        "queue-index buffers of an acquire: untended {untended_before} → {untended_after}; \
         tended {before} → {after}"
    );
    // Without upkeep the cost grows with every task that passed (the shape this replaced):
    // the test can see the growth it guards against.
    assert!(
        untended_after > 4 * untended_before,
        "untended: {untended_before} → {untended_after} buffers"
    );
    assert!(
        after <= 2 * before,
        "tended: an acquire read {before} buffers of the queue's indexes with {BACKLOG} scans \
         waiting and {after} after {} more passed through",
        ROUND * ROUNDS
    );
}
