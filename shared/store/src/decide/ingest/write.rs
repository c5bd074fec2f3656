//! What an ingestion decision writes for the result batches it accepted: the batch rows, their
//! assets (linked to their scans), their findings and their evaluations, one statement each
//! whatever the number of batches.

use std::collections::{BTreeMap, BTreeSet};

use messages::v1;
use sqlx::PgConnection;
use uuid::Uuid;

use super::{BatchParams, Job, LockedRow};
use crate::StoreError;
use crate::evidence::{evaluation_key, finding_key, redact};
use crate::sql;
use crate::states::{EvaluationStatus, ResultBatchStatus};

/// Writes the accepted batches with their assets, findings and evaluations: one statement each.
pub(super) async fn write_batches(
    conn: &mut PgConnection,
    accepted: &[(&BatchParams<'_>, &LockedRow, Job)],
) -> Result<(), StoreError> {
    if accepted.is_empty() {
        return Ok(());
    }
    let n = accepted.len();
    let mut ids = Vec::with_capacity(n);
    let mut task_ids = Vec::with_capacity(n);
    let mut attempt_ids = Vec::with_capacity(n);
    let mut sequences = Vec::with_capacity(n);
    let mut keys = Vec::with_capacity(n);
    let mut checksums = Vec::with_capacity(n);
    let mut finding_counts = Vec::with_capacity(n);
    let mut asset_counts = Vec::with_capacity(n);
    for (params, _, _) in accepted {
        ids.push(Uuid::now_v7());
        task_ids.push(params.claim.task_id);
        attempt_ids.push(params.claim.attempt_id);
        sequences.push(params.sequence_number);
        keys.push(params.idempotency_key);
        checksums.push(params.payload_sha256);
        finding_counts.push(params.findings.len() as i32);
        asset_counts.push(params.assets.len() as i32);
    }
    sql::worker_result_batches::InsertMany {
        ids: &ids,
        task_ids: &task_ids,
        attempt_ids: &attempt_ids,
        sequences: &sequences,
        keys: &keys,
        checksums: &checksums,
        finding_counts: &finding_counts,
        asset_counts: &asset_counts,
        persisted_status: ResultBatchStatus::Persisted.as_str(),
    }
    .query()
    .execute(&mut *conn)
    .await?;
    let evidence: Vec<Evidence<'_, '_>> = accepted
        .iter()
        .map(|(params, row, job)| Evidence {
            params,
            plugin: &row.locked.plugin,
            organization_id: job.organization_id,
            scan_id: job.scan_id,
            scan_job_id: job.scan_job_id,
        })
        .collect();
    write_evidence(conn, &evidence).await
}

/// An accepted batch's evidence and where it belongs.
struct Evidence<'e, 'p> {
    params: &'e BatchParams<'p>,
    /// The task's plugin, part of every finding's key.
    plugin: &'e str,
    organization_id: Uuid,
    scan_id: Uuid,
    scan_job_id: Uuid,
}

/// Upserts the batches' assets (linked to their scans), findings and evaluations: one
/// statement each, whatever the number of batches.
async fn write_evidence(
    conn: &mut PgConnection,
    evidence: &[Evidence<'_, '_>],
) -> Result<(), StoreError> {
    write_assets(conn, evidence).await?;
    write_findings(conn, evidence).await?;
    write_evaluations(conn, evidence).await
}

async fn write_assets(
    conn: &mut PgConnection,
    accepted: &[Evidence<'_, '_>],
) -> Result<(), StoreError> {
    // Assets once per (organization, kind, value), sorted, so that concurrent upserts lock
    // shared assets in one order; links once per (scan, asset), the last writer winning.
    let mut assets: BTreeSet<(Uuid, &str, &str)> = BTreeSet::new();
    let mut links: BTreeMap<(Uuid, Uuid, &str, &str), (Uuid, Uuid)> = BTreeMap::new();
    for batch in accepted {
        for asset in batch.params.assets {
            let identity = (
                batch.organization_id,
                asset.kind.as_str(),
                asset.value.as_str(),
            );
            assets.insert(identity);
            links.insert(
                (batch.scan_id, identity.0, identity.1, identity.2),
                (batch.scan_job_id, batch.params.claim.attempt_id),
            );
        }
    }
    if assets.is_empty() {
        return Ok(());
    }
    let asset_ids: Vec<Uuid> = assets.iter().map(|_| Uuid::now_v7()).collect();
    let organizations: Vec<Uuid> = assets.iter().map(|asset| asset.0).collect();
    let kinds: Vec<&str> = assets.iter().map(|asset| asset.1).collect();
    let values: Vec<&str> = assets.iter().map(|asset| asset.2).collect();
    let link_scans: Vec<Uuid> = links.keys().map(|link| link.0).collect();
    let link_organizations: Vec<Uuid> = links.keys().map(|link| link.1).collect();
    let link_kinds: Vec<&str> = links.keys().map(|link| link.2).collect();
    let link_values: Vec<&str> = links.keys().map(|link| link.3).collect();
    let link_jobs: Vec<Uuid> = links.values().map(|link| link.0).collect();
    let link_attempts: Vec<Uuid> = links.values().map(|link| link.1).collect();
    sql::assets::UpsertMany {
        asset_ids: &asset_ids,
        organizations: &organizations,
        kinds: &kinds,
        values: &values,
        link_scans: &link_scans,
        link_organizations: &link_organizations,
        link_kinds: &link_kinds,
        link_values: &link_values,
        link_jobs: &link_jobs,
        link_attempts: &link_attempts,
    }
    .query()
    .execute(conn)
    .await?;
    Ok(())
}

/// One item (a finding, an evaluation) of an accepted batch, with the batch it came in.
type Keyed<'e, 'p, 'r, T> = (&'e T, &'e Evidence<'p, 'r>);

/// The accepted batches' items (`items` of each batch) by (scan, `key` of the item under the
/// batch's plugin), the last message winning, in key order: one statement never touches a row
/// twice, and concurrent writers lock in one order.
fn by_key<'e, 'p, 'r, T: 'r>(
    accepted: &'e [Evidence<'p, 'r>],
    items: impl Fn(&'p BatchParams<'r>) -> &'r [T],
    key: impl Fn(&str, &T) -> String,
) -> BTreeMap<(Uuid, String), Keyed<'e, 'p, 'r, T>> {
    let mut by_key = BTreeMap::new();
    for batch in accepted {
        for item in items(batch.params) {
            by_key.insert((batch.scan_id, key(batch.plugin, item)), (item, batch));
        }
    }
    by_key
}

/// The accepted batches' findings by (scan, `finding_key`) ([`by_key`]).
fn findings_by_key<'e, 'p, 'r>(
    accepted: &'e [Evidence<'p, 'r>],
) -> BTreeMap<(Uuid, String), Keyed<'e, 'p, 'r, v1::Finding>> {
    by_key(
        accepted,
        |params| params.findings,
        |plugin, finding: &v1::Finding| {
            finding_key(
                plugin,
                &finding.rule_id,
                &finding.resource,
                &finding.discriminator,
            )
        },
    )
}

