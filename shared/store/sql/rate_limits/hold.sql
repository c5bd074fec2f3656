-- Enrichment, before a request to a rate-limited upstream: locks the limit's row (every
-- replica's requests queue here) and reads the starts still inside the window, oldest first,
-- with the database's clock. No row: the limit is unknown (its migration inserts it).
-- $1 name: text
-- $2 window_seconds: float8 — window in seconds
SELECT ARRAY(SELECT s FROM unnest(l.starts) AS s
             WHERE s > clock_timestamp() - make_interval(secs => $2) ORDER BY s) AS live,
       clock_timestamp() AS now
FROM rate_limits l
WHERE l.name = $1
FOR UPDATE
