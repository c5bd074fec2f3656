//! palisade tends its own hot tables: vacuum and analyze driven by their churn, so the cost of a
//! decision does not depend on whether the server's autovacuum keeps up, or runs at all.
//!
//! Every lease and every end rewrites a task row and an attempt row, every decision inserts and
//! deletes an outbox row; each rewrite leaves a dead row version and, where an indexed column
//! changed, a dead index entry. Queue-like reads walk from the front of their index (acquire's
//! due tasks, the outbox claim), which is exactly where the entries of the rows just moved on
//! lie, so until a vacuum removes them every acquire walks past all of them: measured with
//! autovacuum off, a 50,000-scan burn-down ran at 0.28× the rate of a 5,000-scan one, and with
//! these tables vacuumed every few seconds as fast as the small one. And a table analyzed while
//! it was empty is planned as if it still were.
//!
//! [`churn`] reads PostgreSQL's cumulative statistics of the [`HOT_TABLES`] (one statement);
//! [`Churn::work`] decides, per table, from thresholds that do not grow with the backlog
//! ([`DEAD_ROWS_MIN`], [`DEAD_SHARE_DIVISOR`]); [`tend`] runs it with `SKIP_LOCKED`, so a table another
//! vacuum holds (autovacuum, an operator) is skipped, never waited for. The reaper's leader runs
//! this every `PALISADE_UPKEEP_INTERVAL_MS`; every statement here needs the table's owner,
//! which is the role palisade migrates with (`docs/deploy.md`).
//!
//! `VACUUM` and `ANALYZE` name their table, so they are built here from [`HOT_TABLES`]' fixed
//! names rather than bound (as `online_indexes` builds its utility statements); they run
//! outside any transaction.

use sqlx::PgPool;

use crate::StoreError;
use crate::sql;

/// A table palisade tends, with its three utility statements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HotTable {
    pub name: &'static str,
    vacuum: &'static str,
    vacuum_analyze: &'static str,
    analyze: &'static str,
}

macro_rules! hot_table {
    ($name:literal) => {
        HotTable {
            name: $name,
            vacuum: concat!("VACUUM (SKIP_LOCKED) ", $name),
            vacuum_analyze: concat!("VACUUM (ANALYZE, SKIP_LOCKED) ", $name),
            analyze: concat!("ANALYZE (SKIP_LOCKED) ", $name),
        }
    };
}

/// The tables every scan rewrites or deletes from: the task queue, the attempts (leases), the
/// scan's rows, the workers (seen at every acquire), the outbox (one row per decision) and the
/// enrichment queue. Tables that only grow (findings, assets, result batches) need only the
/// daily vacuum `docs/operations.md` asks for.
pub const HOT_TABLES: [HotTable; 8] = [
    hot_table!("worker_tasks"),
    hot_table!("worker_task_attempts"),
    hot_table!("scan_jobs"),
    hot_table!("scans"),
    hot_table!("workers"),
    hot_table!("outbox_batches"),
    hot_table!("outbox"),
    hot_table!("enrichment_jobs"),
];

/// A table is vacuumed once it holds at least this many dead row versions (and a
/// [`DEAD_SHARE_DIVISOR`]th of its live ones): a queue read walks at most about this many dead
/// entries.
pub const DEAD_ROWS_MIN: i64 = 1_000;
/// ... and at least this fraction (1/50, 2 %) of its live rows, so a table of millions of
/// finished rows is not vacuumed every interval for a thousand dead ones.
pub const DEAD_SHARE_DIVISOR: i64 = 50;
/// A table is analyzed once this many rows changed since its last analyze (and a
/// [`MODIFIED_SHARE_DIVISOR`]th of its live rows): a table filled since it was analyzed empty is
/// planned on its real size within seconds.
pub const MODIFIED_ROWS_MIN: i64 = 1_000;
/// ... and at least this fraction (1/10) of its live rows.
pub const MODIFIED_SHARE_DIVISOR: i64 = 10;

/// One hot table's statistics.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Churn {
    pub table_name: String,
    pub live_rows: i64,
    pub dead_rows: i64,
    pub modified_since_analyze: i64,
}

