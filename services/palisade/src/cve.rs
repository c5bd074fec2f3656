//! `palisade cve`: the local CVE table enrichment reads: import NVD files into it, report where
//! it stands.

use runtime::CommonSettings;

/// `palisade cve …`.
#[derive(Debug, clap::Subcommand)]
pub enum CveCommand {
    /// Import NVD JSON 2.0 files (data feeds such as nvdcve-2.0-2024.json, .json.gz too, or
    /// saved API pages) into the local CVE table, for sites without internet; a file or a
    /// folder of them. Prints a line per file on stderr, then a JSON summary.
    Import { path: std::path::PathBuf },
    /// The local CVE table: how many ids it holds, where the NVD sync stands, and the upstream
    /// records stored sanitised or set aside (quarantined), most recently seen first; JSON.
    Status {
        /// Quarantined records listed at most.
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(i64).range(1..=1000))]
        limit: i64,
    },
}

/// Runs one `palisade cve` command.
pub async fn run(common: &CommonSettings, command: CveCommand) -> anyhow::Result<()> {
    match command {
        CveCommand::Import { path } => import(common, &path).await,
        CveCommand::Status { limit } => status(common, limit).await,
    }
}

async fn import(common: &CommonSettings, path: &std::path::Path) -> anyhow::Result<()> {
    let pool = store::connect(&common.database).await?;
    let summary = crate::commands::import_cves(&pool, path, |line| eprintln!("{line}")).await?;
    println!("{summary}");
    Ok(())
}

async fn status(common: &CommonSettings, limit: i64) -> anyhow::Result<()> {
    let pool = store::connect(&common.database).await?;
    let status = store::cves::status(&pool, limit).await?;
    println!("{}", serde_json::to_string_pretty(&status)?);
    Ok(())
}
