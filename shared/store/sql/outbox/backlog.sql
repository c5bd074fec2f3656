-- How many events wait to be published, and the age of the oldest, in either table.
SELECT coalesce(sum(events), 0)::int8, extract(epoch FROM now() - min(created_at))::float8
FROM (
    SELECT 1 AS events, created_at FROM outbox WHERE published_at IS NULL
    UNION ALL
    SELECT cardinality(event_ids), created_at FROM outbox_batches
) waiting
