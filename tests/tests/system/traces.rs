//! The trace an SRE reads (issue 25), the way palisade runs in production: the five services
//! and two reference workers as processes of their own, each exporting OTLP with its own
//! `service.name` to a collector in the test, and the test itself as the client. Scans: one
//! driven by hand (an acquire sent twice with one request id, a forged batch), a one-plugin
//! and a three-plugin scan, one failing at once and one after its attempts. Then:
//! - every scan is one trace, holding every service it crossed, whose id `scan show` names,
//!   and every ingestion span in it names the scan;
//! - no exported span waits for a parent that is never exported while the system runs
//!   (a process-lifetime span), and none at all once everything stopped;
//! - while idle, no trace starts but a worker's long-poll for work;
//! - span names come from a bounded set: no prefix, no id;
//! - failures are ERROR spans: the failing scans', the forged batch's;
//! - one `lease` span per attempt, the acknowledgements inside their message's trace;
//! - the request latency histogram's exemplars name exported traces.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tests::{TestSystem, WorkerProcess};
use tracing::Instrument as _;
use uuid::Uuid;

use super::otlp::{Exported, ServiceProcesses, start_collector};

const WORKER: &str = env!("CARGO_BIN_EXE_test-worker");

/// OpenTelemetry's `STATUS_CODE_ERROR`.
const STATUS_ERROR: i32 = 2;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos() as u64
}

fn is_error(span: &Exported) -> bool {
    span.span
        .status
        .as_ref()
        .is_some_and(|status| status.code == STATUS_ERROR)
}