/// Writes the accepted batches' findings ([`findings_by_key`]) in one statement.
async fn write_findings(
    conn: &mut PgConnection,
    accepted: &[Evidence<'_, '_>],
) -> Result<(), StoreError> {
    let by_key = findings_by_key(accepted);
    if by_key.is_empty() {
        return Ok(());
    }
    let n = by_key.len();
    let mut ids = Vec::with_capacity(n);
    let mut organizations = Vec::with_capacity(n);
    let mut scans = Vec::with_capacity(n);
    let mut jobs = Vec::with_capacity(n);
    let mut attempts = Vec::with_capacity(n);
    let mut keys = Vec::with_capacity(n);
    let mut plugins = Vec::with_capacity(n);
    let mut rule_ids = Vec::with_capacity(n);
    let mut resources = Vec::with_capacity(n);
    let mut discriminators = Vec::with_capacity(n);
    let mut severities = Vec::with_capacity(n);
    let mut titles = Vec::with_capacity(n);
    let mut descriptions = Vec::with_capacity(n);
    let mut evidence = Vec::with_capacity(n);
    let mut cves = Vec::with_capacity(n);
    for ((scan_id, key), (finding, batch)) in &by_key {
        ids.push(Uuid::now_v7());
        organizations.push(batch.organization_id);
        scans.push(*scan_id);
        jobs.push(batch.scan_job_id);
        attempts.push(batch.params.claim.attempt_id);
        keys.push(key.as_str());
        plugins.push(batch.plugin);
        rule_ids.push(finding.rule_id.as_str());
        resources.push(redact(&finding.resource));
        discriminators.push(redact(&finding.discriminator));
        severities.push(finding.severity.as_str());
        titles.push(redact(&finding.title));
        descriptions.push(redact(&finding.description));
        evidence.push(redact(&finding.evidence));
        cves.push(finding.cve_ids.join(","));
    }
    sql::findings::InsertMany {
        ids: &ids,
        organizations: &organizations,
        scans: &scans,
        jobs: &jobs,
        attempts: &attempts,
        keys: &keys,
        plugins: &plugins,
        rule_ids: &rule_ids,
        resources: &resources,
        discriminators: &discriminators,
        severities: &severities,
        titles: &titles,
        descriptions: &descriptions,
        evidence: &evidence,
        cves: &cves,
    }
    .query()
    .execute(conn)
    .await?;
    Ok(())
}

