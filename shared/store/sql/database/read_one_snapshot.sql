-- The first statement of a read-only transaction whose reads must agree with each other (a
-- scan's findings summary and its coverage): every statement after it sees one snapshot.
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY
