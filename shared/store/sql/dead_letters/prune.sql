-- Retention: deletes a slice of dead letters recorded before the cutoff.
-- $1 retention_seconds: float8 — the cutoff, this long before now
-- $2 limit: int8
DELETE FROM dead_letters WHERE id = ANY(ARRAY(
    SELECT id FROM dead_letters WHERE created_at < now() - make_interval(secs => $1)
    ORDER BY created_at LIMIT $2
))
