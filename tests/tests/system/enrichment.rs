//! The enrichment job lifecycle (SPEC §4.4, I11; issue 11, item 1): exactly `max_attempts`
//! executions of a job that always fails, then `failed` with one `enrichment.failed`; a stale
//! claim fenced on renewal, checkpoint, CVE writes, failure and completion by a newer one (two claims,
//! no race left to chance); a crashed execution recovered by the reaper's sweep and resumed
//! from its checkpoint, without redoing the steps before it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use enrichment::{Enricher, Execution, JobInput, Step, StepError};
use futures::future::BoxFuture;
use messages::retry::RetryPolicy;
use messages::{EventKind, v1};
use store::enrichment::FailOutcome;
use tests::TestSystem;
use uuid::Uuid;

/// No backoff: a retried job is due again at once.
const QUICK_RETRY: RetryPolicy = RetryPolicy::new(Duration::ZERO, Duration::ZERO);

/// A completed scan whose enrichment job is pending, its findings naming a CVE.
async fn scan_to_enrich(system: &TestSystem) -> (Uuid, Uuid) {
    system.scan_to_enrich(&["CVE-2021-44228"]).await
}

async fn job_row(system: &TestSystem, job_id: Uuid) -> (String, i32, serde_json::Value, String) {
    sqlx::query_as(
        "SELECT state, attempt_count, checkpoint, last_error FROM enrichment_jobs WHERE id = $1",
    )
    .bind(job_id)
    .fetch_one(&system.pool)
    .await
    .expect("the job")
}

/// Events of `kind` naming `job_id`, published or not.
async fn events(system: &TestSystem, kind: EventKind, job_id: Uuid) -> usize {
    let payloads = tests::written_payloads(system, kind).await;
    payloads
        .iter()
        .filter(|payload| {
            use prost::Message as _;
            let job = match kind {
                EventKind::EnrichmentCompleted => {
                    v1::EnrichmentCompleted::decode(payload.as_slice()).map(|e| e.job_id)
                }
                _ => v1::EnrichmentFailed::decode(payload.as_slice()).map(|e| e.job_id),
            };
            job.is_ok_and(|id| id == job_id.to_string())
        })
        .count()
}

fn service(
    system: &TestSystem,
    enricher: impl Enricher,
    lease_ttl: Duration,
) -> enrichment::Service {
    let mut settings = system.settings.enrichment.clone();
    settings.http_addr = None;
    settings.lease_ttl = lease_ttl;
    settings.retry = QUICK_RETRY;
    enrichment::Service::with_enricher(
        settings,
        runtime::Connections {
            pool: system.pool.clone(),
            bus: system.bus.clone(),
        },
        Arc::new(enricher),
    )
}

fn service_with(system: &TestSystem, enricher: impl Enricher) -> enrichment::Service {
    service(system, enricher, Duration::from_secs(30))
}

/// Fails every step, retryably, counting them.
#[derive(Default, Clone)]
struct AlwaysFails(Arc<AtomicUsize>);

impl Enricher for AlwaysFails {
    fn step<'a>(
        &'a self,
        _job: &'a JobInput,
        _checkpoint: &'a serde_json::Value,
    ) -> BoxFuture<'a, Result<Step, StepError>> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Box::pin(async {
            Err(StepError {
                error: v1::Error {
                    code: "nvd_unavailable".into(),
                    message: "NVD answered 503".into(),
                    ..Default::default()
                },
                retryable: true,
            })
        })
    }
}

