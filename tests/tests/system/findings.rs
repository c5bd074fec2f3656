//! The finding lifecycle (issue 12, item 1): of concurrent changes naming one revision exactly
//! one wins and the others get `revision_conflict`; the five exclusions need a reason; the
//! gate follows each change; a stale collection revision is refused; replayed batches leave
//! dispositions alone; a new scan's findings start open, with the older scan's as occurrences;
//! deleting is refused while the scan runs and keeps the history.

use futures::future::join_all;
use messages::v1;
use store::findings::{Change, ChangeOutcome, Filter};
use store::states::{FindingStatus, Severity};
use tests::TestSystem;
use uuid::Uuid;

/// The scan's findings in key order.
async fn findings(system: &TestSystem, scan_id: Uuid) -> Vec<store::findings::Finding> {
    store::findings::page(&system.pool, None, scan_id, &Filter::default(), "", 100)
        .await
        .unwrap()
        .expect("the scan")
        .findings
}

fn change(finding_id: Uuid, revision: i32, reason: &str) -> Change {
    Change {
        finding_id,
        organization_id: None,
        expected_revision: revision,
        expected_collection_revision: None,
        reason: reason.into(),
        actor: "alice".into(),
    }
}

async fn summary(system: &TestSystem, scan_id: Uuid) -> store::findings::Summary {
    store::findings::summary(&system.pool, None, scan_id, Severity::Low)
        .await
        .unwrap()
        .expect("the scan")
}

