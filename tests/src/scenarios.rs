//! Ready-made situations tests start from: a leased scan, a completed one, a web app to scan.

use super::*;

/// An organization, a manual worker serving it with `plugins` as capabilities, and one scan
/// of `plugins` whose first task the worker has leased.
pub struct LeasedScan {
    pub organization_id: Uuid,
    pub worker: ManualWorker,
    pub scan_id: String,
    pub lease: v1::Lease,
}

impl TestSystem {
    pub async fn leased_scan(&self, plugins: &[&str]) -> LeasedScan {
        let organization_id = self.organization().await;
        let worker = self.manual_worker(organization_id, 8).await;
        let hello = worker.hello(plugins).await;
        assert!(hello.error.is_none(), "{hello:?}");
        let reply = self
            .submit(&self.request(organization_id, "http://target.test", plugins))
            .await;
        assert!(reply.error.is_none(), "{reply:?}");
        let lease = worker.acquire_one().await;
        LeasedScan {
            organization_id,
            worker,
            scan_id: reply.scan_id,
            lease,
        }
    }

    /// Completes the single-task `scan` with one batch of `findings` findings, then waits for
    /// the scan to be completed and every event to be relayed.
    pub async fn complete_with_findings(&self, scan: &LeasedScan, findings: usize) {
        let worker = &scan.worker;
        let batch = worker.batch(&scan.lease, 0, &findings_payload(findings));
        let ack = worker.send_batch(&batch).await;
        assert!(ack.error.is_none(), "{ack:?}");
        let ack = worker.complete(&scan.lease, 1).await;
        assert!(ack.error.is_none(), "{ack:?}");
        self.wait_scan_state(&scan.scan_id, "completed").await;
        self.wait_outbox_drained().await;
    }

    /// One reaper sweep of lapsed enrichment claims, without backoff: a job returned to the
    /// queue is due again at once.
    pub async fn sweep_enrichment(&self) -> store::enrichment::RecoveredJobs {
        store::enrichment::recover_expired(
            &self.pool,
            &self.subjects,
            store::RetryPolicy::new(Duration::ZERO, Duration::ZERO),
            100,
        )
        .await
        .expect("a sweep")
    }

    /// Submits a `dependency_audit` scan of the test lockfile (`rust/Cargo.lock` under
    /// [`DEPENDENCY_AUDIT_DATA`]) for `organization` and waits until it completed: its id.
    pub async fn completed_dependency_audit(&self, organization: Uuid) -> Uuid {
        let lockfile = format!("{DEPENDENCY_AUDIT_DATA}/rust/Cargo.lock");
        let lockfile = std::fs::canonicalize(lockfile).expect("the test lockfile");
        let reply = self
            .submit(&self.request(
                organization,
                &lockfile.display().to_string(),
                &["dependency_audit"],
            ))
            .await;
        assert!(reply.error.is_none(), "{reply:?}");
        self.wait_scan_state(&reply.scan_id, "completed").await;
        reply.scan_id.parse().expect("a scan id")
    }

    /// A completed scan with two findings naming `cve_ids`, whose enrichment job is pending
    /// with `{}` as its checkpoint, as a dependency audit's would be: (scan id, job id).
    pub async fn scan_to_enrich(&self, cve_ids: &[&str]) -> (Uuid, Uuid) {
        let scan = self.leased_scan(&["alpha"]).await;
        self.complete_with_findings(&scan, 2).await;
        let job_id: Uuid = sqlx::query_scalar(
            "WITH cve AS (UPDATE findings SET cve_ids = $2 WHERE scan_id = $1::uuid) \
             UPDATE enrichment_jobs SET state = 'pending', finished_at = NULL, checkpoint = '{}' \
             WHERE scan_id = $1::uuid RETURNING id",
        )
        .bind(&scan.scan_id)
        .bind(cve_ids)
        .fetch_one(&self.pool)
        .await
        .expect("a job to enrich");
        (scan.scan_id.parse().expect("a scan id"), job_id)
    }

    /// Cancels the task `task_id` (and its scan) as dispatch's cancel does.
    pub async fn cancel_task(&self, task_id: Uuid) {
        let outcome = store::cancel::cancel(
            &self.pool,
            &self.subjects,
            None,
            store::cancel::CancelTarget::Task(task_id),
            "cancelled by the test",
        )
        .await
        .expect("cancel decided");
        assert!(
            matches!(outcome, store::cancel::CancelOutcome::Cancelled { .. }),
            "{outcome:?}"
        );
    }

    /// Expires the live attempt of `lease`'s task by the database clock, recovers it with the
    /// reaper, and makes the task due at once.
    pub async fn expire_and_recover(&self, lease: &v1::Lease) {
        let task_id =
            Uuid::parse_str(&lease.lease.as_ref().expect("lease ref").task_id).expect("uuid");
        store::testing::expire_live_attempt(&self.pool, task_id)
            .await
            .expect("expired");
        let outcome = self.reaper().run_once().await.expect("reaper sweep");
        assert!(outcome.recovered.retried.contains(&task_id), "{outcome:?}");
        store::testing::make_task_due(&self.pool, task_id)
            .await
            .expect("due");
    }
}

/// A local web app without the usual security headers, for the plugins to scan.
pub async fn start_web_app() -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buffer = [0_u8; 4096];
                let _ = stream.read(&mut buffer).await;
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\nServer: test-app/1.0\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
                    .await;
            });
        }
    });
    address
}
