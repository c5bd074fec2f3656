//! The ceiling: a *fenced step* the benchmark runs itself, without palisade, in scratch tables
//! of the run's database, on N connections at once: one step per commit, then
//! [`CEILING_BATCH`] per commit; and what the two phases wrote, checked afterwards.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::json;
use tokio::task::JoinSet;

/// What the ceiling measured.
#[derive(Debug, Clone, Default)]
pub struct Ceiling {
    pub connections: usize,
    pub seconds: f64,
    pub steps: u64,
    pub steps_per_second: f64,
    /// Fenced UPDATEs that did not match their (live, correctly tokened) lease row.
    pub fence_misses: u64,
    /// Whether an UPDATE with a stale token matched nothing.
    pub stale_token_refused: bool,
    /// Result and outbox rows in the scratch tables afterwards (both phases).
    pub result_rows: i64,
    pub outbox_rows: i64,
    /// The batched phase: [`CEILING_BATCH`] fenced steps per commit, for as long again.
    pub batched: BatchedCeiling,
}

/// What the ceiling's batched phase measured.
#[derive(Debug, Clone, Copy, Default)]
pub struct BatchedCeiling {
    pub per_commit: usize,
    pub seconds: f64,
    pub steps: u64,
    pub steps_per_second: f64,
    /// Fenced steps of a batch that did not match their lease row.
    pub fence_misses: u64,
}

/// The statements that set up the ceiling's scratch tables, shaped like palisade's own:
/// a lease row with a token and an expiry, result rows unique per (lease, sequence), an outbox
/// with a partial index on what is unpublished.
const CEILING_SCHEMA: [&str; 4] = [
    "CREATE TABLE bench_leases (
        id BIGINT PRIMARY KEY,
        token TEXT NOT NULL,
        expires_at TIMESTAMPTZ NOT NULL,
        renewed_at TIMESTAMPTZ NULL,
        steps BIGINT NOT NULL DEFAULT 0)",
    "CREATE TABLE bench_results (
        id BIGSERIAL PRIMARY KEY,
        lease_id BIGINT NOT NULL REFERENCES bench_leases(id),
        sequence BIGINT NOT NULL,
        payload JSONB NOT NULL,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        UNIQUE (lease_id, sequence))",
    "CREATE TABLE bench_outbox (
        id BIGSERIAL PRIMARY KEY,
        subject TEXT NOT NULL,
        payload BYTEA NOT NULL,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        published_at TIMESTAMPTZ NULL)",
    "CREATE INDEX bench_outbox_unpublished ON bench_outbox (id) WHERE published_at IS NULL",
];

/// Statements of one fenced step as the cost counter counts them: UPDATE, two INSERTs and
/// COMMIT (sqlx does not report `BEGIN`).
pub(super) const CEILING_STATEMENTS_PER_STEP: u64 = 4;

/// Fenced steps per commit in the ceiling's batched phase: about what palisade's consumers
/// decide per transaction under load.
pub const CEILING_BATCH: usize = 100;

/// Where the batched phase's lease rows begin, after the one-step phase's.
const CEILING_BATCH_LEASES_FROM: i64 = 1_000_000;

