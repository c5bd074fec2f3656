//! `palisade queue`: the unfinished tasks by organization, plugin and state.

use runtime::CommonSettings;

use crate::cli_support::{Json, Output, print, table};

/// Runs `palisade queue`: how many unfinished tasks, how many due, how long the oldest due one
/// has waited, by organization, plugin and state.
pub async fn run(common: &CommonSettings, output: Output) -> anyhow::Result<()> {
    let pool = store::connect(&common.database).await?;
    let backlog = store::observability::backlog(&pool).await?;
    print(output, Json::Pretty, &backlog, |backlog| {
        table(
            &format!(
                "{:<36} {:<16} {:<10} {:>8} {:>8} {:>16}",
                "organization", "plugin", "state", "tasks", "due", "oldest due (s)"
            ),
            backlog.iter().map(|row| {
                format!(
                    "{:<36} {:<16} {:<10} {:>8} {:>8} {:>16.1}",
                    row.organization_id,
                    row.plugin,
                    row.state,
                    row.tasks,
                    row.due,
                    row.oldest_due_age_seconds
                )
            }),
        )
    })
}
