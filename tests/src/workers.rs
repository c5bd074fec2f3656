//! Workers driven by the tests: [`ManualWorker`] speaks the worker protocol by hand, one
//! message at a time; [`StoppableWorker`] and [`WorkerProcess`] run the reference worker
//! in-process or as a child process.

use super::*;

/// A worker whose every message the test sends by hand.
pub struct ManualWorker {
    pub id: Uuid,
    pub(crate) bus: Bus,
    pub(crate) acks: tokio::sync::Mutex<async_nats::Subscriber>,
}

impl ManualWorker {
    pub async fn connect(bus: Bus, id: Uuid) -> Self {
        let acks = bus
            .client()
            .subscribe(bus.subjects().worker(&id.to_string(), WorkerVerb::Ack))
            .await
            .expect("ack subscription");
        bus.flush().await.expect("subscription registered");
        Self {
            id,
            bus,
            acks: tokio::sync::Mutex::new(acks),
        }
    }

    pub(crate) fn subject(&self, verb: WorkerVerb) -> String {
        self.bus.subjects().worker(&self.id.to_string(), verb)
    }

    /// A request/reply round trip with raw bytes.
    pub async fn request_raw(&self, verb: WorkerVerb, payload: Vec<u8>) -> bytes::Bytes {
        self.bus
            .request(self.subject(verb), payload.into(), Duration::from_secs(35))
            .await
            .expect("dispatch answers")
            .payload
    }

    pub async fn hello(&self, capabilities: &[&str]) -> v1::HelloReply {
        self.hello_with_capacity(capabilities, 8).await
    }

    pub async fn hello_with_capacity(
        &self,
        capabilities: &[&str],
        capacity: u32,
    ) -> v1::HelloReply {
        self.hello_with_rules(capabilities, capacity, &[]).await
    }

    /// A hello declaring `rules`: (plugin, rule id, resource kinds).
    pub async fn hello_with_rules(
        &self,
        capabilities: &[&str],
        capacity: u32,
        rules: &[(&str, &str, &[&str])],
    ) -> v1::HelloReply {
        let request = v1::HelloRequest {
            schema_version: 1,
            worker_id: self.id.to_string(),
            software_version: "manual/1".into(),
            protocol_version: messages::PROTOCOL_VERSION.into(),
            capabilities: capabilities.iter().map(|c| (*c).to_owned()).collect(),
            capacity,
            rules: rules
                .iter()
                .map(|(plugin, rule_id, kinds)| v1::RuleDeclaration {
                    plugin: (*plugin).to_owned(),
                    rule_id: (*rule_id).to_owned(),
                    resource_kinds: kinds.iter().map(|k| (*k).to_owned()).collect(),
                })
                .collect(),
        };
        v1::HelloReply::decode(
            self.request_raw(WorkerVerb::Hello, request.encode_to_vec())
                .await,
        )
        .expect("HelloReply")
    }

    pub async fn acquire(
        &self,
        request_id: Uuid,
        max_tasks: u32,
        wait_ms: u32,
    ) -> v1::AcquireReply {
        let request = v1::AcquireRequest {
            schema_version: 1,
            worker_id: self.id.to_string(),
            request_id: request_id.to_string(),
            max_tasks,
            wait_ms,
        };
        v1::AcquireReply::decode(
            self.request_raw(WorkerVerb::Acquire, request.encode_to_vec())
                .await,
        )
        .expect("AcquireReply")
    }

    /// Acquires exactly one lease, waiting for it.
    pub async fn acquire_one(&self) -> v1::Lease {
        let reply = self.acquire(Uuid::new_v4(), 1, 10_000).await;
        assert!(reply.error.is_none(), "acquire refused: {:?}", reply.error);
        reply
            .leases
            .into_iter()
            .next()
            .expect("a lease within the long-poll")
    }

