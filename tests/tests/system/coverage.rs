//! Coverage (issue 47, SPEC I16): evaluations travel in result batches and are written in the
//! batch's fenced transaction; a stale worker writes none, a replay neither duplicates nor
//! drops one, a completion keeps only what the completing attempt evaluated; a required rule
//! nobody evaluated reads UNKNOWN and the gate refuses it whatever the dispositions.

use messages::ErrorCode;
use messages::{EventKind, v1};
use prost::Message as _;
use store::findings::{Change, ChangeOutcome};
use store::states::{FindingStatus, Severity};
use tests::{TestSystem, written_events};
use uuid::Uuid;

/// The target `leased_scan` submits.
const TARGET: &str = "http://target.test";

/// The scan's evaluations as stored: (rule, resource, status, reason, attempt).
async fn evaluations(
    system: &TestSystem,
    scan_id: &str,
) -> Vec<(String, String, String, String, Uuid)> {
    sqlx::query_as(
        "SELECT rule_id, resource, status, reason_code, attempt_id FROM evaluations \
         WHERE scan_id = $1 ORDER BY rule_id, resource",
    )
    .bind(Uuid::parse_str(scan_id).unwrap())
    .fetch_all(&system.pool)
    .await
    .unwrap()
}

fn attempt_of(lease: &v1::Lease) -> Uuid {
    Uuid::parse_str(&lease.lease.as_ref().unwrap().attempt_id).unwrap()
}

fn payload(evaluations: Vec<v1::Evaluation>) -> v1::BatchPayload {
    v1::BatchPayload {
        evaluations,
        ..Default::default()
    }
}

/// One batch's evaluations are stored once, with the failure linked to its finding; its replay
/// is a duplicate that changes nothing; a later batch's evaluation of the same rule and
/// resource replaces the earlier one, and the completion keeps them all.
#[tokio::test]
async fn evaluations_are_stored_with_their_batch_and_a_replay_neither_duplicates_nor_drops_one() {
    let system = TestSystem::spawn().await;
    let scan = system.leased_scan(&["alpha"]).await;
    let worker = &scan.worker;
    let mut first = tests::findings_payload(1);
    first.evaluations.extend([
        v1::Evaluation::error("tls", TARGET, "connection_refused"),
        v1::Evaluation::not_applicable("ssh", TARGET, "no_ssh_service"),
    ]);
    let batch = worker.batch(&scan.lease, 0, &first);
    assert!(worker.send_batch(&batch).await.error.is_none());
    let stored = evaluations(&system, &scan.scan_id).await;
    assert_eq!(stored.len(), 4, "{stored:?}");

    let before = system.table_counts().await;
    let ack = worker.send_batch(&batch).await;
    assert!(ack.error.is_none() && ack.duplicate, "{ack:?}");
    assert_eq!(system.table_counts().await, before);
    assert_eq!(
        evaluations(&system, &scan.scan_id).await,
        stored,
        "the replay changed nothing"
    );

    // The failure names its finding.
    let linked: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM evaluations e JOIN findings f \
         ON f.scan_id = e.scan_id AND f.finding_key = e.finding_key WHERE e.scan_id = $1",
    )
    .bind(Uuid::parse_str(&scan.scan_id).unwrap())
    .fetch_one(&system.pool)
    .await
    .unwrap();
    assert_eq!(linked, 1);

    // The TLS check, made again, passes: one row, replaced.
    let second = payload(vec![v1::Evaluation::pass("tls", TARGET)]);
    assert!(
        worker
            .send_batch(&worker.batch(&scan.lease, 1, &second))
            .await
            .error
            .is_none()
    );
    assert!(worker.complete(&scan.lease, 2).await.error.is_none());
    system.wait_scan_state(&scan.scan_id, "completed").await;
    let statuses: Vec<(String, String)> = evaluations(&system, &scan.scan_id)
        .await
        .into_iter()
        .map(|(rule, _, status, _, _)| (rule, status))
        .collect();
    assert_eq!(
        statuses,
        [
            ("rule-0".to_owned(), "fail".to_owned()),
            ("rule-ok".to_owned(), "pass".to_owned()),
            ("ssh".to_owned(), "not_applicable".to_owned()),
            ("tls".to_owned(), "pass".to_owned()),
        ]
    );
    system.finish().await;
}

