-- `palisade target show`: a scan's findings, each with its occurrences across the scans of the
-- same target (findings_occurrence_idx): the first and last scan that reported its key, and
-- how many did. Each keeps its own disposition: nothing is inherited.
-- $1 scan_id: uuid
SELECT f.id, f.finding_key, f.plugin, f.rule_id, f.resource, f.severity, f.title, f.status,
       (extract(epoch FROM o.first_seen) * 1000)::bigint AS first_seen_unix_ms,
       (extract(epoch FROM o.last_seen) * 1000)::bigint AS last_seen_unix_ms,
       o.scans
FROM findings f
JOIN scans s ON s.id = f.scan_id
CROSS JOIN LATERAL (
    SELECT min(s2.created_at) AS first_seen, max(s2.created_at) AS last_seen, count(*) AS scans
    FROM findings f2 JOIN scans s2 ON s2.id = f2.scan_id
    WHERE f2.organization_id = f.organization_id AND f2.finding_key = f.finding_key
      AND s2.target_id = s.target_id
) o
WHERE f.scan_id = $1
ORDER BY f.severity DESC, f.finding_key
