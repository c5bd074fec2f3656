-- A scan's findings, for `palisade scan show`.
-- $1 scan_id: uuid
SELECT finding_key, plugin, rule_id, resource, severity, title, evidence, status, attempt_id
FROM findings WHERE scan_id = $1 ORDER BY plugin, rule_id, resource
