-- Gives rows the bus refused (any of their events) back to the poll, without the events it
-- acknowledged: those are on the stream, and publishing them again past the stream's
-- duplicate window would repeat them. Either table.
-- $1 ids: uuid[]
-- $2 published_event_ids: uuid[]
WITH single AS (
    UPDATE outbox SET claimed_until = NULL WHERE id = ANY($1)
)
UPDATE outbox_batches b
SET claimed_until = NULL,
    (event_ids, subjects, payloads, headers) = (
        SELECT array_agg(e.id ORDER BY e.position), array_agg(e.subject ORDER BY e.position),
               array_agg(e.payload ORDER BY e.position), array_agg(e.headers ORDER BY e.position)
        FROM UNNEST(b.event_ids, b.subjects, b.payloads, b.headers) WITH ORDINALITY
             AS e(id, subject, payload, headers, position)
        WHERE e.id <> ALL($2)
    )
WHERE b.id = ANY($1)
