//! Admission: I5 (one scan per organization, client and key), I6 (one active scan per
//! target), quotas, the client's registration at decision time, and "nothing written" on every
//! refusal.

use messages::ErrorCode;
use tests::TestSystem;

#[tokio::test]
async fn replayed_request_returns_the_original_scan_and_writes_nothing() {
    let system = TestSystem::spawn().await;
    let org = system.organization().await;
    let request = system.request(org, "http://a.test", &["alpha"]);
    let first = system.submit(&request).await;
    assert!(first.error.is_none(), "{first:?}");
    assert!(!first.deduplicated);
    let before = system.table_counts().await;

    let replay = system.submit(&request).await;
    assert!(replay.error.is_none(), "{replay:?}");
    assert!(replay.deduplicated);
    assert_eq!(replay.scan_id, first.scan_id);
    assert_eq!(system.table_counts().await, before);
    system.finish().await;
}

#[tokio::test]
async fn same_key_with_another_payload_is_an_idempotency_conflict() {
    let system = TestSystem::spawn().await;
    let org = system.organization().await;
    let request = system.request(org, "http://a.test", &["alpha"]);
    assert!(system.submit(&request).await.error.is_none());
    let before = system.table_counts().await;

    for change in [
        Box::new(|r: &mut messages::v1::ScanRequest| r.priority = 7) as Box<dyn Fn(&mut _)>,
        Box::new(|r: &mut messages::v1::ScanRequest| r.target = "http://b.test".into()),
        Box::new(|r: &mut messages::v1::ScanRequest| r.plugins.push("beta".into())),
    ] {
        let mut conflicting = request.clone();
        change(&mut conflicting);
        let reply = system.submit(&conflicting).await;
        let error = reply.error.expect("refused");
        assert_eq!(
            error.error_code(),
            Some(ErrorCode::IdempotencyConflict),
            "{error:?}"
        );
        assert!(reply.scan_id.is_empty());
    }
    assert_eq!(system.table_counts().await, before);
    system.finish().await;
}

#[tokio::test]
async fn second_scan_of_an_active_target_is_refused_naming_the_active_scan() {
    let system = TestSystem::spawn().await;
    let org = system.organization().await;
    let first = system
        .submit(&system.request(org, "http://a.test", &["alpha"]))
        .await;
    let before = system.table_counts().await;

    let second = system
        .submit(&system.request(org, "http://a.test", &["beta"]))
        .await;
    let error = second.error.expect("refused");
    assert_eq!(error.error_code(), Some(ErrorCode::ScanAlreadyActive));
    assert_eq!(error.active_scan_id, first.scan_id);
    assert_eq!(system.table_counts().await, before);

    // Another organization's scan of the same target is its own business.
    let other_org = system.organization().await;
    assert!(
        system
            .submit(&system.request(other_org, "http://a.test", &["alpha"]))
            .await
            .error
            .is_none()
    );
    system.finish().await;
}

#[tokio::test]
async fn concurrent_requests_for_one_target_admit_exactly_one() {
    let system = TestSystem::spawn().await;
    let org = system.organization().await;
    let requests: Vec<_> = (0..16)
        .map(|_| system.request(org, "http://race.test", &["alpha"]))
        .collect();
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(requests.len()));
    let replies = futures::future::join_all(requests.iter().map(|request| {
        let barrier = barrier.clone();
        let client = system.client();
        async move {
            barrier.wait().await;
            client.submit(request).await.expect("answer")
        }
    }))
    .await;
    let admitted: Vec<_> = replies
        .iter()
        .filter(|reply| reply.error.is_none())
        .collect();
    assert_eq!(admitted.len(), 1, "{replies:?}");
    for reply in replies.iter().filter(|reply| reply.error.is_some()) {
        let error = reply.error.as_ref().expect("refused");
        assert_eq!(error.error_code(), Some(ErrorCode::ScanAlreadyActive));
        assert_eq!(error.active_scan_id, admitted[0].scan_id);
    }
    assert_eq!(system.table_counts().await["scans"], 1);
    system.finish().await;
}

#[tokio::test]
async fn concurrent_replays_of_one_key_converge_on_one_scan() {
    let system = TestSystem::spawn().await;
    let org = system.organization().await;
    let request = system.request(org, "http://replay.test", &["alpha"]);
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(8));
    let replies = futures::future::join_all((0..8).map(|_| {
        let barrier = barrier.clone();
        let client = system.client();
        let request = request.clone();
        async move {
            barrier.wait().await;
            client.submit(&request).await.expect("answer")
        }
    }))
    .await;
    let scan_id = &replies[0].scan_id;
    assert!(
        replies
            .iter()
            .all(|reply| reply.error.is_none() && &reply.scan_id == scan_id),
        "{replies:?}"
    );
    assert_eq!(
        replies.iter().filter(|reply| !reply.deduplicated).count(),
        1
    );
    assert_eq!(system.table_counts().await["scans"], 1);
    system.finish().await;
}

