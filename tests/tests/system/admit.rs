//! The admission decision script (`store::admit`) driven directly against PostgreSQL: what a
//! batch costs in statements whatever its size, and each request of a mixed batch getting the
//! answer it would get decided alone, in order; and request/reply submissions decided in
//! batches as the durable path's are.

use admission::request::{ValidScanRequest, validate};
use messages::v1;
use store::admit::{self, AdmitOutcome, AdmitParams};
use telemetry::cost::{self, lanes};
use tests::TestSystem;
use uuid::Uuid;

/// Validated requests, owning what the store's params borrow.
pub(crate) struct Requests(Vec<ValidScanRequest>);

impl Requests {
    pub(crate) fn new(requests: &[v1::ScanRequest]) -> Self {
        Self(
            requests
                .iter()
                .map(|request| validate(request).expect("a valid request"))
                .collect(),
        )
    }

    pub(crate) fn params(&self) -> Vec<AdmitParams<'_>> {
        self.0
            .iter()
            .map(|request| request.params(3, None))
            .collect()
    }
}

/// Decides `requests` set-wise in one transaction in the admission lane; returns the outcomes
/// and the statements it took (BEGIN and COMMIT included).
async fn decide(system: &TestSystem, requests: &Requests) -> (Vec<AdmitOutcome>, u64) {
    let params = requests.params();
    let before = cost::snapshot();
    let outcomes = cost::in_lane(lanes::ADMISSION, async {
        let mut tx = system.pool.begin().await.expect("begin");
        let outcomes = admit::decide(
            &mut tx,
            &mut store::Staged::default(),
            &system.subjects,
            &params,
        )
        .await
        .expect("the batch is decided");
        tx.commit().await.expect("commit");
        outcomes
    })
    .await;
    let spent = cost::spent(&before, &cost::snapshot());
    (outcomes, spent[lanes::ADMISSION].statements)
}

/// The same, one request per savepoint: what each request gets decided alone, in order.
async fn decide_each(system: &TestSystem, requests: &Requests) -> Vec<AdmitOutcome> {
    let params = requests.params();
    let mut tx = system.pool.begin().await.expect("begin");
    let outcomes = admit::decide_each(
        &mut tx,
        &mut store::Staged::default(),
        &system.subjects,
        &params,
    )
    .await
    .expect("the batch is decided");
    tx.commit().await.expect("commit");
    outcomes
        .into_iter()
        .map(|outcome| outcome.expect("no request fails"))
        .collect()
}

