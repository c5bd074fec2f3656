//! What each lane of work costs: PostgreSQL statements and NATS messages, counted per lane so
//! that cost per scan is a division of two counters.
//!
//! A *lane* is a bounded, named kind of work (`admission`, `dispatch`, one per reaper sweep…;
//! see [`lanes`]). Work runs inside [`in_lane`]; everything it does is charged to that lane:
//!
//! - **statements**: every statement sqlx sends through its executor (`COMMIT`, `ROLLBACK`
//!   and `RELEASE SAVEPOINT` included; sqlx 0.9 sends `BEGIN` and `SAVEPOINT` without the
//!   event, so they are not counted) emits a `sqlx::query` event in the task that sent it;
//!   [`StatementCounter`], a layer [`crate::init`] installs, counts those events against the
//!   task's lane. Counting does not depend on the log level: the layer has its own filter.
//! - **commits**: the subset of those statements that is a `COMMIT` (the event's `summary`
//!   field says so). A statement outside a transaction commits on its own and is not counted
//!   here, so this is the number of explicit transactions committed.
//! - **messages**: `bus` calls [`count_messages`] for every message it sends (publishes,
//!   requests, replies, acknowledgements) and receives (deliveries, requests, replies,
//!   PubAcks). JetStream pull requests and idle heartbeats are protocol traffic and are not
//!   counted.
//!
//! Work outside any lane is charged to [`lanes::OTHER`]; a growing `other` means a task was
//! spawned without [`inherit`].

use std::collections::BTreeMap;
use std::sync::LazyLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tracing::Subscriber;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::Context;

/// The lane names: the only values the `lane` label takes.
pub mod lanes {
    pub const ADMISSION: &str = "admission";
    pub const DISPATCH: &str = "dispatch";
    pub const INGESTION: &str = "ingestion";
    pub const ENRICHMENT: &str = "enrichment";
    /// Expired-lease recovery (retry or fail the task).
    pub const REAPER_RECOVERY: &str = "reaper.recovery";
    /// Attempts past their execution deadline.
    pub const REAPER_DEADLINES: &str = "reaper.deadlines";
    /// Tasks no live worker offers, failed after the pending deadline.
    pub const REAPER_STRANDED: &str = "reaper.stranded";
    /// Upload expiry.
    pub const REAPER_UPLOADS: &str = "reaper.uploads";
    /// Enrichment jobs whose claim lapsed.
    pub const REAPER_ENRICHMENT: &str = "reaper.enrichment";
    /// Retention pruning.
    pub const REAPER_RETENTION: &str = "reaper.retention";
    /// Due-retry wake-ups.
    pub const REAPER_RETRIES: &str = "reaper.retries";
    /// Firing the slots of recurring scan schedules.
    pub const REAPER_SCHEDULES: &str = "reaper.schedules";
    /// Vacuuming and analyzing the hot tables.
    pub const REAPER_UPKEEP: &str = "reaper.upkeep";
    /// Campaigning for and renewing the reaper's leader lease.
    pub const REAPER_ELECTION: &str = "reaper.election";
    /// Outbox relays (every service runs one; they share the table, so the lane is shared).
    pub const OUTBOX: &str = "outbox";
    /// A worker run in the same process (the demo, `palisade dev`, tests).
    pub const WORKER: &str = "worker";
    /// Readiness checks and the database gauges behind `/metrics`.
    pub const OBSERVABILITY: &str = "observability";
    /// Work outside any lane.
    pub const OTHER: &str = "other";

    pub const ALL: [&str; 18] = [
        ADMISSION,
        DISPATCH,
        INGESTION,
        ENRICHMENT,
        REAPER_RECOVERY,
        REAPER_DEADLINES,
        REAPER_STRANDED,
        REAPER_UPLOADS,
        REAPER_ENRICHMENT,
        REAPER_RETENTION,
        REAPER_RETRIES,
        REAPER_SCHEDULES,
        REAPER_UPKEEP,
        REAPER_ELECTION,
        OUTBOX,
        WORKER,
        OBSERVABILITY,
        OTHER,
    ];
}

/// Which way a counted message went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    Sent,
    Received,
}

