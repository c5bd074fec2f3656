//! What some `palisade` subcommands do, apart from printing (`cli_support::print` does that):
//! the system tests run them as the command does.

use std::path::Path;

use store::PgPool;
use uuid::Uuid;

use crate::exit;

/// The bus as the operator's identity (`NATS_CREDS` holds its credentials).
pub async fn operator_bus(common: &runtime::CommonSettings) -> anyhow::Result<bus::Bus> {
    Ok(bus::Bus::connect(
        &common.nats_url,
        &common.nats_credentials,
        &common.nats_tls,
        common.subjects.clone(),
        &messages::Identity::Operator,
    )
    .await?)
}

/// The bus for submitting and following a scan as client `client_id` of `organization`: with a
/// client's credentials (`NATS_CREDS` issued by `palisade client add`), as that client, whose
/// id `client_id` must then be; else as the operator, who may submit for any client.
pub async fn client_bus(
    common: &runtime::CommonSettings,
    client_id: &str,
    organization: Uuid,
) -> anyhow::Result<bus::Bus> {
    let Some(issued_to) = common
        .nats_credentials
        .user_name()
        .and_then(|name| name.strip_prefix("client-").map(str::to_owned))
    else {
        return operator_bus(common).await;
    };
    if issued_to != client_id {
        return Err(crate::exit::refused(format!(
            "NATS_CREDS are client {issued_to:?}'s: pass --client {issued_to}"
        )));
    }
    Ok(bus::Bus::connect(
        &common.nats_url,
        &common.nats_credentials,
        &common.nats_tls,
        common.subjects.clone(),
        &messages::Identity::Client {
            client_id: issued_to,
            organizations: vec![organization],
        },
    )
    .await?)
}

/// Who an operator's change is recorded as: `--by`, else `$USER`, else `operator`.
pub fn actor(by: Option<String>) -> String {
    by.or_else(|| std::env::var("USER").ok())
        .map(|by| by.trim().to_owned())
        .filter(|by| !by.is_empty())
        .unwrap_or_else(|| "operator".to_owned())
}

