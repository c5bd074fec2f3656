-- Gives rows the bus refused back to the poll.
-- $1: ids
UPDATE outbox SET claimed_until = NULL WHERE id = ANY($1)
