-- Ingestion: opens an upload session for an attempt that holds its lease (the fence was
-- checked in this transaction), or finds the one a resent prepare opened. Returns the row.
-- $1 upload_id: uuid — the worker's
-- $2 task_id: uuid
-- $3 attempt_id: uuid
-- $4 worker_id: uuid
-- $5 object_key: text
-- $6 name: text
-- $7 content_type: text
-- $8 ttl_seconds: float8
-- $9 prepared_status: text — UploadStatus::Prepared.as_str()
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
