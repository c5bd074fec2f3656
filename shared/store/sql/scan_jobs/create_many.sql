-- Creates scan jobs and their tasks, and emits nothing: the caller stages `task.ready`.
-- $1 job_ids: uuid[]
-- $2 task_ids: uuid[]
-- $3 scan_ids: uuid[]
-- $4 organizations: uuid[]
-- $5 positions: int4[]
-- $6 plugins: text[]
-- $7 payloads: jsonb[]
-- $8 priorities: int4[]
-- $9 deadlines: int4[]
-- $10 max_attempts: int4[]
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
