-- Ingestion (one by one): completes a scan job and publishes its evidence counts.
-- $1: scan_job_id
-- $2: finding_count as i32
-- $3: asset_count as i32
-- $4: summary
-- $5: ScanJobState::Completed.as_str()
UPDATE scan_jobs SET state = $5, evidence_published_at = now(), finished_at = now(),
       finding_count = $2, asset_count = $3, summary = $4, updated_at = now()
WHERE id = $1
