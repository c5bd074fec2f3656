-- `palisade schedule delete`: removes a schedule and its fire records (its scans stay). No row:
-- no such schedule.
-- $1 id: uuid
DELETE FROM scan_schedules WHERE id = $1 RETURNING id
