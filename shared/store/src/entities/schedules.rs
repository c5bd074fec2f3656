//! Recurring scans (issue 27, item 1): a schedule submits one scan request at every slot of a
//! cron expression, read in the schedule's time zone, or of an interval (slots at multiples of
//! it since 1970-01-01T00:00Z, so `every 1h` fires on the hour).
//!
//! Here: the schedules' slots ([`Timing`], the catch-up rule, jitter) and their reads and
//! writes. The reaper's leader fires due schedules with [`crate::fire::FireDue`], whose module
//! holds the firing rules.

use std::str::FromStr as _;

use chrono::{DateTime, SubsecRound as _, TimeDelta, Utc};
use serde::Serialize;
use sha2::{Digest as _, Sha256};
use uuid::Uuid;

use crate::StoreError;
use crate::sql;
use crate::states::ScheduleOverlap;

/// Slots passed over by the catch-up rule that one fire record counts; beyond it the count
/// stops (a minutely cron after a week without a leader passes over about 10 000).
pub const CATCH_UP_COUNT_MAX: i64 = 10_000;
/// The shortest interval a schedule may have.
pub const INTERVAL_SECONDS_MIN: i64 = 60;
/// The most schedules one organization may have.
pub const SCHEDULES_PER_ORGANIZATION_MAX: i64 = 1_000;
/// The longest jitter a schedule may have: a day.
pub const JITTER_SECONDS_MAX: i32 = 86_400;

/// A schedule definition refused before anything was written; the message says what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidSchedule(pub String);

/// When a schedule's slots fall.
#[derive(Debug, Clone)]
pub enum Timing {
    /// A five-field cron expression (minute hour day-of-month month day-of-week; `@daily` and
    /// the other nicknames too), read in a time zone of the IANA database.
    Cron {
        cron: Box<croner::Cron>,
        time_zone: chrono_tz::Tz,
    },
    /// Every so many seconds, at multiples of it since the Unix epoch.
    Every { seconds: i64 },
}

impl Timing {
    /// `expression` read in `time_zone` (an IANA name such as `Europe/Berlin`, or `UTC`).
    pub fn cron(expression: &str, time_zone: &str) -> Result<Self, InvalidSchedule> {
        let time_zone = chrono_tz::Tz::from_str(time_zone).map_err(|_| {
            InvalidSchedule(format!(
                "time zone {time_zone:?} is not in the IANA database; name one such as UTC or \
                 Europe/Berlin"
            ))
        })?;
        let cron = croner::Cron::from_str(expression).map_err(|error| {
            InvalidSchedule(format!(
                "cron expression {expression:?} does not parse ({error}); write five fields: \
                 minute hour day-of-month month day-of-week, e.g. \"0 3 * * *\""
            ))
        })?;
        Ok(Self::Cron {
            cron: Box::new(cron),
            time_zone,
        })
    }

    /// Every `seconds` (at least [`INTERVAL_SECONDS_MIN`]).
    pub fn every(seconds: i64) -> Result<Self, InvalidSchedule> {
        if seconds < INTERVAL_SECONDS_MIN {
            return Err(InvalidSchedule(format!(
                "an interval of {seconds} s is below the minimum of {INTERVAL_SECONDS_MIN} s"
            )));
        }
        Ok(Self::Every { seconds })
    }

    /// The timing a stored schedule row names.
    pub(crate) fn of(
        row_cron: Option<&str>,
        interval_seconds: Option<i64>,
        time_zone: &str,
    ) -> Result<Self, StoreError> {
        let timing = match (row_cron, interval_seconds) {
            (Some(expression), None) => Self::cron(expression, time_zone),
            (None, Some(seconds)) => Self::every(seconds),
            _ => Err(InvalidSchedule(
                "neither or both of cron and interval".into(),
            )),
        };
        timing.map_err(|error| StoreError::Corrupt(format!("stored schedule: {error}")))
    }

    /// The first slot strictly after `after`. Slots fall on whole seconds.
    pub fn next_after(&self, after: DateTime<Utc>) -> Result<DateTime<Utc>, InvalidSchedule> {
        // croner keeps the fraction of a second it is given.
        let after = after.trunc_subsecs(0);
        match self {
            Self::Cron { cron, time_zone } => cron
                .find_next_occurrence(&after.with_timezone(time_zone), false)
                .map(|next| next.with_timezone(&Utc))
                .map_err(|error| InvalidSchedule(format!("no slot after {after}: {error}"))),
            Self::Every { seconds } => {
                let next = (after.timestamp().div_euclid(*seconds) + 1) * seconds;
                DateTime::from_timestamp(next, 0)
                    .ok_or_else(|| InvalidSchedule(format!("no slot after {after}")))
            }
        }
    }

