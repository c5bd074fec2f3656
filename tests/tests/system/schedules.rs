//! Recurring scans (issue 27, item 1): each slot fired once by the reaper's leader, through the
//! admission script, by a clock the test steps; across a leader change, a restart and a clock
//! stepped back; the catch-up rule; both overlap policies.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use lease::ManualClock;
use store::schedules::{self, Created, FireRow, NewSchedule};
use store::states::{ScheduleFireOutcome, ScheduleOverlap};
use tests::TestSystem;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// A minute boundary far from the machine's clock, so only the test's clock fires anything.
fn start() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2031-03-01T10:00:30Z")
        .unwrap()
        .with_timezone(&Utc)
}

fn minute(n: i64) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2031-03-01T10:00:00Z")
        .unwrap()
        .with_timezone(&Utc)
        + TimeDelta::minutes(n)
}

fn every_minute(organization_id: Uuid, name: &str, overlap: ScheduleOverlap) -> NewSchedule {
    NewSchedule {
        organization_id,
        name: name.to_owned(),
        target: format!("https://{name}.example"),
        plugins: vec!["tcp_connect".to_owned()],
        priority: 0,
        execution_deadline_seconds: None,
        client_id: "schedules".to_owned(),
        cron: None,
        interval_seconds: Some(60),
        time_zone: "UTC".to_owned(),
        jitter_seconds: 0,
        overlap,
        paused: false,
    }
}

async fn create(system: &TestSystem, schedule: &NewSchedule) -> Uuid {
    match schedules::create(&system.pool, schedule, start(), "test", "")
        .await
        .unwrap()
        .unwrap()
    {
        Created::Created(id) => id,
        other => panic!("not created: {other:?}"),
    }
}

/// Fired slots, oldest first.
async fn fires(system: &TestSystem, id: Uuid) -> Vec<FireRow> {
    let mut fires = schedules::fires(&system.pool, id, 1_000).await.unwrap();
    fires.reverse();
    fires
}

