//! Ingestion: I2 (batch idempotency), I1 (fencing), out-of-order batches, advancing through a
//! profile, evidence published once.

use messages::{ErrorCode, v1};
use tests::{TestSystem, findings_payload};

#[tokio::test]
async fn replayed_batch_gets_the_same_ack_and_writes_nothing() {
    let system = TestSystem::spawn().await;
    let scan = system.leased_scan(&["alpha"]).await;
    let batch = scan.worker.batch(&scan.lease, 0, &findings_payload(3));
    let first = scan.worker.send_batch(&batch).await;
    assert!(first.error.is_none() && !first.duplicate, "{first:?}");
    let before = system.table_counts().await;
    assert_eq!(before["findings"], 3);

    let replay = scan.worker.send_batch(&batch).await;
    assert!(replay.error.is_none(), "{replay:?}");
    assert!(replay.duplicate);
    assert_eq!(
        (replay.kind.as_str(), &replay.idempotency_key),
        ("result", &batch.idempotency_key)
    );
    assert_eq!(system.table_counts().await, before);
    system.finish().await;
}

#[tokio::test]
async fn same_batch_key_with_another_checksum_is_a_batch_conflict() {
    let system = TestSystem::spawn().await;
    let scan = system.leased_scan(&["alpha"]).await;
    let batch = scan.worker.batch(&scan.lease, 0, &findings_payload(3));
    assert!(scan.worker.send_batch(&batch).await.error.is_none());
    let before = system.table_counts().await;

    let mut other = scan.worker.batch(&scan.lease, 0, &findings_payload(5));
    other.idempotency_key = batch.idempotency_key.clone();
    let ack = scan.worker.send_batch(&other).await;
    assert_eq!(
        ack.error.expect("refused").error_code(),
        Some(ErrorCode::BatchConflict)
    );
    assert_eq!(system.table_counts().await, before);
    system.finish().await;
}

#[tokio::test]
async fn payload_not_matching_its_checksum_is_refused() {
    let system = TestSystem::spawn().await;
    let scan = system.leased_scan(&["alpha"]).await;
    let before = system.table_counts().await;
    let mut batch = scan.worker.batch(&scan.lease, 0, &findings_payload(3));
    batch.payload_sha256 = messages::sha256_hex(b"something else");
    let ack = scan.worker.send_batch(&batch).await;
    assert_eq!(
        ack.error.expect("refused").error_code(),
        Some(ErrorCode::ChecksumMismatch)
    );
    assert_eq!(system.table_counts().await, before);
    system.finish().await;
}

#[tokio::test]
async fn superseded_attempt_cannot_write_batch_completion_or_failure() {
    let system = TestSystem::spawn().await;
    let scan = system.leased_scan(&["alpha"]).await;
    let stale = scan.lease.clone();
    system.expire_and_recover(&stale).await;

    let successor = system.manual_worker(scan.organization_id, 8).await;
    assert!(successor.hello(&["alpha"]).await.error.is_none());
    let current = successor.acquire_one().await;
    let stale_ref = stale.lease.clone().unwrap();
    let current_ref = current.lease.clone().unwrap();
    assert_eq!(current_ref.task_id, stale_ref.task_id);
    assert!(
        current_ref.attempt_number > stale_ref.attempt_number,
        "fencing numbers strictly increase"
    );

    let before = system.table_counts().await;
    let batch = scan.worker.batch(&stale, 0, &findings_payload(2));
    let ack = scan.worker.send_batch(&batch).await;
    assert_eq!(
        ack.error.expect("refused").error_code(),
        Some(ErrorCode::LeaseLost)
    );
    let ack = scan.worker.complete(&stale, 0).await;
    assert_eq!(
        ack.error.expect("refused").error_code(),
        Some(ErrorCode::LeaseLost)
    );
    let ack = scan.worker.fail(&stale, "boom", false).await;
    assert_eq!(
        ack.error.expect("refused").error_code(),
        Some(ErrorCode::LeaseLost)
    );
    let renew = scan.worker.renew(&stale).await;
    assert_eq!(
        renew.error.expect("refused").error_code(),
        Some(ErrorCode::LeaseLost)
    );
    assert_eq!(
        system.table_counts().await,
        before,
        "a superseded attempt changed nothing"
    );

    // A forged token on the current attempt is refused the same way.
    let mut forged = current.clone();
    forged.lease.as_mut().unwrap().lease_token = "forged".into();
    let ack = successor
        .send_batch(&successor.batch(&forged, 0, &findings_payload(1)))
        .await;
    assert_eq!(
        ack.error.expect("refused").error_code(),
        Some(ErrorCode::LeaseLost)
    );
    assert_eq!(system.table_counts().await, before);

    // The current attempt still works.
    assert!(
        successor
            .send_batch(&successor.batch(&current, 0, &findings_payload(1)))
            .await
            .error
            .is_none()
    );
    assert!(successor.complete(&current, 1).await.error.is_none());
    system.wait_scan_state(&scan.scan_id, "completed").await;
    system.finish().await;
}

