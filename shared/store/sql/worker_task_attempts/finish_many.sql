-- Ingestion: moves attempts, their tasks and scan jobs to running or completed, publishing each
-- completed job's evidence counts.
-- $1: attempt_ids
-- $2: task_ids
-- $3: finished
-- $4: job_ids
-- $5: summaries
-- $6: AttemptStatus::Succeeded.as_str()
-- $7: AttemptStatus::Running.as_str()
-- $8: AttemptStatus::Leased.as_str()
-- $9: TaskState::Completed.as_str()
-- $10: TaskState::Running.as_str()
-- $11: TaskState::Leased.as_str()
-- $12: ScanJobState::Completed.as_str()
WITH attempts AS (
    UPDATE worker_task_attempts a
    SET status = CASE WHEN u.done THEN $6 ELSE $7 END,
        finished_at = CASE WHEN u.done THEN now() ELSE a.finished_at END,
        updated_at = now()
    FROM UNNEST($1::uuid[], $3::bool[]) AS u(id, done)
    WHERE a.id = u.id AND (u.done OR a.status = $8)
), tasks AS (
    UPDATE worker_tasks t
    SET state = CASE WHEN u.done THEN $9 ELSE $10 END,
        completed_at = CASE WHEN u.done THEN now() ELSE t.completed_at END,
        updated_at = now()
    FROM UNNEST($2::uuid[], $3::bool[]) AS u(id, done)
    WHERE t.id = u.id AND (u.done OR t.state = $11)
)
UPDATE scan_jobs j
SET state = $12, evidence_published_at = now(), finished_at = now(),
    finding_count = (SELECT count(*) FROM findings f WHERE f.scan_job_id = j.id),
    asset_count = (SELECT count(*) FROM scan_assets s WHERE s.scan_job_id = j.id),
    summary = u.summary, updated_at = now()
FROM UNNEST($4::uuid[], $5::text[]) AS u(id, summary)
WHERE j.id = u.id
RETURNING j.id, j.finding_count, j.asset_count
