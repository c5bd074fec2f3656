-- `palisade schedule show` and the commands that change one: a schedule by id.
-- $1 id: uuid
SELECT id, organization_id, name, target, plugins, priority, execution_deadline_seconds,
       client_id, cron, interval_seconds, time_zone, jitter_seconds, overlap, paused, next_slot,
       next_fire_at, created_at, created_by, updated_at, updated_by, update_reason
FROM scan_schedules
WHERE id = $1
