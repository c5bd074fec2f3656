//! Bad input (SPEC §6): a typed error to the sender, the message terminated, nothing written.

use futures::StreamExt as _;
use messages::{ErrorCode, EventKind, WorkerVerb, v1};
use prost::Message as _;
use tests::{TestSystem, findings_payload};

#[tokio::test]
async fn malformed_and_invalid_scan_requests_are_rejected_as_events_and_terminated() {
    let system = TestSystem::spawn().await;
    let org = system.organization().await;
    let mut rejections = system
        .bus
        .client()
        .subscribe(system.subjects.tenant_event(&org, EventKind::ScanRejected))
        .await
        .unwrap();
    system.bus.flush().await.unwrap();
    let before = system.table_counts().await;

    let mut missing_fields = system.request(org, "http://a.test", &["alpha"]);
    missing_fields.plugins.clear();
    let mut bad_version = system.request(org, "http://a.test", &["alpha"]);
    bad_version.schema_version = 9;
    // A valid request padded with a field palisade does not know: over the 4 KiB a request
    // may have (admission refuses it), and over the 64 KiB the requests stream takes (JetStream
    // refuses it at publish, so admission never sees it).
    let padded = |len: usize| {
        let mut padded = system
            .request(org, "http://a.test", &["alpha"])
            .encode_to_vec();
        prost::encoding::encode_key(99, prost::encoding::WireType::LengthDelimited, &mut padded);
        prost::encoding::encode_varint(len as u64, &mut padded);
        padded.resize(padded.len() + len, b'x');
        padded
    };
    let refused = system
        .bus
        .publish_durable(
            system
                .subjects
                .client(&org, tests::TEST_CLIENT_ID, messages::ClientVerb::Request)
                .unwrap(),
            "oversize",
            Default::default(),
            padded(900_000).into(),
        )
        .await;
    assert!(
        matches!(&refused, Err(bus::BusError::Quota { .. })),
        "a 900 KB request is refused at publish: {refused:?}"
    );
    let cases: Vec<(Vec<u8>, ErrorCode)> = vec![
        (vec![0xff, 0x01, 0x02], ErrorCode::MalformedMessage),
        (padded(8_000), ErrorCode::TooLarge),
        (missing_fields.encode_to_vec(), ErrorCode::InvalidField),
        (
            bad_version.encode_to_vec(),
            ErrorCode::UnsupportedSchemaVersion,
        ),
    ];
    for (payload, expected) in cases {
        system.publish_request_bytes(org, payload).await;
        let event = tokio::time::timeout(tests::WAIT_MAX, rejections.next())
            .await
            .unwrap()
            .unwrap();
        let rejected = v1::ScanRejected::decode(event.payload.as_ref()).unwrap();
        assert_eq!(rejected.error.unwrap().error_code(), Some(expected));
    }
    tests::wait_consumer_idle(
        &system,
        &system.subjects.requests_stream(),
        admission::CONSUMER_NAME,
    )
    .await;
    assert_eq!(system.table_counts().await, before);
    system.finish().await;
}

