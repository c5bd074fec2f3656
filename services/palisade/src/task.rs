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
    },
}

/// Runs one `palisade task` command.
pub async fn run(common: &CommonSettings, command: TaskCommand) -> anyhow::Result<()> {
    match command {
        TaskCommand::Cancel { task_id, reason } => {
            crate::scan::cancel(common, store::cancel::CancelTarget::Task(task_id), &reason).await
        }
    }
}
