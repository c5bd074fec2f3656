-- One scan with its target, for `palisade scan show`.
-- $1: scan_id
SELECT s.id, s.organization_id, t.locator AS target, s.client_id, s.idempotency_key, s.plugins,
       s.state, s.failure_code, s.failure_reason, s.finding_count, s.created_at, s.finished_at
FROM scans s JOIN targets t ON t.id = s.target_id WHERE s.id = $1
