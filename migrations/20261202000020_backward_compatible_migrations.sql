-- Which migrations a build that does not know them may still run against (issue 13): during
-- a rolling upgrade the new build migrates first and replicas of the old build keep running,
-- or restart, against the newer schema. A build accepts a schema holding migrations it does
-- not know only if each of them has a row here; a migration without one (the default) stops
-- older builds at start-up and fails their readiness, naming both versions. The rule is
-- `store::schema` (`Comparison::runnable`); docs/operations.md#migrations says when to mark.
--
-- A migration marks itself, in its own file and transaction, when every build before it keeps
-- working beside it: it only adds (a table, an index, a nullable column or one with a
-- default, a constraint old writers already satisfy), and older builds neither read nor write
-- what it changes in a way that would now be wrong.
CREATE TABLE IF NOT EXISTS backward_compatible_migrations (
    -- The marked migration's version, as in _sqlx_migrations.
    version BIGINT PRIMARY KEY,
    -- Why older builds keep working beside it.
    reason TEXT NOT NULL CHECK (reason <> '')
);

-- This one only adds a table older builds never read.
INSERT INTO backward_compatible_migrations (version, reason)
VALUES (20261202000020, 'adds a table older builds do not read')
ON CONFLICT (version) DO NOTHING;
