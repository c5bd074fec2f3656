-- Acquire: the target assets each leased scan names.
-- $1 needs_assets: uuid[]
-- $2 lease_assets_max: int8
SELECT s.scan_id, s.kind, s.value FROM unnest($1::uuid[]) AS wanted(scan_id)
CROSS JOIN LATERAL (
    SELECT sa.scan_id, a.kind, a.value FROM scan_assets sa JOIN assets a ON a.id = sa.asset_id
    WHERE sa.scan_id = wanted.scan_id ORDER BY a.kind, a.value LIMIT $2
) s
