-- `palisade schedule add` and `schedules add`: a new schedule, unless its organization is
-- unknown, has one of that name already, or has `SCHEDULES_PER_ORGANIZATION_MAX` (no row:
-- `create` tells them apart). Runs after `lock_organization`, so the count sees every schedule
-- a concurrent create committed.
-- $1 id: uuid — Uuid::now_v7()
-- $2 organization_id: uuid
-- $3 name: text
-- $4 target: text
-- $5 plugins: text[]
-- $6 priority: int4
-- $7 execution_deadline_seconds: int4
-- $8 client_id: text
-- $9 cron: text — may be NULL
-- $10 interval_seconds: int8 — may be NULL
-- $11 time_zone: text
-- $12 jitter_seconds: int4
-- $13 overlap: text — ScheduleOverlap
-- $14 paused: bool
-- $15 next_slot: timestamptz
-- $16 next_fire_at: timestamptz
-- $17 who: text — the operator's name
-- $18 why: text
-- $19 schedules_per_organization_max: int8
INSERT INTO scan_schedules (id, organization_id, name, target, plugins, priority,
                            execution_deadline_seconds, client_id, cron, interval_seconds,
                            time_zone, jitter_seconds, overlap, paused, next_slot, next_fire_at,
                            created_by, updated_by, update_reason)
SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $17, $18
WHERE EXISTS (SELECT 1 FROM organizations WHERE id = $2)
  AND (SELECT count(*) FROM scan_schedules WHERE organization_id = $2) < $19
ON CONFLICT (organization_id, name) DO NOTHING
RETURNING id
