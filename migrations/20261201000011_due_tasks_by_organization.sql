-- Acquire picks an organization's due tasks in priority order and stops after the few it
-- grants: this index holds exactly that order per organization, so an acquire reads about as
-- many tasks as it leases, whatever the backlog. The index it replaces, (organization_id,
-- state), made every acquire read and sort all of its organizations' waiting tasks.
CREATE INDEX IF NOT EXISTS worker_tasks_due_by_org_idx
    ON worker_tasks (organization_id, priority DESC, available_at, created_at)
    WHERE state IN ('pending', 'retry_wait');

DROP INDEX IF EXISTS worker_tasks_org_state_idx;
