//! One scan is one trace, as an SRE sees it in production: the five services and the
//! reference worker run as processes of their own, each exporting OTLP under its own
//! `service.name` to a collector in the test, and the test itself is the client. The spans of
//! a three-plugin scan keep the structure documented in docs/operations.md ("Following one
//! scan"): one trace id, every service present under its own name, parents and links as
//! described, messaging attributes set.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use tests::{TestSystem, WorkerProcess};

use super::otlp::{Exported, ServiceProcesses, service_name, start_collector};

const PROFILE: [&str; 3] = ["tcp_connect", "http_headers", "synthetic"];

/// The reference worker binary, built by cargo with this test.
const WORKER: &str = env!("CARGO_BIN_EXE_test-worker");

/// The `service.name` of this process, the client.
const CLIENT: &str = "palisade-test-client";

/// The `service.name` a span's `palisade.service` attribute says it must be exported under.
fn exported_as(service: &str) -> String {
    match service {
        "client" => CLIENT.to_owned(),
        service => service_name(service),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_scan_is_one_trace_across_every_service_and_the_worker() {
    let (collector, collector_addr) = start_collector().await;
    let endpoint = format!("http://{collector_addr}");
    let telemetry = telemetry::init(
        CLIENT,
        &telemetry::TelemetrySettings {
            json: false,
            default_filter: "info".into(),
            otlp: Some(telemetry::OtlpSettings {
                protocol: telemetry::OtlpProtocol::Grpc,
                endpoint: Some(endpoint.clone()),
            }),
            to_stderr: false,
            flush_timeout: None,
        },
    )
    .expect("telemetry installs once per test process");

    let system = TestSystem::spawn().await;
    let services = ServiceProcesses::start(
        &system,
        &endpoint,
        &[
            ("PALISADE_ACQUIRE_POLL_MS", "200"),
            ("PALISADE_ENRICHMENT_POLL_MS", "200"),
            ("PALISADE_CVE_SOURCE", "local"),
        ],
    )
    .await;
    let org = system.organization().await;
    let address = tests::start_web_app().await;
    // One slot: no acquire of the worker's is waiting while a plugin runs, so each later
    // plugin is the one its predecessor's completion hands on, never taken by an acquire.
    let exporting = [("OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(), endpoint.clone())];
    let worker = WorkerProcess::start_with_env(&system, WORKER, org, 1, &exporting).await;
    let request = system.request(org, &format!("http://{address}/"), &PROFILE);
    let reply = system.submit(&request).await;
    assert!(reply.error.is_none(), "{reply:?}");
    system.wait_scan_state(&reply.scan_id, "completed").await;
    // None of this profile's findings names a CVE, so the scan's enrichment job was born
    // completed; give it one to enrich, as a dependency audit's finding would, and let the
    // enrichment process run it.
    sqlx::query(
        "WITH cve AS (UPDATE findings SET cve_ids = '{CVE-2021-44228}' WHERE scan_id = $1::uuid) \
         UPDATE enrichment_jobs SET state = 'pending', finished_at = NULL WHERE scan_id = $1::uuid",
    )
    .bind(&reply.scan_id)
    .execute(&system.pool)
    .await
    .expect("a CVE to enrich");
    system
        .wait_for("enrichment to run", || async {
            let finished: bool = sqlx::query_scalar(
                "SELECT bool_and(finished_at IS NOT NULL) FROM enrichment_jobs \
                 WHERE scan_id = $1::uuid",
            )
            .bind(&reply.scan_id)
            .fetch_one(&system.pool)
            .await
            .expect("the scan's enrichment job");
            finished.then_some(())
        })
        .await;

    // Stopped as an orchestrator stops them, each process exports what it still holds.
    worker.terminate(Duration::from_secs(20)).await;
    services.stop().await;
    let spans = system
        .wait_for("the scan's spans to be exported", || async {
            telemetry.flush().await;
            let spans = collector.spans();
            let named = |name: &str| spans.iter().any(|span| span.span.name == name);
            let done = named("enrich scan")
                && named("ingestion transaction")
                && PROFILE
                    .iter()
                    .all(|plugin| named(&format!("execute {plugin}")));
            done.then_some(spans)
        })
        .await;
    let by_id: HashMap<Vec<u8>, &Exported> = spans
        .iter()
        .map(|span| (span.span.span_id.clone(), span))
        .collect();
    let parent_of = |span: &Exported| by_id.get(&span.span.parent_span_id).copied();

    // The admission span is the scan's root context; the whole scan is its trace.
    let admission = spans
        .iter()
        .find(|span| {
            span.attribute("palisade.service").as_deref() == Some("admission")
                && span.attribute("palisade.scan_id").as_deref() == Some(reply.scan_id.as_str())
        })
        .expect("admission's span of the scan");
    let trace_id = admission.span.trace_id.clone();
    let in_trace: Vec<&Exported> = spans
        .iter()
        .filter(|span| span.span.trace_id == trace_id)
        .collect();
    for span in &spans {
        if span.attribute("palisade.scan_id").as_deref() == Some(reply.scan_id.as_str()) {
            assert_eq!(
                span.span.trace_id, trace_id,
                "every span of the scan is in one trace: {}",
                span.span.name
            );
        }
        // Each process exports under its own name: a service's span under that service's.
        if let Some(service) = span.attribute("palisade.service") {
            assert_eq!(
                span.service_name,
                exported_as(&service),
                "the resource service.name of {service}'s {}",
                span.span.name
            );
        }
    }
    // What the tracing UI lists for the scan's trace: every service, by its service.name.
    let services: BTreeSet<&str> = in_trace
        .iter()
        .map(|span| span.service_name.as_str())
        .collect();
    for service in [
        "client",
        "admission",
        "dispatch",
        "worker",
        "ingestion",
        "enrichment",
    ] {
        assert!(
            services.contains(exported_as(service).as_str()),
            "{service} missing from {services:?}"
        );
    }

    // client submit → send (request) → admission process.
    let send_submit = parent_of(admission).expect("admission's parent is exported");
    assert!(
        send_submit.span.name.starts_with("send "),
        "{send_submit:?}"
    );
    assert!(
        send_submit.span.name.ends_with(".submit"),
        "{send_submit:?}"
    );
    let client = parent_of(send_submit).expect("the send's parent is exported");
    assert_eq!(client.span.name, "submit scan");
    assert!(
        client.span.parent_span_id.is_empty(),
        "the client's span is the root"
    );

    for (position, plugin) in PROFILE.iter().enumerate() {
        // The grant's lease span: a child of the scan context. The first plugin's is
        // dispatch's, linked to the worker's acquire (in the worker's own trace); each later
        // one is ingestion's, handed on with the previous plugin's completion and linked to
        // that completion's span (in this trace).
        let lease = in_trace
            .iter()
            .find(|span| span.span.name == format!("lease {plugin}"))
            .unwrap_or_else(|| panic!("the lease span of {plugin}"));
        assert_eq!(lease.span.parent_span_id, admission.span.span_id);
        let (granter, linked_trace_is_this_one) = if position == 0 {
            ("dispatch", false)
        } else {
            ("ingestion", true)
        };
        assert_eq!(
            lease.attribute("palisade.service").as_deref(),
            Some(granter),
            "{plugin}"
        );
        assert!(
            lease
                .span
                .links
                .iter()
                .any(|link| (link.trace_id == trace_id) == linked_trace_is_this_one),
            "the lease of {plugin} links to what asked for it: {:?}",
            lease.span.links
        );
        // The worker's execution: a child of the lease.
        let execute = in_trace
            .iter()
            .find(|span| span.span.name == format!("execute {plugin}"))
            .unwrap_or_else(|| panic!("the worker's execution span of {plugin}"));
        assert_eq!(execute.span.parent_span_id, lease.span.span_id);
        assert_eq!(
            execute.attribute("palisade.service").as_deref(),
            Some("worker")
        );
        // Every message the execution sent is processed by ingestion as a child of its send.
        let sends: Vec<&&Exported> = in_trace
            .iter()
            .filter(|span| span.span.parent_span_id == execute.span.span_id)
            .filter(|span| span.span.name.starts_with("send "))
            .collect();
        assert!(
            sends
                .iter()
                .any(|span| span.span.name.ends_with(".complete")),
            "{plugin}: its completion (its only batch travels inside it)"
        );
        for send in sends {
            assert!(
                in_trace.iter().any(|span| {
                    span.span.parent_span_id == send.span.span_id
                        && span.attribute("palisade.service").as_deref() == Some("ingestion")
                }),
                "ingestion processed {}",
                send.span.name
            );
        }
    }

    // Fan-in: an ingestion transaction is a root of its own, linked to the messages it decided.
    let ingestion_process: BTreeSet<Vec<u8>> = in_trace
        .iter()
        .filter(|span| span.attribute("palisade.service").as_deref() == Some("ingestion"))
        .map(|span| span.span.span_id.clone())
        .collect();
    assert!(
        spans.iter().any(|span| {
            span.span.name == "ingestion transaction"
                && span.span.trace_id != trace_id
                && span.span.links.iter().any(|link| {
                    link.trace_id == trace_id && ingestion_process.contains(&link.span_id)
                })
        }),
        "an ingestion transaction links to the scan's messages"
    );

    // Events of the scan (outbox relay) and enrichment hang off the scan context.
    let enrich = in_trace
        .iter()
        .find(|span| span.span.name == "enrich scan")
        .expect("enrichment's span");
    assert_eq!(enrich.span.parent_span_id, admission.span.span_id);
    for event in [
        "scan.admitted",
        "task.ready",
        "task.leased",
        "scan.completed",
    ] {
        assert!(
            in_trace.iter().any(|span| {
                span.span.name.ends_with(&format!(".event.{event}"))
                    && span.span.parent_span_id == admission.span.span_id
            }),
            "the {event} event is sent in the scan's trace"
        );
    }

    // Messaging attributes on every send and process span.
    for span in &in_trace {
        let operation = match span.span.name.split(' ').next() {
            Some("send") => "send",
            Some("process") => "process",
            _ => continue,
        };
        assert_eq!(span.attribute("messaging.system").as_deref(), Some("nats"));
        assert_eq!(
            span.attribute("messaging.operation.type").as_deref(),
            Some(operation)
        );
        // Named from the subject's template (ids in attributes only).
        let destination = span
            .attribute("messaging.destination.name")
            .expect("destination");
        let template = system.subjects.template_of(&destination);
        assert_eq!(
            span.attribute("messaging.destination.template").as_deref(),
            Some(template.as_str())
        );
        assert!(span.span.name.ends_with(&template), "{}", span.span.name);
    }
    assert!(
        in_trace
            .iter()
            .any(|span| span.attribute("messaging.message.id").is_some()),
        "durable messages carry their id"
    );

    system.finish().await;
    drop(telemetry);
}
