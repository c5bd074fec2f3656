//! `palisade task`: tasks (one plugin execution each): cancel one.

use runtime::CommonSettings;
use uuid::Uuid;

/// `palisade task …`.
#[derive(Debug, clap::Subcommand)]
pub enum TaskCommand {
    /// Cancel one task (and with it its scan).
    Cancel {
        task_id: Uuid,
        #[arg(long, default_value = "cancelled from the command line")]
        reason: String,
        #[arg(long, value_enum, default_value_t = crate::cli_support::Output::Text)]
        output: crate::cli_support::Output,
    },
}

/// Runs one `palisade task` command.
pub async fn run(common: &CommonSettings, command: TaskCommand) -> anyhow::Result<()> {
    match command {
        TaskCommand::Cancel {
            task_id,
            reason,
            output,
        } => {
            let target = store::cancel::CancelTarget::Task(task_id);
            crate::scan::cancel(common, target, &reason, output).await
        }
    }
}
