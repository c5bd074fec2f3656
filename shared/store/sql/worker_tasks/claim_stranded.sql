-- Reaper: claims tasks never leased that have waited longer than the pending deadline while no
-- live worker could take them: none enabled, assigned to the task's organization, offering
-- every capability it needs, and seen within the live window or holding a live lease (a
-- worker busy with long tasks does not ask for more). Skips tasks someone holds locked; for
-- `progress::fail_tasks`, which fails them with their scans and frees their targets. A pending or
-- retry_wait task whose attempts are spent (which the grant never leases) is claimed the same
-- way once the deadline passed: no worker can take it either.
-- $1 limit: int8
-- $2 waiting_states: text[] — [TaskState::Pending.as_str(), TaskState::RetryWait.as_str()]
-- $3 pending_deadline_seconds: float8
-- $4 worker_live_within_seconds: float8
-- $5 live_statuses: text[] — AttemptStatus::LIVE.map(AttemptStatus::as_str)
-- $6 pending_state: text — TaskState::Pending.as_str()
SELECT NULL::uuid AS attempt_id, t.id AS task_id, t.organization_id, t.scan_id, t.scan_job_id,
       coalesce(t.payload->>'plugin', '') AS plugin, t.attempt_count, t.max_attempts,
       true AS task_live
FROM worker_tasks t
WHERE t.state = ANY($2)
  AND t.available_at <= now() - make_interval(secs => $3)
  AND t.cancel_requested_at IS NULL
  AND (t.attempt_count >= t.max_attempts OR t.state = $6 AND NOT EXISTS (
      SELECT 1
      FROM organization_workers o JOIN workers w ON w.id = o.worker_id
      WHERE o.organization_id = t.organization_id AND o.enabled AND o.revoked_at IS NULL
        AND w.enabled AND w.revoked_at IS NULL
        AND w.capabilities @> t.required_capabilities
        AND (w.last_seen_at > now() - make_interval(secs => $4)
             OR EXISTS (SELECT 1 FROM worker_task_attempts a
                        WHERE a.worker_id = w.id AND a.status = ANY($5)
                          AND a.lease_expires_at > now()))
  ))
ORDER BY t.available_at
LIMIT $1
FOR UPDATE OF t SKIP LOCKED