async fn organization_with_quota(system: &TestSystem, quota: i32) -> Uuid {
    let id = Uuid::now_v7();
    store::admin::create_organization(&system.pool, id, "quota", Some(quota))
        .await
        .expect("organization created");
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_per_admission_batch_do_not_grow_with_the_batch() {
    let system = TestSystem::spawn().await;
    let mut counts = Vec::new();
    for size in [10, 100] {
        // Half in an organization without a quota, half in one with a quota to count.
        let free = system.organization().await;
        let counted = organization_with_quota(&system, 1_000).await;
        let wire: Vec<v1::ScanRequest> = (0..size)
            .map(|index| {
                let organization = if index % 2 == 0 { free } else { counted };
                system.request(
                    organization,
                    &format!("http://target-{index}.test"),
                    &["alpha", "beta"],
                )
            })
            .collect();
        let requests = Requests::new(&wire);
        let (outcomes, admitted) = decide(&system, &requests).await;
        assert!(
            outcomes
                .iter()
                .all(|outcome| matches!(outcome, AdmitOutcome::Admitted { .. })),
            "{outcomes:?}"
        );

        // The same batch again: every request a replay.
        let (outcomes, replayed) = decide(&system, &requests).await;
        assert!(
            outcomes
                .iter()
                .all(|outcome| matches!(outcome, AdmitOutcome::Duplicate { .. })),
            "{outcomes:?}"
        );

        // New keys for the same (now busy) targets: every request refused.
        let wire: Vec<v1::ScanRequest> = wire
            .iter()
            .map(|request| {
                let mut request = request.clone();
                request.idempotency_key = Uuid::new_v4().to_string();
                request
            })
            .collect();
        let (outcomes, refused) = decide(&system, &Requests::new(&wire)).await;
        assert!(
            outcomes
                .iter()
                .all(|outcome| matches!(outcome, AdmitOutcome::Refused(_))),
            "{outcomes:?}"
        );
        counts.push((size, admitted, replayed, refused));
    }
    println!("(batch size, statements to admit, to replay, to refuse): {counts:?}");
    let (_, admitted_10, replayed_10, refused_10) = counts[0];
    let (_, admitted_100, replayed_100, refused_100) = counts[1];
    assert_eq!(
        (admitted_10, replayed_10, refused_10),
        (admitted_100, replayed_100, refused_100),
        "statements per admission batch grew with the batch: {counts:?}"
    );
    // BEGIN, locks, organizations, look-up, targets and scans, jobs and tasks, outbox, COMMIT.
    assert!(admitted_100 <= 8, "admitted: {admitted_100} statements");
    // BEGIN, locks, organizations, look-up, COMMIT.
    assert!(replayed_100 <= 5, "replayed: {replayed_100} statements");
    assert!(refused_100 <= 5, "refused: {refused_100} statements");

    let counts = system.table_counts().await;
    assert_eq!(counts["scans"], 110);
    assert_eq!(counts["worker_tasks"], 110);
    assert_eq!(counts["events_written"], 220);
    system.finish().await;
}

/// A mixed batch in its own organizations: returns the batch, after writing what it replays.
async fn mixed_batch(system: &TestSystem) -> (Requests, Vec<AdmitOutcome>) {
    let org = system.organization().await;
    let quota_org = organization_with_quota(system, 2).await;
    let earlier = system.request(org, "http://earlier.test", &["alpha"]);
    let earlier_quota = system.request(quota_org, "http://q0.test", &["alpha"]);
    let (outcomes, _) = decide(
        system,
        &Requests::new(&[earlier.clone(), earlier_quota.clone()]),
    )
    .await;
    assert!(
        outcomes
            .iter()
            .all(|outcome| matches!(outcome, AdmitOutcome::Admitted { .. })),
        "{outcomes:?}"
    );

    let new = system.request(org, "http://n1.test", &["alpha"]);
    let mut conflicting = earlier.clone();
    conflicting.priority = 7;
    let second_new = system.request(org, "http://n2.test", &["alpha", "beta"]);
    let same_target = system.request(org, "http://n2.test", &["beta"]);
    let busy_target = system.request(org, "http://earlier.test", &["beta"]);
    let unknown = system.request(Uuid::now_v7(), "http://n1.test", &["alpha"]);
    let under_quota = system.request(quota_org, "http://q1.test", &["alpha"]);
    let over_quota = system.request(quota_org, "http://q2.test", &["alpha"]);
    let mut in_batch_conflict = second_new.clone();
    in_batch_conflict.target = "http://n3.test".into();
    let batch = Requests::new(&[
        new.clone(),       // 0 admitted
        earlier,           // 1 duplicate of the earlier scan
        conflicting,       // 2 idempotency_conflict (same key, another priority)
        second_new,        // 3 admitted
        same_target,       // 4 scan_already_active, naming 3
        busy_target,       // 5 scan_already_active, naming the earlier scan
        unknown,           // 6 unknown_organization
        under_quota,       // 7 admitted: one of two used
        over_quota,        // 8 quota_exceeded: 7 took the last one
        new,               // 9 duplicate of 0
        in_batch_conflict, // 10 idempotency_conflict with 3
        earlier_quota,     // 11 duplicate, even with the quota spent
    ]);
    (batch, outcomes)
}

fn answer(outcome: &AdmitOutcome, scans: &[Uuid]) -> String {
    let name = |scan_id: &Uuid| match scans.iter().position(|id| id == scan_id) {
        Some(position) => format!("#{position}"),
        None => format!("{scan_id}"),
    };
    match outcome {
        AdmitOutcome::Admitted { scan_id, .. } => format!("admitted {}", name(scan_id)),
        AdmitOutcome::Duplicate { scan_id, state } => {
            format!("duplicate of {} ({state})", name(scan_id))
        }
        AdmitOutcome::Refused(error) if !error.active_scan_id.is_empty() => {
            let active: Uuid = error.active_scan_id.parse().expect("a scan id");
            format!("{} naming {}", error.code, name(&active))
        }
        AdmitOutcome::Refused(error) => error.code.clone(),
    }
}

/// The answers, naming scans by their position in `scans` (the earlier ones, then the batch's).
fn answers(earlier: &[AdmitOutcome], outcomes: &[AdmitOutcome]) -> Vec<String> {
    let scans: Vec<Uuid> = earlier
        .iter()
        .chain(outcomes)
        .map(|outcome| match outcome {
            AdmitOutcome::Admitted { scan_id, .. } => *scan_id,
            _ => Uuid::nil(),
        })
        .collect();
    outcomes
        .iter()
        .map(|outcome| answer(outcome, &scans))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_admission_batch_gives_each_request_its_own_answer() {
    let system = TestSystem::spawn().await;
    let (batch, earlier) = mixed_batch(&system).await;
    let before = system.table_counts().await;
    let (outcomes, _) = decide(&system, &batch).await;
    // Scans are named by position: #0 and #1 were admitted earlier, #2.. are the batch's.
    let expected = [
        "admitted #2",
        "duplicate of #0 (pending)",
        "idempotency_conflict",
        "admitted #5",
        "scan_already_active naming #5",
        "scan_already_active naming #0",
        "unknown_organization",
        "admitted #9",
        "quota_exceeded",
        "duplicate of #2 (pending)",
        "idempotency_conflict",
        "duplicate of #1 (pending)",
    ];
    assert_eq!(answers(&earlier, &outcomes), expected);
    let AdmitOutcome::Refused(conflict) = &outcomes[10] else {
        unreachable!()
    };
    let AdmitOutcome::Admitted { scan_id, .. } = &outcomes[3] else {
        unreachable!()
    };
    assert!(
        conflict.message.contains(&scan_id.to_string()),
        "{conflict:?}"
    );

    // Exactly what the three admissions write: no target of a refused request.
    let after = system.table_counts().await;
    for (table, written) in [
        ("scans", 3),
        ("targets", 3),
        ("scan_jobs", 3),
        ("worker_tasks", 3),
        ("events_written", 6),
    ] {
        assert_eq!(after[table] - before[table], written, "{table}");
    }

    // Each request got what it gets decided alone, after the requests before it.
    let (batch, earlier) = mixed_batch(&system).await;
    let one_by_one = decide_each(&system, &batch).await;
    assert_eq!(answers(&earlier, &one_by_one), expected);
    system.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admission_request_the_schema_refuses_fails_alone_when_decided_one_by_one() {
    let system = TestSystem::spawn().await;
    let org = system.organization().await;
    let good = system.request(org, "http://good.test", &["alpha"]);
    let bad = system.request(org, "http://bad.test", &["alpha"]);
    let also_good = system.request(org, "http://also-good.test", &["alpha"]);
    let batch = Requests::new(&[good, bad, also_good]);
    let mut params = batch.params();
    // Past the schema's limit: validation refuses it on the wire; here it reaches the store.
    let long_client = "c".repeat(129);
    params[1].client_id = &long_client;

    let mut tx = system.pool.begin().await.expect("begin");
    let error = admit::decide(
        &mut tx,
        &mut store::Staged::default(),
        &system.subjects,
        &params,
    )
    .await
    .expect_err("the set-wise scan statement is refused");
    assert!(!error.is_transient(), "{error}");
    tx.rollback().await.expect("rollback");

    let mut tx = system.pool.begin().await.expect("begin");
    let outcomes = admit::decide_each(
        &mut tx,
        &mut store::Staged::default(),
        &system.subjects,
        &params,
    )
    .await
    .expect("decided one by one");
    tx.commit().await.expect("commit");
    assert!(
        matches!(outcomes[0], Ok(AdmitOutcome::Admitted { .. })),
        "{outcomes:?}"
    );
    assert!(outcomes[1].is_err(), "{:?}", outcomes[1]);
    assert!(
        matches!(outcomes[2], Ok(AdmitOutcome::Admitted { .. })),
        "{outcomes:?}"
    );
    let counts = system.table_counts().await;
    assert_eq!(counts["scans"], 2);
    assert_eq!(counts["targets"], 2);
    system.finish().await;
}

/// Request/reply submissions that arrive together are decided together (issue 24): a burst
/// costs a few admission transactions, not one per request, and each request still gets its
/// own answer, a repeated one the first one's scan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_submissions_are_decided_in_shared_transactions() {
    const SUBMISSIONS: usize = 60;
    let system = tests::TestSystem::spawn().await;
    let org = system.organization().await;
    let client = system.client();
    let mut requests: Vec<v1::ScanRequest> = (0..SUBMISSIONS)
        .map(|index| system.request(org, &format!("http://together-{index}.test"), &["alpha"]))
        .collect();
    requests.push(requests[0].clone());

    let before = cost::snapshot();
    let replies =
        futures::future::join_all(requests.iter().map(|request| client.submit(request))).await;
    let spent = cost::spent(&before, &cost::snapshot());

    let replies: Vec<v1::ScanRequestReply> = replies
        .into_iter()
        .map(|reply| reply.expect("admission answers"))
        .collect();
    for reply in &replies {
        assert!(reply.error.is_none(), "{reply:?}");
    }
    let scans: std::collections::HashSet<&str> =
        replies.iter().map(|reply| reply.scan_id.as_str()).collect();
    assert_eq!(scans.len(), SUBMISSIONS, "one scan per distinct request");
    let (first, repeated) = (&replies[0], &replies[SUBMISSIONS]);
    assert_eq!(
        first.scan_id, repeated.scan_id,
        "the repeat names the first's scan"
    );
    assert_eq!(
        [first.deduplicated, repeated.deduplicated]
            .iter()
            .filter(|deduplicated| **deduplicated)
            .count(),
        1,
        "one of the two admitted it: {first:?} {repeated:?}"
    );
    assert_eq!(system.table_counts().await["scans"], SUBMISSIONS as i64);
    // Decided one per transaction, the burst costs 61 commits; the deciders take what queued
    // while they were busy, so a few transactions take it all.
    let commits = spent[lanes::ADMISSION].commits;
    assert!(
        commits <= (SUBMISSIONS / 4) as u64,
        "{commits} admission commits for {} submissions ({spent:?})",
        SUBMISSIONS + 1
    );
    system.finish().await;
}

/// Submissions of two organizations decided in shared transactions still get each its own
/// organization's answer: a request of another organization under the same idempotency key is
/// a scan of its own, not a replay of the first organization's, and one organization's refused
/// requests refuse nothing of the other's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submissions_of_two_organizations_decided_together_stay_apart() {
    const EACH: usize = 20;
    let system = tests::TestSystem::spawn().await;
    let (first_org, second_org) = (system.organization().await, system.organization().await);
    let client = system.client();
    let first: Vec<v1::ScanRequest> = (0..EACH)
        .map(|index| system.request(first_org, &format!("http://first-{index}.test"), &["alpha"]))
        .collect();
    let second: Vec<v1::ScanRequest> = (0..EACH)
        .map(|index| {
            let mut request = system.request(
                second_org,
                &format!("http://second-{index}.test"),
                &["alpha"],
            );
            if index % 4 == 1 {
                request.priority = 5_000;
            }
            if index == 0 {
                // The first organization's key, for a request of its own.
                request.idempotency_key = first[0].idempotency_key.clone();
            }
            request
        })
        .collect();

    let all: Vec<&v1::ScanRequest> = first
        .iter()
        .zip(&second)
        .flat_map(|(a, b)| [a, b])
        .collect();
    let replies: Vec<v1::ScanRequestReply> =
        futures::future::join_all(all.iter().map(|request| client.submit(request)))
            .await
            .into_iter()
            .map(|reply| reply.expect("admission answers"))
            .collect();

    for (request, reply) in all.iter().zip(&replies) {
        let refused = request.priority == 5_000;
        assert_eq!(
            reply.error.as_ref().and_then(|error| error.error_code()),
            refused.then_some(messages::ErrorCode::InvalidField),
            "{request:?} -> {reply:?}"
        );
        if !refused {
            assert!(!reply.deduplicated, "{reply:?}");
            let scan_id: Uuid = reply.scan_id.parse().expect("a scan id");
            let organization: Uuid =
                sqlx::query_scalar("SELECT organization_id FROM scans WHERE id = $1")
                    .bind(scan_id)
                    .fetch_one(&system.pool)
                    .await
                    .expect("the scan");
            assert_eq!(organization.to_string(), request.organization_id);
        }
    }
    assert_ne!(
        replies[0].scan_id, replies[1].scan_id,
        "one key, two organizations, two scans"
    );
    let refused = second
        .iter()
        .filter(|request| request.priority == 5_000)
        .count();
    assert_eq!(
        system.table_counts().await["scans"],
        (2 * EACH - refused) as i64
    );
    system.finish().await;
}