#[tokio::test]
async fn bad_worker_messages_get_typed_errors_and_change_nothing() {
    let system = TestSystem::spawn_with(|settings| {
        settings.ingestion.batch_limits.findings_max = 5;
    })
    .await;
    let scan = system.leased_scan(&["alpha"]).await;
    let worker = &scan.worker;
    let before = system.table_counts().await;

    // Malformed protobuf on the results stream.
    worker
        .publish_raw(WorkerVerb::Result, vec![0xff, 0xff])
        .await;
    assert_eq!(
        worker.next_ack().await.error.unwrap().error_code(),
        Some(ErrorCode::MalformedMessage)
    );
    // A missing lease.
    let mut no_lease = worker.batch(&scan.lease, 0, &findings_payload(1));
    no_lease.lease = None;
    assert_eq!(
        worker
            .send_batch(&no_lease)
            .await
            .error
            .unwrap()
            .error_code(),
        Some(ErrorCode::InvalidField)
    );
    // An oversized batch.
    let oversized = worker.batch(&scan.lease, 0, &findings_payload(6));
    assert_eq!(
        worker
            .send_batch(&oversized)
            .await
            .error
            .unwrap()
            .error_code(),
        Some(ErrorCode::TooLarge)
    );
    // A sequence number out of range.
    let out_of_range = worker.batch(
        &scan.lease,
        messages::limits::BATCH_SEQUENCE_MAX + 1,
        &findings_payload(1),
    );
    assert_eq!(
        worker
            .send_batch(&out_of_range)
            .await
            .error
            .unwrap()
            .error_code(),
        Some(ErrorCode::SequenceOutOfRange)
    );
    // A finding without its required fields.
    let mut no_title = findings_payload(1);
    no_title.findings[0].title.clear();
    assert_eq!(
        worker
            .send_batch(&worker.batch(&scan.lease, 0, &no_title))
            .await
            .error
            .unwrap()
            .error_code(),
        Some(ErrorCode::InvalidField)
    );

    tests::wait_consumer_idle(
        &system,
        &system.subjects.results_stream(),
        ingestion::CONSUMER_NAME,
    )
    .await;
    assert_eq!(system.table_counts().await, before);
    system.finish().await;
}

#[tokio::test]
async fn unknown_and_unassigned_workers_are_refused_by_dispatch() {
    let system = TestSystem::spawn().await;
    let org = system.organization().await;
    let before = system.table_counts().await;

    let stranger = tests::ManualWorker::connect(system.bus.clone(), uuid::Uuid::new_v4()).await;
    let hello = stranger.hello(&["alpha"]).await;
    assert_eq!(
        hello.error.unwrap().error_code(),
        Some(ErrorCode::UnknownWorker)
    );
    let acquire = stranger.acquire(uuid::Uuid::new_v4(), 1, 0).await;
    assert_eq!(
        acquire.error.unwrap().error_code(),
        Some(ErrorCode::UnknownWorker)
    );
    assert_eq!(system.table_counts().await, before);

    // Registered but serving no organization.
    let unassigned_id = uuid::Uuid::new_v4();
    store::admin::register_worker(&system.pool, unassigned_id, "unassigned", 1)
        .await
        .unwrap();
    let unassigned = tests::ManualWorker::connect(system.bus.clone(), unassigned_id).await;
    assert!(
        unassigned
            .hello(&["alpha"])
            .await
            .organization_ids
            .is_empty()
    );
    assert!(
        system
            .submit(&system.request(org, "http://a.test", &["alpha"]))
            .await
            .error
            .is_none()
    );
    let before = system.table_counts().await;
    let acquire = unassigned.acquire(uuid::Uuid::new_v4(), 1, 0).await;
    assert_eq!(
        acquire.error.unwrap().error_code(),
        Some(ErrorCode::WorkerNotAssigned)
    );
    assert!(acquire.leases.is_empty());
    assert_eq!(system.table_counts().await, before);

    // A worker id in the message that is not the subject's.
    let mut forged = v1::HelloRequest {
        schema_version: 1,
        capacity: 1,
        ..Default::default()
    };
    forged.worker_id = uuid::Uuid::new_v4().to_string();
    let reply = v1::HelloReply::decode(
        unassigned
            .request_raw(WorkerVerb::Hello, forged.encode_to_vec())
            .await,
    )
    .unwrap();
    assert_eq!(
        reply.error.unwrap().error_code(),
        Some(ErrorCode::InvalidField)
    );
    // Malformed protobuf on a request subject.
    let reply = v1::AcquireReply::decode(
        unassigned
            .request_raw(WorkerVerb::Acquire, vec![0xff, 0xff])
            .await,
    )
    .unwrap();
    assert_eq!(
        reply.error.unwrap().error_code(),
        Some(ErrorCode::MalformedMessage)
    );
    system.finish().await;
}
