-- Retention of rows marked published by versions before published rows were removed at once:
-- deletes a slice of them once past the cutoff. Today's relays leave no such row.
-- $1 retention_seconds: float8 — the cutoff, this long before now
-- $2 limit: int8
DELETE FROM outbox WHERE id = ANY(ARRAY(
    SELECT id FROM outbox WHERE published_at < now() - make_interval(secs => $1)
    ORDER BY published_at LIMIT $2
))
