//! `admit::Admit`: a mixed batch decided alike set-wise, one by one and by `decide_batch`; a
//! request the schema refuses refused alone by the fallback.

use store::StoreError;
use store::admit::{Admit, AdmitOutcome, AdmitParams};

use crate::support::{Database, Form, Names, Request, commit, difference, rehearse};

/// Each outcome as a line, scans named by `names`.
fn answers(names: &Names, outcomes: &[Result<AdmitOutcome, StoreError>]) -> Vec<String> {
    let mut names = names.clone();
    outcomes
        .iter()
        .map(|outcome| match outcome {
            Ok(AdmitOutcome::Admitted { scan_id, .. }) => {
                format!("admitted {}", names.name(*scan_id))
            }
            Ok(AdmitOutcome::Duplicate { scan_id, state }) => {
                format!("duplicate of {} ({state})", names.name(*scan_id))
            }
            Ok(AdmitOutcome::Refused(error)) if !error.active_scan_id.is_empty() => {
                let active = error.active_scan_id.parse().expect("a scan id");
                format!("{} naming {}", error.code, names.name(active))
            }
            Ok(AdmitOutcome::Refused(error)) => error.code.clone(),
            Err(_) => "error".into(),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_batch_is_decided_alike_in_either_form_and_by_decide_batch() {
    let database = Database::create().await;
    let organization = database.organization(None).await;
    let quota_organization = database.organization(Some(2)).await;
    let earlier = Request::new(organization, "http://earlier.test", &["alpha"]);
    let earlier_quota = Request::new(quota_organization, "http://q0.test", &["alpha"]);
    let admitted = database
        .admitted(&[earlier.clone(), earlier_quota.clone()])
        .await;
    let mut names = Names::default();
    names.know(admitted[0].0, "earlier");
    names.know(admitted[1].0, "earlier-quota");

    let new = Request::new(organization, "http://n1.test", &["alpha"]);
    let second_new = Request::new(organization, "http://n2.test", &["alpha", "beta"]);
    let batch = [
        // Admitted.
        new.clone(),
        // A replay of an earlier scan.
        earlier.clone(),
        // The same key for another request.
        earlier.clone().with_priority(7),
        // Admitted.
        second_new.clone(),
        // Its target is taken by the one before.
        Request::new(organization, "http://n2.test", &["beta"]),
        // Its target is busy with an earlier scan.
        Request::new(organization, "http://earlier.test", &["beta"]),
        // No such organization.
        Request::new(uuid::Uuid::now_v7(), "http://n1.test", &["alpha"]),
        // The quota's last admission, and one over it.
        Request::new(quota_organization, "http://q1.test", &["alpha"]),
        Request::new(quota_organization, "http://q2.test", &["alpha"]),
        // A replay of the batch's first.
        new,
        // The key of the batch's fourth for another request.
        second_new.with_target("http://n3.test"),
        // A replay, with the quota spent.
        earlier_quota,
    ];
    let expected = [
        "admitted new#0",
        "duplicate of earlier (pending)",
        "idempotency_conflict",
        "admitted new#1",
        "scan_already_active naming new#1",
        "scan_already_active naming earlier",
        "unknown_organization",
        "admitted new#2",
        "quota_exceeded",
        "duplicate of new#0 (pending)",
        "idempotency_conflict",
        "duplicate of earlier-quota (pending)",
    ];
    let params: Vec<AdmitParams<'_>> = batch.iter().map(Request::params).collect();
    let script = Admit {
        subjects: &database.subjects,
        requests: &params,
    };
    let before = database.tally().await;

    let set_wise = rehearse(&database, &script, Form::SetWise)
        .await
        .expect("decided set-wise");
    assert_eq!(answers(&names, &set_wise.outcomes), expected);
    // Exactly what the three admissions write: their targets, scans, first jobs and tasks,
    // and a `scan.admitted` and a `task.ready` each.
    let written = difference(&before, &set_wise.tally);
    for (what, rows) in [
        ("targets", 3),
        ("scans pending", 3),
        ("scan_jobs pending", 3),
        ("worker_tasks pending", 3),
    ] {
        assert_eq!(written.get(what), Some(&rows), "{what}: {written:?}");
    }
    assert_eq!(set_wise.events, 6);

    let one_by_one = rehearse(&database, &script, Form::OneByOne)
        .await
        .expect("decided one by one");
    assert_eq!(answers(&names, &one_by_one.outcomes), expected);
    assert_eq!(one_by_one.tally, set_wise.tally, "the same rows written");
    assert_eq!(one_by_one.events, set_wise.events);

    let committed = commit(&database, &script).await;
    assert_eq!(answers(&names, &committed.outcomes), expected);
    assert_eq!(committed.tally, set_wise.tally);
    assert_eq!(committed.events, set_wise.events);
    database.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_schema_refuses_is_refused_alone_and_its_neighbours_admitted() {
    let database = Database::create().await;
    let organization = database.organization(None).await;
    // Past the schema's limit on a client id: admission's validation refuses it on the wire;
    // here it reaches the store.
    let long_client = "c".repeat(129);
    let bad = Request::new(organization, "http://bad.test", &["alpha"])
        .by_client(&long_client, "bad-key");
    let batch = [
        Request::new(organization, "http://good.test", &["alpha"]),
        bad,
        Request::new(organization, "http://also-good.test", &["alpha"]),
    ];
    let params: Vec<AdmitParams<'_>> = batch.iter().map(Request::params).collect();
    let script = Admit {
        subjects: &database.subjects,
        requests: &params,
    };
    let before = database.tally().await;

    let error = rehearse(&database, &script, Form::SetWise)
        .await
        .expect_err("the set-wise scan statement is refused");
    assert!(!error.is_transient(), "{error}");
    let one_by_one = rehearse(&database, &script, Form::OneByOne)
        .await
        .expect("decided one by one");
    let expected = ["admitted new#0", "error", "admitted new#1"];
    assert_eq!(answers(&Names::default(), &one_by_one.outcomes), expected);

    // decide_batch falls back to the one-by-one form by itself.
    let committed = commit(&database, &script).await;
    assert_eq!(answers(&Names::default(), &committed.outcomes), expected);
    assert_eq!(committed.tally, one_by_one.tally);
    assert_eq!(
        committed.events, 4,
        "two admissions' events, none of the refused"
    );
    let written = difference(&before, &committed.tally);
    assert_eq!(written.get("scans pending"), Some(&2), "{written:?}");
    assert_eq!(written.get("targets"), Some(&2), "{written:?}");
    database.drop().await;
}
