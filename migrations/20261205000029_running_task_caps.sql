-- Issue 27, item 5: a cap on an organization's tasks in flight (leased or running) across every
-- worker, changed on the live organization (`palisade org set --max-running-tasks`). Dispatch's
-- grant leases an organization's tasks only while it is under its cap, with the organization's
-- row locked by the acquire first (`store::lease`), so two acquires never both take its last
-- slot. NULL: no cap.
ALTER TABLE organizations ADD COLUMN IF NOT EXISTS max_running_tasks INT NULL;

DO $$
BEGIN
    ALTER TABLE organizations ADD CONSTRAINT organizations_max_running_tasks_check
        CHECK (max_running_tasks IS NULL OR max_running_tasks >= 0);
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;

-- Older builds never read the column: their grants ignore the cap (a mixed-version window may
-- lease past it until the old dispatch replicas are gone).
INSERT INTO backward_compatible_migrations (version, reason)
VALUES (20261205000029, 'adds a nullable column older builds never read')
ON CONFLICT (version) DO NOTHING;
