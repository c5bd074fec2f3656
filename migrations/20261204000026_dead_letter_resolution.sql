-- Issue 27, item 3: an operator resolves a dead letter, by replaying it through the ordinary
-- path or discarding it (`palisade dead-letter`); who did it, why and when are kept with it.
ALTER TABLE dead_letters
    ADD COLUMN IF NOT EXISTS resolution TEXT NULL,
    ADD COLUMN IF NOT EXISTS resolved_at TIMESTAMPTZ NULL,
    ADD COLUMN IF NOT EXISTS resolved_by TEXT NOT NULL DEFAULT '',
    ADD COLUMN IF NOT EXISTS resolution_note TEXT NOT NULL DEFAULT '';

DO $$
BEGIN
    ALTER TABLE dead_letters ADD CONSTRAINT dead_letters_resolution_check
        CHECK (resolution IN ('replayed', 'discarded')
               AND resolved_at IS NOT NULL OR resolution IS NULL AND resolved_at IS NULL);
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;

-- The open ones, newest first, as `palisade dead-letter list` reads them (and the backlog gauge).
CREATE INDEX IF NOT EXISTS dead_letters_open_idx ON dead_letters (id) WHERE resolved_at IS NULL;

-- Older builds only insert dead letters (the new columns have defaults) and never read them.
INSERT INTO backward_compatible_migrations (version, reason)
VALUES (20261204000026, 'adds nullable or defaulted columns older builds never read')
ON CONFLICT (version) DO NOTHING;
