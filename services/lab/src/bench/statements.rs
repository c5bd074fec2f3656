//! Where PostgreSQL's time went, per statement: `pg_stat_statements`' execution time and calls
//! in the benchmark's database, read before and after a burn-down. The extension needs the
//! server to load it (`shared_preload_libraries = 'pg_stat_statements'`, a restart) and a
//! superuser to create it; where either is missing the report says so and why.

use std::collections::HashMap;

use sqlx::PgPool;

/// The statements a report lists: the costliest, by time per scan.
pub const LISTED: usize = 10;

/// One statement's share of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct StatementCost {
    /// PostgreSQL's normalized text, whitespace collapsed.
    pub query: String,
    pub calls: i64,
    pub total_ms: f64,
}

/// A run's statements, costliest first, or why they could not be read.
pub type Statements = Result<Vec<StatementCost>, String>;

/// Counters by query id: (text, calls, total execution ms).
pub type Snapshot = HashMap<i64, (String, i64, f64)>;

/// Creates the extension in the benchmark's database where the server allows it; the reason
/// it cannot be read otherwise.
pub async fn prepare(pool: &PgPool) -> Result<(), String> {
    if let Err(error) = sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(pool)
        .await
    {
        return Err(format!(
            "pg_stat_statements cannot be created here ({error}); per-statement times need a \
             role allowed to create it"
        ));
    }
    snapshot(pool).await.map(|_| ())
}

/// The counters of every statement run in the current database so far.
pub async fn snapshot(pool: &PgPool) -> Result<Snapshot, String> {
    let rows: Vec<(Option<i64>, String, i64, f64)> = sqlx::query_as(
        "SELECT queryid, query, calls, total_exec_time FROM pg_stat_statements
         WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .fetch_all(pool)
    .await
    .map_err(|error| {
        format!(
            "pg_stat_statements is not readable ({error}); load it with \
             shared_preload_libraries = 'pg_stat_statements' and restart PostgreSQL"
        )
    })?;
    Ok(rows
        .into_iter()
        .filter_map(|(id, query, calls, ms)| Some((id?, (collapse(&query), calls, ms))))
        .collect())
}

/// What each statement spent between two snapshots, costliest first (a report lists the first
/// [`LISTED`]).
pub fn spent(before: &Snapshot, after: &Snapshot) -> Vec<StatementCost> {
    let mut spent: Vec<StatementCost> = after
        .iter()
        .map(|(id, (query, calls, ms))| {
            let (then_calls, then_ms) = before
                .get(id)
                .map_or((0, 0.0), |(_, calls, ms)| (*calls, *ms));
            StatementCost {
                query: query.clone(),
                calls: calls - then_calls,
                total_ms: ms - then_ms,
            }
        })
        .filter(|cost| cost.calls > 0)
        .collect();
    spent.sort_by(|a, b| b.total_ms.total_cmp(&a.total_ms));
    spent
}

/// The statements a run spent, given the snapshots around it.
pub fn between(before: Result<Snapshot, String>, after: Result<Snapshot, String>) -> Statements {
    Ok(spent(&before?, &after?))
}

/// What the statement whose text holds `part` spent, if it ran (the text begins with the
/// statement file's comment).
pub fn of<'s>(statements: &'s [StatementCost], part: &str) -> Option<&'s StatementCost> {
    statements
        .iter()
        .find(|statement| statement.query.contains(part))
}

fn collapse(query: &str) -> String {
    query.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_lists_what_each_statement_spent_costliest_first() {
        let before: Snapshot = [(1, ("SELECT 1".to_owned(), 10, 5.0))].into();
        let after: Snapshot = [
            (1, ("SELECT 1".to_owned(), 30, 7.0)),
            (2, ("UPDATE  t\n SET x".to_owned(), 5, 40.0)),
            (3, ("idle".to_owned(), 0, 0.0)),
        ]
        .into();
        let spent = spent(&before, &after);
        assert_eq!(spent.len(), 2);
        assert_eq!(spent[0].calls, 5);
        assert_eq!(spent[1].calls, 20);
        assert!((spent[1].total_ms - 2.0).abs() < 1e-9);
        assert_eq!(collapse("UPDATE  t\n SET x"), "UPDATE t SET x");
        assert_eq!(of(&spent, "SET x").map(|s| s.calls), Some(5));
    }
}