    pub async fn renew(&self, lease: &v1::Lease) -> v1::RenewReply {
        let request = v1::RenewRequest {
            schema_version: 1,
            worker_id: self.id.to_string(),
            lease: lease.lease.clone(),
            more_leases: Vec::new(),
        };
        v1::RenewReply::decode(
            self.request_raw(WorkerVerb::Renew, request.encode_to_vec())
                .await,
        )
        .expect("RenewReply")
    }

    /// Renews `leases` in one request: the first as `lease`, the rest as `more_leases`.
    pub async fn renew_many(&self, leases: &[v1::LeaseRef]) -> v1::RenewReply {
        let request = v1::RenewRequest {
            schema_version: 1,
            worker_id: self.id.to_string(),
            lease: leases.first().cloned(),
            more_leases: leases.iter().skip(1).cloned().collect(),
        };
        v1::RenewReply::decode(
            self.request_raw(WorkerVerb::Renew, request.encode_to_vec())
                .await,
        )
        .expect("RenewReply")
    }

    pub async fn release(&self, lease: &v1::Lease) -> v1::ReleaseReply {
        let request = v1::ReleaseRequest {
            schema_version: 1,
            worker_id: self.id.to_string(),
            lease: lease.lease.clone(),
            reason: "test".into(),
        };
        v1::ReleaseReply::decode(
            self.request_raw(WorkerVerb::Release, request.encode_to_vec())
                .await,
        )
        .expect("ReleaseReply")
    }

    /// A well-formed batch for `lease` with a correct checksum and key `attempt:sequence`.
    pub fn batch(
        &self,
        lease: &v1::Lease,
        sequence_number: u32,
        payload: &v1::BatchPayload,
    ) -> v1::ResultBatch {
        let reference = lease.lease.clone().expect("lease ref");
        let bytes = payload.encode_to_vec();
        v1::ResultBatch {
            schema_version: 1,
            worker_id: self.id.to_string(),
            idempotency_key: format!("{}:{sequence_number}", reference.attempt_id),
            lease: Some(reference),
            sequence_number,
            payload_sha256: messages::sha256_hex(&bytes),
            payload: bytes,
        }
    }

    /// One artifact request for `lease` and its answer.
    pub async fn artifact(
        &self,
        lease: &v1::LeaseRef,
        step: v1::artifact_request::Step,
    ) -> v1::ArtifactReply {
        let request = v1::ArtifactRequest {
            schema_version: 1,
            worker_id: self.id.to_string(),
            lease: Some(lease.clone()),
            step: Some(step),
        };
        v1::ArtifactReply::decode(
            self.request_raw(WorkerVerb::Artifact, request.encode_to_vec())
                .await,
        )
        .expect("ArtifactReply")
    }

    /// Prepares upload `upload_id` of a file named `name` for `lease`.
    pub async fn prepare_upload(
        &self,
        lease: &v1::LeaseRef,
        upload_id: Uuid,
        name: &str,
    ) -> v1::ArtifactReply {
        self.artifact(
            lease,
            v1::artifact_request::Step::Prepare(v1::PrepareUpload {
                upload_id: upload_id.to_string(),
                name: name.into(),
                content_type: "application/json".into(),
            }),
        )
        .await
    }

    /// Publishes `data` on `subject` in chunks of `chunk_bytes` (indexes from 0), each awaiting
    /// its PubAck; the number of chunks.
    pub async fn send_chunks(
        &self,
        subject: &str,
        upload_id: Uuid,
        data: &[u8],
        chunk_bytes: usize,
    ) -> u32 {
        let mut index = 0;
        for piece in data.chunks(chunk_bytes) {
            let chunk = v1::ArtifactChunk {
                upload_id: upload_id.to_string(),
                index,
                data: piece.to_vec(),
            };
            self.bus
                .publish_durable(
                    subject.to_owned(),
                    &format!("{upload_id}:{index}"),
                    Default::default(),
                    chunk.encode_to_vec().into(),
                )
                .await
                .expect("chunk published");
            index += 1;
        }
        index
    }

