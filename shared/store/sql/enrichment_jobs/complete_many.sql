-- Enrichment: completes the jobs whose fencing token is still theirs and whose lease has not
-- lapsed, with their final checkpoint; a job missing from the result was fenced out.
-- $1 ids: uuid[]
-- $2 tokens: int8[]
-- $3 checkpoints: jsonb[]
-- $4 completed_state: text — EnrichmentJobState::Completed.as_str()
-- $5 running_state: text — EnrichmentJobState::Running.as_str()
UPDATE enrichment_jobs j
SET state = $4, checkpoint = c.checkpoint, finished_at = now(), lease_owner = NULL,
    lease_expires_at = NULL, updated_at = now()
FROM UNNEST($1::uuid[], $2::bigint[], $3::jsonb[]) AS c(id, fencing_token, checkpoint)
WHERE j.id = c.id AND j.fencing_token = c.fencing_token AND j.state = $5
  AND j.lease_expires_at > now()
RETURNING j.id, j.scan_id, j.organization_id, j.attempt_count,
          (extract(epoch FROM j.finished_at) * 1000)::bigint AS finished_at_unix_ms
