//! What the `palisade` subcommands that answer in JSON do, apart from printing: the system
//! tests run them as the command does.

use std::path::Path;

use store::PgPool;
use uuid::Uuid;

/// `palisade scan enrich <scan>`: requests enrichment of a scan of any organization; the
/// answer `{scan_id, job_id, status, outcome, message}`, or the refusal as an error.
pub async fn enrich(pool: &PgPool, scan_id: Uuid) -> anyhow::Result<serde_json::Value> {
    let outcome = store::enrichment::request(pool, None, scan_id).await?;
    let reply = enrichment::request::reply(scan_id, &outcome);
    if let Some(error) = reply.error {
        anyhow::bail!("{} ({})", error.message, error.code);
    }
    Ok(serde_json::json!({
        "scan_id": reply.scan_id,
        "job_id": reply.job_id,
        "status": reply.status,
        "outcome": reply.outcome,
        "message": reply.message,
    }))
}

/// `palisade cve import <file or folder>`: imports NVD JSON files into the local CVE table,
/// telling `progress` a line per file; the summary `{files, records, written}`.
pub async fn import_cves(
    pool: &PgPool,
    path: &Path,
    mut progress: impl FnMut(String),
) -> anyhow::Result<serde_json::Value> {
    let files = enrichment::import::files(path)?;
    let (mut records, mut written) = (0, 0);
    for (number, file) in files.iter().enumerate() {
        let imported = enrichment::import::import_file(pool, file).await?;
        progress(format!(
            "[{}/{}] {}: {} CVE records, {} written",
            number + 1,
            files.len(),
            file.display(),
            imported.records,
            imported.written
        ));
        records += imported.records;
        written += imported.written;
    }
    Ok(serde_json::json!({ "files": files.len(), "records": records, "written": written }))
}
