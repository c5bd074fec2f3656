-- Ingestion: moves attempts, their tasks and scan jobs to running or completed, publishing each
-- completed job's evidence counts and copying onto it the rules its plugin declared by the
-- worker that completed it (`coverage`: what the job requires evaluations of).
-- $1 attempt_ids: uuid[]
-- $2 task_ids: uuid[]
-- $3 finished: bool[]
-- $4 job_ids: uuid[]
-- $5 summaries: text[]
-- $6 succeeded_status: text — AttemptStatus::Succeeded.as_str()
-- $7 running_status: text — AttemptStatus::Running.as_str()
-- $8 leased_status: text — AttemptStatus::Leased.as_str()
-- $9 completed_state: text — TaskState::Completed.as_str()
-- $10 running_state: text — TaskState::Running.as_str()
-- $11 leased_state: text — TaskState::Leased.as_str()
-- $12 completed_job_state: text — ScanJobState::Completed.as_str()
-- $13 job_workers: uuid[] — the worker completing each of job_ids
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
    summary = u.summary,
    required_rules = coalesce(
        (SELECT w.declared_rules -> j.plugin FROM workers w WHERE w.id = u.worker_id), '[]'),
    updated_at = now()
FROM UNNEST($4::uuid[], $5::text[], $13::uuid[]) AS u(id, summary, worker_id)
WHERE j.id = u.id
RETURNING j.id, j.finding_count, j.asset_count