#[tokio::test]
async fn a_job_that_always_fails_runs_exactly_max_attempts_times_then_fails_until_requeued() {
    let system = TestSystem::spawn().await;
    let (scan_id, job_id) = scan_to_enrich(&system).await;
    let enricher = AlwaysFails::default();
    let service = service(&system, enricher.clone(), Duration::from_secs(30));

    let mut executions = Vec::new();
    for _ in 0..20 {
        for (id, outcome) in service.run_once().await.expect("a pass") {
            assert_eq!(id, job_id);
            executions.push(outcome);
        }
        if job_row(&system, job_id).await.0 == "failed" {
            break;
        }
    }
    assert_eq!(
        executions,
        [Execution::Retrying, Execution::Retrying, Execution::Failed],
        "three executions (max_attempts), the last one terminal"
    );
    assert_eq!(enricher.0.load(Ordering::SeqCst), 3);
    let (state, attempts, _, last_error) = job_row(&system, job_id).await;
    assert_eq!((state.as_str(), attempts), ("failed", 3));
    assert_eq!(last_error, "nvd_unavailable: NVD answered 503");
    assert!(
        service.run_once().await.expect("a pass").is_empty(),
        "a failed job is never claimed"
    );
    assert_eq!(
        events(&system, EventKind::EnrichmentFailed, job_id).await,
        1
    );
    assert_eq!(
        events(&system, EventKind::EnrichmentCompleted, job_id).await,
        0
    );

    // Requeued from the command line (`palisade scan enrich`), it runs again and completes.
    let answer = palisade::commands::enrich(&system.pool, scan_id)
        .await
        .expect("an answer");
    assert_eq!(
        (&answer["outcome"], &answer["status"], &answer["job_id"]),
        (
            &"requeued".into(),
            &"pending".into(),
            &job_id.to_string().into()
        )
    );
    let again = service_with(&system, enrichment::RecordOnly);
    assert_eq!(
        again.run_once().await.expect("a pass"),
        [(job_id, Execution::Completed)]
    );
    let answer = palisade::commands::enrich(&system.pool, scan_id)
        .await
        .expect("an answer");
    assert_eq!(answer["outcome"], "completed");
    system.finish().await;
}

