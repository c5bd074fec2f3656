-- `scan diff`: two scans of one organization, whether they scan the same target and the second
-- was admitted after the first, the second's state, each one's findings, and the second's
-- evaluations (`coverage::diff`). No row: either scan is missing (in the organization, when
-- one is given).
-- $1 base_scan_id: uuid
-- $2 scan_id: uuid
-- $3 organization_id: uuid — NULL: any
SELECT b.target_id = s.target_id AS same_target, b.created_at < s.created_at AS later,
       s.state, t.locator,
       coalesce((SELECT jsonb_agg(jsonb_build_array(f.finding_key, f.plugin, f.rule_id, f.resource,
                                                    f.severity, f.title, f.id, f.status)
                                  ORDER BY f.finding_key)
                 FROM findings f WHERE f.scan_id = b.id), '[]') AS base_findings,
       coalesce((SELECT jsonb_agg(jsonb_build_array(f.finding_key, f.plugin, f.rule_id, f.resource,
                                                    f.severity, f.title, f.id, f.status)
                                  ORDER BY f.finding_key)
                 FROM findings f WHERE f.scan_id = s.id), '[]') AS findings,
       coalesce((SELECT jsonb_agg(jsonb_build_array(e.plugin, e.rule_id, e.resource, e.status))
                 FROM evaluations e WHERE e.scan_id = s.id), '[]') AS evaluations
FROM scans b, scans s JOIN targets t ON t.id = s.target_id
WHERE b.id = $1 AND s.id = $2
  AND ($3::uuid IS NULL OR (b.organization_id = $3 AND s.organization_id = $3))