/// `palisade scan enrich <scan>`: requests enrichment of a scan of any organization; the
/// answer `{scan_id, job_id, status, outcome, message}`, or the refusal as an error.
pub async fn enrich(pool: &PgPool, scan_id: Uuid) -> anyhow::Result<serde_json::Value> {
    let outcome = store::enrichment::request(pool, None, scan_id).await?;
    let reply = enrichment::request::reply(scan_id, &outcome);
    if let Some(error) = reply.error {
        let message = format!("{} ({})", error.message, error.code);
        return Err(match error.error_code() {
            Some(messages::ErrorCode::NotFound) => exit::not_found(message),
            _ => exit::refused(message),
        });
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
    let (mut records, mut written, mut quarantined) = (0, 0, 0);
    for (number, file) in files.iter().enumerate() {
        let imported = enrichment::import::import_file(pool, file).await?;
        let set_apart = if imported.quarantined > 0 {
            format!(
                ", {} quarantined (see palisade cve status)",
                imported.quarantined
            )
        } else {
            String::new()
        };
        progress(format!(
            "[{}/{}] {}: {} CVE records, {} written{set_apart}",
            number + 1,
            files.len(),
            file.display(),
            imported.records,
            imported.written
        ));
        records += imported.records;
        written += imported.written;
        quarantined += imported.quarantined;
    }
    Ok(serde_json::json!({
        "files": files.len(),
        "records": records,
        "written": written,
        "quarantined": quarantined,
    }))
}

/// A refusal of a `palisade finding` change, with what to do.
fn refused(outcome: &store::findings::ChangeOutcome, finding_id: Uuid) -> Option<anyhow::Error> {
    use store::findings::ChangeOutcome;
    Some(match outcome {
        ChangeOutcome::Changed { .. } => return None,
        ChangeOutcome::RevisionConflict {
            current_revision,
            current_collection_revision,
        } => exit::refused(format!(
            "revision_conflict: finding {finding_id} is at revision {current_revision} (its \
             scan's findings at collection revision {current_collection_revision}) since you \
             read it: nothing changed; read it again (palisade finding show {finding_id}) and \
             decide on what it holds now"
        )),
        ChangeOutcome::ReasonRequired => exit::refused(
            "reason_required: gate_exempt, accepted_risk, ignore, false_positive and fixed \
             need a non-blank --reason",
        ),
        ChangeOutcome::ScanActive => exit::refused(format!(
            "scan_active: finding {finding_id}'s scan is still pending or running, and its \
             plugin could write the finding again; delete it once the scan ended"
        )),
        ChangeOutcome::NotFound => exit::not_found(format!("not_found: no finding {finding_id}")),
    })
}

/// `palisade finding set`: the finding's new revision and its scan's collection revision, or
/// the refusal as an error.
pub async fn set_finding_status(
    pool: &PgPool,
    change: &store::findings::Change,
    status: store::states::FindingStatus,
) -> anyhow::Result<serde_json::Value> {
    let outcome = store::findings::set_status(pool, change, status).await?;
    if let Some(error) = refused(&outcome, change.finding_id) {
        return Err(error);
    }
    Ok(serde_json::to_value(&outcome)?)
}

/// `palisade finding delete`.
pub async fn delete_finding(
    pool: &PgPool,
    change: &store::findings::Change,
) -> anyhow::Result<serde_json::Value> {
    let outcome = store::findings::delete(pool, change).await?;
    if let Some(error) = refused(&outcome, change.finding_id) {
        return Err(error);
    }
    Ok(serde_json::to_value(&outcome)?)
}

/// `palisade finding list`: one page.
pub async fn list_findings(
    pool: &PgPool,
    scan_id: Uuid,
    filter: &store::findings::Filter,
    after: &str,
    limit: i64,
) -> anyhow::Result<store::findings::Page> {
    store::findings::page(pool, None, scan_id, filter, after, limit)
        .await?
        .ok_or_else(|| exit::not_found(format!("not_found: no scan {scan_id}")))
}

/// `palisade finding show`.
pub async fn show_finding(
    pool: &PgPool,
    finding_id: Uuid,
) -> anyhow::Result<store::findings::Detail> {
    store::findings::show(pool, None, finding_id)
        .await?
        .ok_or_else(|| exit::not_found(format!("not_found: no finding {finding_id}")))
}

/// `palisade scan gate`.
pub async fn scan_gate(
    pool: &PgPool,
    scan_id: Uuid,
    threshold: store::states::Severity,
) -> anyhow::Result<store::findings::Summary> {
    store::findings::summary(pool, None, scan_id, threshold)
        .await?
        .ok_or_else(|| exit::not_found(format!("not_found: no scan {scan_id}")))
}

/// `palisade artifact list --scan <id>`: the scan's artifacts (committed upload sessions), in
/// commit order.
pub async fn list_artifacts(
    pool: &PgPool,
    scan_id: Uuid,
) -> anyhow::Result<Vec<store::artifacts::Upload>> {
    Ok(store::artifacts::of_scan(pool, scan_id).await?)
}

/// `palisade artifact get <id>`: a committed artifact's record and bytes, read from the
/// artifact store and checked against the size and sha256 verified at its commit; a
/// difference is an error, and nothing is returned.
pub async fn get_artifact(
    pool: &PgPool,
    artifacts: &impl bus::artifacts::ArtifactStore,
    id: Uuid,
) -> anyhow::Result<(store::artifacts::Upload, bytes::Bytes)> {
    let upload = store::artifacts::get(pool, id)
        .await?
        .filter(|upload| upload.status == store::states::UploadStatus::Committed.as_str())
        .ok_or_else(|| exit::not_found(format!("not_found: no committed artifact {id}")))?;
    let bytes = artifacts.get(&upload.object_key).await?.ok_or_else(|| {
        anyhow::anyhow!(
            "artifact {id} is recorded as committed but its object {:?} is missing from the artifact store: it was deleted outside palisade, or the store was rebuilt without it",
            upload.object_key
        )
    })?;
    let expected_size = upload.size_bytes.unwrap_or(-1);
    let sha256 = messages::sha256_hex(&bytes);
    if bytes.len() as i64 != expected_size || sha256 != upload.sha256 {
        anyhow::bail!(
            "artifact {id} does not match what was verified at its commit: {} bytes with sha256 {sha256} in the store, {expected_size} bytes with sha256 {} recorded; the stored object was changed or damaged",
            bytes.len(),
            upload.sha256
        );
    }
    Ok((upload, bytes))
}