/// Spans whose parent is not among `spans`, ended before `before` (nanoseconds).
fn orphans(spans: &[Exported], before: u64) -> Vec<String> {
    let ids: BTreeSet<Vec<u8>> = spans.iter().map(|span| span.span.span_id.clone()).collect();
    spans
        .iter()
        .filter(|span| {
            !span.span.parent_span_id.is_empty()
                && span.span.end_time_unix_nano < before
                && !ids.contains(&span.span.parent_span_id)
        })
        .map(|span| format!("{} ({})", span.span.name, span.service_name))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scan_is_one_clean_trace_across_separate_processes() {
    let (collector, collector_addr) = start_collector().await;
    let endpoint = format!("http://{collector_addr}");
    let telemetry = telemetry::init(
        "palisade-test-client",
        &telemetry::TelemetrySettings {
            json: false,
            default_filter: "warn".into(),
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
    let organization_id = system.organization().await;
    let prefix = system.subjects.prefix().to_owned();
    let mut services = ServiceProcesses::start(
        &system,
        &endpoint,
        &[
            ("PALISADE_ACQUIRE_POLL_MS", "200"),
            // A cancelled attempt's worker hears of it at its next renew, within a second.
            ("PALISADE_LEASE_TTL_MS", "6000"),
            ("PALISADE_RENEW_INTERVAL_MS", "1000"),
            ("PALISADE_DISPATCH_HEARTBEAT_MS", "500"),
            ("PALISADE_REAPER_INTERVAL_MS", "200"),
            ("PALISADE_ENRICHMENT_POLL_MS", "200"),
            ("PALISADE_MAX_ATTEMPTS", "2"),
            ("PALISADE_RETRY_BASE_MS", "100"),
            ("PALISADE_RETRY_CAP_MS", "200"),
        ],
    )
    .await;
    let exporting = vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(), endpoint.clone()),
        ("PALISADE_SUBJECT_PREFIX".to_owned(), prefix.clone()),
        ("RUST_LOG".to_owned(), "warn".to_owned()),
    ];

    // By hand, before any reference worker runs: the acquire sent twice with one request
    // id, a batch with a forged lease token, then the completion.
    let manual = system.manual_worker(organization_id, 1).await;
    assert!(manual.hello(&["synthetic"]).await.error.is_none());
    let by_hand = system
        .submit(&system.request(organization_id, "synthetic://by-hand", &["synthetic"]))
        .await;
    assert!(by_hand.error.is_none(), "{by_hand:?}");
    let request_id = Uuid::new_v4();
    let first = manual.acquire(request_id, 1, 10_000).await;
    assert_eq!(first.leases.len(), 1, "{first:?}");
    let again = manual.acquire(request_id, 1, 10_000).await;
    assert_eq!(
        again.leases.len(),
        1,
        "the resent acquire is answered again: {again:?}"
    );
    // Issue 48, item 4: the replayed lease carries the context of the lease span opened the
    // first time (it carried the scan's, so the work hung under admission's span beside an
    // empty lease span).
    assert!(!first.leases[0].traceparent.is_empty(), "{first:?}");
    assert_eq!(
        again.leases[0].traceparent, first.leases[0].traceparent,
        "the replayed lease's context"
    );
    let lease = first.leases[0].clone();
    let mut forged = lease.clone();
    forged
        .lease
        .as_mut()
        .expect("a lease reference")
        .lease_token = "forged".into();
    // The worker's messages continue the lease's trace, as the reference worker's do.
    let working = tracing::info_span!("work by hand");
    bus::trace::set_parent_from_traceparent(&working, &lease.traceparent);
    let refused = manual
        .send_batch(&manual.batch(&forged, 0, &tests::findings_payload(1)))
        .instrument(working.clone())
        .await;
    assert!(
        refused.error.is_some(),
        "a forged token is refused: {refused:?}"
    );
    let completed = manual.complete(&lease, 0).instrument(working).await;
    assert!(completed.error.is_none(), "{completed:?}");
    system.wait_scan_state(&by_hand.scan_id, "completed").await;

    let workers = [
        WorkerProcess::start_with_env(&system, WORKER, organization_id, 2, &exporting).await,
        WorkerProcess::start_with_env(&system, WORKER, organization_id, 2, &exporting).await,
    ];
    let web = tests::start_web_app().await;
    let scans = [
        (
            "one plugin",
            "synthetic://one?findings=2".to_owned(),
            vec!["synthetic"],
            "completed",
        ),
        (
            "three plugins",
            format!("http://{web}/"),
            vec!["tcp_connect", "http_headers", "synthetic"],
            "completed",
        ),
        (
            "failing at once",
            "synthetic://at-once?fail=1&retryable=false".to_owned(),
            vec!["synthetic"],
            "failed",
        ),
        (
            "failing after its attempts",
            "synthetic://retried?fail=1".to_owned(),
            vec!["synthetic"],
            "failed",
        ),
        (
            "cancelled by the operator",
            "synthetic://cancelled-by-the-operator?duration_ms=20000".to_owned(),
            vec!["synthetic"],
            "cancelled",
        ),
        (
            "cancelled",
            "synthetic://cancelled?duration_ms=20000".to_owned(),
            vec!["synthetic"],
            "cancelled",
        ),
    ];
    let mut scan_ids = vec![("by hand", by_hand.scan_id.clone(), "completed")];
    for (what, target, plugins, _) in &scans {
        let reply = system
            .submit(&system.request(organization_id, target, plugins))
            .await;
        assert!(reply.error.is_none(), "{what}: {reply:?}");
        scan_ids.push((what, reply.scan_id, ""));
    }
    let cancelled = scan_ids.last().expect("the cancelled scan").1.clone();
    system.wait_scan_state(&cancelled, "running").await;
    let reply = system
        .client()
        .cancel_scan(&organization_id, &cancelled, "not needed after all")
        .await
        .expect("dispatch answers");
    assert_eq!(reply.outcome, "cancelled", "{reply:?}");
    let by_operator = scan_ids[scan_ids.len() - 2].1.clone();
    system.wait_scan_state(&by_operator, "running").await;
    palisade::scan::cancel(
        &system.settings.common,
        store::cancel::CancelTarget::Scan(by_operator.parse().expect("a scan id")),
        "cancelled from the command line",
        palisade::cli_support::Output::Text,
    )
    .await
    .expect("the operator's cancel");
    for ((_, scan_id, _), (_, _, _, state)) in scan_ids.iter().skip(1).zip(&scans) {
        system.wait_scan_state(scan_id, state).await;
    }

    // Idle: what finished is exported within the batch exporter's 5 s; then a window in
    // which nothing happens, and time for what it started to be exported.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let idle_from = now_nanos();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let idle_until = now_nanos();
    tokio::time::sleep(Duration::from_secs(6)).await;
    telemetry.flush().await;
    let running = collector.spans();
    let waiting = orphans(&running, idle_from);
    assert!(
        waiting.is_empty(),
        "spans exported while their parent never was (a span as long as the process?): {waiting:?}"
    );

    // Exemplars: dispatch's request latencies name traces the collector has.
    let metrics = palisade::probe::probe(&format!(
        "http://{}/metrics",
        services
            .process(messages::Service::Dispatch)
            .http_addr
            .expect("an address")
    ))
    .await
    .expect("dispatch serves /metrics")
    .body;
    let exemplars: Vec<String> = metrics
        .lines()
        .filter(|line| line.starts_with("palisade_request_seconds_bucket"))
        .filter_map(|line| line.split("# {trace_id=\"").nth(1))
        .filter_map(|rest| rest.split('"').next())
        .map(str::to_owned)
        .collect();
    let traced: BTreeSet<String> = running
        .iter()
        .map(|span| hex(&span.span.trace_id))
        .collect();
    assert!(
        exemplars.iter().any(|trace_id| traced.contains(trace_id)),
        "request latency exemplars {exemplars:?} name no exported trace"
    );

    // Stopped as an orchestrator stops them: a worker asked to stop waits for the answer to
    // its long-poll (it may carry leases), which dispatch gives as it stops.
    for worker in &workers {
        worker.signal("TERM");
    }
    services
        .process(messages::Service::Dispatch)
        .stop(Duration::from_secs(20))
        .await;
    for worker in workers {
        worker.terminate(Duration::from_secs(20)).await;
    }
    services.stop().await;
    telemetry.flush().await;
    let spans = collector.spans();
    let missing = orphans(&spans, u64::MAX);
    assert!(
        missing.is_empty(),
        "spans whose parent never arrived: {missing:?}"
    );

    // While idle, only a worker's long-poll for work starts a trace.
    let idle_roots: Vec<String> = spans
        .iter()
        .filter(|span| {
            span.span.parent_span_id.is_empty()
                && (idle_from..idle_until).contains(&span.span.start_time_unix_nano)
                && !(span.service_name == "palisade-worker" && span.span.name.ends_with(".acquire"))
        })
        .map(|span| format!("{} ({})", span.span.name, span.service_name))
        .collect();
    assert!(
        idle_roots.is_empty(),
        "traces started while idle: {idle_roots:?}"
    );

    // Span names: a bounded set, with neither the prefix nor any id.
    let names: BTreeSet<&str> = spans.iter().map(|span| span.span.name.as_str()).collect();
    for name in &names {
        let has_id = name
            .split(['.', ' '])
            .any(|token| Uuid::parse_str(token).is_ok());
        assert!(
            !has_id && !name.contains(&prefix),
            "span name {name:?} names an id"
        );
    }
    assert!(names.len() <= 60, "{} span names: {names:?}", names.len());

    // Issue 48, item 5: who cancelled is in the scan's trace: a `cancel` span of the scan's
    // trace naming the canceller, linked to the canceller's own trace (the client's request,
    // the operator's command), which did not reach the scan's before.
    for (scan_id, by) in [(&cancelled, "client "), (&by_operator, "operator")] {
        let trace_id: String = sqlx::query_scalar(
            "SELECT split_part(trace_context, '-', 2) FROM scans WHERE id = $1::uuid",
        )
        .bind(scan_id)
        .fetch_one(&system.pool)
        .await
        .expect("the scan's trace");
        let cancel = spans
            .iter()
            .find(|span| span.span.name == "cancel" && hex(&span.span.trace_id) == trace_id)
            .unwrap_or_else(|| panic!("no cancel span in the trace of {scan_id} ({by})"));
        assert!(
            cancel
                .attribute("palisade.cancelled_by")
                .is_some_and(|who| who.starts_with(by)),
            "{:?}",
            cancel.span.attributes
        );
        let linked: Vec<String> = cancel
            .span
            .links
            .iter()
            .map(|link| hex(&link.trace_id))
            .collect();
        assert!(
            linked
                .iter()
                .any(|linked| *linked != trace_id && traced.contains(linked)),
            "the cancel of {scan_id} links no exported trace of the canceller: {linked:?}"
        );
    }

    // One `lease` span per attempt.
    let mut leases: HashMap<(String, String), usize> = HashMap::new();
    for span in spans
        .iter()
        .filter(|span| span.span.name.starts_with("lease "))
    {
        let attempt = (
            span.attribute("palisade.task_id").unwrap_or_default(),
            span.attribute("palisade.attempt_number")
                .unwrap_or_default(),
        );
        *leases.entry(attempt).or_default() += 1;
    }
    assert!(!leases.is_empty());
    assert!(
        leases.values().all(|count| *count == 1),
        "lease spans per attempt: {leases:?}"
    );

    // Every acknowledgement to a worker is sent inside the message it answers.
    let acks: Vec<&Exported> = spans
        .iter()
        .filter(|span| span.span.name.ends_with(".ack") && span.span.name.starts_with("send "))
        .collect();
    assert!(!acks.is_empty());
    assert!(
        acks.iter().all(|ack| !ack.span.parent_span_id.is_empty()),
        "acknowledgements outside their message's trace"
    );

    let mut by_trace: HashMap<Vec<u8>, Vec<&Exported>> = HashMap::new();
    for span in &spans {
        by_trace
            .entry(span.span.trace_id.clone())
            .or_default()
            .push(span);
    }
    let mut sizes = BTreeMap::new();
    for (what, scan_id, _) in &scan_ids {
        let naming: Vec<&Exported> = spans
            .iter()
            .filter(|span| span.attribute("palisade.scan_id").as_deref() == Some(scan_id.as_str()))
            .collect();
        // A cancel is a request of its own (the canceller's trace) that names the scan it
        // acted on; everything else naming the scan is in the scan's trace.
        let (cancels, of_the_scan): (Vec<&Exported>, Vec<&Exported>) = naming
            .into_iter()
            .partition(|span| span.span.name.ends_with(".cancel"));
        assert_eq!(
            cancels.len(),
            usize::from(*what == "cancelled"),
            "{what}: the cancel request names its scan"
        );
        let traces: BTreeSet<Vec<u8>> = of_the_scan
            .iter()
            .map(|span| span.span.trace_id.clone())
            .collect();
        assert_eq!(traces.len(), 1, "{what}: one trace, not {}", traces.len());
        let trace_id = traces.into_iter().next().expect("one trace");
        let trace = &by_trace[&trace_id];
        sizes.insert(*what, trace.len());
        let scan = store::admin::scan(&system.pool, Uuid::parse_str(scan_id).unwrap())
            .await
            .unwrap()
            .expect("the scan");
        assert_eq!(
            scan.trace_id,
            Some(hex(&trace_id)),
            "{what}: scan show names its trace"
        );
        let services: BTreeSet<&str> = trace
            .iter()
            .map(|span| span.service_name.as_str())
            .collect();
        for service in [
            "palisade-test-client",
            "palisade-admission",
            "palisade-dispatch",
        ] {
            assert!(
                services.contains(service),
                "{what}: no {service} in {services:?}"
            );
        }
        // A cancelled scan's worker may have sent nothing to ingestion.
        if !what.starts_with("cancelled") {
            assert!(
                services.contains("palisade-ingestion"),
                "{what}: {services:?}"
            );
        }
        if *what != "by hand" {
            assert!(services.contains("palisade-worker"), "{what}: {services:?}");
        }
        for span in trace.iter().filter(|span| {
            span.service_name == "palisade-ingestion" && span.span.name.starts_with("process ")
        }) {
            assert_eq!(
                span.attribute("palisade.scan_id").as_deref(),
                Some(scan_id.as_str()),
                "{what}: ingestion's {} names its scan",
                span.span.name
            );
        }
        let errors: Vec<&str> = trace
            .iter()
            .filter(|span| is_error(span))
            .map(|span| span.span.name.as_str())
            .collect();
        match *what {
            "failing at once" | "failing after its attempts" => {
                assert!(!errors.is_empty(), "{what}: no ERROR span")
            }
            "cancelled" => assert!(
                trace
                    .iter()
                    .any(|span| span.span.name.ends_with(".event.scan.cancelled")),
                "{what}: its scan.cancelled event is in its trace"
            ),
            "by hand" => assert!(
                trace.iter().any(|span| is_error(span)
                    && span.service_name == "palisade-ingestion"
                    && span.attribute("palisade.error_code").is_some()),
                "{what}: the forged batch is an ERROR span with its code: {errors:?}"
            ),
            _ => assert!(errors.is_empty(), "{what}: ERROR spans {errors:?}"),
        }
    }
    println!("spans per scan: {sizes:?}; {} span names", names.len());
    assert!(
        sizes.values().all(|size| *size <= 40),
        "spans per scan grew: {sizes:?}"
    );
    system.finish().await;
}
