//! `palisade cve`: the local CVE table enrichment reads: import NVD files into it, report where
//! it stands.

use runtime::CommonSettings;

use crate::cli_support::{Json, Output, field, instant, instant_or_dash, print, table};

/// `palisade cve …`.
#[derive(Debug, clap::Subcommand)]
pub enum CveCommand {
    /// Import NVD JSON 2.0 files (data feeds such as nvdcve-2.0-2024.json, .json.gz too, or
    /// saved API pages) into the local CVE table, for sites without internet; a file or a
    /// folder of them. Prints a line per file on stderr, then what was imported (with
    /// `--output json`, {files, records, written, quarantined} on one line).
    Import {
        path: std::path::PathBuf,
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// The local CVE table: how many ids it holds, where the NVD sync stands, and the upstream
    /// records stored sanitised or set aside (quarantined), most recently seen first.
    Status {
        /// Quarantined records listed at most.
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(i64).range(1..=1000))]
        limit: i64,
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
}

/// Runs one `palisade cve` command.
pub async fn run(common: &CommonSettings, command: CveCommand) -> anyhow::Result<()> {
    match command {
        CveCommand::Import { path, output } => import(common, &path, output).await,
        CveCommand::Status { limit, output } => status(common, limit, output).await,
    }
}

async fn import(
    common: &CommonSettings,
    path: &std::path::Path,
    output: Output,
) -> anyhow::Result<()> {
    let pool = store::connect(&common.database).await?;
    let summary = crate::commands::import_cves(&pool, path, |line| eprintln!("{line}")).await?;
    print(output, Json::Line, &summary, |summary| {
        format!(
            "{} file(s) imported: {} CVE records, {} written, {} quarantined",
            summary["files"], summary["records"], summary["written"], summary["quarantined"]
        )
    })
}

async fn status(common: &CommonSettings, limit: i64, output: Output) -> anyhow::Result<()> {
    let pool = store::connect(&common.database).await?;
    let status = store::cves::status(&pool, limit).await?;
    print(output, Json::Pretty, &status, status_text)
}

/// `palisade cve status` as text: the table and its sync a field a line, then the quarantined
/// records seen most recently.
fn status_text(status: &store::cves::CveStatus) -> String {
    let quarantined = table(
        &format!(
            "{:<20} {:>5} {:<10} {:<8} {:<16} reason",
            "last seen", "times", "action", "source", "cve"
        ),
        status.recent_quarantined.iter().map(|entry| {
            format!(
                "{:<20} {:>5} {:<10} {:<8} {:<16} {}",
                instant(&entry.last_seen_at),
                entry.times_seen,
                entry.action,
                entry.source,
                entry.cve_id.as_deref().unwrap_or(&entry.record_key),
                entry.reason
            )
        }),
    );
    [
        field("known", status.known),
        field("unknown", status.unknown),
        field("imported", status.imported),
        field("synced to", instant_or_dash(status.synced_through.as_ref())),
        field(
            "sync job",
            status
                .sync_holder_job_id
                .map_or_else(|| "-".to_owned(), |id| id.to_string()),
        ),
        field(
            "sync state",
            format!("updated {}", instant(&status.sync_updated_at)),
        ),
        field("quarantined", status.quarantined),
        String::new(),
        quarantined,
    ]
    .join("\n")
}