/// A worker whose lease lapsed stores no evaluation; when the task's next attempt completes,
/// the evaluations the superseded attempt stored while it held the lease are gone, and the
/// completing attempt's stand.
#[tokio::test]
async fn a_stale_worker_stores_no_evaluation_and_a_completion_keeps_only_its_own_attempts() {
    let system = TestSystem::spawn().await;
    let scan = system.leased_scan(&["alpha"]).await;
    let early = payload(vec![
        v1::Evaluation::pass("old-only", TARGET),
        v1::Evaluation::pass("both", TARGET),
    ]);
    let ack = scan
        .worker
        .send_batch(&scan.worker.batch(&scan.lease, 0, &early))
        .await;
    assert!(ack.error.is_none(), "{ack:?}");
    system.expire_and_recover(&scan.lease).await;

    // The stale worker's next batch is refused and writes nothing.
    let late = payload(vec![v1::Evaluation::pass("stale", TARGET)]);
    let before = system.table_counts().await;
    let ack = scan
        .worker
        .send_batch(&scan.worker.batch(&scan.lease, 1, &late))
        .await;
    assert_eq!(
        ack.error.expect("refused").error_code(),
        Some(ErrorCode::LeaseLost)
    );
    assert_eq!(system.table_counts().await, before);

    let successor = system.manual_worker(scan.organization_id, 8).await;
    assert!(successor.hello(&["alpha"]).await.error.is_none());
    let current = successor.acquire_one().await;
    let own = payload(vec![v1::Evaluation::error("both", TARGET, "timeout")]);
    assert!(
        successor
            .send_batch(&successor.batch(&current, 0, &own))
            .await
            .error
            .is_none()
    );
    assert!(successor.complete(&current, 1).await.error.is_none());
    system.wait_scan_state(&scan.scan_id, "completed").await;
    let stored = evaluations(&system, &scan.scan_id).await;
    assert_eq!(
        stored,
        [(
            "both".to_owned(),
            TARGET.to_owned(),
            "error".to_owned(),
            "timeout".to_owned(),
            attempt_of(&current)
        )],
        "only the completing attempt's evaluations stand"
    );
    system.finish().await;
}

fn set_false_positive(finding_id: Uuid, revision: i32) -> Change {
    Change {
        finding_id,
        organization_id: None,
        expected_revision: revision,
        expected_collection_revision: None,
        reason: "not ours".into(),
        actor: "alice".into(),
    }
}