    /// The catch-up rule for a schedule whose oldest unfired slot is `next_slot`, at `now`
    /// (not before `next_slot`): the newest slot not after `now`, and how many slots from
    /// `next_slot` on it passes over (counted up to [`CATCH_UP_COUNT_MAX`]).
    pub fn catch_up(
        &self,
        next_slot: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<(DateTime<Utc>, i64), InvalidSchedule> {
        if now < next_slot {
            return Ok((next_slot, 0));
        }
        match self {
            Self::Every { seconds } => {
                let newest = now.timestamp().div_euclid(*seconds) * seconds;
                let missed = (newest - next_slot.timestamp()).div_euclid(*seconds).max(0);
                let newest = DateTime::from_timestamp(newest, 0)
                    .ok_or_else(|| InvalidSchedule(format!("no slot before {now}")))?;
                Ok((newest.max(next_slot), missed.min(CATCH_UP_COUNT_MAX)))
            }
            Self::Cron { .. } => {
                let mut slot = next_slot;
                let mut missed = 0;
                loop {
                    let next = self.next_after(slot)?;
                    if next > now {
                        return Ok((slot, missed));
                    }
                    slot = next;
                    missed += 1;
                    if missed >= CATCH_UP_COUNT_MAX {
                        return self
                            .newest_cron_slot(now)
                            .map(|newest| (newest.max(slot), missed));
                    }
                }
            }
        }
    }

    /// The newest cron slot not after `now`.
    fn newest_cron_slot(&self, now: DateTime<Utc>) -> Result<DateTime<Utc>, InvalidSchedule> {
        match self {
            Self::Cron { cron, time_zone } => cron
                .find_previous_occurrence(&now.trunc_subsecs(0).with_timezone(time_zone), true)
                .map(|slot| slot.with_timezone(&Utc))
                .map_err(|error| InvalidSchedule(format!("no slot before {now}: {error}"))),
            Self::Every { .. } => unreachable!("called for cron timings only"),
        }
    }
}

/// When `slot` of schedule `id` fires: the slot plus a delay in `0..=jitter_seconds` seconds
/// fixed by the pair (a hash of it), so every replica computes the same time.
pub fn fire_time(id: Uuid, slot: DateTime<Utc>, jitter_seconds: i32) -> DateTime<Utc> {
    if jitter_seconds <= 0 {
        return slot;
    }
    let digest = Sha256::new()
        .chain_update(id.as_bytes())
        .chain_update(slot.timestamp().to_be_bytes())
        .finalize();
    let value = u64::from_be_bytes(digest[..8].try_into().expect("eight bytes"));
    let delay = value % (u64::from(jitter_seconds.unsigned_abs()) + 1);
    slot + TimeDelta::seconds(i64::try_from(delay).expect("at most a day"))
}

/// The idempotency key of a slot's scan request: names the schedule and the slot.
pub fn idempotency_key(id: Uuid, slot: DateTime<Utc>) -> String {
    format!(
        "schedule:{id}:{}",
        slot.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    )
}

/// A schedule to create.
#[derive(Debug, Clone)]
pub struct NewSchedule {
    pub organization_id: Uuid,
    pub name: String,
    pub target: String,
    pub plugins: Vec<String>,
    pub priority: i32,
    pub execution_deadline_seconds: Option<i32>,
    /// The client its scans are requested as: a registered client that is revoked has them
    /// refused.
    pub client_id: String,
    /// `Some` for a cron schedule, with `time_zone`.
    pub cron: Option<String>,
    pub interval_seconds: Option<i64>,
    pub time_zone: String,
    pub jitter_seconds: i32,
    pub overlap: ScheduleOverlap,
    pub paused: bool,
}

impl NewSchedule {
    /// Its timing, or what is wrong with it.
    pub fn timing(&self) -> Result<Timing, InvalidSchedule> {
        if !(0..=JITTER_SECONDS_MAX).contains(&self.jitter_seconds) {
            return Err(InvalidSchedule(format!(
                "jitter of {} s is outside 0..={JITTER_SECONDS_MAX} s",
                self.jitter_seconds
            )));
        }
        match (&self.cron, self.interval_seconds) {
            (Some(expression), None) => Timing::cron(expression, &self.time_zone),
            (None, Some(seconds)) => Timing::every(seconds),
            _ => Err(InvalidSchedule(
                "give exactly one of a cron expression and an interval".into(),
            )),
        }
    }
}

/// What [`create`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Created {
    Created(Uuid),
    UnknownOrganization,
    NameTaken,
    /// The organization has [`SCHEDULES_PER_ORGANIZATION_MAX`] schedules.
    TooMany,
}

