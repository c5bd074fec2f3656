-- Reaper: sessions whose leftovers on the bus are still to be removed, at most $1. First those
-- that ended without a commit (their chunks and any object), oldest first; then committed ones
-- whose chunks ingestion did not record purged within $4 seconds of the commit (it stopped
-- between its commit and its purge; their chunks only: the object is the artifact), oldest
-- commit first.
-- $1 limit: int8
-- $2 removable_statuses: text[] — [UploadStatus::Expired.as_str(), UploadStatus::Failed.as_str()]
-- $3 committed_status: text — UploadStatus::Committed.as_str()
-- $4 committed_chunks_grace_seconds: float8
(SELECT id, worker_id, object_key, status FROM worker_artifact_uploads
 WHERE status = ANY($2) AND removed_at IS NULL
 ORDER BY created_at
 LIMIT $1)
UNION ALL
(SELECT id, worker_id, object_key, status FROM worker_artifact_uploads
 WHERE status = $3 AND removed_at IS NULL AND committed_at <= now() - make_interval(secs => $4)
 ORDER BY committed_at
 LIMIT $1)
LIMIT $1
