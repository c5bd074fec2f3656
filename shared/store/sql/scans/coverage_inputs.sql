-- Scans' coverage inputs (`coverage::of_scans`), in the caller's snapshot: each scan's target
-- locator, its scan jobs (plugin, state, the rules they require), the assets it discovered, and
-- its evaluations with the finding each failure names (its id and disposition, if it exists).
-- No row for a scan that does not exist (in the organization, when one is given).
-- $1 scan_ids: uuid[]
-- $2 organization_id: uuid — NULL: any
-- $3 with_evidence: bool — false: every evaluation's evidence read as '' (a summary needs none)
SELECT s.id AS scan_id, s.state, t.locator,
       coalesce((SELECT jsonb_agg(jsonb_build_array(j.plugin, j.state, j.required_rules)
                                  ORDER BY j.position)
                 FROM scan_jobs j WHERE j.scan_id = s.id), '[]') AS jobs,
       coalesce((SELECT jsonb_agg(jsonb_build_array(a.kind, a.value))
                 FROM scan_assets sa JOIN assets a ON a.id = sa.asset_id
                 WHERE sa.scan_id = s.id), '[]') AS assets,
       coalesce((SELECT jsonb_agg(jsonb_build_array(e.plugin, e.rule_id, e.resource, e.status,
                                                    e.reason_code,
                                                    CASE WHEN $3 THEN e.evidence ELSE '' END,
                                                    f.id, f.status))
                 FROM evaluations e
                 LEFT JOIN findings f ON f.scan_id = e.scan_id AND f.finding_key = e.finding_key
                 WHERE e.scan_id = s.id), '[]') AS evaluations
FROM scans s JOIN targets t ON t.id = s.target_id
WHERE s.id = ANY($1::uuid[]) AND ($2::uuid IS NULL OR s.organization_id = $2)