    /// Commits upload `upload_id` claiming `size_bytes`, `sha256` and `chunks`.
    pub async fn commit_upload(
        &self,
        lease: &v1::LeaseRef,
        upload_id: Uuid,
        size_bytes: u64,
        sha256: &str,
        chunks: u32,
    ) -> v1::ArtifactReply {
        self.artifact(
            lease,
            v1::artifact_request::Step::Commit(v1::CommitUpload {
                upload_id: upload_id.to_string(),
                size_bytes,
                sha256: sha256.into(),
                chunks,
            }),
        )
        .await
    }

    /// Publishes raw bytes on this worker's `verb` stream subject with a fresh `Nats-Msg-Id`
    /// (so JetStream never de-duplicates a deliberate repeat).
    pub async fn publish_raw(&self, verb: WorkerVerb, payload: Vec<u8>) {
        self.bus
            .publish_durable(
                self.subject(verb),
                &Uuid::new_v4().to_string(),
                Default::default(),
                payload.into(),
            )
            .await
            .expect("published");
    }

    /// The next acknowledgement from ingestion.
    pub async fn next_ack(&self) -> v1::IngestAck {
        let mut acks = self.acks.lock().await;
        let message = tokio::time::timeout(WAIT_MAX, acks.next())
            .await
            .expect("ingestion answered in time")
            .expect("ack subscription open");
        v1::IngestAck::decode(message.payload.as_ref()).expect("IngestAck")
    }

    pub async fn send_batch(&self, batch: &v1::ResultBatch) -> v1::IngestAck {
        self.publish_raw(WorkerVerb::Result, batch.encode_to_vec())
            .await;
        self.next_ack().await
    }

    pub fn completion(&self, lease: &v1::Lease, batch_count: u32) -> v1::TaskComplete {
        v1::TaskComplete {
            schema_version: 1,
            worker_id: self.id.to_string(),
            lease: lease.lease.clone(),
            batch_count,
            summary: "done".into(),
            final_batch: None,
            lease_next: false,
        }
    }

    pub async fn complete(&self, lease: &v1::Lease, batch_count: u32) -> v1::IngestAck {
        self.publish_raw(
            WorkerVerb::Complete,
            self.completion(lease, batch_count).encode_to_vec(),
        )
        .await;
        self.next_ack().await
    }

    /// Completes `lease` asking for its scan's next plugin with the acknowledgement
    /// (`TaskComplete.lease_next`).
    pub async fn complete_asking_next(&self, lease: &v1::Lease, batch_count: u32) -> v1::IngestAck {
        let completion = v1::TaskComplete {
            lease_next: true,
            ..self.completion(lease, batch_count)
        };
        self.publish_raw(WorkerVerb::Complete, completion.encode_to_vec())
            .await;
        self.next_ack().await
    }

    pub fn failure(&self, lease: &v1::Lease, code: &str, retryable: bool) -> v1::TaskFail {
        v1::TaskFail {
            schema_version: 1,
            worker_id: self.id.to_string(),
            lease: lease.lease.clone(),
            error: Some(v1::Error {
                code: code.into(),
                message: "test failure".into(),
                ..Default::default()
            }),
            retryable,
        }
    }

    pub async fn fail(&self, lease: &v1::Lease, code: &str, retryable: bool) -> v1::IngestAck {
        self.publish_raw(
            WorkerVerb::Fail,
            self.failure(lease, code, retryable).encode_to_vec(),
        )
        .await;
        self.next_ack().await
    }
}

/// Decides `claim`'s completion (no batches) inside `tx` as ingestion does, through
/// `ingest::decide`: a forced race drives the path production runs.
pub async fn complete_attempt(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    subjects: &messages::Subjects,
    claim: &store::LeaseClaim,
) -> Result<store::ingest::IngestOutcome, store::StoreError> {
    let completion = store::ingest::Message::Complete(store::ingest::CompleteParams {
        claim,
        batch_count: 0,
        summary: "",
        lease_next: false,
    });
    store::ingest::decide(tx, &mut store::Staged::default(), subjects, &[completion])
        .await?
        .outcomes
        .pop()
        .expect("one message, one outcome")
}

