-- Progress: fails tasks (to retry_wait with a delay, or terminally with their scan job and scan).
-- $1 task_ids: uuid[]
-- $2 job_ids: uuid[]
-- $3 scan_ids: uuid[]
-- $4 retries: bool[]
-- $5 delays: float8[]
-- $6 reasons: text[]
-- $7 retry_wait_state: text — TaskState::RetryWait.as_str()
-- $8 failed_terminal_state: text — TaskState::FailedTerminal.as_str()
-- $9 error_code: text
-- $10 task_message: text
-- $11 from_states: text[] — failure.from, the states the tasks are failed from (live attempts: leased or running;
--      never leased: pending)
-- $12 pending_job_state: text — ScanJobState::Pending.as_str()
-- $13 failed_job_state: text — ScanJobState::Failed.as_str()
-- $14 error_message: text
-- $15 running_job_state: text — ScanJobState::Running.as_str() (stored only by an older build: a retry moves such a job back
--      to pending; this build leaves a retried job's row as it is)
-- $16 failed_scan_state: text — ScanState::Failed.as_str()
-- $17 pending_scan_state: text — ScanState::Pending.as_str()
-- $18 running_scan_state: text — ScanState::Running.as_str() (stored only by an older build)
WITH input AS (
    SELECT * FROM UNNEST($1::uuid[], $2::uuid[], $3::uuid[], $4::bool[], $5::float8[], $6::text[])
        WITH ORDINALITY AS u(task_id, scan_job_id, scan_id, retry, delay, reason, ord)
), tasks AS (
    UPDATE worker_tasks t
    SET state = CASE WHEN u.retry THEN $7 ELSE $8 END,
        available_at = CASE WHEN u.retry THEN now() + make_interval(secs => u.delay)
                            ELSE t.available_at END,
        completed_at = CASE WHEN u.retry THEN t.completed_at ELSE now() END,
        last_error_code = $9, last_error = $10, updated_at = now()
    FROM input u
    WHERE t.id = u.task_id AND t.state = ANY($11)
    RETURNING u.ord, u.scan_job_id, u.scan_id, u.retry, u.reason
), jobs AS (
    UPDATE scan_jobs j
    SET state = CASE WHEN tasks.retry THEN $12 ELSE $13 END,
        error_code = CASE WHEN tasks.retry THEN j.error_code ELSE $9 END,
        error_message = CASE WHEN tasks.retry THEN j.error_message ELSE $14 END,
        finished_at = CASE WHEN tasks.retry THEN j.finished_at ELSE now() END,
        updated_at = now()
    FROM tasks
    WHERE j.id = tasks.scan_job_id
      AND CASE WHEN tasks.retry THEN j.state = $15 ELSE j.state IN ($12, $15) END
), scans_failed AS (
    -- One reason per scan: its first terminal task's.
    UPDATE scans s
    SET state = $16, failure_code = $9, failure_reason = f.reason, finished_at = now(),
        updated_at = now()
    FROM (SELECT DISTINCT ON (scan_id) scan_id, reason, ord FROM tasks
          WHERE NOT retry AND scan_id IS NOT NULL ORDER BY scan_id, ord) f
    WHERE s.id = f.scan_id AND s.state IN ($17, $18)
    RETURNING f.ord, s.client_id, s.idempotency_key,
              (extract(epoch FROM s.finished_at) * 1000)::bigint AS failed_at_unix_ms
)
SELECT tasks.ord, tasks.retry, scans_failed.client_id, scans_failed.idempotency_key,
       scans_failed.failed_at_unix_ms
FROM tasks LEFT JOIN scans_failed ON scans_failed.ord = tasks.ord
ORDER BY tasks.ord
