-- Retention: deletes a slice of rows published before the cutoff.
-- $1: seconds
-- $2: limit
DELETE FROM outbox WHERE id = ANY(ARRAY(
    SELECT id FROM outbox WHERE published_at < now() - make_interval(secs => $1)
    ORDER BY published_at LIMIT $2
))