impl Direction {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Sent => "sent",
            Self::Received => "received",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LaneLabels {
    pub lane: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MessageLabels {
    pub lane: &'static str,
    pub direction: &'static str,
}

/// The cost counter families. Cheap to clone (handles share their values).
#[derive(Debug, Clone, Default)]
pub struct CostMetrics {
    /// `palisade_db_statements_total{lane}`.
    pub statements: Family<LaneLabels, Counter>,
    /// `palisade_db_commits_total{lane}`: the statements that were a `COMMIT`.
    pub commits: Family<LaneLabels, Counter>,
    /// `palisade_nats_messages_total{lane,direction}`.
    pub messages: Family<MessageLabels, Counter>,
}

/// One lane's series, resolved once so that counting is one atomic add.
#[derive(Debug)]
struct LaneCounters {
    statements: Counter,
    commits: Counter,
    sent: Counter,
    received: Counter,
}

#[derive(Debug)]
struct Cost {
    metrics: CostMetrics,
    /// In [`lanes::ALL`] order.
    lanes: Vec<LaneCounters>,
}

static COST: LazyLock<Cost> = LazyLock::new(|| {
    let metrics = CostMetrics::default();
    // Every series exists from the start, so the set never depends on history.
    let lanes = lanes::ALL
        .into_iter()
        .map(|lane| {
            let message = |direction: Direction| {
                metrics
                    .messages
                    .get_or_create(&MessageLabels {
                        lane,
                        direction: direction.as_str(),
                    })
                    .clone()
            };
            LaneCounters {
                statements: metrics
                    .statements
                    .get_or_create(&LaneLabels { lane })
                    .clone(),
                commits: metrics.commits.get_or_create(&LaneLabels { lane }).clone(),
                sent: message(Direction::Sent),
                received: message(Direction::Received),
            }
        })
        .collect();
    Cost { metrics, lanes }
});

/// The process-wide cost counters (registered for `/metrics` by [`crate::metrics`]).
pub fn metrics() -> &'static CostMetrics {
    &COST.metrics
}

tokio::task_local! {
    /// The index of the current lane in [`lanes::ALL`].
    static LANE: usize;
}

fn index_of(lane: &'static str) -> usize {
    lanes::ALL
        .iter()
        .position(|name| *name == lane)
        .unwrap_or_else(|| panic!("lane {lane:?} is not in telemetry::cost::lanes::ALL"))
}

fn current_index() -> usize {
    LANE.try_with(|lane| *lane).unwrap_or(OTHER_INDEX)
}

/// [`lanes::OTHER`] is the last lane (a unit test checks).
const OTHER_INDEX: usize = lanes::ALL.len() - 1;

fn counters() -> &'static LaneCounters {
    &COST.lanes[current_index()]
}

/// Runs `work` with everything it does charged to `lane` (one of [`lanes`]; panics on a
/// name that is not, since its cost would be lost).
pub async fn in_lane<F: Future>(lane: &'static str, work: F) -> F::Output {
    LANE.scope(index_of(lane), work).await
}

/// `work` charged to the caller's lane: wrap futures handed to `tokio::spawn` with it, since
/// a spawned task does not inherit its spawner's lane.
pub fn inherit<F: Future>(work: F) -> impl Future<Output = F::Output> {
    LANE.scope(current_index(), work)
}

/// The lane the current task works in; [`lanes::OTHER`] outside any.
pub fn current() -> &'static str {
    lanes::ALL[current_index()]
}

/// Counts `n` messages sent or received by the current lane.
pub fn count_messages(direction: Direction, n: u64) {
    let lane = counters();
    match direction {
        Direction::Sent => lane.sent.inc_by(n),
        Direction::Received => lane.received.inc_by(n),
    };
}

/// The target of the event sqlx emits once per statement.
const SQLX_STATEMENT_TARGET: &str = "sqlx::query";

/// Counts every statement sqlx sends against the sending task's lane, and separately those
/// that are a `COMMIT`. Installed by [`crate::init`]; use [`statement_counter`] to get it with
/// its filter.
#[derive(Debug, Clone, Copy, Default)]
pub struct StatementCounter;

impl<S: Subscriber> Layer<S> for StatementCounter {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        if event.metadata().target() == SQLX_STATEMENT_TARGET {
            let lane = counters();
            lane.statements.inc();
            let mut commit = IsCommit(false);
            event.record(&mut commit);
            if commit.0 {
                lane.commits.inc();
            }
        }
    }
}

/// Whether a `sqlx::query` event's `summary` (the statement's first words) is `COMMIT`.
struct IsCommit(bool);

impl tracing::field::Visit for IsCommit {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "summary" {
            self.0 = value.trim().eq_ignore_ascii_case("COMMIT");
        }
    }

    fn record_debug(&mut self, _field: &tracing::field::Field, _value: &dyn std::fmt::Debug) {}
}

