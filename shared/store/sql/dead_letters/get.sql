-- `palisade dead-letter show` and `replay`: one dead letter with its payload.
-- $1 id: uuid
SELECT id, consumer, subject, stream_sequence, delivered, reason, payload, created_at,
       resolution, resolved_at, resolved_by, resolution_note
FROM dead_letters
WHERE id = $1
