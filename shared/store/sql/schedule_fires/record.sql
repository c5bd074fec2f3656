-- The fired slots of one sweep, each once: a slot already recorded keeps its first record
-- (the schedule row lock makes that case unreachable; the key makes it harmless).
-- $1: schedule ids
-- $2: slots
-- $3: fired at (the reaper's clock)
-- $4: ScheduleFireOutcome of each
-- $5: scan ids (the admitted, replayed or active scan), NULL where none
-- $6: slots the catch-up rule passed over before each
-- $7: details (the refusal's code and message)
INSERT INTO schedule_fires (schedule_id, slot, fired_at, outcome, scan_id, missed_before, detail)
SELECT * FROM unnest($1::uuid[], $2::timestamptz[], $3::timestamptz[], $4::text[], $5::uuid[],
                     $6::bigint[], $7::text[])
ON CONFLICT (schedule_id, slot) DO NOTHING
