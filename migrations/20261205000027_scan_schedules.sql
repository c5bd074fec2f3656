-- Issue 27, item 1: recurring scans. A schedule submits its scan request at every slot of a cron
-- expression (read in its time zone) or of an interval. The reaper's leader fires each due slot
-- in one transaction that admits the scan through the ordinary admission script (its idempotency
-- key names the schedule and the slot), records the slot in `schedule_fires` (the slot is the
-- key: a slot is recorded once) and moves the schedule to its next slot (`store::schedules`).
CREATE TABLE IF NOT EXISTS scan_schedules (
    id UUID PRIMARY KEY,
    organization_id UUID NOT NULL REFERENCES organizations (id),
    name TEXT NOT NULL,
    -- The scan request it submits at each slot.
    target TEXT NOT NULL,
    plugins TEXT[] NOT NULL,
    priority INT NOT NULL DEFAULT 0,
    execution_deadline_seconds INT NULL,
    client_id TEXT NOT NULL,
    -- When: a cron expression in `time_zone`, or every `interval_seconds`.
    cron TEXT NULL,
    interval_seconds BIGINT NULL,
    time_zone TEXT NOT NULL DEFAULT 'UTC',
    -- Each slot fires up to this many seconds late, by an amount fixed per (schedule, slot).
    jitter_seconds INT NOT NULL DEFAULT 0,
    -- What a slot does while the target still has an active scan.
    overlap TEXT NOT NULL,
    paused BOOLEAN NOT NULL DEFAULT FALSE,
    -- The next slot not yet fired, and when it fires (the slot plus its jitter).
    next_slot TIMESTAMPTZ NOT NULL,
    next_fire_at TIMESTAMPTZ NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    created_by TEXT NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_by TEXT NOT NULL,
    update_reason TEXT NOT NULL DEFAULT '',
    CONSTRAINT scan_schedules_name_key UNIQUE (organization_id, name),
    CONSTRAINT scan_schedules_timing_check CHECK ((cron IS NULL) <> (interval_seconds IS NULL)),
    CONSTRAINT scan_schedules_interval_check CHECK (interval_seconds IS NULL OR interval_seconds > 0),
    CONSTRAINT scan_schedules_jitter_check CHECK (jitter_seconds >= 0),
    CONSTRAINT scan_schedules_overlap_check CHECK (overlap IN ('skip', 'queue'))
);

-- The reaper's due read: active schedules by next fire time.
CREATE INDEX IF NOT EXISTS scan_schedules_due_idx ON scan_schedules (next_fire_at) WHERE NOT paused;

-- One row per fired slot: what admission answered, and how many earlier slots the catch-up rule
-- passed over (they were due while no leader swept; only the newest due slot fires).
CREATE TABLE IF NOT EXISTS schedule_fires (
    schedule_id UUID NOT NULL REFERENCES scan_schedules (id) ON DELETE CASCADE,
    slot TIMESTAMPTZ NOT NULL,
    fired_at TIMESTAMPTZ NOT NULL,
    outcome TEXT NOT NULL,
    scan_id UUID NULL,
    missed_before BIGINT NOT NULL DEFAULT 0,
    detail TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (schedule_id, slot),
    CONSTRAINT schedule_fires_outcome_check
        CHECK (outcome IN ('admitted', 'duplicate', 'skipped', 'refused'))
);

-- Retention prunes fire records by slot.
CREATE INDEX IF NOT EXISTS schedule_fires_slot_idx ON schedule_fires (slot);

-- New tables: older builds never read or write them.
INSERT INTO backward_compatible_migrations (version, reason)
VALUES (20261205000027, 'adds tables older builds never read')
ON CONFLICT (version) DO NOTHING;