/// Issue 26, item 3: a batch key is its attempt's. A later attempt that sends a batch under a
/// key an earlier attempt used, with the same content, has it stored for itself and completes;
/// today's code answered it `duplicate` without storing it, and refused its completion
/// `batch_missing` for good.
#[tokio::test]
async fn a_later_attempt_may_use_an_earlier_attempts_batch_key_again() {
    let system = TestSystem::spawn().await;
    let scan = system.leased_scan(&["alpha"]).await;
    let payload = findings_payload(2);
    let mut first = scan.worker.batch(&scan.lease, 0, &payload);
    first.idempotency_key = "results-0".into();
    let ack = scan.worker.send_batch(&first).await;
    assert!(ack.error.is_none() && !ack.duplicate, "{ack:?}");
    system.expire_and_recover(&scan.lease).await;

    let successor = system.manual_worker(scan.organization_id, 8).await;
    assert!(successor.hello(&["alpha"]).await.error.is_none());
    let current = successor.acquire_one().await;
    let mut again = successor.batch(&current, 0, &payload);
    again.idempotency_key = "results-0".into();
    let ack = successor.send_batch(&again).await;
    assert!(ack.error.is_none(), "{ack:?}");
    assert!(!ack.duplicate, "stored for the new attempt: {ack:?}");
    let ack = successor.send_batch(&again).await;
    assert!(
        ack.error.is_none() && ack.duplicate,
        "its own replay: {ack:?}"
    );
    let ack = successor.complete(&current, 1).await;
    assert!(ack.error.is_none(), "{ack:?}");
    system.wait_scan_state(&scan.scan_id, "completed").await;
    system.finish().await;
}

/// Issue 26, item 3: a replay is answered after the fence. The attempt that stored a batch
/// gets `duplicate` for it even once superseded (its batch is in); anyone else presenting the
/// attempt's id and key without its token gets `lease_lost` and learns nothing of the batch.
/// Today's code answered every sender from the batch record alone.
#[tokio::test]
async fn a_replay_is_answered_only_to_the_claim_that_stored_it() {
    let system = TestSystem::spawn().await;
    let scan = system.leased_scan(&["alpha"]).await;
    let batch = scan.worker.batch(&scan.lease, 0, &findings_payload(2));
    assert!(scan.worker.send_batch(&batch).await.error.is_none());
    system.expire_and_recover(&scan.lease).await;
    let before = system.table_counts().await;

    let ack = scan.worker.send_batch(&batch).await;
    assert!(
        ack.error.is_none() && ack.duplicate,
        "its own, superseded: {ack:?}"
    );
    let mut forged = batch.clone();
    forged.lease.as_mut().unwrap().lease_token = "f".repeat(64);
    let ack = scan.worker.send_batch(&forged).await;
    assert_eq!(
        ack.error.expect("refused").error_code(),
        Some(ErrorCode::LeaseLost),
        "a replay without the attempt's token"
    );
    assert_eq!(system.table_counts().await, before);
    system.finish().await;
}

