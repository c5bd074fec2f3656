//! The lease conformance suite and `run` against PostgreSQL, in a database of the test's own
//! (`DATABASE_URL`, default `postgres://postgres@127.0.0.1:5432/postgres`, names the server).

use std::future::Future;
use std::time::Duration;

use lease::{CancellationToken, Election, PgStore, RunConfig, Store, SystemClock};
use sqlx::PgPool;

const LOCAL_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_conforms() {
    with_database(|pool| async move {
        warm(&pool, lease::conformance::ACQUIRERS_CONCURRENT).await;
        lease::conformance::run_all(&PgStore::new(pool)).await;
    })
    .await;
}

/// Two candidates on real time and a real database: one leads, and a clean stop hands over
/// within one retry interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_hands_over_on_postgres() {
    with_database(|pool| async move {
        let store = PgStore::new(pool);
        let config = RunConfig::new(Duration::from_secs(3), Duration::from_millis(200)).unwrap();
        let (first, mut first_leads) = spawn(&store, "a", config);
        first_leads.wait_for(|leads| *leads).await.unwrap();
        let (second, mut second_leads) = spawn(&store, "b", config);
        // An observation window, not a synchronization: the second candidate campaigns a few
        // times against a held lease and must lose every time.
        tokio::time::sleep(config.retry() * 3).await;
        assert!(!*second_leads.borrow(), "two leaders at once");

        let stopped_at = tokio::time::Instant::now();
        first.0.cancel();
        first.1.await.unwrap();
        second_leads.wait_for(|leads| *leads).await.unwrap();
        let handed_over = stopped_at.elapsed();
        // One retry interval, plus scheduling and round trips on a busy machine; the exact
        // bound is tested on paused time in `run`'s unit tests.
        assert!(
            handed_over <= config.retry() + Duration::from_secs(1),
            "handed over after {handed_over:?}"
        );
        second.0.cancel();
        second.1.await.unwrap();
        let released = store
            .acquire(lease::names::REAPER, "c", chrono::Utc::now(), config.ttl())
            .await
            .unwrap();
        assert!(released.is_some(), "released at shutdown");
    })
    .await;
}

type Running = (CancellationToken, tokio::task::JoinHandle<()>);

fn spawn(
    store: &PgStore,
    owner: &str,
    config: RunConfig,
) -> (Running, tokio::sync::watch::Receiver<bool>) {
    let election = Election::new(
        store.clone(),
        SystemClock,
        lease::names::REAPER,
        owner,
        config,
    );
    let leads = election.watch();
    let shutdown = CancellationToken::new();
    let task =
        tokio::spawn(election.run(|term| async move { term.ended().await }, shutdown.clone()));
    ((shutdown, task), leads)
}

/// Opens `connections` connections at once, so racing acquirers do not wait on connects.
async fn warm(pool: &PgPool, connections: usize) {
    let held = join_all((0..connections).map(|_| pool.acquire())).await;
    for connection in held {
        connection.expect("a pool connection");
    }
}

async fn join_all<F: Future + Send + 'static>(futures: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F::Output: Send,
{
    let mut set = tokio::task::JoinSet::new();
    for future in futures {
        set.spawn(future);
    }
    let mut outputs = Vec::new();
    while let Some(output) = set.join_next().await {
        outputs.push(output.expect("no panic"));
    }
    outputs
}

/// Runs `test` on a migrated database named for this test alone, and drops the database
/// afterwards, also when the test panics.
async fn with_database<F, Fut>(test: F)
where
    F: FnOnce(PgPool) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let server = std::env::var("DATABASE_URL").unwrap_or_else(|_| LOCAL_DATABASE_URL.to_owned());
    let database = format!("lease_test_{}", uuid::Uuid::new_v4().simple());
    let url = store::with_database(&server, &database);
    store::create_database_if_missing(&url)
        .await
        .expect("create the test database");
    let mut settings = store::DatabaseSettings::new(url.clone());
    settings.max_connections = u32::try_from(lease::conformance::ACQUIRERS_CONCURRENT).unwrap();
    let pool = store::connect(&settings).await.expect("connect");
    store::migrate(&pool).await.expect("migrate");
    let outcome = tokio::spawn(test(pool.clone())).await;
    pool.close().await;
    store::drop_database(&url)
        .await
        .expect("drop the test database");
    if let Err(error) = outcome {
        std::panic::resume_unwind(error.into_panic());
    }
}
