-- `palisade org show`: an organization's limits, its workers (with each assignment's state),
-- its clients, its schedules and its tasks in flight. No row: no such organization.
-- $1 id: uuid
-- $2 leased_states: text[] — TaskState::LEASED
SELECT o.id, o.name, o.hourly_scan_quota, o.max_running_tasks, o.created_at,
       (SELECT count(*) FROM worker_tasks t
        WHERE t.organization_id = o.id AND t.state = ANY($2)) AS tasks_in_flight,
       (SELECT count(*) FROM scan_schedules s WHERE s.organization_id = o.id) AS schedules,
       coalesce((SELECT jsonb_agg(jsonb_build_object(
                    'worker_id', ow.worker_id, 'enabled', ow.enabled,
                    'assigned_at', ow.assigned_at, 'revoked_at', ow.revoked_at,
                    'revocation_reason', ow.revocation_reason) ORDER BY ow.worker_id)
                 FROM organization_workers ow WHERE ow.organization_id = o.id), '[]'::jsonb) AS workers,
       ARRAY(SELECT c.id FROM clients c WHERE o.id = ANY(c.organization_ids) ORDER BY c.id) AS client_ids,
       coalesce((SELECT jsonb_agg(jsonb_build_object(
                    'id', c.id, 'name', c.name, 'revoked_at', c.revoked_at,
                    'revocation_reason', c.revocation_reason) ORDER BY c.id)
                 FROM clients c WHERE o.id = ANY(c.organization_ids)), '[]'::jsonb) AS clients
FROM organizations o
WHERE o.id = $1
