-- `palisade org set`: an organization's hourly scan quota, changed on the live organization
-- (admission reads it at each decision, so the next admission counts against it), and the
-- change recorded. Returns the quota it replaced; no row: no such organization.
-- $1 id: uuid
-- $2 hourly_scan_quota: int4 — the new quota (NULL: none)
-- $3 change_id: uuid — the change's id (Uuid::now_v7())
-- $4 who: text
-- $5 why: text
-- $6 organization_limits_set_action: text — AdminAction::OrganizationLimitsSet
WITH previous AS (
    SELECT id, hourly_scan_quota FROM organizations WHERE id = $1 FOR UPDATE
), changed AS (
    UPDATE organizations o SET hourly_scan_quota = $2
    FROM previous WHERE o.id = previous.id
    RETURNING previous.id, previous.hourly_scan_quota
), recorded AS (
    INSERT INTO admin_changes (id, actor, reason, action, organization_id, detail)
    SELECT $3, $4, $5, $6, id, jsonb_build_object(
        'hourly_scan_quota', jsonb_build_object('before', hourly_scan_quota, 'after', $2::int))
    FROM changed
)
SELECT hourly_scan_quota FROM changed
