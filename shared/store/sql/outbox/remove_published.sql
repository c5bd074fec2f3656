-- Removes rows the bus acknowledged: a published event is on the events stream, so its row
-- has done its work (one deleted row version, against an updated one per event before).
-- $1: ids
DELETE FROM outbox WHERE id = ANY($1)