/// The accepted batches' evaluations by (scan, `evaluation_key`) ([`by_key`]).
fn evaluations_by_key<'e, 'p, 'r>(
    accepted: &'e [Evidence<'p, 'r>],
) -> BTreeMap<(Uuid, String), Keyed<'e, 'p, 'r, v1::Evaluation>> {
    by_key(
        accepted,
        |params| params.evaluations,
        |plugin, evaluation: &v1::Evaluation| {
            evaluation_key(plugin, &evaluation.rule_id, &evaluation.resource)
        },
    )
}

/// Writes the accepted batches' evaluations ([`evaluations_by_key`]) in one statement. A
/// failure's finding key is computed as its finding's was, from what the worker sent. The
/// caller checked each status; the schema's CHECK refuses any other (and the batch is then
/// decided message by message).
async fn write_evaluations(
    conn: &mut PgConnection,
    accepted: &[Evidence<'_, '_>],
) -> Result<(), StoreError> {
    let by_key = evaluations_by_key(accepted);
    if by_key.is_empty() {
        return Ok(());
    }
    let n = by_key.len();
    let mut ids = Vec::with_capacity(n);
    let mut organizations = Vec::with_capacity(n);
    let mut scans = Vec::with_capacity(n);
    let mut jobs = Vec::with_capacity(n);
    let mut attempts = Vec::with_capacity(n);
    let mut keys = Vec::with_capacity(n);
    let mut plugins = Vec::with_capacity(n);
    let mut rule_ids = Vec::with_capacity(n);
    let mut resources = Vec::with_capacity(n);
    let mut statuses = Vec::with_capacity(n);
    let mut reason_codes = Vec::with_capacity(n);
    let mut evidence = Vec::with_capacity(n);
    let mut finding_keys = Vec::with_capacity(n);
    for ((scan_id, key), (evaluation, batch)) in &by_key {
        let failed = evaluation.status == EvaluationStatus::Fail.as_str();
        ids.push(Uuid::now_v7());
        organizations.push(batch.organization_id);
        scans.push(*scan_id);
        jobs.push(batch.scan_job_id);
        attempts.push(batch.params.claim.attempt_id);
        keys.push(key.as_str());
        plugins.push(batch.plugin);
        rule_ids.push(evaluation.rule_id.as_str());
        resources.push(redact(&evaluation.resource));
        statuses.push(evaluation.status.as_str());
        reason_codes.push(evaluation.reason_code.as_str());
        evidence.push(redact(&evaluation.evidence));
        finding_keys.push(if failed {
            finding_key(
                batch.plugin,
                &evaluation.rule_id,
                &evaluation.resource,
                &evaluation.finding_discriminator,
            )
        } else {
            String::new()
        });
    }
    sql::evaluations::UpsertMany {
        ids: &ids,
        organizations: &organizations,
        scans: &scans,
        jobs: &jobs,
        attempts: &attempts,
        keys: &keys,
        plugins: &plugins,
        rule_ids: &rule_ids,
        resources: &resources,
        statuses: &statuses,
        reason_codes: &reason_codes,
        evidence: &evidence,
        finding_keys: &finding_keys,
    }
    .query()
    .execute(conn)
    .await?;
    Ok(())
}
