-- `palisade schedule pause` and `resume`: pauses or resumes a schedule, recording who and why.
-- Resuming moves it to the first slot after now (slots that passed while paused never fire).
-- No row: no such schedule.
-- $1 id: uuid
-- $2 paused: bool
-- $3 next_slot: timestamptz — kept as is when pausing
-- $4 next_fire_at: timestamptz
-- $5 who: text
-- $6 why: text
UPDATE scan_schedules
SET paused = $2, next_slot = $3, next_fire_at = $4, updated_at = now(), updated_by = $5,
    update_reason = $6
WHERE id = $1
RETURNING id
