//! Firing due schedules (issue 27, item 1): [`FireDue`], the reaper leader's decision script,
//! run by [`crate::decide_batch`] in one transaction:
//!
//! 1. one statement reads the active schedules whose next fire time (their next slot plus its
//!    jitter) has come, locked `FOR UPDATE SKIP LOCKED`;
//! 2. each one's slot is chosen by the **catch-up rule**: the newest slot not after now fires,
//!    late if need be, once; older unfired slots (due while no leader swept: every replica
//!    down, a long sweep, the clock stepped forward) are passed over and counted on the fired
//!    slot's record (`missed_before`, at most [`crate::schedules::CATCH_UP_COUNT_MAX`]
//!    counted);
//! 3. the slots' scan requests go through the ordinary admission script ([`crate::admit`]:
//!    quota, one active scan per target, a revoked client refused), each with the idempotency
//!    key `schedule:<schedule id>:<slot>`, so a slot can never admit two scans;
//! 4. one statement records each fired slot in `schedule_fires`, whose key is the slot, and one
//!    moves each fired schedule to its first slot after the fired one.
//!
//! A slot is fired in the transaction that moves its schedule past it, so a leader change, a
//! crash or a restart mid-fire either fired it (and the next leader reads the next slot) or did
//! not (and the next leader fires it): never twice, never skipped unrecorded. A clock stepped
//! back fires nothing until it passes the stored next slot again.
//!
//! Overlap: a slot whose target still has an active scan is recorded `skipped` (policy `skip`),
//! or (policy `queue`) not recorded and not moved past, so every sweep tries it again until the
//! target is free; slots that pass meanwhile fold into it by the catch-up rule (one queued fire
//! at most). Any other refusal (`quota_exceeded`, `client_revoked`) is recorded `refused` and
//! the schedule moves on.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use messages::{ErrorCode, Subjects, v1};
use sqlx::{Postgres, Transaction};
use uuid::Uuid;

use crate::StoreError;
use crate::admit::{self, AdmitOutcome, AdmitParams};
use crate::outbox::Staged;
use crate::schedules::{InvalidSchedule, Timing, fire_time, idempotency_key};
use crate::sql;
use crate::states::{ScheduleFireOutcome, ScheduleOverlap};

/// A due schedule, as the firing transaction reads it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct DueSchedule {
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
    pub next_slot: DateTime<Utc>,
}

/// What firing one due schedule did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fire {
    pub schedule_id: Uuid,
    pub slot: DateTime<Utc>,
    /// `None`: queued behind the target's active scan (policy `queue`); tried again next sweep.
    pub outcome: Option<ScheduleFireOutcome>,
    /// The admitted scan, the one its key named, or the target's active one.
    pub scan_id: Option<Uuid>,
    /// Older slots the catch-up rule passed over.
    pub missed: i64,
}

/// The firing script over the schedules due at `now`, for [`crate::decide_batch`].
pub struct FireDue<'a> {
    pub subjects: &'a Subjects,
    /// The reaper's clock: tests control it.
    pub now: DateTime<Utc>,
    pub limit: i64,
    /// The task attempt budget of the admitted scans (`PALISADE_MAX_ATTEMPTS`).
    pub max_attempts: i32,
    /// The trace context each slot's scan joins (the caller's span for the fire), if any.
    pub trace_context: &'a (dyn Fn(&DueSchedule, DateTime<Utc>) -> Option<String> + Sync),
}

impl crate::Script for FireDue<'_> {
    type Outcomes = Vec<Fire>;

    async fn set_wise(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        staged: &mut Staged,
    ) -> Result<Self::Outcomes, StoreError> {
        self.fire(tx, staged, false).await
    }

    fn one_by_one(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        staged: &mut Staged,
    ) -> impl Future<Output = Result<Self::Outcomes, StoreError>> + Send {
        self.fire(tx, staged, true)
    }
}

/// One due schedule's slot and what it asks admission.
struct Planned {
    schedule: DueSchedule,
    slot: DateTime<Utc>,
    missed: i64,
    next_slot: DateTime<Utc>,
    key: String,
    fingerprint: String,
    trace_context: Option<String>,
}

