-- Every migration sqlx recorded, oldest first: its version, and whether it finished (a
-- failed `-- no-transaction` migration stays recorded as unsuccessful).
SELECT version, success FROM _sqlx_migrations ORDER BY version
