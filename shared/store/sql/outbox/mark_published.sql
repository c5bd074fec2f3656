-- Marks rows the bus acknowledged as published.
-- $1: ids
UPDATE outbox SET published_at = now(), claimed_until = NULL WHERE id = ANY($1)