/// Creates a schedule whose first slot is the first after `now`, unless its organization is
/// unknown, has one of that name, or has [`SCHEDULES_PER_ORGANIZATION_MAX`] already.
pub async fn create(
    pool: &sqlx::PgPool,
    schedule: &NewSchedule,
    now: DateTime<Utc>,
    by: &str,
    reason: &str,
) -> Result<Result<Created, InvalidSchedule>, StoreError> {
    let timing = match schedule.timing() {
        Ok(timing) => timing,
        Err(invalid) => return Ok(Err(invalid)),
    };
    let next_slot = match timing.next_after(now) {
        Ok(slot) => slot,
        Err(invalid) => return Ok(Err(invalid)),
    };
    let id = Uuid::now_v7();
    let mut tx = pool.begin().await?;
    let organization: Option<Uuid> = sql::scan_schedules::LockOrganization {
        organization_id: schedule.organization_id,
    }
    .query_scalar()
    .fetch_optional(&mut *tx)
    .await?;
    if organization.is_none() {
        return Ok(Ok(Created::UnknownOrganization));
    }
    let created: Option<Uuid> = sql::scan_schedules::Create {
        id,
        organization_id: schedule.organization_id,
        name: &schedule.name,
        target: &schedule.target,
        plugins: &schedule.plugins,
        priority: schedule.priority,
        execution_deadline_seconds: schedule.execution_deadline_seconds,
        client_id: &schedule.client_id,
        cron: &schedule.cron,
        interval_seconds: schedule.interval_seconds,
        time_zone: &schedule.time_zone,
        jitter_seconds: schedule.jitter_seconds,
        overlap: schedule.overlap.as_str(),
        paused: schedule.paused,
        next_slot,
        next_fire_at: fire_time(id, next_slot, schedule.jitter_seconds),
        who: by,
        why: reason,
        schedules_per_organization_max: SCHEDULES_PER_ORGANIZATION_MAX,
    }
    .query_scalar()
    .fetch_optional(&mut *tx)
    .await?;
    let outcome = if created.is_some() {
        Created::Created(id)
    } else {
        let count: i64 = sql::scan_schedules::Count {
            organization_id: schedule.organization_id,
        }
        .query_scalar()
        .fetch_one(&mut *tx)
        .await?;
        if count >= SCHEDULES_PER_ORGANIZATION_MAX {
            Created::TooMany
        } else {
            Created::NameTaken
        }
    };
    tx.commit().await?;
    Ok(Ok(outcome))
}

/// A schedule as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct ScheduleRow {
    pub id: Uuid,
    pub organization_id: Uuid,
    pub name: String,
    pub target: String,
    pub plugins: Vec<String>,
    pub priority: i32,
    pub execution_deadline_seconds: Option<i32>,
    pub client_id: String,
    pub cron: Option<String>,
    pub interval_seconds: Option<i64>,
    pub time_zone: String,
    pub jitter_seconds: i32,
    pub overlap: String,
    pub paused: bool,
    pub next_slot: DateTime<Utc>,
    pub next_fire_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub created_by: String,
    pub updated_at: DateTime<Utc>,
    pub updated_by: String,
    pub update_reason: String,
}

impl ScheduleRow {
    fn timing(&self) -> Result<Timing, StoreError> {
        Timing::of(self.cron.as_deref(), self.interval_seconds, &self.time_zone)
    }
}

/// One schedule.
pub async fn get(pool: &sqlx::PgPool, id: Uuid) -> Result<Option<ScheduleRow>, StoreError> {
    Ok(sql::scan_schedules::Get { id }
        .query_as()
        .fetch_optional(pool)
        .await?)
}

/// A page of schedules in creation order, of one organization or all.
pub async fn list(
    pool: &sqlx::PgPool,
    organization_id: Option<Uuid>,
    after: Option<Uuid>,
    limit: i64,
) -> Result<Vec<ScheduleRow>, StoreError> {
    Ok(sql::scan_schedules::List {
        organization_id,
        after_id: after,
        limit,
    }
    .query_as()
    .fetch_all(pool)
    .await?)
}

/// A fired slot as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct FireRow {
    pub slot: DateTime<Utc>,
    pub fired_at: DateTime<Utc>,
    pub outcome: String,
    pub scan_id: Option<Uuid>,
    pub missed_before: i64,
    pub detail: String,
}

/// A schedule's latest fired slots, newest first.
pub async fn fires(pool: &sqlx::PgPool, id: Uuid, limit: i64) -> Result<Vec<FireRow>, StoreError> {
    Ok(sql::schedule_fires::Recent {
        schedule_id: id,
        limit,
    }
    .query_as()
    .fetch_all(pool)
    .await?)
}

