//! Indexes on tables that grow are built by `palisade migrate` concurrently, outside any
//! transaction (`store::online_indexes`, issue 27 item 2): writes to the table go on while a
//! build waits for a writer, where a build inside a transaction blocks them; an INVALID index an
//! interrupted build left is dropped and built again; a build that would fail is refused first.

use std::time::Duration;

use sqlx::Executor as _;
use store::online_indexes::{self, Built, IndexState, OnlineIndex, Preflight};
use tests::TestSystem;
use uuid::Uuid;

const INDEX: &str = "scans_target_created_idx";

/// Two admitted scans of one organization.
async fn two_scans(system: &TestSystem) -> (Uuid, Uuid) {
    let organization = system.organization().await;
    let mut scans = Vec::new();
    for target in ["https://one.example", "https://two.example"] {
        let reply = system
            .submit(&system.request(organization, target, &["tcp_connect"]))
            .await;
        scans.push(reply.scan_id.parse().unwrap());
    }
    (scans[0], scans[1])
}

/// Updates scan `id` from a connection of its own that gives up after `timeout`.
async fn write(system: &TestSystem, id: Uuid, timeout: Duration) -> Result<(), sqlx::Error> {
    let mut conn = system.pool.acquire().await.unwrap();
    conn.execute(sqlx::AssertSqlSafe(format!(
        "SET statement_timeout = {}",
        timeout.as_millis()
    )))
    .await
    .unwrap();
    sqlx::query("UPDATE scans SET failure_reason = failure_reason WHERE id = $1")
        .bind(id)
        .execute(&mut *conn)
        .await
        .map(|_| ())
}

/// Waits until a session runs `statement` and waits on a lock.
async fn waiting_on_a_lock(system: &TestSystem, statement: &str) {
    system
        .wait_for(&format!("{statement} waiting"), || async {
            let waiting: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                 WHERE datname = current_database() AND query LIKE $1 AND wait_event_type = 'Lock')",
            )
            .bind(format!("%{statement}%"))
            .fetch_one(&system.pool)
            .await
            .unwrap();
            waiting.then_some(())
        })
        .await;
}

#[tokio::test]
async fn a_concurrent_index_build_lets_writes_through_where_a_transactional_one_blocks_them() {
    let system = TestSystem::spawn().await;
    let (held, other) = two_scans(&system).await;
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP INDEX {INDEX}")))
        .execute(&system.pool)
        .await
        .unwrap();

    // A transaction writing the table stays open: any index build must wait for it.
    let mut writer = system.pool.begin().await.unwrap();
    sqlx::query("UPDATE scans SET failure_reason = failure_reason WHERE id = $1")
        .bind(held)
        .execute(&mut *writer)
        .await
        .unwrap();

    // The control: built inside a transaction, as a migration would, the index waits for the
    // writer with a SHARE lock requested, and every other write queues behind it.
    let control = {
        let pool = system.pool.clone();
        tokio::spawn(async move {
            let mut tx = pool.begin().await.unwrap();
            sqlx::query("CREATE INDEX in_transaction_idx ON scans (target_id)")
                .execute(&mut *tx)
                .await
                .map(|_| ())
        })
    };
    waiting_on_a_lock(&system, "CREATE INDEX in_transaction_idx").await;
    let blocked = write(&system, other, Duration::from_millis(1_000)).await;
    assert!(
        blocked.is_err(),
        "a transactional build blocks writes: {blocked:?}"
    );
    sqlx::query(
        "SELECT pg_cancel_backend(pid) FROM pg_stat_activity
         WHERE datname = current_database() AND query LIKE '%CREATE INDEX in_transaction_idx%'
           AND pid <> pg_backend_pid()",
    )
    .execute(&system.pool)
    .await
    .unwrap();
    assert!(control.await.unwrap().is_err(), "the control was cancelled");

    // Concurrently, the build waits for the same writer while writes go through.
    let build = {
        let pool = system.pool.clone();
        tokio::spawn(
            async move { online_indexes::build(&pool, online_indexes::ONLINE_INDEXES).await },
        )
    };
    waiting_on_a_lock(
        &system,
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS scans_target_created_idx",
    )
    .await;
    for _ in 0..5 {
        write(&system, other, Duration::from_millis(1_000))
            .await
            .expect("a write goes through while the concurrent build waits");
    }
    // A scan admitted meanwhile (an insert through admission) goes through too.
    let organization = system.organization().await;
    let admitted = system
        .submit(&system.request(organization, "https://three.example", &["tcp_connect"]))
        .await;
    assert!(admitted.error.is_none(), "{admitted:?}");
    assert_eq!(
        online_indexes::state(&system.pool, INDEX).await.unwrap(),
        IndexState::Invalid,
        "still building"
    );

    writer.commit().await.unwrap();
    let built = build.await.unwrap().unwrap();
    assert_eq!(built, [(INDEX, Built::Built)]);
    assert_eq!(
        online_indexes::state(&system.pool, INDEX).await.unwrap(),
        IndexState::Valid
    );
    system.finish().await;
}

