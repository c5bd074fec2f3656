-- `palisade dead-letter replay` (after its publish was acknowledged) and `discard`: resolves
-- an open dead letter. No row: it is unknown or was resolved already.
-- $1 id: uuid
-- $2 resolution: text — DeadLetterResolution
-- $3 who: text — the operator's name
-- $4 why: text
UPDATE dead_letters
SET resolution = $2, resolved_at = now(), resolved_by = $3, resolution_note = $4
WHERE id = $1 AND resolved_at IS NULL
RETURNING resolved_at