async fn cancel(system: &TestSystem, scan_id: Uuid) {
    store::cancel::cancel(
        &system.pool,
        &system.subjects,
        None,
        store::cancel::CancelTarget::Scan(scan_id),
        "test",
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn each_slot_fires_once_by_the_catch_up_rule_and_a_busy_target_is_skipped() {
    let system = TestSystem::spawn().await;
    let organization = system.organization().await;
    let busy = create(
        &system,
        &every_minute(organization, "busy", ScheduleOverlap::Skip),
    )
    .await;
    let clock = ManualClock::new(start());
    let reaper = system.reaper().with_clock(Arc::new(clock.clone()));

    // Before the first slot nothing fires; at it, its scan is admitted once.
    assert!(reaper.run_once().await.unwrap().schedules.is_empty());
    clock.set(minute(1));
    let swept = reaper.run_once().await.unwrap().schedules;
    assert_eq!(swept.len(), 1);
    assert_eq!(swept[0].outcome, Some(ScheduleFireOutcome::Admitted));
    let first_scan = swept[0].scan_id.unwrap();
    assert!(
        reaper.run_once().await.unwrap().schedules.is_empty(),
        "fired once"
    );

    // A clock stepped back fires nothing again.
    clock.set(minute(0));
    assert!(reaper.run_once().await.unwrap().schedules.is_empty());

    // The next slot finds the target busy with the first scan: skipped, naming it.
    clock.set(minute(2) + TimeDelta::seconds(5));
    let swept = reaper.run_once().await.unwrap().schedules;
    assert_eq!(swept[0].outcome, Some(ScheduleFireOutcome::Skipped));
    assert_eq!(swept[0].scan_id, Some(first_scan));

    // Seven minutes without a sweep: the newest slot fires, late, once; six are passed over.
    cancel(&system, first_scan).await;
    clock.set(minute(9) + TimeDelta::seconds(40));
    let swept = reaper.run_once().await.unwrap().schedules;
    assert_eq!(swept.len(), 1);
    assert_eq!(swept[0].outcome, Some(ScheduleFireOutcome::Admitted));
    assert_eq!(swept[0].slot, minute(9));
    assert_eq!(swept[0].missed, 6);

    let recorded = fires(&system, busy).await;
    let slots: Vec<_> = recorded.iter().map(|fire| fire.slot).collect();
    assert_eq!(slots, [minute(1), minute(2), minute(9)]);
    assert_eq!(recorded[2].missed_before, 6);
    // The scan went through admission as any request: its key names the slot.
    let scan = store::admin::scan(&system.pool, recorded[2].scan_id.unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(scan.client_id, "schedules");
    assert_eq!(
        scan.idempotency_key,
        schedules::idempotency_key(busy, minute(9))
    );
    let shown = store::schedules::get(&system.pool, busy)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(shown.next_slot, minute(10));
    system.finish().await;
}

#[tokio::test]
async fn a_queued_slot_waits_for_its_target_and_fires_once_it_is_free() {
    let system = TestSystem::spawn().await;
    let organization = system.organization().await;
    let queued = create(
        &system,
        &every_minute(organization, "queued", ScheduleOverlap::Queue),
    )
    .await;
    let clock = ManualClock::new(minute(1));
    let reaper = system.reaper().with_clock(Arc::new(clock.clone()));
    let first = reaper.run_once().await.unwrap().schedules[0]
        .scan_id
        .unwrap();

    // The target is busy: the slot is neither recorded nor passed, sweep after sweep.
    clock.set(minute(2));
    for _ in 0..3 {
        let swept = reaper.run_once().await.unwrap().schedules;
        assert_eq!(swept.len(), 1);
        assert_eq!(swept[0].outcome, None, "queued");
        assert_eq!(swept[0].scan_id, Some(first));
    }
    assert_eq!(fires(&system, queued).await.len(), 1);

    // Freed a minute and a half later: the queued fire goes out once, as the newest slot.
    cancel(&system, first).await;
    clock.set(minute(3) + TimeDelta::seconds(30));
    let swept = reaper.run_once().await.unwrap().schedules;
    assert_eq!(swept[0].outcome, Some(ScheduleFireOutcome::Admitted));
    assert_eq!((swept[0].slot, swept[0].missed), (minute(3), 1));
    assert!(reaper.run_once().await.unwrap().schedules.is_empty());
    assert_eq!(fires(&system, queued).await.len(), 2);
    system.finish().await;
}

#[tokio::test]
async fn a_paused_schedule_does_not_fire_and_resumes_from_the_next_slot() {
    let system = TestSystem::spawn().await;
    let organization = system.organization().await;
    let id = create(
        &system,
        &every_minute(organization, "paused", ScheduleOverlap::Skip),
    )
    .await;
    let clock = ManualClock::new(minute(5));
    let reaper = system.reaper().with_clock(Arc::new(clock.clone()));
    schedules::set_paused(&system.pool, id, true, minute(0), "alice", "maintenance")
        .await
        .unwrap()
        .unwrap();
    assert!(reaper.run_once().await.unwrap().schedules.is_empty());
    let resumed = schedules::set_paused(&system.pool, id, false, minute(5), "bob", "done")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        resumed.next_slot,
        minute(6),
        "slots passed while paused never fire"
    );
    assert_eq!(
        (resumed.updated_by.as_str(), resumed.update_reason.as_str()),
        ("bob", "done")
    );
    clock.set(minute(6));
    assert_eq!(reaper.run_once().await.unwrap().schedules.len(), 1);
    system.finish().await;
}

#[tokio::test]
async fn a_slot_fires_once_across_a_leader_change_and_a_restart() {
    let system = TestSystem::spawn_with(|settings| {
        settings.reaper.lease =
            lease::RunConfig::new(Duration::from_millis(3_000), Duration::from_millis(300))
                .unwrap();
    })
    .await;
    let organization = system.organization().await;
    let id = create(
        &system,
        &every_minute(organization, "leaders", ScheduleOverlap::Skip),
    )
    .await;
    let clock = ManualClock::new(start());
    let replica = |clock: &ManualClock| {
        let service = system.reaper().with_clock(Arc::new(clock.clone()));
        let stop = CancellationToken::new();
        let run = tokio::spawn(service.clone().run_until_stopped(stop.clone()));
        Replica { service, stop, run }
    };
    let fired = |count: usize| {
        let system = &system;
        async move {
            system
                .wait_for(&format!("{count} slots fired"), || async {
                    (fires(system, id).await.len() >= count).then_some(())
                })
                .await;
        }
    };

    let mut replicas = vec![replica(&clock), replica(&clock)];
    let leader = system
        .wait_for("a leader", || async {
            replicas
                .iter()
                .position(|replica| replica.service.is_leader())
        })
        .await;
    clock.set(minute(1));
    fired(1).await;

    // The leader stops (releasing its lease); the other replica takes over and fires the next
    // slot, never the first again.
    replicas.remove(leader).stop().await;
    system
        .wait_for("the other replica leads", || async {
            replicas[0].service.is_leader().then_some(())
        })
        .await;
    clock.set(minute(2));
    fired(2).await;

    // Every replica restarts, with the clock stepped back before the second slot: the new
    // leader sweeps and fires nothing, then fires the third slot once.
    replicas.remove(0).stop().await;
    clock.set(minute(1) + TimeDelta::seconds(50));
    let restarted = replica(&clock);
    system
        .wait_for("the restarted replica leads", || async {
            restarted.service.is_leader().then_some(())
        })
        .await;
    for _ in 0..3 {
        restarted.service.run_once().await.unwrap();
    }
    assert_eq!(fires(&system, id).await.len(), 2);
    clock.set(minute(3));
    fired(3).await;
    restarted.stop().await;

    let recorded = fires(&system, id).await;
    let slots: Vec<_> = recorded.iter().map(|fire| fire.slot).collect();
    assert_eq!(slots, [minute(1), minute(2), minute(3)], "each slot once");
    system.finish().await;
}

/// A reaper replica running under the leader lease.
struct Replica {
    service: reaper::Service,
    stop: CancellationToken,
    run: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Replica {
    async fn stop(self) {
        self.stop.cancel();
        self.run.await.unwrap().unwrap();
    }
}

#[tokio::test]
async fn two_sweeps_at_once_fire_each_slot_once() {
    let system = TestSystem::spawn().await;
    let organization = system.organization().await;
    let mut ids = Vec::new();
    for index in 0..10 {
        ids.push(
            create(
                &system,
                &every_minute(
                    organization,
                    &format!("race-{index}"),
                    ScheduleOverlap::Skip,
                ),
            )
            .await,
        );
    }
    let clock = ManualClock::new(start());
    let one = system.reaper().with_clock(Arc::new(clock.clone()));
    let two = system.reaper().with_clock(Arc::new(clock.clone()));
    for slot in 1..=3 {
        clock.set(minute(slot));
        let (first, second) = tokio::join!(one.run_once(), two.run_once());
        let fired = first.unwrap().schedules.len() + second.unwrap().schedules.len();
        assert_eq!(
            fired,
            ids.len(),
            "slot {slot}: each schedule fired by one sweep"
        );
    }
    for id in ids {
        assert_eq!(fires(&system, id).await.len(), 3);
    }
    system.finish().await;
}

/// The same over the bus (`schedules`, served by admission), for a client of the organization:
/// its schedules submit as it, and another organization's are `not_found`.
#[tokio::test]
async fn a_client_manages_its_organizations_schedules_over_the_bus() {
    use messages::v1;
    use messages::v1::schedules_reply::Answer;
    use messages::v1::schedules_request::Query;

    let system = TestSystem::spawn().await;
    let organization = system.organization().await;
    let other = system.organization().await;
    let client = system.client();
    let schedule_of = |reply: v1::SchedulesReply| match reply.answer {
        Some(Answer::Schedule(schedule)) => schedule,
        _ => panic!("{reply:?}"),
    };
    let add = |name: &str, every_seconds: u32| {
        Query::Add(v1::AddSchedule {
            name: name.to_owned(),
            target: format!("https://{name}.example"),
            plugins: vec!["tcp_connect".to_owned()],
            every_seconds,
            reason: "nightly audit".to_owned(),
            ..Default::default()
        })
    };
    let added = schedule_of(
        client
            .schedules(&organization, add("hourly", 3_600))
            .await
            .unwrap(),
    );
    assert_eq!(
        added.client_id,
        tests::TEST_CLIENT_ID,
        "it submits as the client"
    );
    assert_eq!(added.overlap, "skip");
    assert_eq!(
        added.updated_by,
        format!("client:{}", tests::TEST_CLIENT_ID)
    );
    assert_eq!(added.next_slot_unix_ms % 3_600_000, 0, "on the hour");
    let id = added.schedule_id.clone();

    // What could never fire, or is taken, is refused with the field.
    for (query, says) in [
        (add("hourly", 3_600), "add.name"),
        (add("too-often", 10), "minimum"),
        (add("neither", 0), "exactly one"),
    ] {
        let refused = client.schedules(&organization, query).await.unwrap();
        let error = refused.error.unwrap();
        assert_eq!(error.code, "invalid_field", "{error:?}");
        assert!(error.message.contains(says), "{says}: {error:?}");
    }

    // Another organization sees none of it.
    let theirs = client
        .schedules(
            &other,
            Query::Show(v1::ScheduleRef {
                schedule_id: id.clone(),
            }),
        )
        .await
        .unwrap();
    assert_eq!(theirs.error.unwrap().code, "not_found");
    let listed = client
        .schedules(&other, Query::List(v1::ListSchedules::default()))
        .await
        .unwrap();
    let Some(Answer::Page(page)) = listed.answer else {
        panic!("{listed:?}");
    };
    assert!(page.schedules.is_empty());
    let deleted_elsewhere = client
        .schedules(
            &other,
            Query::Delete(v1::ScheduleRef {
                schedule_id: id.clone(),
            }),
        )
        .await
        .unwrap();
    assert_eq!(deleted_elsewhere.error.unwrap().code, "not_found");

    let paused = schedule_of(
        client
            .schedules(
                &organization,
                Query::Pause(v1::ScheduleChange {
                    schedule_id: id.clone(),
                    reason: "freeze".to_owned(),
                }),
            )
            .await
            .unwrap(),
    );
    assert!(paused.paused);
    assert_eq!(paused.update_reason, "freeze");
    let unexplained = client
        .schedules(
            &organization,
            Query::Resume(v1::ScheduleChange {
                schedule_id: id.clone(),
                reason: String::new(),
            }),
        )
        .await
        .unwrap();
    assert_eq!(unexplained.error.unwrap().code, "invalid_field");

    // Fired, its scan is the client's.
    let resumed = schedule_of(
        client
            .schedules(
                &organization,
                Query::Resume(v1::ScheduleChange {
                    schedule_id: id.clone(),
                    reason: "thaw".to_owned(),
                }),
            )
            .await
            .unwrap(),
    );
    let slot = DateTime::<Utc>::from_timestamp_millis(resumed.next_slot_unix_ms).unwrap();
    let reaper = system.reaper().with_clock(Arc::new(ManualClock::new(slot)));
    let fired = reaper.run_once().await.unwrap().schedules;
    assert_eq!(fired.len(), 1);
    let scan = store::admin::scan(&system.pool, fired[0].scan_id.unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(scan.client_id, tests::TEST_CLIENT_ID);
    let shown = schedule_of(
        client
            .schedules(
                &organization,
                Query::Show(v1::ScheduleRef {
                    schedule_id: id.clone(),
                }),
            )
            .await
            .unwrap(),
    );
    assert_eq!(shown.fires.len(), 1);
    assert_eq!(shown.fires[0].outcome, "admitted");
    assert_eq!(shown.fires[0].scan_id, scan.id.to_string());

    let deleted = schedule_of(
        client
            .schedules(
                &organization,
                Query::Delete(v1::ScheduleRef {
                    schedule_id: id.clone(),
                }),
            )
            .await
            .unwrap(),
    );
    assert!(deleted.deleted);
    let gone = client
        .schedules(
            &organization,
            Query::Show(v1::ScheduleRef { schedule_id: id }),
        )
        .await
        .unwrap();
    assert_eq!(gone.error.unwrap().code, "not_found");
    system.finish().await;
}

/// An organization holds at most `SCHEDULES_PER_ORGANIZATION_MAX` schedules, counted under its
/// row's lock, so concurrent creates never pass it.
#[tokio::test]
async fn an_organization_holds_at_most_its_limit_of_schedules_even_when_created_at_once() {
    let system = TestSystem::spawn().await;
    let organization = system.organization().await;
    let limit = usize::try_from(schedules::SCHEDULES_PER_ORGANIZATION_MAX).unwrap();
    // All but two, then four at once: two are created, two refused.
    for index in 0..limit - 2 {
        create(
            &system,
            &every_minute(organization, &format!("s{index}"), ScheduleOverlap::Skip),
        )
        .await;
    }
    let racing = (0..4).map(|index| {
        let (pool, schedule) = (
            system.pool.clone(),
            every_minute(
                organization,
                &format!("race-{index}"),
                ScheduleOverlap::Skip,
            ),
        );
        tokio::spawn(async move {
            schedules::create(&pool, &schedule, start(), "test", "")
                .await
                .unwrap()
                .unwrap()
        })
    });
    let outcomes: Vec<Created> = futures::future::join_all(racing)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let created = outcomes
        .iter()
        .filter(|outcome| matches!(outcome, Created::Created(_)))
        .count();
    assert_eq!(created, 2, "{outcomes:?}");
    assert!(
        outcomes
            .iter()
            .all(|outcome| matches!(outcome, Created::Created(_) | Created::TooMany))
    );
    let unknown = schedules::create(
        &system.pool,
        &every_minute(Uuid::now_v7(), "nowhere", ScheduleOverlap::Skip),
        start(),
        "test",
        "",
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(unknown, Created::UnknownOrganization);
    system.finish().await;
}
