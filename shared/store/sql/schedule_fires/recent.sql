-- `palisade schedule show`: a schedule's latest fired slots, newest first.
-- $1 schedule_id: uuid
-- $2 limit: int8
SELECT slot, fired_at, outcome, scan_id, missed_before, detail
FROM schedule_fires
WHERE schedule_id = $1
ORDER BY slot DESC
LIMIT $2
