//! What every script test needs: a database of its own, seeded through the store's API, and a
//! script run in each of its forms.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use messages::Subjects;
use store::admit::{Admit, AdmitOutcome, AdmitParams};
use store::lease::{AcquireOutcome, AcquireParams, GrantedLease, HelloOutcome, HelloParams};
use store::{LeaseClaim, PgPool, ProgressEvents, Script, Staged, StoreError};
use uuid::Uuid;

/// The server the tests use when `DATABASE_URL` is not set.
const LOCAL_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// A migrated database made for one test, dropped by [`Database::drop`].
pub struct Database {
    pub pool: PgPool,
    pub subjects: Subjects,
    url: String,
}

impl Database {
    pub async fn create() -> Self {
        let server = std::env::var("DATABASE_URL").unwrap_or_else(|_| LOCAL_DATABASE_URL.into());
        let name = format!("store_scripts_{}", Uuid::new_v4().simple());
        let url = store::with_database(&server, &name);
        store::create_database_if_missing(&url)
            .await
            .expect("the test's database is created");
        let pool = store::connect(&store::DatabaseSettings::new(url.clone()))
            .await
            .expect("the test's database answers");
        store::migrate(&pool).await.expect("the schema migrates");
        Self {
            pool,
            subjects: Subjects::new(Subjects::DEFAULT_PREFIX).expect("the default prefix"),
            url,
        }
    }

    pub async fn drop(self) {
        self.pool.close().await;
        store::drop_database(&self.url)
            .await
            .expect("the test's database is dropped");
    }

    /// A new organization, with an hourly scan quota or none.
    pub async fn organization(&self, hourly_scan_quota: Option<i32>) -> Uuid {
        let id = Uuid::now_v7();
        store::admin::create_organization(&self.pool, id, "store tests", hourly_scan_quota)
            .await
            .expect("organization created");
        id
    }

    /// A worker assigned to `organization_id` that said hello with `capacity` slots for
    /// `plugins`.
    pub async fn worker(&self, organization_id: Uuid, capacity: i32, plugins: &[&str]) -> Uuid {
        let id = Uuid::now_v7();
        store::admin::register_worker(&self.pool, id, "store-tests", capacity)
            .await
            .expect("worker registered");
        let change = store::audit::Change::new("store tests", "");
        store::admin::assign_worker(&self.pool, organization_id, id, &change)
            .await
            .expect("worker assigned");
        let capabilities: Vec<String> = plugins.iter().map(|plugin| (*plugin).into()).collect();
        let hello = store::lease::hello(
            &self.pool,
            &HelloParams {
                worker_id: id,
                software_version: "store-tests",
                protocol_version: "1",
                capabilities: &capabilities,
                capacity,
                rules: &[],
            },
        )
        .await
        .expect("hello decided");
        assert!(matches!(hello, HelloOutcome::Accepted { .. }), "{hello:?}");
        id
    }

    /// Admits `requests` (committed); every one must be admitted: (scan id, task id) each.
    pub async fn admitted(&self, requests: &[Request]) -> Vec<(Uuid, Uuid)> {
        let params: Vec<AdmitParams<'_>> = requests.iter().map(Request::params).collect();
        let script = Admit {
            subjects: &self.subjects,
            requests: &params,
        };
        let (outcomes, _) = store::decide_batch(&self.pool, ProgressEvents::On, &script)
            .await
            .expect("the requests are decided");
        outcomes
            .into_iter()
            .map(|outcome| match outcome {
                Ok(AdmitOutcome::Admitted { scan_id, task_id }) => (scan_id, task_id),
                other => panic!("not admitted: {other:?}"),
            })
            .collect()
    }

    /// `count` leases granted to `worker_id`, as the worker presents them.
    pub async fn leases(&self, worker_id: Uuid, count: usize) -> Vec<LeaseClaim> {
        let mut granted: Vec<GrantedLease> = Vec::with_capacity(count);
        for _ in 0..count {
            if granted.len() == count {
                break;
            }
            let (outcome, _) = store::lease::acquire(
                &self.pool,
                &mut Staged::default(),
                &self.subjects,
                &AcquireParams {
                    worker_id,
                    request_id: Uuid::new_v4(),
                    max_tasks: (count - granted.len()) as i64,
                    lease_ttl: Duration::from_secs(300),
                },
            )
            .await
            .expect("the acquire is decided");
            match outcome {
                AcquireOutcome::Leases(leases) => granted.extend(leases),
                AcquireOutcome::Refused(error) => panic!("acquire refused: {error:?}"),
            }
        }
        assert_eq!(granted.len(), count, "leases granted");
        granted
            .into_iter()
            .map(|lease| LeaseClaim {
                worker_id,
                task_id: lease.task_id,
                attempt_id: lease.attempt_id,
                attempt_number: lease.attempt_number,
                lease_token: lease.lease_token,
            })
            .collect()
    }

    /// What the database holds now ([`store::testing::tally`]).
    pub async fn tally(&self) -> BTreeMap<String, i64> {
        let mut conn = self.pool.acquire().await.expect("a connection");
        store::testing::tally(&mut conn).await.expect("tallied")
    }
}

