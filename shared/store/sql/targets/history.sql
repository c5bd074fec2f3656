-- `palisade target show`: each target with this locator (in the organization, when one is
-- given) and its latest scans, newest first (scans_target_created_idx).
-- $1 locator: text
-- $2 organization_id: uuid — NULL: any
-- $3 scans_max: int8 — at most this many scans per target
SELECT t.id, t.organization_id, t.locator,
       coalesce((SELECT jsonb_agg(jsonb_build_array(s.id, s.state,
                                                    (extract(epoch FROM s.created_at) * 1000)::bigint)
                                  ORDER BY s.created_at DESC)
                 FROM (SELECT id, state, created_at FROM scans
                       WHERE target_id = t.id ORDER BY created_at DESC LIMIT $3) s), '[]') AS scans
FROM targets t
WHERE t.locator = $1 AND ($2::uuid IS NULL OR t.organization_id = $2)
ORDER BY t.organization_id
