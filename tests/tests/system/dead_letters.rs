//! `palisade dead-letter` (issue 27, item 3): a scan request admission refuses on every
//! delivery for its own reasons (a row the database refuses; here a constraint the test adds)
//! is recorded dead; once the cause is fixed, replaying it admits exactly one scan, however
//! often it is replayed or published again; a worker's dead message is not replayable and is
//! discarded; each resolution records who and why, once.

use messages::{WorkerVerb, v1};
use prost::Message as _;
use tests::{TestSystem, findings_payload};
use uuid::Uuid;

const MAX_DELIVER: i64 = 2;

async fn dead_letter_of(system: &TestSystem, consumer: &str) -> Uuid {
    system
        .wait_for(&format!("a dead letter of {consumer}"), || async {
            sqlx::query_scalar("SELECT id FROM dead_letters WHERE consumer = $1")
                .bind(consumer)
                .fetch_optional(&system.pool)
                .await
                .expect("read")
        })
        .await
}

/// The open dead letters, newest first.
async fn open_letters(system: &TestSystem) -> Vec<palisade::dead_letters::Listed> {
    palisade::dead_letters::list(
        &system.pool,
        &store::dead_letters::ListFilter {
            limit: 10,
            ..Default::default()
        },
    )
    .await
    .unwrap()
}

async fn scans_of(system: &TestSystem, idempotency_key: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM scans WHERE idempotency_key = $1")
        .bind(idempotency_key)
        .fetch_one(&system.pool)
        .await
        .expect("count")
}

#[tokio::test]
async fn a_replayed_dead_request_admits_exactly_once_and_a_dead_worker_message_is_discarded() {
    let system = TestSystem::spawn_with(|settings| {
        settings.admission.consumer.max_deliver = MAX_DELIVER;
        settings.ingestion.consumer.max_deliver = MAX_DELIVER;
    })
    .await;
    const TARGET: &str = "http://refused.test";
    let organization_id = system.organization().await;
    let mut request = system.request(organization_id, TARGET, &["alpha"]);
    request.idempotency_key = "refused-by-the-test".into();
    sqlx::query(
        "ALTER TABLE scans ADD CONSTRAINT test_refuses \
         CHECK (idempotency_key <> 'refused-by-the-test')",
    )
    .execute(&system.pool)
    .await
    .expect("constraint added");
    system
        .publish_request_bytes(organization_id, request.encode_to_vec())
        .await;
    let id = dead_letter_of(&system, admission::CONSUMER_NAME).await;

    // Read as an operator reads it.
    let shown = palisade::dead_letters::show(&system.pool, id)
        .await
        .unwrap();
    assert_eq!(shown["delivered"], MAX_DELIVER);
    assert_eq!(shown["payload"]["target"], TARGET);
    assert_eq!(shown["payload"]["idempotency_key"], request.idempotency_key);
    assert!(shown["resolution"].is_null());
    let open = open_letters(&system).await;
    assert_eq!(open.len(), 1);

    // A replay needs a reason, and the cause fixed first.
    let error = palisade::dead_letters::replay(&system.pool, &system.bus, id, "ops", " ")
        .await
        .unwrap_err();
    assert!(error.to_string().starts_with("reason_required"), "{error}");
    sqlx::query("ALTER TABLE scans DROP CONSTRAINT test_refuses")
        .execute(&system.pool)
        .await
        .expect("constraint dropped");
    let replayed =
        palisade::dead_letters::replay(&system.pool, &system.bus, id, "ops", "constraint fixed")
            .await
            .unwrap();
    assert_eq!(replayed["resolution"], "replayed");
    system
        .wait_for("the replayed request admitted", || async {
            (scans_of(&system, &request.idempotency_key).await == 1).then_some(())
        })
        .await;

    // Replayed again: refused, nothing published. Published again anyway (an operator's
    // second copy, a crash between the publish and the record): the same scan.
    let error = palisade::dead_letters::replay(&system.pool, &system.bus, id, "ops", "again")
        .await
        .unwrap_err();
    assert!(error.to_string().starts_with("already_resolved"), "{error}");
    assert!(error.to_string().contains("\"ops\""), "{error}");
    system
        .publish_request_bytes(organization_id, request.encode_to_vec())
        .await;
    tests::wait_consumer_idle(
        &system,
        &system.subjects.requests_stream(),
        admission::CONSUMER_NAME,
    )
    .await;
    assert_eq!(
        scans_of(&system, &request.idempotency_key).await,
        1,
        "admitted exactly once"
    );
    let (resolution, by, note): (String, String, String) = sqlx::query_as(
        "SELECT resolution, resolved_by, resolution_note FROM dead_letters WHERE id = $1",
    )
    .bind(id)
    .fetch_one(&system.pool)
    .await
    .unwrap();
    assert_eq!(
        (resolution.as_str(), by.as_str(), note.as_str()),
        ("replayed", "ops", "constraint fixed")
    );

    // A worker's message that died: not replayable (its lease has ended), discarded.
    sqlx::query("ALTER TABLE findings ADD CONSTRAINT test_refuses CHECK (title <> 'refused')")
        .execute(&system.pool)
        .await
        .expect("constraint added");
    let scan = system.leased_scan(&["alpha"]).await;
    let mut payload = findings_payload(1);
    payload.findings[0].title = "refused".into();
    let batch: v1::ResultBatch = scan.worker.batch(&scan.lease, 0, &payload);
    scan.worker
        .publish_raw(WorkerVerb::Result, batch.encode_to_vec())
        .await;
    let dead = dead_letter_of(&system, ingestion::CONSUMER_NAME).await;
    let error = palisade::dead_letters::replay(&system.pool, &system.bus, dead, "ops", "try")
        .await
        .unwrap_err();
    assert!(error.to_string().starts_with("not_replayable"), "{error}");
    let discarded = palisade::dead_letters::discard(&system.pool, dead, "ops", "task retried")
        .await
        .unwrap();
    assert_eq!(discarded["resolution"], "discarded");
    let open = open_letters(&system).await;
    assert!(open.is_empty(), "both resolved: {open:?}");
    let all = palisade::dead_letters::list(
        &system.pool,
        &store::dead_letters::ListFilter {
            all: true,
            limit: 10,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].letter.id, dead, "newest first");
    system.finish().await;
}
