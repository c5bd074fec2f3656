-- Acquire, before any grant: locks the organizations with a cap on tasks in flight among those
-- the acquiring workers serve, in id order, so acquires that may lease their tasks take turns
-- and each grant's count of tasks in flight sees the leases of the acquire before it (the grant
-- statement's snapshot is taken after this lock).
-- $1 organization_ids: uuid[]
SELECT id FROM organizations
WHERE id = ANY($1) AND max_running_tasks IS NOT NULL
ORDER BY id
FOR NO KEY UPDATE
