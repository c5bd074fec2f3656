//! Renewals of one worker's leases in one message: dispatch's batched renew on the wire (one
//! answer per lease, a single renew answered as it always was, the request's own checks), and
//! the worker SDK renewing every lease it holds in one request per tick.

use std::collections::HashSet;
use std::time::Duration;

use futures::StreamExt as _;
use messages::{ErrorCode, WorkerVerb, v1};
use prost::Message as _;
use tests::{ManualWorker, TestSystem};
use uuid::Uuid;

const PLUGIN: &str = "synthetic";

/// A manual worker holding `count` leases, one per scan.
async fn holding(system: &TestSystem, count: usize) -> (ManualWorker, Vec<v1::LeaseRef>) {
    let organization_id = system.organization().await;
    let worker = system.manual_worker(organization_id, count as u32).await;
    let hello = worker.hello_with_capacity(&[PLUGIN], count as u32).await;
    assert!(hello.error.is_none(), "{hello:?}");
    for index in 0..count {
        let reply = system
            .submit(&system.request(
                organization_id,
                &format!("http://renew-{index}.test"),
                &[PLUGIN],
            ))
            .await;
        assert!(reply.error.is_none(), "{reply:?}");
    }
    let mut leases = Vec::new();
    while leases.len() < count {
        let reply = worker
            .acquire(Uuid::new_v4(), (count - leases.len()) as u32, 5_000)
            .await;
        assert!(reply.error.is_none(), "{reply:?}");
        leases.extend(
            reply
                .leases
                .into_iter()
                .map(|lease| lease.lease.expect("a lease reference")),
        );
    }
    (worker, leases)
}

fn answer(error: Option<&v1::Error>) -> &str {
    error.map_or("renewed", |error| error.code.as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batched_renew_answers_each_lease_and_a_single_renew_as_before() {
    let system = TestSystem::spawn().await;
    let (worker, mut leases) = holding(&system, 4).await;
    system
        .cancel_task(Uuid::parse_str(&leases[2].task_id).expect("task id"))
        .await;
    leases[3].lease_token = "not-the-token".into();

    let reply = worker.renew_many(&leases).await;
    let answers: Vec<(&str, &str)> = reply
        .renewals
        .iter()
        .map(|renewal| (renewal.attempt_id.as_str(), answer(renewal.error.as_ref())))
        .collect();
    let expected: Vec<(&str, &str)> = leases
        .iter()
        .map(|lease| lease.attempt_id.as_str())
        .zip(["renewed", "renewed", "cancel_requested", "lease_lost"])
        .collect();
    assert_eq!(answers, expected);
    assert!(
        reply.renewals[..2]
            .iter()
            .all(|renewal| (1..=30_000).contains(&renewal.lease_expires_in_ms))
    );
    // The top-level fields answer `lease`, as for a single renew.
    assert!(reply.error.is_none(), "{reply:?}");
    assert_eq!(
        reply.lease_expires_in_ms,
        reply.renewals[0].lease_expires_in_ms
    );

    // With a lost first lease, the top-level answer is its refusal.
    let lost_first = [leases[3].clone(), leases[0].clone()];
    let reply = worker.renew_many(&lost_first).await;
    assert_eq!(answer(reply.error.as_ref()), "lease_lost");
    assert_eq!(reply.renewals.len(), 2);
    assert_eq!(answer(reply.renewals[1].error.as_ref()), "renewed");

    // A single renew gets exactly the reply it always got: no `renewals`.
    let reply = worker.renew_many(&leases[..1]).await;
    assert!(
        reply.error.is_none() && reply.renewals.is_empty(),
        "{reply:?}"
    );
    assert!(reply.lease_expires_in_ms > 0);
    let reply = worker.renew_many(&leases[2..3]).await;
    assert_eq!(answer(reply.error.as_ref()), "cancel_requested");
    assert!(reply.renewals.is_empty(), "{reply:?}");

    // Refusals of the whole request, with no `renewals`.
    let refused = |reply: v1::RenewReply, code: ErrorCode| {
        assert_eq!(
            reply.error.as_ref().and_then(v1::Error::error_code),
            Some(code),
            "{reply:?}"
        );
        assert!(reply.renewals.is_empty(), "{reply:?}");
    };
    let twice = [leases[0].clone(), leases[1].clone(), leases[0].clone()];
    refused(worker.renew_many(&twice).await, ErrorCode::InvalidField);
    let too_many = vec![leases[0].clone(); messages::limits::RENEW_LEASES_MAX + 1];
    refused(worker.renew_many(&too_many).await, ErrorCode::TooLarge);
    system.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_renews_all_its_leases_in_one_message_per_tick() {
    const LEASES: usize = 8;
    let renew_interval = Duration::from_millis(300);
    let system = TestSystem::spawn_with(|settings| {
        settings.dispatch.lease.ttl = Duration::from_secs(3);
        settings.dispatch.lease.renew_interval = renew_interval;
    })
    .await;
    let organization_id = system.organization().await;
    let stats = system
        .reference_worker(organization_id, LEASES as u32)
        .await;
    for index in 0..LEASES {
        let request = system.request(
            organization_id,
            &format!("synthetic://renew-{index}?duration_ms=60000"),
            &[PLUGIN],
        );
        let reply = system.submit(&request).await;
        assert!(reply.error.is_none(), "{reply:?}");
    }
    system
        .wait_for("every lease running", || async {
            (stats.snapshot().leases_running == LEASES as u64).then_some(())
        })
        .await;

    let mut renewals = system
        .bus
        .client()
        .subscribe(system.subjects.worker_wildcard(WorkerVerb::Renew))
        .await
        .expect("subscribed to renewals");
    system.bus.flush().await.expect("subscription registered");
    let mut seen = Vec::new();
    for _ in 0..4 {
        let message = tokio::time::timeout(Duration::from_secs(10), renewals.next())
            .await
            .expect("a renew within the interval")
            .expect("subscription open");
        seen.push((
            tokio::time::Instant::now(),
            v1::RenewRequest::decode(message.payload).expect("a RenewRequest"),
        ));
    }
    for (_, request) in &seen {
        let attempts: HashSet<&str> = request
            .lease
            .iter()
            .chain(&request.more_leases)
            .map(|lease| lease.attempt_id.as_str())
            .collect();
        assert_eq!(
            attempts.len(),
            LEASES,
            "every message renews every lease the worker holds: {request:?}"
        );
    }
    // One message per tick: consecutive messages are a renew interval apart, not a burst.
    let span = seen[3].0 - seen[0].0;
    assert!(
        span >= renew_interval * 2,
        "4 renew messages within {span:?}: more than one per tick"
    );
    // Each lease's renewal is counted as dispatch answers it.
    system
        .wait_for("every renewal of the four messages counted", || async {
            (stats.snapshot().renewals >= 4 * LEASES as u64).then_some(())
        })
        .await;
    system.finish().await;
}
