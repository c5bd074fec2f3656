-- `palisade schedule list`: schedules in creation order (ids are UUIDv7s), a page after the id
-- $2, of one organization unless $1 is NULL.
-- $1 organization_id: uuid — may be NULL
-- $2 after_id: uuid — the last id of the previous page, or NULL
-- $3 limit: int8
SELECT id, organization_id, name, target, plugins, priority, execution_deadline_seconds,
       client_id, cron, interval_seconds, time_zone, jitter_seconds, overlap, paused, next_slot,
       next_fire_at, created_at, created_by, updated_at, updated_by, update_reason
FROM scan_schedules
WHERE ($1::uuid IS NULL OR organization_id = $1)
  AND ($2::uuid IS NULL OR id > $2)
ORDER BY id
LIMIT $3