/// A scan request as admission's validation leaves it, owning what [`AdmitParams`] borrows.
#[derive(Debug, Clone)]
pub struct Request {
    pub organization_id: Uuid,
    pub target: String,
    pub plugins: Vec<String>,
    pub priority: i32,
    pub client_id: String,
    pub idempotency_key: String,
    pub fingerprint: String,
}

impl Request {
    /// A request under a new idempotency key.
    pub fn new(organization_id: Uuid, target: &str, plugins: &[&str]) -> Self {
        Self {
            organization_id,
            target: target.into(),
            plugins: plugins.iter().map(|plugin| (*plugin).into()).collect(),
            priority: 0,
            client_id: "store-tests".into(),
            idempotency_key: Uuid::new_v4().to_string(),
            fingerprint: String::new(),
        }
        .fingerprinted()
    }

    /// The same request with another priority: another fingerprint under the same key.
    pub fn with_priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self.fingerprinted()
    }

    /// The same request with another target.
    pub fn with_target(mut self, target: &str) -> Self {
        self.target = target.into();
        self.fingerprinted()
    }

    /// The same request as `client_id` under `idempotency_key`.
    pub fn by_client(mut self, client_id: &str, idempotency_key: &str) -> Self {
        self.client_id = client_id.into();
        self.idempotency_key = idempotency_key.into();
        self.fingerprinted()
    }

    fn fingerprinted(mut self) -> Self {
        self.fingerprint = messages::scan_request_fingerprint(&messages::v1::ScanRequest {
            schema_version: 1,
            organization_id: self.organization_id.to_string(),
            target: self.target.clone(),
            plugins: self.plugins.clone(),
            priority: self.priority,
            execution_deadline_seconds: 0,
            client_id: self.client_id.clone(),
            idempotency_key: self.idempotency_key.clone(),
        });
        self
    }

    pub fn params(&self) -> AdmitParams<'_> {
        AdmitParams {
            organization_id: self.organization_id,
            target: &self.target,
            plugins: &self.plugins,
            priority: self.priority,
            execution_deadline_seconds: None,
            client_id: &self.client_id,
            idempotency_key: &self.idempotency_key,
            fingerprint: &self.fingerprint,
            max_attempts: 3,
            trace_context: None,
        }
    }
}

/// A script's form.
#[derive(Debug, Clone, Copy)]
pub enum Form {
    SetWise,
    OneByOne,
}

/// What one run of a script decided, what the database held after it, and the events it
/// staged.
#[derive(Debug)]
pub struct Decided<O> {
    pub outcomes: O,
    pub tally: BTreeMap<String, i64>,
    pub events: usize,
}

/// Runs `form` of `script` in a fresh transaction and rolls it back, so that the other form
/// can decide the same batch on the same rows.
pub async fn rehearse<S: Script + Sync>(
    database: &Database,
    script: &S,
    form: Form,
) -> Result<Decided<S::Outcomes>, StoreError> {
    let mut tx = database.pool.begin().await?;
    let mut staged = Staged::new(ProgressEvents::On);
    let outcomes = match form {
        Form::SetWise => script.set_wise(&mut tx, &mut staged).await?,
        Form::OneByOne => script.one_by_one(&mut tx, &mut staged).await?,
    };
    let tally = store::testing::tally(&mut tx).await?;
    tx.rollback().await?;
    Ok(Decided {
        outcomes,
        tally,
        events: staged.len(),
    })
}

/// Runs `script` through [`store::decide_batch`], committed.
pub async fn commit<S: Script + Sync>(database: &Database, script: &S) -> Decided<S::Outcomes> {
    let (outcomes, staged) = store::decide_batch(&database.pool, ProgressEvents::On, script)
        .await
        .expect("the batch is decided");
    Decided {
        outcomes,
        tally: database.tally().await,
        events: staged.len(),
    }
}

/// Names for ids that differ from run to run: the ones a test knows by name, and the ones a
/// decision made (`new#0`, `new#1`, … in order of first appearance).
#[derive(Debug, Clone, Default)]
pub struct Names {
    names: HashMap<Uuid, String>,
    made: usize,
}

impl Names {
    pub fn know(&mut self, id: Uuid, name: &str) {
        self.names.insert(id, name.into());
    }

    pub fn name(&mut self, id: Uuid) -> String {
        if let Some(name) = self.names.get(&id) {
            return name.clone();
        }
        let name = format!("new#{}", self.made);
        self.made += 1;
        self.names.insert(id, name.clone());
        name
    }
}

/// `after` less `before`, per key, leaving out what did not change.
pub fn difference(
    before: &BTreeMap<String, i64>,
    after: &BTreeMap<String, i64>,
) -> BTreeMap<String, i64> {
    before
        .keys()
        .chain(after.keys())
        .filter_map(|key| {
            let change = after.get(key).copied().unwrap_or_default()
                - before.get(key).copied().unwrap_or_default();
            (change != 0).then(|| (key.clone(), change))
        })
        .collect()
}
