-- Whether an index of the current schema exists and is valid (a `CREATE INDEX CONCURRENTLY`
-- that failed or was interrupted leaves it INVALID). No row: it does not exist.
-- $1 index_name: name — the index name
SELECT i.indisvalid
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_index i ON i.indexrelid = c.oid
WHERE c.relname = $1 AND n.nspname = current_schema()
