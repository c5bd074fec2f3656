-- `palisade org set --max-running-tasks`: an organization's cap on tasks in flight, changed on
-- the live organization (dispatch reads it at each grant). Returns the cap it replaced; no row:
-- no such organization.
-- $1: id
-- $2: the new cap (NULL: none)
UPDATE organizations o SET max_running_tasks = $2
FROM (SELECT id, max_running_tasks FROM organizations WHERE id = $1 FOR UPDATE) previous
WHERE o.id = previous.id
RETURNING previous.max_running_tasks
