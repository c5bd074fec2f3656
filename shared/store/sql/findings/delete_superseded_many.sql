-- Ingestion: deletes the findings, evaluations and asset links an earlier attempt of each
-- completing scan job left.
-- $1 jobs: uuid[]
-- $2 attempts: uuid[]
WITH gone_findings AS (
    DELETE FROM findings f USING UNNEST($1::uuid[], $2::uuid[]) AS u(scan_job_id, attempt_id)
    WHERE f.scan_job_id = u.scan_job_id AND f.attempt_id <> u.attempt_id
), gone_evaluations AS (
    DELETE FROM evaluations e USING UNNEST($1::uuid[], $2::uuid[]) AS u(scan_job_id, attempt_id)
    WHERE e.scan_job_id = u.scan_job_id AND e.attempt_id <> u.attempt_id
)
DELETE FROM scan_assets s USING UNNEST($1::uuid[], $2::uuid[]) AS u(scan_job_id, attempt_id)
WHERE s.scan_job_id = u.scan_job_id AND s.attempt_id <> u.attempt_id