/// `connections` connections each repeating the fenced step on a lease row of its own for
/// `duration`, then the same batched, then the checks of what they wrote.
pub(super) async fn run(
    database_url: &str,
    connections: usize,
    duration: Duration,
) -> anyhow::Result<Ceiling> {
    anyhow::ensure!(connections > 0, "--ceiling-connections must be at least 1");
    let mut settings = store::DatabaseSettings::new(database_url);
    settings.max_connections = connections as u32;
    let pool = store::connect(&settings).await?;
    create_ceiling_tables(&pool, connections).await?;
    let (steps, fence_misses, seconds) = fenced_in_parallel(
        connections,
        duration,
        "a fenced stepper",
        |connection, deadline| {
            let pool = pool.clone();
            async move { fenced_steps(&pool, connection + 1, deadline).await }
        },
    )
    .await?;
    // The same, batched: each connection fences its own CEILING_BATCH leases per commit.
    let (batched_steps, batched_misses, batched_seconds) = fenced_in_parallel(
        connections,
        duration,
        "a batched fenced stepper",
        |connection, deadline| {
            let pool = pool.clone();
            let first = CEILING_BATCH_LEASES_FROM + connection * CEILING_BATCH as i64;
            async move { fenced_batches(&pool, first, deadline).await }
        },
    )
    .await?;
    let stale_token_refused = sqlx::query(
        "UPDATE bench_leases SET renewed_at = now()
          WHERE id = 1 AND token = 'stale' AND expires_at > now()",
    )
    .execute(&pool)
    .await?
    .rows_affected()
        == 0;
    let (result_rows, outbox_rows) = sqlx::query_as::<_, (i64, i64)>(
        "SELECT (SELECT count(*) FROM bench_results), (SELECT count(*) FROM bench_outbox)",
    )
    .fetch_one(&pool)
    .await?;
    pool.close().await;
    Ok(Ceiling {
        connections,
        seconds,
        steps,
        steps_per_second: steps as f64 / seconds.max(0.001),
        fence_misses,
        stale_token_refused,
        result_rows,
        outbox_rows,
        batched: BatchedCeiling {
            per_commit: CEILING_BATCH,
            seconds: batched_seconds,
            steps: batched_steps,
            steps_per_second: batched_steps as f64 / batched_seconds.max(0.001),
            fence_misses: batched_misses,
        },
    })
}

/// The ceiling's scratch tables, and the lease rows of both phases: one per connection for
/// the one-step phase, [`CEILING_BATCH`] per connection for the batched one.
async fn create_ceiling_tables(pool: &sqlx::PgPool, connections: usize) -> anyhow::Result<()> {
    for statement in CEILING_SCHEMA {
        sqlx::query(statement)
            .execute(pool)
            .await
            .context("cannot create the ceiling's scratch tables")?;
    }
    sqlx::query(
        "INSERT INTO bench_leases (id, token, expires_at)
         SELECT g, md5(g::text), now() + interval '1 hour' FROM generate_series(1, $1) g
         UNION ALL
         SELECT g, md5(g::text), now() + interval '1 hour'
         FROM generate_series($2, $2 + $1 * $3 - 1) g",
    )
    .bind(connections as i64)
    .bind(CEILING_BATCH_LEASES_FROM)
    .bind(CEILING_BATCH as i64)
    .execute(pool)
    .await
    .context("cannot create the ceiling's leases")?;
    Ok(())
}

/// One phase of the ceiling: `stepper` run once per connection (given its index, from 0, and
/// the deadline `duration` from now), all at once. Returns the steps and the fence misses they
/// counted, and the seconds until the last ended; `stepper` names them when one panics.
async fn fenced_in_parallel<F>(
    connections: usize,
    duration: Duration,
    stepper: &str,
    start: impl Fn(i64, Instant) -> F,
) -> anyhow::Result<(u64, u64, f64)>
where
    F: std::future::Future<Output = anyhow::Result<(u64, u64)>> + Send + 'static,
{
    let started = Instant::now();
    let deadline = started + duration;
    let mut steppers = JoinSet::new();
    for connection in 0..connections as i64 {
        steppers.spawn(start(connection, deadline));
    }
    let (mut steps, mut misses) = (0, 0);
    while let Some(stepped) = steppers.join_next().await {
        let (stepped, missed) = stepped.with_context(|| format!("{stepper} panicked"))??;
        steps += stepped;
        misses += missed;
    }
    Ok((steps, misses, started.elapsed().as_secs_f64()))
}