#[tokio::test]
async fn out_of_order_batches_are_accepted_and_completion_names_what_is_missing() {
    let system = TestSystem::spawn().await;
    let scan = system.leased_scan(&["alpha"]).await;
    let worker = &scan.worker;
    assert!(
        worker
            .send_batch(&worker.batch(&scan.lease, 2, &findings_payload(1)))
            .await
            .error
            .is_none()
    );
    assert!(
        worker
            .send_batch(&worker.batch(&scan.lease, 1, &findings_payload(2)))
            .await
            .error
            .is_none()
    );
    let before = system.table_counts().await;
    let ack = worker.complete(&scan.lease, 3).await;
    let error = ack.error.expect("refused");
    assert_eq!(error.error_code(), Some(ErrorCode::BatchMissing));
    assert_eq!(error.missing_sequence_numbers, vec![0]);
    assert_eq!(system.table_counts().await, before);

    assert!(
        worker
            .send_batch(&worker.batch(&scan.lease, 0, &findings_payload(3)))
            .await
            .error
            .is_none()
    );
    assert!(worker.complete(&scan.lease, 3).await.error.is_none());
    system.wait_scan_state(&scan.scan_id, "completed").await;
    system.finish().await;
}

#[tokio::test]
async fn next_plugin_sees_assets_found_before_it_and_last_plugin_completes_the_scan() {
    let system = TestSystem::spawn().await;
    let scan = system.leased_scan(&["alpha", "beta"]).await;
    let worker = &scan.worker;
    assert_eq!(scan.lease.plugin, "alpha");
    let discovered = v1::BatchPayload {
        findings: vec![],
        assets: vec![v1::Asset {
            kind: "http_service".into(),
            value: "http://10.0.0.1:8080".into(),
        }],
        ..Default::default()
    };
    assert!(
        worker
            .send_batch(&worker.batch(&scan.lease, 0, &discovered))
            .await
            .error
            .is_none()
    );
    assert!(worker.complete(&scan.lease, 1).await.error.is_none());

    let next = worker.acquire_one().await;
    assert_eq!((next.plugin.as_str(), next.position), ("beta", 1));
    assert_eq!(next.discovered_assets, discovered.assets);
    assert_eq!(system.scan_state(&scan.scan_id).await, "running");
    assert!(
        worker
            .send_batch(&worker.batch(&next, 0, &findings_payload(4)))
            .await
            .error
            .is_none()
    );
    assert!(worker.complete(&next, 1).await.error.is_none());
    system.wait_scan_state(&scan.scan_id, "completed").await;
    let counts = system.table_counts().await;
    assert_eq!(
        counts["enrichment_jobs"], 1,
        "completion creates the scan's one enrichment job"
    );
    assert_eq!(counts["findings"], 4);
    system.finish().await;
}

#[tokio::test]
async fn findings_of_a_superseded_attempt_are_not_published_with_the_successor() {
    let system = TestSystem::spawn().await;
    let scan = system.leased_scan(&["alpha"]).await;
    // The first attempt reports two findings, then loses its lease.
    assert!(
        scan.worker
            .send_batch(&scan.worker.batch(&scan.lease, 0, &findings_payload(2)))
            .await
            .error
            .is_none()
    );
    system.expire_and_recover(&scan.lease).await;
    let current = scan.worker.acquire_one().await;
    // The successor finds only one of them (rule-0) and completes.
    assert!(
        scan.worker
            .send_batch(&scan.worker.batch(&current, 0, &findings_payload(1)))
            .await
            .error
            .is_none()
    );
    assert!(scan.worker.complete(&current, 1).await.error.is_none());
    system.wait_scan_state(&scan.scan_id, "completed").await;
    let findings =
        store::admin::findings(&system.pool, uuid::Uuid::parse_str(&scan.scan_id).unwrap())
            .await
            .unwrap();
    assert_eq!(findings.len(), 1);
    assert_eq!(findings[0].rule_id, "rule-0");
    assert_eq!(
        findings[0].attempt_id.to_string(),
        current.lease.unwrap().attempt_id
    );
    system.finish().await;
}