#[tokio::test]
async fn a_stale_claim_is_fenced_on_renewal_checkpoint_cve_writes_failure_and_completion() {
    let system = TestSystem::spawn().await;
    let (_scan_id, job_id) = scan_to_enrich(&system).await;
    let ttl = Duration::from_secs(30);
    let stale = store::enrichment::claim(&system.pool, "enrichment-a", ttl, 8)
        .await
        .expect("a claim")
        .pop()
        .expect("the job");
    assert!(
        store::enrichment::checkpoint(&system.pool, &stale, &serde_json::json!({"page": 1}))
            .await
            .unwrap()
    );

    // Its lease lapses (a stalled process); the reaper's sweep returns it to the queue and a
    // newer claim takes it, resuming from the checkpoint.
    sqlx::query(
        "UPDATE enrichment_jobs SET lease_expires_at = now() - interval '1 second' WHERE id = $1",
    )
    .bind(job_id)
    .execute(&system.pool)
    .await
    .expect("lapsed");
    let recovered = system.sweep_enrichment().await;
    assert_eq!(recovered.retried, [job_id]);
    let fresh = store::enrichment::claim(&system.pool, "enrichment-b", ttl, 8)
        .await
        .expect("a claim")
        .pop()
        .expect("the job again");
    assert!(fresh.fencing_token > stale.fencing_token);
    assert_eq!(fresh.checkpoint, serde_json::json!({"page": 1}));
    assert_eq!(fresh.attempt_count, 2);

    // Everything the stale claim writes is refused and changes nothing.
    let pool = &system.pool;
    assert!(!store::enrichment::renew(pool, &stale, ttl).await.unwrap());
    assert!(
        !store::enrichment::checkpoint(pool, &stale, &serde_json::json!({"page": 9}))
            .await
            .unwrap()
    );
    let error = v1::Error {
        code: "nvd_unavailable".into(),
        ..Default::default()
    };
    assert_eq!(
        store::enrichment::fail(pool, &system.subjects, QUICK_RETRY, &stale, &error, false)
            .await
            .unwrap(),
        FailOutcome::Fenced
    );
    let done = serde_json::json!({"source": "stale"});
    assert!(
        store::enrichment::complete(pool, &system.subjects, &[(&stale, done)])
            .await
            .unwrap()
            .is_empty()
    );
    let (state, _, checkpoint, last_error) = job_row(&system, job_id).await;
    assert_eq!(state, "running");
    assert_eq!(checkpoint, serde_json::json!({"page": 1}));
    assert!(last_error.starts_with("lease_expired"), "{last_error}");

    // Nor do its CVE writes: no CVE row, no finding's CVE data, no hold on the sync or move
    // of its watermark.
    let record = store::cves::CveRecord::unknown("CVE-2021-44228");
    let origin = store::cves::CveOrigin::Nvd;
    let (sync, forever) = (store::cves::NVD_SYNC, Duration::ZERO);
    assert_eq!(
        store::cves::upsert(
            pool,
            Some(stale.fence()),
            origin,
            std::slice::from_ref(&record)
        )
        .await
        .unwrap(),
        store::cves::Written::Fenced
    );
    assert_eq!(
        store::cves::write_findings(pool, stale.fence())
            .await
            .unwrap(),
        store::cves::FindingsWritten::Fenced
    );
    assert_eq!(
        store::cves::take_sync(pool, stale.fence(), sync, forever)
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        store::cves::finish_sync(pool, stale.fence(), sync, chrono::Utc::now())
            .await
            .unwrap(),
        store::cves::Written::Fenced
    );
    let cve_writes: (i64, i64, bool) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM cves), \
                (SELECT count(*) FROM findings WHERE cve_data IS NOT NULL), \
                (SELECT synced_through IS NULL AND holder_job_id IS NULL FROM cve_sync)",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(cve_writes, (0, 0, true));

    // The holder's writes go through.
    assert_eq!(
        store::cves::upsert(pool, Some(fresh.fence()), origin, &[record])
            .await
            .unwrap(),
        store::cves::Written::Rows(1)
    );
    assert_eq!(
        store::cves::write_findings(pool, fresh.fence())
            .await
            .unwrap(),
        store::cves::FindingsWritten::Written {
            findings: 2,
            written: 2
        }
    );
    assert!(
        store::cves::take_sync(pool, fresh.fence(), sync, forever)
            .await
            .unwrap()
            .is_some()
    );
    assert!(store::enrichment::renew(pool, &fresh, ttl).await.unwrap());
    let done = serde_json::json!({"source": "fresh"});
    assert_eq!(
        store::enrichment::complete(pool, &system.subjects, &[(&fresh, done.clone())])
            .await
            .unwrap(),
        [job_id]
    );
    let (state, attempts, checkpoint, _) = job_row(&system, job_id).await;
    assert_eq!(
        (state.as_str(), attempts, checkpoint),
        ("completed", 2, done)
    );
    assert_eq!(
        events(&system, EventKind::EnrichmentCompleted, job_id).await,
        1
    );
    system.finish().await;
}

/// A CVE write that began before a newer claim committed, and would commit after it, writes
/// nothing: the write locks the job's row `FOR SHARE`, so it waits for the newer claim, then
/// sees its token and stands down (without the lock it reads the old token and writes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cve_write_racing_a_newer_claim_waits_for_it_and_writes_nothing() {
    let system = TestSystem::spawn().await;
    let (_scan_id, job_id) = scan_to_enrich(&system).await;
    let stale = store::enrichment::claim(&system.pool, "enrichment-a", Duration::from_secs(30), 1)
        .await
        .expect("a claim")
        .pop()
        .expect("the job");
    // A newer claim, written but not committed.
    let mut newer = system.pool.begin().await.unwrap();
    sqlx::query("UPDATE enrichment_jobs SET fencing_token = fencing_token + 1 WHERE id = $1")
        .bind(job_id)
        .execute(&mut *newer)
        .await
        .unwrap();
    let writing = {
        let pool = system.pool.clone();
        let fence = stale.fence();
        tokio::spawn(async move {
            let record = store::cves::CveRecord::unknown("CVE-2021-44228");
            store::cves::upsert(&pool, Some(fence), store::cves::CveOrigin::Nvd, &[record]).await
        })
    };
    system
        .wait_for("the write to wait on the job's row", || async {
            (store::testing::backends_waiting_for_locks(&system.pool)
                .await
                .unwrap()
                == 1)
                .then_some(())
        })
        .await;
    newer.commit().await.unwrap();
    assert_eq!(
        writing.await.unwrap().unwrap(),
        store::cves::Written::Fenced
    );
    assert_eq!(
        store::testing::count_rows(&system.pool, "cves")
            .await
            .unwrap(),
        0
    );
    system.finish().await;
}

