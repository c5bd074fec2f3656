-- The fired slots of one sweep, each once: a slot already recorded keeps its first record
-- (the schedule row lock makes that case unreachable; the key makes it harmless).
-- $1 schedule_ids: uuid[]
-- $2 slots: timestamptz[]
-- $3 fired_ats: timestamptz[] — fired at (the reaper's clock)
-- $4 outcomes: text[] — ScheduleFireOutcome of each
-- $5 scan_ids: uuid[] — the admitted, replayed or active scan; NULL where none
-- $6 skipped_slots: int8[] — slots the catch-up rule passed over before each
-- $7 details: text[] — the refusal's code and message
INSERT INTO schedule_fires (schedule_id, slot, fired_at, outcome, scan_id, missed_before, detail)
SELECT * FROM unnest($1::uuid[], $2::timestamptz[], $3::timestamptz[], $4::text[], $5::uuid[],
                     $6::bigint[], $7::text[])
ON CONFLICT (schedule_id, slot) DO NOTHING
