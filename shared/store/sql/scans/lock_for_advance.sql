-- Progress: locks the scans to advance, in id order, and reads what their next step needs.
-- $1 scan_ids: uuid[]
SELECT s.id, s.plugins, s.state, s.client_id, s.idempotency_key, s.priority,
       s.execution_deadline_seconds, t.locator AS target,
       (extract(epoch FROM s.created_at) * 1000)::bigint AS admitted_at_unix_ms
FROM scans s JOIN targets t ON t.id = s.target_id
WHERE s.id = ANY($1)
ORDER BY s.id
FOR NO KEY UPDATE OF s
