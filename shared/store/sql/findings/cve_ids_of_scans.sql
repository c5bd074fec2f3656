-- Enrichment: the distinct CVE ids of each scan's findings.
-- $1 scan_ids: uuid[]
SELECT f.scan_id, array_agg(DISTINCT cve.id ORDER BY cve.id)
FROM findings f, unnest(f.cve_ids) AS cve(id)
WHERE f.scan_id = ANY($1) AND cardinality(f.cve_ids) > 0
GROUP BY f.scan_id
