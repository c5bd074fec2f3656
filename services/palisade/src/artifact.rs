//! `palisade artifact`: files plugins uploaded as evidence of a scan (an SBOM, a report): list a
//! scan's, download one (checked against what was verified when it was committed).

use anyhow::Context as _;
use runtime::CommonSettings;
use uuid::Uuid;

use crate::cli_support::{Json, Output, print, table};

/// `palisade artifact …`.
#[derive(Debug, clap::Subcommand)]
pub enum ArtifactCommand {
    /// A scan's artifacts, in the order they were committed.
    List {
        #[arg(long)]
        scan: Uuid,
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Downloads an artifact, checking its size and sha256 against what was verified when it
    /// was committed (a difference is an error and nothing is written).
    Get {
        id: Uuid,
        /// Where to write it; `-` (the default) is standard output.
        #[arg(long, default_value = "-")]
        out: std::path::PathBuf,
    },
}

/// Runs one `palisade artifact` command.
pub async fn run(common: &CommonSettings, command: ArtifactCommand) -> anyhow::Result<()> {
    let pool = store::connect(&common.database).await?;
    match command {
        ArtifactCommand::List { scan, output } => {
            let artifacts = crate::commands::list_artifacts(&pool, scan).await?;
            print(output, Json::Pretty, &artifacts, |artifacts| {
                table(
                    &format!(
                        "{:<36} {:>10} {:<64} {:<30} name",
                        "id", "bytes", "sha256", "content type"
                    ),
                    artifacts.iter().map(|artifact| {
                        format!(
                            "{:<36} {:>10} {:<64} {:<30} {}",
                            artifact.id,
                            artifact.size_bytes.unwrap_or_default(),
                            artifact.sha256,
                            artifact.content_type,
                            artifact.original_name
                        )
                    }),
                )
            })?;
        }
        ArtifactCommand::Get { id, out } => {
            let bus = crate::commands::operator_bus(common).await?;
            let store = runtime::artifacts::Artifacts::open(&bus, &common.artifact_store).await?;
            let (artifact, bytes) = crate::commands::get_artifact(&pool, &store, id).await?;
            if out.as_os_str() == "-" {
                use std::io::Write as _;
                std::io::stdout().write_all(&bytes)?;
            } else {
                std::fs::write(&out, &bytes)
                    .with_context(|| format!("cannot write {}", out.display()))?;
            }
            eprintln!(
                "{} ({} bytes, sha256 {} verified)",
                artifact.original_name,
                bytes.len(),
                artifact.sha256
            );
        }
    }
    Ok(())
}
