-- `palisade org set --max-running-tasks`: an organization's cap on tasks in flight, changed on
-- the live organization (dispatch reads it at each grant), and the change recorded. Returns the
-- cap it replaced; no row: no such organization.
-- $1 id: uuid
-- $2 max_running_tasks: int4 — the new cap (NULL: none)
-- $3 change_id: uuid — the change's id (Uuid::now_v7())
-- $4 who: text
-- $5 why: text
-- $6 organization_limits_set_action: text — AdminAction::OrganizationLimitsSet
WITH previous AS (
    SELECT id, max_running_tasks FROM organizations WHERE id = $1 FOR UPDATE
), changed AS (
    UPDATE organizations o SET max_running_tasks = $2
    FROM previous WHERE o.id = previous.id
    RETURNING previous.id, previous.max_running_tasks
), recorded AS (
    INSERT INTO admin_changes (id, actor, reason, action, organization_id, detail)
    SELECT $3, $4, $5, $6, id, jsonb_build_object(
        'max_running_tasks', jsonb_build_object('before', max_running_tasks, 'after', $2::int))
    FROM changed
)
SELECT max_running_tasks FROM changed
