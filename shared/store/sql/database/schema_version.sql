-- The newest migration applied.
SELECT max(version) FROM _sqlx_migrations WHERE success