/// Pauses (`true`) or resumes a schedule; resuming moves it to its first slot after `now`.
/// `None` when there is no such schedule.
pub async fn set_paused(
    pool: &sqlx::PgPool,
    id: Uuid,
    paused: bool,
    now: DateTime<Utc>,
    by: &str,
    reason: &str,
) -> Result<Option<ScheduleRow>, StoreError> {
    let Some(schedule) = get(pool, id).await? else {
        return Ok(None);
    };
    let (next_slot, next_fire_at) = if paused {
        (schedule.next_slot, schedule.next_fire_at)
    } else {
        let slot = schedule
            .timing()?
            .next_after(now)
            .map_err(|error| StoreError::Corrupt(error.to_string()))?;
        (slot, fire_time(id, slot, schedule.jitter_seconds))
    };
    let changed: Option<Uuid> = sql::scan_schedules::SetPaused {
        id,
        paused,
        next_slot,
        next_fire_at,
        who: by,
        why: reason,
    }
    .query_scalar()
    .fetch_optional(pool)
    .await?;
    match changed {
        Some(_) => get(pool, id).await,
        None => Ok(None),
    }
}

/// Deletes a schedule and its fire records; whether it existed.
pub async fn delete(pool: &sqlx::PgPool, id: Uuid) -> Result<bool, StoreError> {
    let deleted: Option<Uuid> = sql::scan_schedules::Delete { id }
        .query_scalar()
        .fetch_optional(pool)
        .await?;
    Ok(deleted.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn interval_slots_fall_on_multiples_since_the_epoch() {
        let hourly = Timing::every(3_600).unwrap();
        assert_eq!(
            hourly.next_after(at("2026-12-05T10:20:00Z")).unwrap(),
            at("2026-12-05T11:00:00Z")
        );
        assert_eq!(
            hourly.next_after(at("2026-12-05T11:00:00Z")).unwrap(),
            at("2026-12-05T12:00:00Z"),
            "strictly after"
        );
        assert!(Timing::every(59).is_err());
    }

    #[test]
    fn cron_slots_are_read_in_the_time_zone() {
        let berlin = Timing::cron("0 3 * * *", "Europe/Berlin").unwrap();
        // 03:00 in Berlin in winter is 02:00 UTC.
        assert_eq!(
            berlin.next_after(at("2026-12-05T10:00:00.317Z")).unwrap(),
            at("2026-12-06T02:00:00Z"),
            "on the whole second"
        );
        assert!(Timing::cron("0 3 * *", "UTC").is_err(), "four fields");
        assert!(Timing::cron("0 3 * * *", "Mars/Olympus").is_err());
    }

    #[test]
    fn the_catch_up_rule_fires_the_newest_due_slot_and_counts_the_rest() {
        let every_minute = Timing::every(60).unwrap();
        let next = at("2026-12-05T10:00:00Z");
        assert_eq!(
            every_minute
                .catch_up(next, at("2026-12-05T10:00:30Z"))
                .unwrap(),
            (next, 0),
            "on time: the slot itself"
        );
        assert_eq!(
            every_minute
                .catch_up(next, at("2026-12-05T10:09:10Z"))
                .unwrap(),
            (at("2026-12-05T10:09:00Z"), 9)
        );
        let cron = Timing::cron("*/5 * * * *", "UTC").unwrap();
        assert_eq!(
            cron.catch_up(next, at("2026-12-05T10:17:00Z")).unwrap(),
            (at("2026-12-05T10:15:00Z"), 3)
        );
        // A week of minutes: the count stops, the slot is still the newest.
        let minutely = Timing::cron("* * * * *", "UTC").unwrap();
        let (slot, missed) = minutely.catch_up(next, at("2026-12-12T10:00:30Z")).unwrap();
        assert_eq!(slot, at("2026-12-12T10:00:00Z"));
        assert_eq!(missed, CATCH_UP_COUNT_MAX);
    }

    #[test]
    fn jitter_is_fixed_per_schedule_and_slot_and_bounded() {
        let id = Uuid::now_v7();
        let slot = at("2026-12-05T10:00:00Z");
        assert_eq!(fire_time(id, slot, 0), slot);
        let delayed = fire_time(id, slot, 300);
        assert_eq!(delayed, fire_time(id, slot, 300), "the same every time");
        assert!(delayed >= slot && delayed <= slot + TimeDelta::seconds(300));
        let spread: std::collections::HashSet<DateTime<Utc>> = (0..20)
            .map(|minute| {
                fire_time(id, slot + TimeDelta::minutes(minute), 300) - TimeDelta::minutes(minute)
            })
            .collect();
        assert!(spread.len() > 1, "slots get different delays");
    }
}
