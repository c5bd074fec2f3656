-- `palisade org set`: an organization's hourly scan quota, changed on the live organization
-- (admission reads it at each decision, so the next admission counts against it). Returns the
-- quota it replaced; no row: no such organization.
-- $1: id
-- $2: the new quota (NULL: none)
UPDATE organizations o SET hourly_scan_quota = $2
FROM (SELECT id, hourly_scan_quota FROM organizations WHERE id = $1 FOR UPDATE) previous
WHERE o.id = previous.id
RETURNING previous.hourly_scan_quota