/// A rule the worker declared for its plugin, on a resource of its kind the scan has, with no
/// evaluation: UNKNOWN, and the gate refuses the scan, whatever the findings' dispositions;
/// the `scan.completed` event says so too. Evaluated, the gate passes.
#[tokio::test]
async fn a_gate_refuses_a_required_rule_left_unevaluated_whatever_the_dispositions() {
    let system = TestSystem::spawn().await;
    let organization_id = system.organization().await;
    let worker = system.manual_worker(organization_id, 8).await;
    let rules: &[(&str, &str, &[&str])] = &[
        ("alpha", "reachable", &["target"]),
        ("alpha", "hsts", &["http_service"]),
    ];
    assert!(
        worker
            .hello_with_rules(&["alpha"], 8, rules)
            .await
            .error
            .is_none()
    );
    let mut gates = Vec::new();
    for evaluate_hsts in [false, true] {
        let reply = system
            .submit(&system.request(organization_id, TARGET, &["alpha"]))
            .await;
        assert!(reply.error.is_none(), "{reply:?}");
        let lease = worker.acquire_one().await;
        // One finding and its failure, a pass, and the asset http://example.test:80.
        let mut results = tests::findings_payload(1);
        results
            .evaluations
            .push(v1::Evaluation::pass("reachable", TARGET));
        if evaluate_hsts {
            results
                .evaluations
                .push(v1::Evaluation::pass("hsts", "http://example.test:80"));
        }
        assert!(
            worker
                .send_batch(&worker.batch(&lease, 0, &results))
                .await
                .error
                .is_none()
        );
        assert!(worker.complete(&lease, 1).await.error.is_none());
        system.wait_scan_state(&reply.scan_id, "completed").await;
        gates.push(Uuid::parse_str(&reply.scan_id).unwrap());
    }
    let [unevaluated, evaluated] = <[Uuid; 2]>::try_from(gates).unwrap();
    let summary = |scan_id| {
        let pool = system.pool.clone();
        async move {
            store::findings::summary(&pool, None, scan_id, Severity::Low)
                .await
                .unwrap()
                .expect("the scan")
        }
    };

    let gate = summary(unevaluated).await;
    assert!(gate.complete, "every plugin completed: {gate:?}");
    assert_eq!(gate.coverage.required_incomplete, 1, "{gate:?}");
    assert!(!gate.gate_passed);
    assert!(
        gate.gate_refusal
            .as_deref()
            .unwrap()
            .contains("coverage incomplete"),
        "{gate:?}"
    );
    // Every finding excluded: the findings no longer block, the coverage still does.
    let finding_id: Uuid = sqlx::query_scalar("SELECT id FROM findings WHERE scan_id = $1")
        .bind(unevaluated)
        .fetch_one(&system.pool)
        .await
        .unwrap();
    let outcome = store::findings::set_status(
        &system.pool,
        &set_false_positive(finding_id, 1),
        FindingStatus::FalsePositive,
    )
    .await
    .unwrap();
    assert!(
        matches!(outcome, ChangeOutcome::Changed { .. }),
        "{outcome:?}"
    );
    let gate = summary(unevaluated).await;
    assert_eq!(gate.blocking, 0);
    assert!(
        !gate.gate_passed,
        "a disposition passed unevaluated coverage: {gate:?}"
    );
    assert_eq!(gate.coverage.required_incomplete, 1);

    // The same scan with the rule evaluated: blocked only by its finding.
    let gate = summary(evaluated).await;
    assert!(gate.coverage.complete, "{gate:?}");
    assert_eq!(gate.blocking, 1);

    // scan.completed carries each scan's coverage.
    system.wait_outbox_drained().await;
    let completed: Vec<v1::ScanCompleted> = written_events(&system)
        .await
        .into_iter()
        .filter(|event| event.kind == Some(EventKind::ScanCompleted))
        .map(|event| v1::ScanCompleted::decode(event.payload.as_slice()).unwrap())
        .collect();
    let coverage_of = |scan_id: Uuid| {
        completed
            .iter()
            .find(|event| event.scan_id == scan_id.to_string())
            .and_then(|event| event.coverage.clone())
            .expect("scan.completed with coverage")
    };
    let unknown = coverage_of(unevaluated);
    assert_eq!((unknown.status.as_str(), unknown.complete), ("fail", false));
    assert_eq!(unknown.counts["unknown"], 1);
    assert_eq!(unknown.required_incomplete, 1);
    let known = coverage_of(evaluated);
    assert!(known.complete, "{known:?}");
    // rule-0 fails, rule-ok, reachable and hsts pass.
    assert_eq!(known.score, Some(3.0 / 4.0));
    system.finish().await;
}

