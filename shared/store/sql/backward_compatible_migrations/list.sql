-- The applied migrations marked as safe for builds that do not know them (see
-- `store::schema`), oldest first.
SELECT version FROM backward_compatible_migrations ORDER BY version