async fn completed_scan(system: &TestSystem, count: usize) -> (tests::LeasedScan, Uuid) {
    let scan = system.leased_scan(&["alpha"]).await;
    system.complete_with_findings(&scan, count).await;
    let scan_id = scan.scan_id.parse().unwrap();
    (scan, scan_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_concurrent_changes_naming_one_revision_exactly_one_wins() {
    let system = TestSystem::spawn().await;
    let (_scan, scan_id) = completed_scan(&system, 1).await;
    let finding = findings(&system, scan_id).await.remove(0);
    assert_eq!((finding.status.as_str(), finding.revision), ("open", 1));

    // Six changes wait on the finding's row, then go at once (within the test pool's eight
    // connections, with the lock holder and the probe).
    let mut held = system.pool.begin().await.unwrap();
    sqlx::query("SELECT id FROM findings WHERE id = $1 FOR UPDATE")
        .bind(finding.id)
        .execute(&mut *held)
        .await
        .unwrap();
    let statuses = [
        FindingStatus::NeedsReview,
        FindingStatus::FalsePositive,
        FindingStatus::AcceptedRisk,
        FindingStatus::Ignore,
        FindingStatus::Fixed,
        FindingStatus::GateExempt,
    ];
    let changes: Vec<_> = statuses
        .iter()
        .map(|&status| {
            let pool = system.pool.clone();
            let change = change(finding.id, 1, "decided in a review");
            tokio::spawn(async move { store::findings::set_status(&pool, &change, status).await })
        })
        .collect();
    system
        .wait_for("the six changes to wait on the finding", || async {
            (store::testing::backends_waiting_for_locks(&system.pool)
                .await
                .unwrap()
                == 6)
                .then_some(())
        })
        .await;
    held.rollback().await.unwrap();
    let outcomes: Vec<ChangeOutcome> = join_all(changes)
        .await
        .into_iter()
        .map(|outcome| outcome.unwrap().unwrap())
        .collect();
    let won: Vec<&ChangeOutcome> = outcomes
        .iter()
        .filter(|outcome| matches!(outcome, ChangeOutcome::Changed { .. }))
        .collect();
    assert_eq!(
        won,
        [&ChangeOutcome::Changed {
            revision: Some(2),
            collection_revision: 1
        }]
    );
    assert!(
        outcomes.iter().all(|outcome| matches!(
            outcome,
            ChangeOutcome::Changed { .. }
                | ChangeOutcome::RevisionConflict {
                    current_revision: 2,
                    current_collection_revision: 1
                }
        )),
        "{outcomes:?}"
    );
    let detail = store::findings::show(&system.pool, None, finding.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(detail.finding.revision, 2);
    assert_eq!(detail.history.len(), 1, "one change recorded");
    assert_eq!(detail.history[0].actor, "alice");
    assert_eq!(detail.history[0].to_status, detail.finding.status);
    system.finish().await;
}

#[tokio::test]
async fn exclusions_need_a_reason_and_the_gate_follows_each_change() {
    let system = TestSystem::spawn().await;
    let (_scan, scan_id) = completed_scan(&system, 3).await;
    let [a, b, c] = <[_; 3]>::try_from(findings(&system, scan_id).await).unwrap();
    let gate = summary(&system, scan_id).await;
    assert_eq!(gate.scan_state, "completed");
    assert!(gate.complete);
    assert_eq!((gate.blocking, gate.gate_passed), (3, false));

    // A blank reason for any of the five exclusions changes nothing.
    for status in FindingStatus::ALL
        .iter()
        .filter(|status| status.needs_reason())
    {
        assert_eq!(
            store::findings::set_status(&system.pool, &change(a.id, 1, "  "), *status)
                .await
                .unwrap(),
            ChangeOutcome::ReasonRequired,
            "{status}"
        );
    }
    assert_eq!(summary(&system, scan_id).await.collection_revision, 0);

    let set = |finding: Uuid, revision: i32, status: FindingStatus| {
        let pool = system.pool.clone();
        async move {
            store::findings::set_status(&pool, &change(finding, revision, "triaged"), status)
                .await
                .unwrap()
        }
    };
    // needs_review still counts; gate_exempt is shown, not counted; ignore suppresses.
    assert!(matches!(
        set(a.id, 1, FindingStatus::NeedsReview).await,
        ChangeOutcome::Changed { .. }
    ));
    assert_eq!(summary(&system, scan_id).await.blocking, 3);
    set(b.id, 1, FindingStatus::GateExempt).await;
    let gate = summary(&system, scan_id).await;
    assert_eq!(
        (gate.blocking, gate.gate_exempt, gate.suppressed),
        (2, 1, 0)
    );
    set(c.id, 1, FindingStatus::Ignore).await;
    set(a.id, 2, FindingStatus::FalsePositive).await;
    let gate = summary(&system, scan_id).await;
    assert_eq!(
        (gate.blocking, gate.gate_exempt, gate.suppressed),
        (0, 1, 2)
    );
    assert!(gate.gate_passed, "{gate:?}");
    assert_eq!(gate.collection_revision, 4);
    assert_eq!(gate.by_status.get("false_positive"), Some(&1));
    // Back to open: it counts again.
    set(c.id, 2, FindingStatus::Open).await;
    let gate = summary(&system, scan_id).await;
    assert_eq!((gate.blocking, gate.gate_passed), (1, false));
    // Above the threshold only.
    let high = store::findings::summary(&system.pool, None, scan_id, Severity::High)
        .await
        .unwrap()
        .unwrap();
    assert!(high.gate_passed, "the findings are low");

    // A page read at collection revision 5 cannot decide after another change.
    let stale = Change {
        expected_collection_revision: Some(4),
        ..change(b.id, 2, "still exempt")
    };
    assert_eq!(
        store::findings::set_status(&system.pool, &stale, FindingStatus::AcceptedRisk)
            .await
            .unwrap(),
        ChangeOutcome::RevisionConflict {
            current_revision: 2,
            current_collection_revision: 5
        }
    );
    system.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_batches_leave_the_finding_set_and_dispositions_untouched() {
    let system = TestSystem::spawn().await;
    let scan = system.leased_scan(&["alpha"]).await;
    let batch = scan
        .worker
        .batch(&scan.lease, 0, &tests::findings_payload(4));
    let storm = |times: usize| join_all((0..times).map(|_| scan.worker.send_batch(&batch)));
    for ack in storm(20).await {
        assert!(ack.error.is_none(), "{ack:?}");
    }
    let scan_id: Uuid = scan.scan_id.parse().unwrap();
    // A disposition set while the scan runs survives the storm and the completion.
    let first = findings(&system, scan_id).await.remove(0);
    set_reviewed(&system, first.id).await;
    for ack in storm(20).await {
        assert!(ack.error.is_none(), "{ack:?}");
    }
    let ack = scan.worker.complete(&scan.lease, 1).await;
    assert!(ack.error.is_none(), "{ack:?}");
    system.wait_scan_state(&scan.scan_id, "completed").await;
    for ack in storm(20).await {
        // After completion too, a replay is answered as the duplicate it is, writing nothing.
        assert!(ack.error.is_none() && ack.duplicate, "{ack:?}");
    }
    let after = findings(&system, scan_id).await;
    assert_eq!(after.len(), 4);
    let kept = after.iter().find(|finding| finding.id == first.id).unwrap();
    assert_eq!((kept.status.as_str(), kept.revision), ("needs_review", 2));
    assert!(
        after
            .iter()
            .filter(|finding| finding.id != first.id)
            .all(|finding| finding.status == "open" && finding.revision == 1)
    );
    system.finish().await;
}

async fn set_reviewed(system: &TestSystem, finding: Uuid) {
    assert!(matches!(
        store::findings::set_status(
            &system.pool,
            &change(finding, 1, ""),
            FindingStatus::NeedsReview
        )
        .await
        .unwrap(),
        ChangeOutcome::Changed { .. }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_scan_starts_open_with_the_older_as_an_occurrence_and_deleting_keeps_history() {
    let system = TestSystem::spawn().await;
    let (scan, first_scan) = completed_scan(&system, 1).await;
    let old = findings(&system, first_scan).await.remove(0);
    let marked = palisade::commands::set_finding_status(
        &system.pool,
        &change(old.id, 1, "the header is set by the proxy"),
        FindingStatus::FalsePositive,
    )
    .await
    .unwrap();
    assert_eq!(marked["outcome"], "changed");

    // The same target scanned again: the same finding key, open.
    let reply = system
        .submit(&system.request(scan.organization_id, "http://target.test", &["alpha"]))
        .await;
    assert!(reply.error.is_none(), "{reply:?}");
    let lease = scan.worker.acquire_one().await;
    let second = tests::LeasedScan {
        organization_id: scan.organization_id,
        worker: scan.worker,
        scan_id: reply.scan_id.clone(),
        lease,
    };
    // Deleting while it runs is refused.
    let batch = second
        .worker
        .batch(&second.lease, 0, &tests::findings_payload(1));
    assert!(second.worker.send_batch(&batch).await.error.is_none());
    let second_scan: Uuid = reply.scan_id.parse().unwrap();
    let new = findings(&system, second_scan).await.remove(0);
    assert_eq!(
        store::findings::delete(&system.pool, &change(new.id, 1, "noise"))
            .await
            .unwrap(),
        ChangeOutcome::ScanActive
    );
    let ack = second.worker.complete(&second.lease, 1).await;
    assert!(ack.error.is_none(), "{ack:?}");
    system.wait_scan_state(&second.scan_id, "completed").await;

    assert_eq!(new.finding_key, old.finding_key);
    assert_eq!((new.status.as_str(), new.revision), ("open", 1));
    let detail = palisade::commands::show_finding(&system.pool, new.id)
        .await
        .unwrap();
    let occurrences: Vec<(Uuid, &str)> = detail
        .occurrences
        .iter()
        .map(|occurrence| (occurrence.scan_id, occurrence.status.as_str()))
        .collect();
    assert_eq!(
        occurrences,
        [(second_scan, "open"), (first_scan, "false_positive")]
    );

    // Deleting names the revision; the history stays.
    let error = palisade::commands::delete_finding(&system.pool, &change(old.id, 1, "gone"))
        .await
        .unwrap_err();
    assert!(
        error.to_string().starts_with("revision_conflict"),
        "{error}"
    );
    palisade::commands::delete_finding(&system.pool, &change(old.id, 2, "the proxy is gone"))
        .await
        .unwrap();
    assert!(findings(&system, first_scan).await.is_empty());
    let history: Vec<(String, i32)> = sqlx::query_as(
        "SELECT action, revision FROM finding_history WHERE finding_id = $1 ORDER BY id",
    )
    .bind(old.id)
    .fetch_all(&system.pool)
    .await
    .unwrap();
    assert_eq!(history, [("set".to_owned(), 2), ("delete".to_owned(), 2)]);
    let gate = summary(&system, first_scan).await;
    assert_eq!(gate.collection_revision, 2);
    assert!(gate.by_status.is_empty());
    system.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reads_and_decides_its_organizations_findings_over_the_bus() {
    use v1::findings_reply::Answer;
    use v1::findings_request::Query;
    let system = TestSystem::spawn().await;
    let (scan, scan_id) = completed_scan(&system, 3).await;
    let client = system.client();
    let organization = scan.organization_id;
    let ask = |organization: Uuid, query: Query| {
        let client = client.clone();
        async move {
            client
                .findings(&organization, query)
                .await
                .expect("an answer")
        }
    };
    let list = Query::List(v1::ListFindings {
        scan_id: scan_id.to_string(),
        limit: 2,
        ..Default::default()
    });
    let Some(Answer::Page(page)) = ask(organization, list.clone()).await.answer else {
        panic!("a page")
    };
    assert_eq!((page.findings.len(), page.collection_revision), (2, 0));
    assert!(!page.next_after.is_empty());
    let first = page.findings[0].clone();
    assert_eq!((first.status.as_str(), first.revision), ("open", 1));

    let set = |revision: u32| {
        Query::Set(v1::SetDisposition {
            finding_id: first.id.clone(),
            status: "accepted_risk".into(),
            expected_revision: revision,
            expected_collection_revision: Some(0),
            reason: "compensating control in front".into(),
            actor: "alice".into(),
        })
    };
    let Some(Answer::Set(done)) = ask(organization, set(1)).await.answer else {
        panic!("set")
    };
    assert_eq!((done.revision, done.collection_revision), (2, 1));
    let stale = ask(organization, set(1)).await;
    assert_eq!(
        stale.error.map(|error| error.code),
        Some("revision_conflict".to_owned())
    );

    let show = Query::Show(v1::ShowFinding {
        finding_id: first.id.clone(),
    });
    let Some(Answer::Finding(detail)) = ask(organization, show.clone()).await.answer else {
        panic!("a finding")
    };
    assert_eq!(detail.history.len(), 1);
    assert_eq!(
        detail.history[0].actor,
        format!("{}:alice", tests::TEST_CLIENT_ID)
    );
    assert_eq!(detail.finding.unwrap().status, "accepted_risk");

    let gate = Query::Gate(v1::ScanGate {
        scan_id: scan_id.to_string(),
        threshold: "low".into(),
    });
    let Some(Answer::Gate(result)) = ask(organization, gate.clone()).await.answer else {
        panic!("a gate")
    };
    assert_eq!(
        (
            result.blocking,
            result.gate_exempt,
            result.passed,
            result.complete
        ),
        (2, 1, false, true)
    );

    // Another organization's subject: every query answers not_found.
    let other = system.organization().await;
    for query in [list, show, set(2), gate] {
        let reply = ask(other, query).await;
        assert_eq!(
            reply.error.map(|error| error.code),
            Some("not_found".to_owned())
        );
    }
    system.finish().await;
}