#[tokio::test]
async fn hourly_quota_refuses_the_scan_over_it() {
    let system = TestSystem::spawn().await;
    let org = uuid::Uuid::now_v7();
    store::admin::create_organization(&system.pool, org, "quota", Some(1))
        .await
        .unwrap();
    assert!(
        system
            .submit(&system.request(org, "http://one.test", &["alpha"]))
            .await
            .error
            .is_none()
    );
    let before = system.table_counts().await;
    let reply = system
        .submit(&system.request(org, "http://two.test", &["alpha"]))
        .await;
    assert_eq!(
        reply.error.expect("refused").error_code(),
        Some(ErrorCode::QuotaExceeded)
    );
    assert_eq!(system.table_counts().await, before);
    system.finish().await;
}

#[tokio::test]
async fn unknown_organization_is_refused() {
    let system = TestSystem::spawn().await;
    let before = system.table_counts().await;
    let reply = system
        .submit(&system.request(uuid::Uuid::now_v7(), "http://a.test", &["alpha"]))
        .await;
    assert_eq!(
        reply.error.expect("refused").error_code(),
        Some(ErrorCode::UnknownOrganization)
    );
    assert_eq!(system.table_counts().await, before);
    system.finish().await;
}

#[tokio::test]
async fn durable_requests_are_admitted_once_even_when_published_twice() {
    let system = TestSystem::spawn().await;
    let org = system.organization().await;
    let request = system.request(org, "http://durable.test", &["alpha"]);
    let payload = prost::Message::encode_to_vec(&request);
    // Two different Nats-Msg-Ids: JetStream stores both, admission must converge.
    system.publish_request_bytes(org, payload.clone()).await;
    system.publish_request_bytes(org, payload).await;
    system
        .wait_for("the scan to be admitted", || async {
            (system.table_counts().await["scans"] == 1).then_some(())
        })
        .await;
    tests::wait_consumer_idle(
        &system,
        &system.subjects.requests_stream(),
        admission::CONSUMER_NAME,
    )
    .await;
    assert_eq!(system.table_counts().await["scans"], 1);
    assert_eq!(system.table_counts().await["worker_tasks"], 1);
    system.finish().await;
}

/// A synchronous submission nobody answers falls back to the durable path: with admission
/// stopped, `submit_or_queue` publishes the request to the stream and says so; once admission
/// runs again the request is admitted once, and a submission of the same request answers with
/// that scan.
#[tokio::test]
async fn an_unanswered_submission_falls_back_to_the_durable_stream() {
    let system = TestSystem::spawn().await;
    let org = system.organization().await;
    let request = system.request(org, "http://fallback.test", &["alpha"]);
    system.stop(tests::Component::Admission).await;

    let submitted = system
        .client()
        .submit_or_queue(&request)
        .await
        .expect("one of the two paths took the request");
    let client::Submitted::Queued { reason } = submitted else {
        panic!("nobody could have answered: {submitted:?}");
    };
    assert!(!reason.is_empty());
    assert_eq!(system.table_counts().await["scans"], 0);

    system.start(tests::Component::Admission);
    let replay = system.submit(&request).await;
    assert!(replay.error.is_none(), "{replay:?}");
    system
        .wait_for("the queued request to be admitted", || async {
            (system.table_counts().await["scans"] == 1).then_some(())
        })
        .await;
    let again = system.submit(&request).await;
    assert!(again.deduplicated, "{again:?}");
    assert_eq!(again.scan_id, replay.scan_id);
    assert_eq!(system.table_counts().await["scans"], 1, "one scan");
    system.finish().await;
}

/// `palisade org set` (issue 27, item 5): a live organization's hourly quota changed takes
/// effect at the next admission, raised, removed or set.
#[tokio::test]
async fn an_organizations_quota_changed_live_applies_to_the_next_admission() {
    let system = TestSystem::spawn().await;
    let org = system.organization().await;
    let submit = |target: &'static str| {
        let system = &system;
        async move {
            system
                .submit(&system.request(org, target, &["alpha"]))
                .await
        }
    };
    assert_eq!(
        store::admin::set_hourly_quota(
            &system.pool,
            org,
            Some(1),
            &store::audit::Change::new("test", "")
        )
        .await
        .unwrap(),
        Ok(None)
    );
    assert!(submit("http://one.test").await.error.is_none());
    let refused = submit("http://two.test").await;
    assert_eq!(refused.error.expect("refused").code, "quota_exceeded");
    assert_eq!(
        store::admin::set_hourly_quota(
            &system.pool,
            org,
            Some(2),
            &store::audit::Change::new("test", "")
        )
        .await
        .unwrap(),
        Ok(Some(1))
    );
    assert!(submit("http://two.test").await.error.is_none());
    let refused = submit("http://three.test").await;
    assert_eq!(refused.error.expect("refused").code, "quota_exceeded");
    store::admin::set_hourly_quota(
        &system.pool,
        org,
        None,
        &store::audit::Change::new("test", ""),
    )
    .await
    .unwrap()
    .unwrap();
    assert!(submit("http://three.test").await.error.is_none());
    assert_eq!(
        store::admin::set_hourly_quota(
            &system.pool,
            uuid::Uuid::new_v4(),
            None,
            &store::audit::Change::new("test", "")
        )
        .await
        .unwrap(),
        Err(()),
        "no such organization"
    );
    system.finish().await;
}
