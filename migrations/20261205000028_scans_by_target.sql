-- Issue 27, item 2: `palisade scan list --target` (a target's history, and a schedule's scans)
-- reads scans by target. The index is built by `palisade migrate` after this migration, with
-- `CREATE INDEX CONCURRENTLY` outside any transaction (`store::online_indexes`:
-- `scans_target_created_idx`), so the build blocks no write to `scans`; this migration only
-- records that the build belongs to it. Until the build finishes, the list reads scans without
-- it (slower on a large table, still correct).

-- Older builds never read the index.
INSERT INTO backward_compatible_migrations (version, reason)
VALUES (20261205000028, 'asks for an index built concurrently after it, which older builds do not use')
ON CONFLICT (version) DO NOTHING;
