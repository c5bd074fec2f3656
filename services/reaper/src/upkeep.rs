//! The reaper's leader tends palisade's hot tables (`store::upkeep`): every
//! `PALISADE_UPKEEP_INTERVAL_MS` it reads their churn and vacuums or analyzes each table that
//! needs it, one at a time, beside the sweeps (a vacuum never delays a sweep). Two series show
//! it: `palisade_table_dead_rows{table}`, set from each read, and
//! `palisade_table_upkeep_total{table,work}`, counted after each statement.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use store::PgPool;
use store::upkeep::{self, HOT_TABLES, Work};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TableLabels {
    table: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WorkLabels {
    table: &'static str,
    work: &'static str,
}

struct UpkeepMetrics {
    dead_rows: Family<TableLabels, Gauge>,
    done: Family<WorkLabels, Counter>,
}

static METRICS: LazyLock<UpkeepMetrics> = LazyLock::new(|| {
    let metrics = UpkeepMetrics {
        dead_rows: Family::default(),
        done: Family::default(),
    };
    for table in HOT_TABLES {
        let _ = metrics
            .dead_rows
            .get_or_create(&TableLabels { table: table.name });
        for work in Work::ALL {
            let _ = metrics.done.get_or_create(&WorkLabels {
                table: table.name,
                work: work.as_str(),
            });
        }
    }
    let mut registry = telemetry::metrics::registry();
    registry.register(
        "table_dead_rows",
        "Dead row versions in each of palisade's hot tables, as the reaper's leader last read \
         them from pg_stat_user_tables (0 on other replicas)",
        metrics.dead_rows.clone(),
    );
    registry.register(
        "table_upkeep",
        "Vacuums and analyzes the reaper's leader ran on each hot table, by work (vacuum, \
         vacuum_analyze, analyze)",
        metrics.done.clone(),
    );
    metrics
});

/// Registers the series (at start, so they show before the first read).
pub fn register() {
    LazyLock::force(&METRICS);
}

/// One round: reads the churn, then tends each table that needs it. Returns what was done.
/// A failed read or statement is logged and left to the next round.
pub async fn tend_once(pool: &PgPool) -> Vec<(&'static str, Work)> {
    let churn = match upkeep::churn(pool).await {
        Ok(churn) => churn,
        Err(error) => {
            tracing::warn!(error = %telemetry::chain(&error), "hot table statistics not read; trying again next interval");
            return Vec::new();
        }
    };
    let mut done = Vec::new();
    for stats in churn {
        let Some(table) = stats.table() else { continue };
        METRICS
            .dead_rows
            .get_or_create(&TableLabels { table: table.name })
            .set(stats.dead_rows);
        let Some(work) = stats.work() else { continue };
        let started = Instant::now();
        match upkeep::tend(pool, table, work).await {
            Ok(()) => {
                METRICS
                    .done
                    .get_or_create(&WorkLabels {
                        table: table.name,
                        work: work.as_str(),
                    })
                    .inc();
                tracing::debug!(
                    table = table.name,
                    work = work.as_str(),
                    dead_rows = stats.dead_rows,
                    live_rows = stats.live_rows,
                    seconds = started.elapsed().as_secs_f64(),
                    "hot table tended"
                );
                done.push((table.name, work));
            }
            Err(error) => {
                tracing::warn!(table = table.name, work = work.as_str(), error = %telemetry::chain(&error), "hot table not tended; trying again next interval (is palisade's role the table's owner?)");
            }
        }
    }
    done
}

/// Tends every `interval` until `ended` resolves.
pub async fn tend_until(pool: &PgPool, interval: Duration, ended: impl Future<Output = ()>) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(ended);
    loop {
        tokio::select! {
            () = &mut ended => return,
            _ = ticker.tick() => {}
        }
        // A statement abandoned mid-way is rolled back by PostgreSQL; nothing is lost.
        tokio::select! {
            () = &mut ended => return,
            _ = tend_once(pool) => {}
        }
    }
}