/// Two scans of one target by a worker declaring rule-0 and rule-1 on the target: the first
/// finds both, the second finds neither, evaluates rule-0 on the findings' resource as a pass
/// and does not evaluate rule-1. Over the bus: rule-0's finding is no longer seen, rule-1's is
/// unknown, never fixed; the coverage pages name the unevaluated rule UNKNOWN; another
/// organization reads neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finding_is_no_longer_seen_only_where_the_later_scan_passed_its_rule() {
    use v1::findings_reply::Answer;
    use v1::findings_request::Query;
    let system = TestSystem::spawn().await;
    let organization_id = system.organization().await;
    let worker = system.manual_worker(organization_id, 8).await;
    // The findings' resource, declared as the target's kind: the rule is required there only
    // if the resource is the target, so these rules are not required here; the diff reads
    // evaluations whether required or not.
    let rules: &[(&str, &str, &[&str])] = &[("alpha", "rule-0", &["http_service"])];
    assert!(
        worker
            .hello_with_rules(&["alpha"], 8, rules)
            .await
            .error
            .is_none()
    );
    let mut scans = Vec::new();
    for payload in [
        tests::findings_payload(2),
        v1::BatchPayload {
            assets: tests::findings_payload(0).assets,
            evaluations: vec![v1::Evaluation::pass("rule-0", "http://example.test/")],
            ..Default::default()
        },
    ] {
        let reply = system
            .submit(&system.request(organization_id, TARGET, &["alpha"]))
            .await;
        assert!(reply.error.is_none(), "{reply:?}");
        let lease = worker.acquire_one().await;
        assert!(
            worker
                .send_batch(&worker.batch(&lease, 0, &payload))
                .await
                .error
                .is_none()
        );
        assert!(worker.complete(&lease, 1).await.error.is_none());
        system.wait_scan_state(&reply.scan_id, "completed").await;
        scans.push(reply.scan_id);
    }
    let client = system.client();
    let ask = |organization: Uuid, query: Query| {
        let client = client.clone();
        async move {
            client
                .findings(&organization, query)
                .await
                .expect("an answer")
        }
    };
    let diff = Query::Diff(v1::ScanDiff {
        base_scan_id: scans[0].clone(),
        scan_id: scans[1].clone(),
        limit: 0,
    });
    let Some(Answer::Diff(result)) = ask(organization_id, diff.clone()).await.answer else {
        panic!("a diff")
    };
    let rules = |findings: &[v1::DiffFinding]| -> Vec<String> {
        findings.iter().map(|f| f.rule_id.clone()).collect()
    };
    assert!(result.scan_complete);
    assert_eq!(rules(&result.no_longer_seen), ["rule-0"], "{result:?}");
    assert_eq!(rules(&result.unknown), ["rule-1"], "{result:?}");
    assert_eq!((result.new_count, result.still_present_count), (0, 0));

    // The diff the other way round is refused; a scan compared with itself has nothing new.
    let backwards = Query::Diff(v1::ScanDiff {
        base_scan_id: scans[1].clone(),
        scan_id: scans[0].clone(),
        limit: 0,
    });
    let refused = ask(organization_id, backwards).await;
    assert_eq!(
        refused.error.map(|e| e.code),
        Some("invalid_field".to_owned())
    );

    // The second scan's coverage, a page at a time: the rule-0 asset entry the worker
    // declared is UNKNOWN (it evaluated rule-0 on another resource), the pass is not required.
    let page = |after: String| {
        Query::Coverage(v1::ScanCoverage {
            scan_id: scans[1].clone(),
            statuses: Vec::new(),
            after,
            limit: 1,
        })
    };
    let mut entries = Vec::new();
    let mut after = String::new();
    loop {
        let Some(Answer::Coverage(coverage)) = ask(organization_id, page(after)).await.answer
        else {
            panic!("a coverage page")
        };
        assert!(coverage.entries.len() <= 1);
        let summary = coverage.summary.expect("the summary");
        assert_eq!((summary.required_incomplete, summary.complete), (1, false));
        entries.extend(coverage.entries);
        if coverage.next_after.is_empty() {
            break;
        }
        after = coverage.next_after;
    }
    let statuses: Vec<(&str, &str, bool)> = entries
        .iter()
        .map(|e| (e.resource.as_str(), e.status.as_str(), e.required))
        .collect();
    assert_eq!(
        statuses,
        [
            ("http://example.test/", "pass", false),
            ("http://example.test:80", "unknown", true)
        ]
    );

    // Another organization: not_found for both.
    let other = system.organization().await;
    for query in [diff, page(String::new())] {
        let reply = ask(other, query).await;
        assert_eq!(reply.error.map(|e| e.code), Some("not_found".to_owned()));
    }
    system.finish().await;
}
