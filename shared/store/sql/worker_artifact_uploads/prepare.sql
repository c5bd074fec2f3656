-- Ingestion: opens an upload session for an attempt that holds its lease (the fence was
-- checked in this transaction), or finds the one a resent prepare opened. Returns the row.
-- $1: upload id (the worker's)
-- $2: claim.task_id
-- $3: claim.attempt_id
-- $4: claim.worker_id
-- $5: object key
-- $6: name
-- $7: content type
-- $8: crate::seconds(ttl)
-- $9: UploadStatus::Prepared.as_str()
WITH inserted AS (
    INSERT INTO worker_artifact_uploads
        (id, task_id, attempt_id, organization_id, scan_id, scan_job_id, worker_id, object_key,
         original_name, content_type, status, expires_at)
    SELECT $1, t.id, $3, t.organization_id, t.scan_id, t.scan_job_id, $4, $5, $6, $7, $9,
           now() + make_interval(secs => $8)
    FROM worker_tasks t WHERE t.id = $2
    ON CONFLICT (id) DO NOTHING
    RETURNING *
)
SELECT * FROM inserted
UNION ALL
SELECT * FROM worker_artifact_uploads WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM inserted)
