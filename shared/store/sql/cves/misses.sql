-- Enrichment: of the ids $1, those the CVE table lacks, or holds as unknown to NVD since a
-- check more than $2 seconds ago; sorted.
-- $1: ids
-- $2: seconds after which an unknown id is looked up again
SELECT wanted.id
FROM unnest($1::text[]) AS wanted(id)
LEFT JOIN cves c ON c.id = wanted.id
WHERE c.id IS NULL OR (NOT c.known AND c.checked_at < now() - make_interval(secs => $2))
ORDER BY wanted.id