/// A small batch payload: `count` findings with stable keys, the failed evaluation of each
/// and one passed evaluation (so a scan completed with it has complete coverage).
pub fn findings_payload(count: usize) -> v1::BatchPayload {
    v1::BatchPayload {
        findings: (0..count)
            .map(|index| v1::Finding {
                rule_id: format!("rule-{index}"),
                resource: "http://example.test/".into(),
                severity: "low".into(),
                title: format!("finding {index}"),
                ..Default::default()
            })
            .collect(),
        assets: vec![v1::Asset {
            kind: "http_service".into(),
            value: "http://example.test:80".into(),
        }],
        evaluations: (0..count)
            .map(|index| v1::Evaluation::fail(&format!("rule-{index}"), "http://example.test/", ""))
            .chain([v1::Evaluation::pass("rule-ok", "http://example.test/")])
            .collect(),
    }
}

/// A reference worker in-process that a test stops the way an operator would: it releases
/// what it holds and says no more.
pub struct StoppableWorker {
    pub worker_id: Uuid,
    pub(crate) stop: CancellationToken,
    pub(crate) handle: JoinHandle<Result<(), worker::WorkerError>>,
}

impl StoppableWorker {
    /// Stops the worker and waits until it has.
    pub async fn stop(self) {
        self.stop.cancel();
        tokio::time::timeout(WAIT_MAX, self.handle)
            .await
            .unwrap_or_else(|_| panic!("worker did not stop within {WAIT_MAX:?}"))
            .expect("worker did not panic")
            .expect("worker stopped cleanly");
    }
}

/// A reference worker running as a child process, so a test can SIGKILL or SIGSTOP it.
pub struct WorkerProcess {
    pub worker_id: Uuid,
    pub(crate) child: tokio::process::Child,
}

impl WorkerProcess {
    /// Registers a worker for `organization_id` and starts `palisade-worker` for it.
    /// `binary` is the `test-worker` binary: `env!("CARGO_BIN_EXE_test-worker")` in the
    /// integration tests.
    pub async fn start(
        system: &TestSystem,
        binary: &str,
        organization_id: Uuid,
        capacity: u32,
    ) -> Self {
        Self::start_with_env(system, binary, organization_id, capacity, &[]).await
    }

    /// [`WorkerProcess::start`] with more environment (`OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub async fn start_with_env(
        system: &TestSystem,
        binary: &str,
        organization_id: Uuid,
        capacity: u32,
        env: &[(String, String)],
    ) -> Self {
        let worker_id = system.registered_worker(organization_id, capacity).await;
        let child = tokio::process::Command::new(binary)
            .envs(env.iter().map(|(key, value)| (key, value)))
            .envs(
                system
                    .nats
                    .child_env(&messages::Identity::Worker { worker_id })
                    .await,
            )
            .env("PALISADE_SUBJECT_PREFIX", system.subjects.prefix())
            .env("PALISADE_WORKER_ID", worker_id.to_string())
            .env("PALISADE_WORKER_CAPACITY", capacity.to_string())
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .kill_on_drop(true)
            .spawn()
            .expect("palisade-worker starts");
        Self { worker_id, child }
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("still running")
    }

    /// SIGTERM, as an orchestrator stops it: it releases its leases and flushes its spans.
    /// Waits at most `grace` for it to exit, then kills it.
    pub async fn terminate(mut self, grace: std::time::Duration) {
        self.signal("TERM");
        if tokio::time::timeout(grace, self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }

    /// SIGKILL: no release, no goodbye; its lease must expire and be recovered.
    pub async fn kill(&mut self) {
        self.child.kill().await.expect("SIGKILL delivered");
    }

    /// SIGSTOP / SIGCONT: a paused process that wakes up believing it still holds its lease.
    pub fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &self.pid().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{signal} failed");
    }
}
