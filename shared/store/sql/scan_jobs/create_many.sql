-- Creates scan jobs and their tasks, and emits nothing: the caller stages `task.ready`.
-- $1: job_ids
-- $2: task_ids
-- $3: scan_ids
-- $4: organizations
-- $5: positions
-- $6: plugins
-- $7: payloads
-- $8: priorities
-- $9: deadlines
-- $10: max_attempts
WITH input AS (
    SELECT * FROM UNNEST($1::uuid[], $2::uuid[], $3::uuid[], $4::uuid[], $5::int[], $6::text[],
                         $7::jsonb[], $8::int[], $9::int[], $10::int[])
        AS u(job_id, task_id, scan_id, organization_id, position, plugin, payload, priority,
             deadline, max_attempts)
), jobs AS (
    INSERT INTO scan_jobs (id, scan_id, organization_id, position, plugin)
    SELECT job_id, scan_id, organization_id, position, plugin FROM input
)
INSERT INTO worker_tasks (id, organization_id, scan_id, scan_job_id, required_capabilities,
                          payload, priority, execution_deadline_seconds, max_attempts)
SELECT task_id, organization_id, scan_id, job_id, ARRAY[plugin], payload, priority, deadline,
       max_attempts
FROM input
