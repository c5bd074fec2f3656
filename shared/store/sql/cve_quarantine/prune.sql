-- Retention: deletes a slice of quarantined CVE records not seen since the cutoff (a record
-- upstream still serves is seen again at each sync and stays).
-- $1 retention_seconds: float8 — the cutoff, this long before now
-- $2 limit: int8
DELETE FROM cve_quarantine WHERE record_key = ANY(ARRAY(
    SELECT record_key FROM cve_quarantine WHERE last_seen_at < now() - make_interval(secs => $1)
    ORDER BY last_seen_at LIMIT $2
))