/// What a table needs now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// `VACUUM`, which also analyzes when [`Churn::work`] found the table due for both.
    Vacuum {
        analyze: bool,
    },
    Analyze,
}

impl Work {
    /// The label of this work on `palisade_table_upkeep_total`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Vacuum { analyze: false } => "vacuum",
            Self::Vacuum { analyze: true } => "vacuum_analyze",
            Self::Analyze => "analyze",
        }
    }

    /// Every label [`Work::as_str`] gives.
    pub const ALL: [Self; 3] = [
        Self::Vacuum { analyze: false },
        Self::Vacuum { analyze: true },
        Self::Analyze,
    ];
}

impl Churn {
    /// What the table needs, if anything.
    pub fn work(&self) -> Option<Work> {
        let due =
            |count: i64, min: i64, divisor: i64| count >= min.max(self.live_rows.max(0) / divisor);
        let vacuum = due(self.dead_rows, DEAD_ROWS_MIN, DEAD_SHARE_DIVISOR);
        let analyze = due(
            self.modified_since_analyze,
            MODIFIED_ROWS_MIN,
            MODIFIED_SHARE_DIVISOR,
        );
        match (vacuum, analyze) {
            (true, analyze) => Some(Work::Vacuum { analyze }),
            (false, true) => Some(Work::Analyze),
            (false, false) => None,
        }
    }

    /// The hot table these statistics are of.
    pub fn table(&self) -> Option<HotTable> {
        HOT_TABLES
            .iter()
            .find(|table| table.name == self.table_name)
            .copied()
    }
}

/// The hot tables' statistics, one row per table that exists in the current schema.
pub async fn churn(pool: &PgPool) -> Result<Vec<Churn>, StoreError> {
    let tables: Vec<&str> = HOT_TABLES.iter().map(|table| table.name).collect();
    Ok(sql::database::HotTableChurn { tables }
        .query_as::<Churn>()
        .fetch_all(pool)
        .await?)
}

/// Runs `work` on `table`, outside any transaction; a table whose lock another vacuum holds is
/// skipped (PostgreSQL logs that, and the next interval tries again).
pub async fn tend(pool: &PgPool, table: HotTable, work: Work) -> Result<(), StoreError> {
    let statement = match work {
        Work::Vacuum { analyze: false } => table.vacuum,
        Work::Vacuum { analyze: true } => table.vacuum_analyze,
        Work::Analyze => table.analyze,
    };
    sql::query(statement).execute(pool).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn churn(live_rows: i64, dead_rows: i64, modified_since_analyze: i64) -> Churn {
        Churn {
            table_name: "worker_tasks".into(),
            live_rows,
            dead_rows,
            modified_since_analyze,
        }
    }

    #[test]
    fn a_table_is_vacuumed_at_a_thousand_dead_rows_or_its_share_of_live_ones() {
        assert_eq!(churn(0, 999, 0).work(), None);
        assert_eq!(
            churn(0, 1_000, 0).work(),
            Some(Work::Vacuum { analyze: false })
        );
        // A backlog of 50,000 does not raise the bar; a history of millions does.
        assert_eq!(
            churn(50_000, 1_000, 0).work(),
            Some(Work::Vacuum { analyze: false })
        );
        assert_eq!(churn(1_000_000, 19_999, 0).work(), None);
        assert_eq!(
            churn(1_000_000, 20_000, 0).work(),
            Some(Work::Vacuum { analyze: false })
        );
    }

    #[test]
    fn a_table_filled_since_its_last_analyze_is_analyzed_with_or_without_a_vacuum() {
        assert_eq!(churn(5_000, 0, 1_000).work(), Some(Work::Analyze));
        assert_eq!(
            churn(5_000, 1_000, 1_000).work(),
            Some(Work::Vacuum { analyze: true })
        );
        assert_eq!(churn(100_000, 0, 9_999).work(), None);
    }

    #[test]
    fn each_statement_names_its_own_table_and_nothing_else() {
        for table in HOT_TABLES {
            for statement in [table.vacuum, table.vacuum_analyze, table.analyze] {
                assert!(
                    statement.ends_with(&format!(") {}", table.name)),
                    "{statement}"
                );
                assert!(statement.contains("SKIP_LOCKED"), "{statement}");
            }
        }
    }
}
