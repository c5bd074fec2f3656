-- The reaper's leader: active schedules whose next fire time has come, locked for the
-- transaction that fires them (another sweep skips them rather than fire them twice).
-- $1 now: timestamptz — the reaper's clock
-- $2 limit: int8
SELECT id, organization_id, name, target, plugins, priority, execution_deadline_seconds,
       client_id, cron, interval_seconds, time_zone, jitter_seconds, overlap, next_slot
FROM scan_schedules
WHERE NOT paused AND next_fire_at <= $1
ORDER BY next_fire_at
LIMIT $2
FOR UPDATE SKIP LOCKED
