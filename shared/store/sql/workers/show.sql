-- `palisade worker show`: a worker, its live leases and its organizations with each
-- assignment's state. No row: no such worker.
-- $1 worker_id: uuid
-- $2 live_statuses: text[] — LIVE_ATTEMPT_STATUSES
SELECT w.id, w.name, w.enabled, w.revoked_at, w.revocation_reason, w.capabilities,
       w.allowed_capabilities, w.nats_account IS NOT NULL AS enrolled,
       w.max_concurrent_tasks AS capacity, w.software_version, w.last_seen_at, w.created_at,
       (SELECT count(*) FROM worker_task_attempts a
        WHERE a.worker_id = w.id AND a.status = ANY($2) AND a.lease_expires_at > now()) AS live_leases,
       coalesce((SELECT jsonb_agg(jsonb_build_object(
                    'organization_id', ow.organization_id, 'enabled', ow.enabled,
                    'assigned_at', ow.assigned_at, 'revoked_at', ow.revoked_at,
                    'revocation_reason', ow.revocation_reason) ORDER BY ow.organization_id)
                 FROM organization_workers ow WHERE ow.worker_id = w.id), '[]'::jsonb) AS organizations
FROM workers w
WHERE w.id = $1
