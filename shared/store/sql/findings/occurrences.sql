-- `palisade finding show`: the same finding key in the scans of the same target, newest
-- first: its occurrence history (each keeps its own disposition).
-- $1 organization_id: uuid
-- $2 finding_key: text
-- $3 target_id: uuid
-- $4 limit: int8 — at most this many
SELECT f.id, f.scan_id, f.status, f.revision, s.state AS scan_state, s.created_at AS scanned_at
FROM findings f JOIN scans s ON s.id = f.scan_id
WHERE f.organization_id = $1 AND f.finding_key = $2 AND s.target_id = $3
ORDER BY s.created_at DESC, f.id
LIMIT $4
