//! The reaper's counters on `/metrics`, registered in the process-wide registry the first time
//! one is used: the slots of recurring scan schedules fired, by outcome. Only the leader fires,
//! so the sum over replicas is the total. The next fire time is a database gauge
//! (`palisade_schedule_next_fire_timestamp_seconds`, `runtime::metrics`).

use std::sync::LazyLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use store::fire::Fire;
use store::states::ScheduleFireOutcome;

/// The `outcome` label of a slot still waiting behind its target's active scan.
pub const QUEUED: &str = "queued";
/// The `outcome` label of slots the catch-up rule passed over.
pub const MISSED: &str = "missed";

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

static FIRES: LazyLock<Family<OutcomeLabels, Counter>> = LazyLock::new(|| {
    let fires = Family::<OutcomeLabels, Counter>::default();
    let outcomes = ScheduleFireOutcome::ALL
        .iter()
        .map(|outcome| outcome.as_str());
    for outcome in outcomes.chain([QUEUED, MISSED]) {
        let _ = fires.get_or_create(&OutcomeLabels { outcome });
    }
    telemetry::metrics::registry().register(
        "schedule_fires",
        "Slots of recurring scan schedules by outcome: admitted, duplicate (the slot's key \
         named a scan already), skipped (overlap policy skip, the target busy), refused (quota, \
         revoked client), queued (a sweep found a queued slot's target still busy), missed \
         (older slots the catch-up rule passed over, counted when the newest fired)",
        fires.clone(),
    );
    fires
});

/// Counts one sweep's fires.
pub fn record_fires(fires: &[Fire]) {
    for fire in fires {
        let outcome = fire.outcome.map_or(QUEUED, ScheduleFireOutcome::as_str);
        FIRES.get_or_create(&OutcomeLabels { outcome }).inc();
        if fire.outcome.is_some() && fire.missed > 0 {
            FIRES
                .get_or_create(&OutcomeLabels { outcome: MISSED })
                .inc_by(fire.missed.unsigned_abs());
        }
    }
}

/// Registers the counters (at start, so they show before the first fire).
pub fn register() {
    LazyLock::force(&FIRES);
}
