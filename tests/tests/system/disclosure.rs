//! What palisade tells, and what it keeps to itself (SPEC I12; issue 10, item 3):
//! - an `internal` answer names an error id and never the database's text; the log line
//!   carrying that id holds the cause, so an operator finds it from what the client reports;
//! - a hello refused to a disabled or revoked worker writes nothing;
//! - no lease token appears in any log line (at `debug`), exported span or metric, while
//!   leases are granted, renewed, refused, released and completed.

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use messages::{ClientVerb, ErrorCode, WorkerVerb, v1};
use prost::Message as _;
use tests::TestSystem;

use super::otlp::start_collector;

/// Everything the process logged, as the log layer wrote it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Captured(Arc<Mutex<Vec<u8>>>);

impl io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0
            .lock()
            .expect("not poisoned")
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Captured {
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("not poisoned")).into_owned()
    }
}

/// Installs the process's telemetry with its log lines captured at `filter` and, with a
/// collector's address, spans exported to it.
pub(crate) fn capture_logs(
    filter: &str,
    collector: Option<std::net::SocketAddr>,
) -> (Captured, telemetry::TelemetryGuard) {
    let captured = Captured::default();
    let writer = captured.clone();
    let guard = telemetry::init_with_writer(
        "palisade-test",
        &telemetry::TelemetrySettings {
            json: false,
            default_filter: filter.into(),
            otlp: collector.map(|addr| telemetry::OtlpSettings {
                protocol: telemetry::OtlpProtocol::Grpc,
                endpoint: Some(format!("http://{addr}")),
            }),
            to_stderr: false,
            flush_timeout: None,
        },
        move || writer.clone(),
    )
    .expect("telemetry installs once per test process");
    (captured, guard)
}

/// The id an `internal` answer names.
fn error_id(error: &v1::Error) -> String {
    assert_eq!(error.error_code(), Some(ErrorCode::Internal), "{error:?}");
    error
        .message
        .split("error id ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .unwrap_or_else(|| panic!("no error id in {:?}", error.message))
        .to_owned()
}

/// Makes every `operation` on `table` fail with `detail`, as a database fault would.
async fn fail_on(system: &TestSystem, table: &str, operation: &str, detail: &str) {
    let function = format!("fail_{table}_{}", operation.to_lowercase());
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN RAISE EXCEPTION '{detail}'; END $$; \
         CREATE TRIGGER {function} BEFORE {operation} ON {table} \
         FOR EACH ROW EXECUTE FUNCTION {function}();"
    )))
    .execute(&system.pool)
    .await
    .expect("fault installed");
}

/// `error` is an `internal` answer that tells nothing of `detail` (the database's words),
/// and the one log line naming its error id carries it.
fn masked_and_logged(logs: &Captured, error: &v1::Error, detail: &str) {
    let id = error_id(error);
    assert!(
        !error.message.contains("secret") && !error.message.contains("acme"),
        "the answer tells nothing of the cause: {}",
        error.message
    );
    logged_cause(logs, &id, detail);
}

