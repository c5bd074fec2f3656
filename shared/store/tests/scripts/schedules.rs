//! `fire::FireDue`: due schedules of every outcome fired alike set-wise, one by one and by
//! `decide_batch`.
//!
//! It has no case of a message the schema refuses: its one-by-one form decides each slot's
//! admission in a savepoint, but a slot whose admission fails fails the whole sweep (the
//! schedule row is validated when it is created, not when it fires).

use chrono::{DateTime, TimeDelta, Utc};
use store::fire::{Fire, FireDue};
use store::schedules::{self, Created, NewSchedule};
use store::states::{ScheduleFireOutcome, ScheduleOverlap};
use uuid::Uuid;

use crate::support::{Database, Form, Names, Request, commit, difference, rehearse};

/// When the schedules are created: a minute boundary far from the machine's clock.
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

const CLIENT: &str = "schedules";
const PLUGIN: &str = "tcp_connect";

/// A schedule named `name` firing every minute, created at [`start`].
async fn create(
    database: &Database,
    organization_id: Uuid,
    name: &str,
    target: &str,
    overlap: ScheduleOverlap,
) -> Uuid {
    let schedule = NewSchedule {
        organization_id,
        name: name.into(),
        target: target.into(),
        plugins: vec![PLUGIN.into()],
        priority: 0,
        execution_deadline_seconds: None,
        client_id: CLIENT.into(),
        cron: None,
        interval_seconds: Some(60),
        time_zone: "UTC".into(),
        jitter_seconds: 0,
        overlap,
        paused: false,
    };
    match schedules::create(&database.pool, &schedule, start(), "store tests", "")
        .await
        .expect("the schedule is decided")
        .expect("a valid schedule")
    {
        Created::Created(id) => id,
        other => panic!("not created: {other:?}"),
    }
}

/// Each fire as a line, schedules and scans named by `names`.
fn answers(names: &Names, fires: &[Fire]) -> Vec<String> {
    let mut names = names.clone();
    fires
        .iter()
        .map(|fire| {
            let outcome = fire
                .outcome
                .map_or("queued", |outcome: ScheduleFireOutcome| outcome.as_str());
            let scan = fire
                .scan_id
                .map_or_else(|| "no scan".into(), |scan_id| names.name(scan_id));
            format!(
                "{} {outcome} {scan} at minute {} ({} missed)",
                names.name(fire.schedule_id),
                (fire.slot - minute(0)).num_minutes(),
                fire.missed
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn due_schedules_are_fired_alike_in_either_form_and_by_decide_batch() {
    let database = Database::create().await;
    let organization = database.organization(None).await;
    // One scan in the last hour spends this organization's quota.
    let quota_organization = database.organization(Some(1)).await;
    let mut names = Names::default();

    let mut schedule = async |organization_id, name: &str, target, overlap| {
        let id = create(&database, organization_id, name, target, overlap).await;
        names.know(id, name);
        id
    };
    schedule(
        organization,
        "fresh",
        "fresh.example",
        ScheduleOverlap::Skip,
    )
    .await;
    schedule(
        organization,
        "skipping",
        "busy.example",
        ScheduleOverlap::Skip,
    )
    .await;
    schedule(
        organization,
        "queueing",
        "busy.example",
        ScheduleOverlap::Queue,
    )
    .await;
    let replayed = schedule(
        organization,
        "replayed",
        "replay.example",
        ScheduleOverlap::Skip,
    )
    .await;
    schedule(
        quota_organization,
        "over-quota",
        "quota.example",
        ScheduleOverlap::Skip,
    )
    .await;

    // The scans already there: the busy target's, the replayed slot's (requested under the key
    // its fire will use, as a fire whose sweep committed it would have), the quota's.
    let now = minute(5) + TimeDelta::seconds(10);
    let earlier = database
        .admitted(&[
            Request::new(organization, "busy.example", &[PLUGIN]),
            Request::new(organization, "replay.example", &[PLUGIN])
                .by_client(CLIENT, &schedules::idempotency_key(replayed, minute(5))),
            Request::new(quota_organization, "other.example", &[PLUGIN]),
        ])
        .await;
    names.know(earlier[0].0, "busy");
    names.know(earlier[1].0, "replayed-earlier");

    let script = FireDue {
        subjects: &database.subjects,
        now,
        limit: 100,
        max_attempts: 3,
        trace_context: &|_, _| None,
    };
    // In the order the due schedules are read (by fire time, then as stored).
    let mut expected = vec![
        "fresh admitted new#0 at minute 5 (4 missed)",
        "skipping skipped busy at minute 5 (4 missed)",
        "queueing queued busy at minute 5 (4 missed)",
        "replayed duplicate replayed-earlier at minute 5 (4 missed)",
        "over-quota refused no scan at minute 5 (4 missed)",
    ];
    expected.sort_unstable();
    let sorted = |mut lines: Vec<String>| {
        lines.sort_unstable();
        lines
    };
    let before = database.tally().await;

    let set_wise = rehearse(&database, &script, Form::SetWise)
        .await
        .expect("fired set-wise");
    assert_eq!(sorted(answers(&names, &set_wise.outcomes)), expected);
    // One scan admitted; four slots recorded, the queued one not; those four schedules moved
    // to minute 6, the queued one left at its first slot.
    let written = difference(&before, &set_wise.tally);
    let next_slot = |slot: DateTime<Utc>| format!("scan_schedules next_slot {}", slot.timestamp());
    let recorded: Vec<(String, i64)> = vec![
        ("scans pending".into(), 1),
        ("schedule_fires admitted".into(), 1),
        ("schedule_fires duplicate".into(), 1),
        ("schedule_fires refused".into(), 1),
        ("schedule_fires skipped".into(), 1),
        (next_slot(minute(1)), -4),
        (next_slot(minute(6)), 4),
    ];
    for (what, rows) in recorded {
        assert_eq!(written.get(&what), Some(&rows), "{what}: {written:?}");
    }

    let one_by_one = rehearse(&database, &script, Form::OneByOne)
        .await
        .expect("fired one by one");
    assert_eq!(
        answers(&names, &one_by_one.outcomes),
        answers(&names, &set_wise.outcomes)
    );
    assert_eq!(one_by_one.tally, set_wise.tally, "the same rows written");
    assert_eq!(one_by_one.events, set_wise.events);

    let committed = commit(&database, &script).await;
    assert_eq!(
        answers(&names, &committed.outcomes),
        answers(&names, &set_wise.outcomes)
    );
    assert_eq!(committed.tally, set_wise.tally);
    assert_eq!(committed.events, set_wise.events);

    // Fired: only the queued slot is due again at the same clock.
    let again = commit(&database, &script).await;
    assert_eq!(
        answers(&names, &again.outcomes),
        ["queueing queued busy at minute 5 (4 missed)"]
    );
    database.drop().await;
}
