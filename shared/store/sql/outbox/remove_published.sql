-- Removes rows whose every event the bus acknowledged: a published event is on the events
-- stream, so its row has done its work (a delete writes no row version). Either table.
-- $1 ids: uuid[]
WITH single AS (
    DELETE FROM outbox WHERE id = ANY($1)
)
DELETE FROM outbox_batches WHERE id = ANY($1)
