-- `palisade dead-letter list`: dead letters newest first (their ids are UUIDv7s, in time order),
-- a page after the id $3, the open ones only unless $2. The payload is not read.
-- $1 consumer: text — or NULL for every consumer
-- $2 include_resolved: bool — true to include resolved ones
-- $3 after_id: uuid — the last id of the previous page, or NULL
-- $4 limit: int8
SELECT id, consumer, subject, stream_sequence, delivered, reason, length(payload)::bigint AS bytes,
       created_at, resolution, resolved_at, resolved_by, resolution_note
FROM dead_letters
WHERE ($1::text IS NULL OR consumer = $1)
  AND ($2 OR resolved_at IS NULL)
  AND ($3::uuid IS NULL OR id < $3)
ORDER BY id DESC
LIMIT $4