#[tokio::test]
async fn retryable_failure_waits_and_non_retryable_failure_fails_the_scan() {
    let system = TestSystem::spawn().await;
    let scan = system.leased_scan(&["alpha"]).await;
    assert!(
        scan.worker
            .fail(&scan.lease, "flaky", true)
            .await
            .error
            .is_none()
    );
    // Backoff in tests is at most one second; the task comes back.
    let second = scan.worker.acquire_one().await;
    assert_eq!(second.lease.as_ref().unwrap().attempt_number, 2);
    assert!(
        scan.worker
            .fail(&second, "bad_target", false)
            .await
            .error
            .is_none()
    );
    system.wait_scan_state(&scan.scan_id, "failed").await;
    let view = store::admin::scan(&system.pool, uuid::Uuid::parse_str(&scan.scan_id).unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(view.failure_code, "bad_target");
    system.finish().await;
}

#[tokio::test]
async fn release_returns_the_task_without_spending_its_budget() {
    let system = TestSystem::spawn().await;
    let scan = system.leased_scan(&["alpha"]).await;
    assert!(scan.worker.release(&scan.lease).await.error.is_none());
    let again = scan.worker.acquire_one().await;
    let jobs = store::admin::scan_jobs(&system.pool, uuid::Uuid::parse_str(&scan.scan_id).unwrap())
        .await
        .unwrap();
    assert_eq!(
        jobs[0].attempt_count,
        Some(1),
        "the released attempt was refunded"
    );
    assert!(again.lease.unwrap().attempt_number > scan.lease.lease.unwrap().attempt_number);
    system.finish().await;
}

#[tokio::test]
async fn a_completion_carrying_its_last_batch_is_one_message_and_one_decision() {
    use messages::WorkerVerb;
    use prost::Message as _;
    let system = TestSystem::spawn().await;
    let scan = system.leased_scan(&["alpha"]).await;
    let worker = &scan.worker;

    // Refused as a whole, writing nothing: a batch of another sequence number, or another lease.
    let mut wrong_sequence = worker.completion(&scan.lease, 1);
    wrong_sequence.final_batch = Some(worker.batch(&scan.lease, 1, &findings_payload(2)));
    let mut foreign = worker.completion(&scan.lease, 1);
    let mut other_lease = scan.lease.clone();
    other_lease.lease.as_mut().expect("lease ref").lease_token = "another-token".into();
    foreign.final_batch = Some(worker.batch(&other_lease, 0, &findings_payload(2)));
    for refused in [wrong_sequence, foreign] {
        worker
            .publish_raw(WorkerVerb::Complete, refused.encode_to_vec())
            .await;
        let ack = worker.next_ack().await;
        assert_eq!(
            ack.error.as_ref().and_then(v1::Error::error_code),
            Some(ErrorCode::InvalidField),
            "{ack:?}"
        );
    }
    assert_eq!(system.table_counts().await["findings"], 0);

    // Batch 1 inside the completion, batch 0 never sent: the completion names what is missing.
    let mut second_only = worker.completion(&scan.lease, 2);
    second_only.final_batch = Some(worker.batch(&scan.lease, 1, &findings_payload(2)));
    worker
        .publish_raw(WorkerVerb::Complete, second_only.encode_to_vec())
        .await;
    let ack = worker.next_ack().await;
    let error = ack.error.expect("batch 0 is missing");
    assert_eq!(error.error_code(), Some(ErrorCode::BatchMissing));
    assert_eq!(error.missing_sequence_numbers, [0]);

    // The whole task in one message: batch 0 and the completion.
    let scan = system.leased_scan(&["alpha"]).await;
    let worker = &scan.worker;
    let mut whole = worker.completion(&scan.lease, 1);
    whole.final_batch = Some(worker.batch(&scan.lease, 0, &findings_payload(3)));
    worker
        .publish_raw(WorkerVerb::Complete, whole.encode_to_vec())
        .await;
    let ack = worker.next_ack().await;
    assert!(ack.error.is_none() && !ack.duplicate, "{ack:?}");
    assert_eq!(ack.kind, "complete");
    system.wait_scan_state(&scan.scan_id, "completed").await;
    let findings: i64 =
        sqlx::query_scalar("SELECT count(*) FROM findings WHERE scan_id = $1::uuid")
            .bind(&scan.scan_id)
            .fetch_one(&system.pool)
            .await
            .expect("count");
    assert_eq!(findings, 3);

    // Sent again, it is a duplicate and writes nothing.
    let before = system.table_counts().await;
    worker
        .publish_raw(WorkerVerb::Complete, whole.encode_to_vec())
        .await;
    let ack = worker.next_ack().await;
    assert!(ack.error.is_none() && ack.duplicate, "{ack:?}");
    assert_eq!(system.table_counts().await, before);
    system.finish().await;
}

/// A worker at its quota of waiting results (issue 46): while ingestion is stopped, a
/// completion JetStream refuses waits for room, and those after it wait behind it unpublished,
/// instead of each being published again every half second; once ingestion decides, each
/// acknowledgement makes room for the next and every scan completes once.
#[tokio::test]
async fn a_worker_at_its_quota_of_waiting_results_waits_for_room_and_loses_nothing() {
    const QUOTA: u64 = 2;
    const SCANS: u64 = 10;
    let system = TestSystem::spawn_with(|settings| {
        settings.common.streams.quotas.results_waiting_per_worker =
            bus::WaitingQuota::Set(QUOTA as i64);
    })
    .await;
    let organization = system.organization().await;
    system.stop(tests::Component::Ingestion).await;
    let stats = system.reference_worker(organization, SCANS as u32).await;
    let mut scan_ids = Vec::new();
    for _ in 0..SCANS {
        let target = format!("synthetic://quota-{}", scan_ids.len());
        let request = system.request(organization, &target, &["synthetic"]);
        let reply = system.submit(&request).await;
        assert!(reply.error.is_none(), "{reply:?}");
        scan_ids.push(reply.scan_id);
    }
    system
        .wait_for(
            "every plugin ran and the quota refused a completion",
            || async {
                let now = stats.snapshot();
                (now.leases_acquired == SCANS && now.quota_refused > 0).then_some(())
            },
        )
        .await;
    // Nothing is decided meanwhile: the old shape published each waiting completion again
    // every half second (6 or more refusals each in three seconds).
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let refused = stats.snapshot().quota_refused;
    assert!(
        refused <= SCANS - QUOTA,
        "{refused} refusals while ingestion was stopped: a waiting completion was published again without room"
    );

    system.start(tests::Component::Ingestion);
    for scan_id in &scan_ids {
        system.wait_scan_state(scan_id, "completed").await;
    }
    // The worker counts a completion when its acknowledgement arrives, after the commit.
    let end = system
        .wait_for("the worker to count every completion", || async {
            let end = stats.snapshot();
            (end.completed == SCANS).then_some(end)
        })
        .await;
    assert_eq!((end.abandoned, end.lost), (0, 0), "{end:?}");
    system.finish().await;
}

/// Decisions reporting an asset already stored do not wait for each other (issue 46: every
/// scan of one host reports it): its row is read, not written, so a transaction holding it
/// for update, as the old shape's decisions did until they committed, does not hold up a
/// batch reporting it.
#[tokio::test]
async fn a_batch_reporting_a_stored_asset_does_not_wait_for_a_transaction_holding_its_row() {
    let system = TestSystem::spawn().await;
    let scan = system.leased_scan(&["alpha"]).await;
    let first = scan.worker.batch(&scan.lease, 0, &findings_payload(1));
    assert!(scan.worker.send_batch(&first).await.error.is_none());

    let mut holder = system.pool.begin().await.expect("begin");
    let held = sqlx::query("UPDATE assets SET last_seen_at = now() WHERE organization_id = $1")
        .bind(scan.organization_id)
        .execute(&mut *holder)
        .await
        .expect("the asset's row held");
    assert_eq!(held.rows_affected(), 1, "the first batch stored its asset");
    let second = scan.worker.batch(&scan.lease, 1, &findings_payload(1));
    let ack = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        scan.worker.send_batch(&second),
    )
    .await
    .expect("the batch was decided while another transaction held its asset's row");
    assert!(ack.error.is_none(), "{ack:?}");
    holder.rollback().await.expect("rollback");
    let linked: i64 =
        sqlx::query_scalar("SELECT count(*) FROM scan_assets WHERE scan_id = $1::uuid")
            .bind(&scan.scan_id)
            .fetch_one(&system.pool)
            .await
            .expect("count");
    assert_eq!(linked, 1, "the scan is linked to its asset once");
    system.finish().await;
}
