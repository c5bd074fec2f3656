-- Admission: the batch's organizations with their quotas; an organization with a quota is locked so
-- its admissions count one after another.
-- $1 ids: uuid[]
WITH counted AS MATERIALIZED (
    -- Serialize an organization's admissions only when it has a quota to count.
    SELECT id FROM organizations
    WHERE id = ANY($1) AND hourly_scan_quota IS NOT NULL
    ORDER BY id
    FOR NO KEY UPDATE
)
SELECT o.id, o.hourly_scan_quota
FROM organizations o LEFT JOIN counted c ON c.id = o.id
WHERE o.id = ANY($1)
