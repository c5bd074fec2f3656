-- What each of palisade's hot tables holds and has churned since it was last tended, from
-- PostgreSQL's cumulative statistics (updated by each backend within about a second of its
-- commits): live and dead row versions, and rows changed since the last analyze. A table not in
-- the current schema is not returned.
-- $1 tables: text[] — the names in `upkeep::HOT_TABLES`
SELECT relname::text AS table_name, n_live_tup AS live_rows, n_dead_tup AS dead_rows,
       n_mod_since_analyze AS modified_since_analyze
FROM pg_stat_user_tables
WHERE schemaname = current_schema() AND relname = ANY($1::text[])
ORDER BY relname
