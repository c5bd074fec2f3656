-- After firing: each fired schedule's next unfired slot and its fire time.
-- $1 schedule_ids: uuid[]
-- $2 next_slots: timestamptz[]
-- $3 next_fire_ats: timestamptz[] — next fire times (the slot plus its jitter)
UPDATE scan_schedules AS s
SET next_slot = fired.next_slot, next_fire_at = fired.next_fire_at
FROM unnest($1::uuid[], $2::timestamptz[], $3::timestamptz[])
     AS fired (id, next_slot, next_fire_at)
WHERE s.id = fired.id
