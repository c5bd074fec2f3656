-- Enrichment: of the ids $1, those the CVE table lacks, or holds as unknown to NVD since a
-- check more than $2 seconds ago; sorted. An id whose record was set aside (unreadable) within
-- those $2 seconds is not a miss: looking it up again would read the same record.
-- $1 ids: text[]
-- $2 retry_after_seconds: float8 — seconds after which an unknown or set-aside id is looked up again
-- $3 set_aside_action: text — QuarantineAction::SetAside.as_str()
SELECT wanted.id
FROM unnest($1::text[]) AS wanted(id)
LEFT JOIN cves c ON c.id = wanted.id
WHERE (c.id IS NULL OR (NOT c.known AND c.checked_at < now() - make_interval(secs => $2)))
  AND NOT EXISTS (
        SELECT 1 FROM cve_quarantine q
        WHERE q.cve_id = wanted.id AND q.action = $3
          AND q.last_seen_at >= now() - make_interval(secs => $2))
ORDER BY wanted.id