/// The fenced step on lease row `lease` until `deadline`: returns the steps committed and the
/// fenced UPDATEs that matched nothing (rolled back; there should be none).
async fn fenced_steps(
    pool: &sqlx::PgPool,
    lease: i64,
    deadline: Instant,
) -> anyhow::Result<(u64, u64)> {
    let token: String = sqlx::query_scalar("SELECT token FROM bench_leases WHERE id = $1")
        .bind(lease)
        .fetch_one(pool)
        .await?;
    let finding = json!({
        "rule_id": "bench-0",
        "severity": "medium",
        "resource": "bench://ceiling",
        "title": "a result row the size of one finding",
    });
    let outbox_payload = vec![0x5a_u8; 160];
    let (mut steps, mut misses) = (0_u64, 0_u64);
    while Instant::now() < deadline {
        let mut transaction = pool.begin().await?;
        let fenced = sqlx::query(
            "UPDATE bench_leases SET renewed_at = now(), steps = steps + 1
              WHERE id = $1 AND token = $2 AND expires_at > now()",
        )
        .bind(lease)
        .bind(&token)
        .execute(&mut *transaction)
        .await?
        .rows_affected();
        if fenced != 1 {
            misses += 1;
            transaction.rollback().await?;
            continue;
        }
        sqlx::query("INSERT INTO bench_results (lease_id, sequence, payload) VALUES ($1, $2, $3)")
            .bind(lease)
            .bind(steps as i64)
            .bind(&finding)
            .execute(&mut *transaction)
            .await?;
        sqlx::query("INSERT INTO bench_outbox (subject, payload) VALUES ($1, $2)")
            .bind("bench.v1.event.result")
            .bind(&outbox_payload)
            .execute(&mut *transaction)
            .await?;
        transaction.commit().await?;
        steps += 1;
    }
    Ok((steps, misses))
}

/// The fenced step set-wise on the [`CEILING_BATCH`] lease rows from `first` until `deadline`:
/// one UPDATE fencing all of them by id and token, one INSERT of their results, one of their
/// outbox rows, COMMIT. Returns the steps committed and the leases a batch's UPDATE did not
/// match (the batch is rolled back; there should be none).
async fn fenced_batches(
    pool: &sqlx::PgPool,
    first: i64,
    deadline: Instant,
) -> anyhow::Result<(u64, u64)> {
    let ids: Vec<i64> = (first..first + CEILING_BATCH as i64).collect();
    let tokens: Vec<String> = sqlx::query_scalar(
        "SELECT l.token FROM UNNEST($1::bigint[]) WITH ORDINALITY AS i(id, position)
         JOIN bench_leases l ON l.id = i.id ORDER BY i.position",
    )
    .bind(&ids)
    .fetch_all(pool)
    .await?;
    let findings: Vec<serde_json::Value> = (0..CEILING_BATCH)
        .map(|index| {
            json!({
                "rule_id": format!("bench-{index}"),
                "severity": "medium",
                "resource": "bench://ceiling",
                "title": "a result row the size of one finding",
            })
        })
        .collect();
    let subjects = vec!["bench.v1.event.result"; CEILING_BATCH];
    let outbox_payloads = vec![vec![0x5a_u8; 160]; CEILING_BATCH];
    let (mut steps, mut misses, mut sequence) = (0_u64, 0_u64, 0_i64);
    while Instant::now() < deadline {
        let mut transaction = pool.begin().await?;
        let fenced = sqlx::query(
            "UPDATE bench_leases l SET renewed_at = now(), steps = l.steps + 1
              FROM UNNEST($1::bigint[], $2::text[]) AS f(id, token)
              WHERE l.id = f.id AND l.token = f.token AND l.expires_at > now()",
        )
        .bind(&ids)
        .bind(&tokens)
        .execute(&mut *transaction)
        .await?
        .rows_affected();
        if fenced != CEILING_BATCH as u64 {
            misses += CEILING_BATCH as u64 - fenced;
            transaction.rollback().await?;
            continue;
        }
        sqlx::query(
            "INSERT INTO bench_results (lease_id, sequence, payload)
             SELECT id, $2, payload FROM UNNEST($1::bigint[], $3::jsonb[]) AS r(id, payload)",
        )
        .bind(&ids)
        .bind(sequence)
        .bind(&findings)
        .execute(&mut *transaction)
        .await?;
        sqlx::query(
            "INSERT INTO bench_outbox (subject, payload)
             SELECT * FROM UNNEST($1::text[], $2::bytea[])",
        )
        .bind(&subjects)
        .bind(&outbox_payloads)
        .execute(&mut *transaction)
        .await?;
        transaction.commit().await?;
        steps += CEILING_BATCH as u64;
        sequence += 1;
    }
    Ok((steps, misses))
}
