-- Enrichment: the limit's row, held by `hold.sql` in this transaction, keeps these starts.
-- $1 name: text
-- $2 starts: timestamptz[] — the starts inside the window, the new one last
UPDATE rate_limits SET starts = $2 WHERE name = $1