/// Three pages: checkpoints `{"page": n}` after each of the first two, done after the third;
/// records every page it fetched. With `hang_after`, it never returns after fetching that
/// page, as a process that crashed there.
#[derive(Clone, Default)]
struct Paged {
    fetched: Arc<Mutex<Vec<u64>>>,
    hang_after: Option<u64>,
}

impl Enricher for Paged {
    fn step<'a>(
        &'a self,
        _job: &'a JobInput,
        checkpoint: &'a serde_json::Value,
    ) -> BoxFuture<'a, Result<Step, StepError>> {
        Box::pin(async move {
            let page = checkpoint["page"].as_u64().unwrap_or(0) + 1;
            self.fetched.lock().unwrap().push(page);
            if self.hang_after == Some(page) {
                std::future::pending::<()>().await;
            }
            Ok(if page == 3 {
                Step::Done(serde_json::json!({"pages": 3}))
            } else {
                Step::Progress(serde_json::json!({"page": page}))
            })
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_execution_is_recovered_by_the_reaper_and_resumes_from_its_checkpoint() {
    let system = TestSystem::spawn().await;
    let (_scan_id, job_id) = scan_to_enrich(&system).await;
    let lease_ttl = Duration::from_millis(600);

    // The first process checkpoints page 1, fetches page 2 and is killed there.
    let crashed = Paged {
        hang_after: Some(2),
        ..Default::default()
    };
    let first = service(&system, crashed.clone(), lease_ttl);
    let run = tokio::spawn(async move { first.run_once().await });
    system
        .wait_for("the first execution to reach page 2", || async {
            (crashed.fetched.lock().unwrap().len() == 2).then_some(())
        })
        .await;
    run.abort();
    assert_eq!(
        job_row(&system, job_id).await.2,
        serde_json::json!({"page": 1})
    );

    // Once its lease lapses the reaper returns it; another process resumes after page 1.
    system
        .wait_for("the reaper to recover the lapsed claim", || async {
            let recovered = system.sweep_enrichment().await;
            (recovered.retried == [job_id]).then_some(())
        })
        .await;
    let resumed = Paged::default();
    let second = service(&system, resumed.clone(), lease_ttl);
    let outcomes = system
        .wait_for("the job to be claimed again", || async {
            let outcomes = second.run_once().await.expect("a pass");
            (!outcomes.is_empty()).then_some(outcomes)
        })
        .await;
    assert_eq!(outcomes, [(job_id, Execution::Completed)]);
    assert_eq!(
        *resumed.fetched.lock().unwrap(),
        [2, 3],
        "page 1 is not fetched again"
    );
    let (state, attempts, checkpoint, _) = job_row(&system, job_id).await;
    assert_eq!((state.as_str(), attempts), ("completed", 2));
    assert_eq!(checkpoint, serde_json::json!({"pages": 3}));
    system.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_execution_keeps_its_lease_by_renewing() {
    let system = TestSystem::spawn().await;
    let (_scan_id, job_id) = scan_to_enrich(&system).await;
    // Long enough that a renewal delayed by a loaded machine still lands in time (one every
    // 0.5 s, each with 1 s to spare).
    let lease_ttl = Duration::from_millis(1_500);

    /// Takes two and a half lease TTLs over one step.
    struct Slow(Duration);
    impl Enricher for Slow {
        fn step<'a>(
            &'a self,
            _job: &'a JobInput,
            _checkpoint: &'a serde_json::Value,
        ) -> BoxFuture<'a, Result<Step, StepError>> {
            Box::pin(async move {
                tokio::time::sleep(self.0).await;
                Ok(Step::Done(serde_json::json!({"slow": true})))
            })
        }
    }
    let service = service(&system, Slow(lease_ttl * 5 / 2), lease_ttl);
    let sweeping = async {
        loop {
            let recovered = system.sweep_enrichment().await;
            assert!(
                recovered.is_empty(),
                "a renewed lease was recovered: {recovered:?}"
            );
            // The reaper's cadence, faster.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let outcomes = tokio::select! {
        outcomes = service.run_once() => outcomes.expect("a pass"),
        () = sweeping => unreachable!(),
    };
    assert_eq!(outcomes, [(job_id, Execution::Completed)]);
    assert_eq!(job_row(&system, job_id).await.1, 1, "one execution");
    system.finish().await;
}

/// `palisade scan enrich`'s path: the operator's request, any organization.
async fn enrich(system: &TestSystem, scan_id: Uuid) -> v1::EnrichReply {
    let outcome = store::enrichment::request(&system.pool, None, scan_id)
        .await
        .expect("a decision");
    enrichment::request::reply(scan_id, &outcome)
}

/// The code of a refused request.
fn refusal(reply: v1::EnrichReply) -> Option<messages::ErrorCode> {
    reply.error.and_then(|error| error.error_code())
}

fn outcome(reply: &v1::EnrichReply) -> (&str, &str) {
    assert!(reply.error.is_none(), "{reply:?}");
    (reply.outcome.as_str(), reply.status.as_str())
}

#[tokio::test]
async fn requesting_enrichment_answers_each_of_the_four_outcomes() {
    let system = TestSystem::spawn().await;
    let (scan_id, job_id) = scan_to_enrich(&system).await;

    // active: pending, and then running under a claim that the request leaves alone.
    let reply = enrich(&system, scan_id).await;
    assert_eq!(outcome(&reply), ("active", "pending"));
    assert_eq!(reply.job_id, job_id.to_string());
    assert_eq!(reply.scan_id, scan_id.to_string());
    let claim = store::enrichment::claim(&system.pool, "holder", Duration::from_secs(30), 1)
        .await
        .unwrap()
        .pop()
        .expect("claimed");
    assert_eq!(
        outcome(&enrich(&system, scan_id).await),
        ("active", "running")
    );
    assert!(
        store::enrichment::renew(&system.pool, &claim, Duration::from_secs(30))
            .await
            .unwrap(),
        "the claim is undisturbed"
    );

    // requeued: a job that failed for good goes back with a fresh budget, keeping its
    // checkpoint and last error.
    assert!(
        store::enrichment::checkpoint(&system.pool, &claim, &serde_json::json!({"page": 2}))
            .await
            .unwrap()
    );
    let error = v1::Error {
        code: "nvd_unavailable".into(),
        message: "503".into(),
        ..Default::default()
    };
    assert_eq!(
        store::enrichment::fail(
            &system.pool,
            &system.subjects,
            QUICK_RETRY,
            &claim,
            &error,
            false
        )
        .await
        .unwrap(),
        FailOutcome::Failed
    );
    assert_eq!(
        outcome(&enrich(&system, scan_id).await),
        ("requeued", "pending")
    );
    let (state, attempts, checkpoint, last_error) = job_row(&system, job_id).await;
    assert_eq!((state.as_str(), attempts), ("pending", 0));
    assert_eq!(checkpoint, serde_json::json!({"page": 2}));
    assert_eq!(last_error, "nvd_unavailable: 503");

    // completed: the requeued job runs (resuming from its checkpoint) and completes.
    let resumed = Paged::default();
    let outcomes = service(&system, resumed.clone(), Duration::from_secs(30))
        .run_once()
        .await
        .unwrap();
    assert_eq!(outcomes, [(job_id, Execution::Completed)]);
    assert_eq!(*resumed.fetched.lock().unwrap(), [3]);
    assert_eq!(
        outcome(&enrich(&system, scan_id).await),
        ("completed", "completed")
    );

    // created: a completed scan whose job row is gone, with a CVE finding, gets a pending one;
    // without one it is recorded as completed, not enriched.
    sqlx::query("DELETE FROM enrichment_jobs WHERE scan_id = $1")
        .bind(scan_id)
        .execute(&system.pool)
        .await
        .unwrap();
    let reply = enrich(&system, scan_id).await;
    assert_eq!(outcome(&reply), ("created", "pending"));
    assert_ne!(reply.job_id, job_id.to_string());
    let plain = system.leased_scan(&["alpha"]).await;
    system.complete_with_findings(&plain, 1).await;
    let plain_id: Uuid = plain.scan_id.parse().unwrap();
    sqlx::query("DELETE FROM enrichment_jobs WHERE scan_id = $1")
        .bind(plain_id)
        .execute(&system.pool)
        .await
        .unwrap();
    assert_eq!(
        outcome(&enrich(&system, plain_id).await),
        ("completed", "completed")
    );
    assert_eq!(
        outcome(&enrich(&system, plain_id).await),
        ("completed", "completed")
    );

    // Refusals: no such scan; a scan that has not completed.
    let reply = enrich(&system, Uuid::new_v4()).await;
    assert_eq!(refusal(reply), Some(messages::ErrorCode::NotFound));
    let running = system.leased_scan(&["alpha"]).await;
    let reply = enrich(&system, running.scan_id.parse().unwrap()).await;
    assert_eq!(refusal(reply), Some(messages::ErrorCode::ScanNotCompleted));
    system.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_concurrent_requests_for_a_failed_job_requeue_it_once() {
    let system = TestSystem::spawn().await;
    let (scan_id, job_id) = scan_to_enrich(&system).await;
    sqlx::query("UPDATE enrichment_jobs SET state = 'failed', attempt_count = 3, finished_at = now() WHERE id = $1")
        .bind(job_id)
        .execute(&system.pool)
        .await
        .unwrap();
    let barrier = Arc::new(tokio::sync::Barrier::new(16));
    let asks: Vec<_> = (0..16)
        .map(|_| {
            let (pool, barrier) = (system.pool.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                store::enrichment::request(&pool, None, scan_id)
                    .await
                    .expect("a decision")
            })
        })
        .collect();
    let mut outcomes = std::collections::BTreeMap::<&str, usize>::new();
    for ask in asks {
        *outcomes.entry(ask.await.unwrap().name()).or_default() += 1;
    }
    assert_eq!(
        outcomes,
        [("active", 15), ("requeued", 1)].into_iter().collect(),
        "exactly one requeue"
    );
    let (state, attempts, _, _) = job_row(&system, job_id).await;
    assert_eq!((state.as_str(), attempts), ("pending", 0));
    system.finish().await;
}

#[tokio::test]
async fn a_client_requests_enrichment_of_its_own_organizations_scans_over_the_bus() {
    let system = TestSystem::spawn().await;
    system.start(tests::Component::Enrichment);
    let (scan_id, job_id) = scan_to_enrich(&system).await;
    let organization_id: Uuid =
        sqlx::query_scalar("SELECT organization_id FROM scans WHERE id = $1")
            .bind(scan_id)
            .fetch_one(&system.pool)
            .await
            .unwrap();
    let client = system.client();
    // The running service (RecordOnly) completes the pending job; ask until it says so.
    let reply = system
        .wait_for("the job to complete", || async {
            let reply = client
                .enrich_scan(&organization_id, &scan_id.to_string())
                .await
                .expect("an answer");
            (reply.outcome == "completed").then_some(reply)
        })
        .await;
    assert_eq!(reply.job_id, job_id.to_string());
    assert_eq!(
        events(&system, EventKind::EnrichmentCompleted, job_id).await,
        1
    );

    // Another organization's subject: as if the scan did not exist.
    let other = system.organization().await;
    let reply = client
        .enrich_scan(&other, &scan_id.to_string())
        .await
        .expect("an answer");
    assert_eq!(refusal(reply), Some(messages::ErrorCode::NotFound));
    let reply = client
        .enrich_scan(&organization_id, "not-a-uuid")
        .await
        .expect("an answer");
    assert_eq!(refusal(reply), Some(messages::ErrorCode::InvalidField));
    system.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dependency_audit_gives_its_scan_cve_findings_that_enrichment_takes_up() {
    let system = TestSystem::spawn().await;
    let organization = system.organization().await;
    let _stats = system.reference_worker(organization, 2).await;
    let scan_id = system.completed_dependency_audit(organization).await;

    // The audit's findings carry their advisories' CVE ids, so the scan's job is pending.
    let mut cves: Vec<String> =
        sqlx::query_scalar("SELECT DISTINCT unnest(cve_ids) FROM findings WHERE scan_id = $1")
            .bind(scan_id)
            .fetch_all(&system.pool)
            .await
            .unwrap();
    cves.sort();
    assert_eq!(cves, ["CVE-2099-0001", "CVE-2099-0002"]);
    let job_id: Uuid = sqlx::query_scalar(
        "SELECT id FROM enrichment_jobs WHERE scan_id = $1 AND state = 'pending'",
    )
    .bind(scan_id)
    .fetch_one(&system.pool)
    .await
    .expect("a pending enrichment job");

    let enrichment = service(&system, enrichment::RecordOnly, Duration::from_secs(30));
    assert_eq!(
        enrichment.run_once().await.unwrap(),
        [(job_id, Execution::Completed)]
    );
    let (_, _, checkpoint, _) = job_row(&system, job_id).await;
    assert_eq!(checkpoint["cve_ids"], serde_json::json!(cves));
    system.finish().await;
}

#[tokio::test]
async fn the_metrics_snapshot_follows_the_enrichment_backlog_and_its_stalest_claim() {
    let system = TestSystem::spawn().await;
    let snapshot = || async {
        store::observability::snapshot(&system.pool, Duration::from_secs(60))
            .await
            .expect("a snapshot")
    };
    let (_scan_id, job_id) = scan_to_enrich(&system).await;
    // Ages measured from a minute ago, not from a sleep.
    let age_by_a_minute = |column: &'static str| {
        let pool = system.pool.clone();
        async move {
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "UPDATE enrichment_jobs SET {column} = now() - interval '1 minute' WHERE id = '{job_id}'"
            )))
            .execute(&pool)
            .await
            .expect("aged");
        }
    };
    age_by_a_minute("available_at").await;
    let waiting = snapshot().await;
    assert_eq!(
        (waiting.enrichment_pending, waiting.enrichment_running),
        (1, 0)
    );
    assert!(
        waiting.enrichment_oldest_due_age_seconds > 0.0,
        "{waiting:?}"
    );
    assert_eq!(waiting.enrichment_stalest_heartbeat_age_seconds, 0.0);

    let claim = store::enrichment::claim(&system.pool, "holder", Duration::from_secs(30), 1)
        .await
        .unwrap()
        .pop()
        .expect("claimed");
    age_by_a_minute("last_heartbeat_at").await;
    let running = snapshot().await;
    assert_eq!(
        (running.enrichment_pending, running.enrichment_running),
        (0, 1)
    );
    assert_eq!(running.enrichment_oldest_due_age_seconds, 0.0);
    assert!(
        running.enrichment_stalest_heartbeat_age_seconds > 0.0,
        "{running:?}"
    );

    let done = serde_json::json!({});
    assert_eq!(
        store::enrichment::complete(&system.pool, &system.subjects, &[(&claim, done)])
            .await
            .unwrap(),
        [job_id]
    );
    let idle = snapshot().await;
    assert_eq!((idle.enrichment_pending, idle.enrichment_running), (0, 0));
    assert_eq!(idle.enrichment_stalest_heartbeat_age_seconds, 0.0);
    system.finish().await;
}