#[tokio::test]
async fn an_invalid_index_left_by_an_interrupted_build_is_dropped_and_built_again() {
    let system = TestSystem::spawn().await;
    // What an interrupted CREATE INDEX CONCURRENTLY leaves: the index, marked invalid.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE pg_index SET indisvalid = false WHERE indexrelid = '{INDEX}'::regclass"
    )))
    .execute(&system.pool)
    .await
    .unwrap();
    assert_eq!(
        online_indexes::state(&system.pool, INDEX).await.unwrap(),
        IndexState::Invalid
    );
    // `palisade migrate` again: the invalid index is replaced by a valid one.
    store::migrate(&system.pool).await.unwrap();
    assert_eq!(
        online_indexes::state(&system.pool, INDEX).await.unwrap(),
        IndexState::Valid
    );
    let again = online_indexes::build(&system.pool, online_indexes::ONLINE_INDEXES)
        .await
        .unwrap();
    assert_eq!(
        again,
        [(INDEX, Built::AlreadyValid)],
        "a valid index is left alone"
    );
    system.finish().await;
}

#[tokio::test]
async fn a_build_that_would_fail_is_refused_before_anything_changes() {
    let system = TestSystem::spawn().await;
    sqlx::raw_sql(
        "CREATE TABLE online_test (k int); INSERT INTO online_test VALUES (1), (1), (2), (2), (3)",
    )
    .execute(&system.pool)
    .await
    .unwrap();
    let unique = OnlineIndex {
        name: "online_test_k_key",
        table: "online_test",
        migration: online_indexes::ONLINE_SINCE,
        build: "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS online_test_k_key ON online_test (k)",
        drop: "DROP INDEX CONCURRENTLY IF EXISTS online_test_k_key",
        preflight: Some(Preflight {
            statement: "SELECT count(*) FROM (SELECT k FROM online_test GROUP BY k HAVING count(*) > 1) d",
            remedy: "remove the duplicate keys",
        }),
    };
    let refused = online_indexes::preflight(&system.pool, &[unique])
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("online_test_k_key")
            && refused.contains("2 row(s)")
            && refused.contains("remove the duplicate keys"),
        "{refused}"
    );
    assert_eq!(
        online_indexes::state(&system.pool, unique.name)
            .await
            .unwrap(),
        IndexState::Absent
    );

    // Built anyway, it fails and leaves an INVALID index; fixed, the next build replaces it.
    assert!(
        online_indexes::build(&system.pool, &[unique])
            .await
            .is_err()
    );
    assert_eq!(
        online_indexes::state(&system.pool, unique.name)
            .await
            .unwrap(),
        IndexState::Invalid
    );
    sqlx::query(
        "DELETE FROM online_test WHERE ctid NOT IN (SELECT min(ctid) FROM online_test GROUP BY k)",
    )
    .execute(&system.pool)
    .await
    .unwrap();
    online_indexes::preflight(&system.pool, &[unique])
        .await
        .unwrap();
    let rebuilt = online_indexes::build(&system.pool, &[unique])
        .await
        .unwrap();
    assert_eq!(rebuilt, [(unique.name, Built::Rebuilt)]);
    assert_eq!(
        online_indexes::state(&system.pool, unique.name)
            .await
            .unwrap(),
        IndexState::Valid
    );
    system.finish().await;
}