/// The one log line naming `error_id`; it must carry `detail`.
fn logged_cause(logs: &Captured, error_id: &str, detail: &str) {
    let text = logs.text();
    let lines: Vec<&str> = text
        .lines()
        .filter(|line| line.contains(error_id))
        .collect();
    assert_eq!(lines.len(), 1, "one log line names {error_id}:\n{text}");
    assert!(
        lines[0].contains(detail),
        "the line naming the error id carries the cause: {}",
        lines[0]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_internal_answer_names_an_error_id_whose_log_line_holds_the_cause() {
    let (logs, _telemetry) = capture_logs("info", None);
    let system = TestSystem::spawn().await;
    let organization = system.organization().await;

    // Dispatch: a hello whose update the database refuses.
    let worker = system.manual_worker(organization, 4).await;
    let detail = "constraint workers_secret_detail of tenant acme";
    fail_on(&system, "workers", "UPDATE", detail).await;
    let reply = worker.hello(&["alpha"]).await;
    let error = reply.error.expect("the hello could not be decided");
    masked_and_logged(&logs, &error, detail);

    // Admission, request/reply: a request whose scan the database refuses to insert.
    let detail = "relation scans_secret_detail of tenant acme";
    fail_on(&system, "scans", "INSERT", detail).await;
    let request = system.request(organization, "http://fault.test", &["alpha"]);
    let subject = system
        .subjects
        .client(&organization, &request.client_id, ClientVerb::Submit)
        .expect("a subject");
    let reply = system
        .bus
        .request(
            subject,
            request.encode_to_vec().into(),
            Duration::from_secs(10),
        )
        .await
        .expect("admission answers");
    let reply = v1::ScanRequestReply::decode(reply.payload).expect("ScanRequestReply");
    let error = reply.error.expect("the request could not be decided");
    masked_and_logged(&logs, &error, detail);
    system.finish().await;
}

#[tokio::test]
async fn a_hello_refused_to_a_disabled_or_revoked_worker_writes_nothing() {
    let system = TestSystem::spawn().await;
    let organization = system.organization().await;
    let worker = system.manual_worker(organization, 4).await;
    assert!(worker.hello(&["alpha"]).await.error.is_none());
    // The whole row, every column.
    let row = || async {
        sqlx::query_scalar::<_, String>("SELECT to_jsonb(w)::text FROM workers w WHERE id = $1")
            .bind(worker.id)
            .fetch_one(&system.pool)
            .await
            .expect("the worker's row")
    };

    sqlx::query("UPDATE workers SET enabled = false WHERE id = $1")
        .bind(worker.id)
        .execute(&system.pool)
        .await
        .expect("disabled");
    let before = row().await;
    let reply = worker.hello_with_capacity(&["beta", "gamma"], 2).await;
    assert_eq!(
        reply.error.and_then(|error| error.error_code()),
        Some(ErrorCode::WorkerDisabled)
    );
    assert_eq!(row().await, before, "a disabled worker's hello wrote");

    store::revoke::revoke_worker(
        &system.pool,
        &system.subjects,
        worker.id,
        &store::audit::Change::new("test", "test"),
        store::revoke::ActiveLeases::Cancel,
    )
    .await
    .expect("revoked");
    let before = row().await;
    let reply = worker.hello_with_capacity(&["delta"], 3).await;
    assert_eq!(
        reply.error.and_then(|error| error.error_code()),
        Some(ErrorCode::WorkerDisabled)
    );
    assert_eq!(row().await, before, "a revoked worker's hello wrote");
    system.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_lease_token_is_logged_traced_or_exported_as_a_metric() {
    let (collector, collector_addr) = start_collector().await;
    let (logs, telemetry) = capture_logs("debug", Some(collector_addr));
    let system = TestSystem::spawn_with(|settings| {
        settings.http_addr = Some("127.0.0.1:0".parse().expect("address"));
    })
    .await;

    // A real worker runs a whole profile: grants, renewals, batches, completions.
    let organization = system.organization().await;
    let address = tests::start_web_app().await;
    let _stats = system.reference_worker(organization, 4).await;
    let reply = system
        .submit(&system.request(
            organization,
            &format!("http://{address}/"),
            &["tcp_connect", "http_headers", "synthetic"],
        ))
        .await;
    assert!(reply.error.is_none(), "{reply:?}");
    system.wait_scan_state(&reply.scan_id, "completed").await;

    // A hand-driven worker walks the refusals, each carrying a token: a renew, a batch and a
    // completion with the wrong one, a release, then a renewal of the released lease.
    let scan = system.leased_scan(&["alpha"]).await;
    let worker = &scan.worker;
    let mut forged = scan.lease.clone();
    let forged_token = format!("forged-{}", uuid::Uuid::new_v4().simple());
    forged.lease.as_mut().expect("a lease ref").lease_token = forged_token.clone();
    assert!(
        worker
            .renew(&forged)
            .await
            .renewals
            .iter()
            .all(|r| r.error.is_some())
    );
    let batch = worker.batch(&forged, 0, &tests::findings_payload(2));
    assert!(worker.send_batch(&batch).await.error.is_some());
    let forged_completion = worker.completion(&forged, 1);
    worker
        .publish_raw(WorkerVerb::Complete, forged_completion.encode_to_vec())
        .await;
    assert!(worker.next_ack().await.error.is_some());
    assert!(
        worker
            .renew(&scan.lease)
            .await
            .renewals
            .iter()
            .all(|r| r.error.is_none())
    );
    assert!(worker.release(&scan.lease).await.error.is_none());
    assert!(
        worker
            .renew(&scan.lease)
            .await
            .renewals
            .iter()
            .all(|r| r.error.is_some())
    );
    system.wait_outbox_drained().await;

    let mut tokens: Vec<String> =
        sqlx::query_scalar("SELECT lease_token FROM worker_task_attempts")
            .fetch_all(&system.pool)
            .await
            .expect("tokens");
    assert!(tokens.len() >= 4, "the scans were leased: {tokens:?}");
    tokens.push(forged_token);

    let metrics = reqwest::get(format!(
        "http://{}/metrics",
        system.health_addr.expect("served")
    ))
    .await
    .expect("a scrape")
    .text()
    .await
    .expect("its text");
    telemetry.flush().await;
    let spans = format!("{:?}", collector.spans());
    let logged = logs.text();
    assert!(
        logged.contains(&reply.scan_id),
        "the capture holds the scan's lines"
    );
    assert!(
        spans.contains("ingestion transaction"),
        "spans were exported"
    );
    for token in &tokens {
        for (what, text) in [
            ("a log line", &logged),
            ("a span", &spans),
            ("/metrics", &metrics),
        ] {
            assert!(
                !text.contains(token.as_str()),
                "lease token {token} in {what}: {}",
                text.lines()
                    .find(|line| line.contains(token.as_str()))
                    .unwrap_or_default()
            );
        }
    }
    system.finish().await;
}