impl FireDue<'_> {
    async fn fire(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        staged: &mut Staged,
        one_by_one: bool,
    ) -> Result<Vec<Fire>, StoreError> {
        let due: Vec<DueSchedule> = sql::scan_schedules::Due {
            now: self.now,
            limit: self.limit,
        }
        .query_as()
        .fetch_all(&mut **tx)
        .await?;
        if due.is_empty() {
            return Ok(Vec::new());
        }
        let planned = due
            .into_iter()
            .map(|schedule| self.plan(schedule))
            .collect::<Result<Vec<_>, _>>()?;
        let requests: Vec<AdmitParams<'_>> = planned
            .iter()
            .map(|plan| AdmitParams {
                organization_id: plan.schedule.organization_id,
                target: &plan.schedule.target,
                plugins: &plan.schedule.plugins,
                priority: plan.schedule.priority,
                execution_deadline_seconds: plan.schedule.execution_deadline_seconds,
                client_id: &plan.schedule.client_id,
                idempotency_key: &plan.key,
                fingerprint: &plan.fingerprint,
                max_attempts: self.max_attempts,
                trace_context: plan.trace_context.as_deref(),
            })
            .collect();
        let outcomes = if one_by_one {
            admit::decide_each(tx, staged, self.subjects, &requests)
                .await?
                .into_iter()
                .collect::<Result<Vec<_>, _>>()?
        } else {
            admit::decide(tx, staged, self.subjects, &requests).await?
        };
        let fires: Vec<(Fire, String)> = planned
            .iter()
            .zip(outcomes)
            .map(|(plan, outcome)| fire_of(plan, outcome))
            .collect();
        record(tx, self.now, &planned, &fires).await?;
        Ok(fires.into_iter().map(|(fire, _)| fire).collect())
    }

    fn plan(&self, schedule: DueSchedule) -> Result<Planned, StoreError> {
        let timing = Timing::of(
            schedule.cron.as_deref(),
            schedule.interval_seconds,
            &schedule.time_zone,
        )?;
        let corrupt = |error: InvalidSchedule| StoreError::Corrupt(error.to_string());
        let (slot, missed) = timing
            .catch_up(schedule.next_slot, self.now)
            .map_err(corrupt)?;
        let next_slot = timing.next_after(slot).map_err(corrupt)?;
        let key = idempotency_key(schedule.id, slot);
        let fingerprint = messages::scan_request_fingerprint(&v1::ScanRequest {
            schema_version: 1,
            organization_id: schedule.organization_id.to_string(),
            target: schedule.target.clone(),
            plugins: schedule.plugins.clone(),
            priority: schedule.priority,
            execution_deadline_seconds: schedule
                .execution_deadline_seconds
                .map_or(0, i32::unsigned_abs),
            client_id: schedule.client_id.clone(),
            idempotency_key: key.clone(),
        });
        let trace_context = (self.trace_context)(&schedule, slot);
        Ok(Planned {
            schedule,
            slot,
            missed,
            next_slot,
            key,
            fingerprint,
            trace_context,
        })
    }
}

/// A slot's fire from admission's answer, with the record's detail.
fn fire_of(plan: &Planned, outcome: AdmitOutcome) -> (Fire, String) {
    let (outcome, scan_id, detail) = match outcome {
        AdmitOutcome::Admitted { scan_id, .. } => (
            Some(ScheduleFireOutcome::Admitted),
            Some(scan_id),
            String::new(),
        ),
        AdmitOutcome::Duplicate { scan_id, .. } => (
            Some(ScheduleFireOutcome::Duplicate),
            Some(scan_id),
            String::new(),
        ),
        AdmitOutcome::Refused(error)
            if error.error_code() == Some(ErrorCode::ScanAlreadyActive) =>
        {
            let active = error.active_scan_id.parse::<Uuid>().ok();
            let outcome = match ScheduleOverlap::parse(&plan.schedule.overlap) {
                Some(ScheduleOverlap::Queue) => None,
                _ => Some(ScheduleFireOutcome::Skipped),
            };
            (
                outcome,
                active,
                format!("{}: {}", error.code, error.message),
            )
        }
        AdmitOutcome::Refused(error) => (
            Some(ScheduleFireOutcome::Refused),
            None,
            format!("{}: {}", error.code, error.message),
        ),
    };
    (
        Fire {
            schedule_id: plan.schedule.id,
            slot: plan.slot,
            outcome,
            scan_id,
            missed: plan.missed,
        },
        detail,
    )
}

/// Records the fired slots and moves their schedules past them, one statement each; a slot
/// queued behind its target's active scan is neither.
async fn record(
    tx: &mut Transaction<'static, Postgres>,
    now: DateTime<Utc>,
    planned: &[Planned],
    fires: &[(Fire, String)],
) -> Result<(), StoreError> {
    let mut by_id: HashMap<Uuid, &Planned> = HashMap::new();
    for plan in planned {
        by_id.insert(plan.schedule.id, plan);
    }
    let fired: Vec<(&Fire, &String, ScheduleFireOutcome)> = fires
        .iter()
        .filter_map(|(fire, detail)| fire.outcome.map(|outcome| (fire, detail, outcome)))
        .collect();
    if fired.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = fired.iter().map(|(fire, ..)| fire.schedule_id).collect();
    let slots: Vec<DateTime<Utc>> = fired.iter().map(|(fire, ..)| fire.slot).collect();
    let fired_at = vec![now; fired.len()];
    let outcomes: Vec<&str> = fired.iter().map(|(.., outcome)| outcome.as_str()).collect();
    let scans: Vec<Option<Uuid>> = fired.iter().map(|(fire, ..)| fire.scan_id).collect();
    let missed: Vec<i64> = fired.iter().map(|(fire, ..)| fire.missed).collect();
    let details: Vec<&str> = fired.iter().map(|(_, detail, _)| detail.as_str()).collect();
    sql::schedule_fires::Record {
        schedule_ids: &ids,
        slots: &slots,
        fired_ats: &fired_at,
        outcomes: &outcomes,
        scan_ids: &scans,
        skipped_slots: &missed,
        details: &details,
    }
    .query()
    .execute(&mut **tx)
    .await?;
    let next_slots: Vec<DateTime<Utc>> = ids.iter().map(|id| by_id[id].next_slot).collect();
    let next_fire: Vec<DateTime<Utc>> = ids
        .iter()
        .zip(&next_slots)
        .map(|(id, slot)| fire_time(*id, *slot, by_id[id].schedule.jitter_seconds))
        .collect();
    sql::scan_schedules::Advance {
        schedule_ids: &ids,
        next_slots: &next_slots,
        next_fire_ats: &next_fire,
    }
    .query()
    .execute(&mut **tx)
    .await?;
    Ok(())
}