/// [`StatementCounter`] with a filter that lets through exactly sqlx's per-statement events
/// (logged at `debug`, or `warn` when slow), whatever `RUST_LOG` says for other layers.
pub fn statement_counter<S>() -> impl Layer<S> + Send + Sync
where
    S: Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    StatementCounter
        .with_filter(Targets::new().with_target(SQLX_STATEMENT_TARGET, LevelFilter::TRACE))
}

/// What one lane spent: its counters at one instant, or the difference of two.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LaneCost {
    pub statements: u64,
    /// The statements that were a `COMMIT`.
    pub commits: u64,
    pub messages_sent: u64,
    pub messages_received: u64,
}

impl LaneCost {
    /// What was spent between `earlier` and `self`.
    pub fn since(self, earlier: Self) -> Self {
        Self {
            statements: self.statements.saturating_sub(earlier.statements),
            commits: self.commits.saturating_sub(earlier.commits),
            messages_sent: self.messages_sent.saturating_sub(earlier.messages_sent),
            messages_received: self
                .messages_received
                .saturating_sub(earlier.messages_received),
        }
    }
}

/// Every lane's counters now.
pub fn snapshot() -> BTreeMap<&'static str, LaneCost> {
    lanes::ALL
        .into_iter()
        .map(|lane| {
            let cost = LaneCost {
                statements: statements(lane),
                commits: commits(lane),
                messages_sent: messages(lane, Direction::Sent),
                messages_received: messages(lane, Direction::Received),
            };
            (lane, cost)
        })
        .collect()
}

/// What each lane spent from snapshot `earlier` to snapshot `later`.
pub fn spent(
    earlier: &BTreeMap<&'static str, LaneCost>,
    later: &BTreeMap<&'static str, LaneCost>,
) -> BTreeMap<&'static str, LaneCost> {
    later
        .iter()
        .map(|(&lane, now)| {
            let then = earlier.get(lane).copied().unwrap_or_default();
            (lane, now.since(then))
        })
        .collect()
}

/// A lane's current statement count (tests and the demo's cost report read these directly).
pub fn statements(lane: &'static str) -> u64 {
    COST.lanes[index_of(lane)].statements.get()
}

/// A lane's current `COMMIT` count.
pub fn commits(lane: &'static str) -> u64 {
    COST.lanes[index_of(lane)].commits.get()
}

/// Messages of `lane` in `direction` so far.
pub fn messages(lane: &'static str, direction: Direction) -> u64 {
    let lane = &COST.lanes[index_of(lane)];
    match direction {
        Direction::Sent => lane.sent.get(),
        Direction::Received => lane.received.get(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_lane_holds_for_its_work_and_spawned_work_inherits_it_only_when_asked() {
        assert_eq!(current(), lanes::OTHER);
        in_lane(lanes::DISPATCH, async {
            assert_eq!(current(), lanes::DISPATCH);
            let inherited = tokio::spawn(inherit(async { current() })).await.unwrap();
            assert_eq!(inherited, lanes::DISPATCH);
            let orphan = tokio::spawn(async { current() }).await.unwrap();
            assert_eq!(orphan, lanes::OTHER);
            let before = messages(lanes::DISPATCH, Direction::Sent);
            count_messages(Direction::Sent, 2);
            assert_eq!(messages(lanes::DISPATCH, Direction::Sent), before + 2);
        })
        .await;
    }

    #[test]
    fn a_commit_is_counted_as_a_statement_and_a_commit() {
        use tracing_subscriber::layer::SubscriberExt as _;
        let subscriber = tracing_subscriber::registry().with(statement_counter());
        tracing::subscriber::with_default(subscriber, || {
            let (statements_before, commits_before) =
                (statements(lanes::OTHER), commits(lanes::OTHER));
            for summary in [
                "COMMIT",
                "UPDATE tasks SET state",
                "RELEASE SAVEPOINT _sqlx_savepoint_1",
            ] {
                tracing::debug!(target: "sqlx::query", summary, rows_affected = 0_u64);
            }
            assert_eq!(statements(lanes::OTHER), statements_before + 3);
            assert_eq!(commits(lanes::OTHER), commits_before + 1);
        });
    }

    #[test]
    fn other_is_the_last_lane() {
        assert_eq!(lanes::ALL[OTHER_INDEX], lanes::OTHER);
    }

    #[test]
    fn lane_names_are_distinct() {
        let mut names = lanes::ALL.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), lanes::ALL.len());
    }
}
