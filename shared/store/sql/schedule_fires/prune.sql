-- Retention: deletes a slice of fire records of slots older than the cutoff.
-- $1 retention_seconds: float8 — the cutoff, this long before now
-- $2 limit: int8
DELETE FROM schedule_fires WHERE (schedule_id, slot) IN (
    SELECT schedule_id, slot FROM schedule_fires
    WHERE slot < now() - make_interval(secs => $1)
    ORDER BY slot LIMIT $2
)
