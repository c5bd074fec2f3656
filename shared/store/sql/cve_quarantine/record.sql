-- Enrichment and `palisade cve import`: records CVE records stored sanitised or set aside.
-- A record seen before is counted again (times_seen, last_seen_at) under its latest reason;
-- returns the keys recorded for the first time, which the caller logs (once per record).
-- $1 records: jsonb — a JSON array of objects {record_key, cve_id, action, reason}
-- $2 source: text — 'nvd' or 'import'
INSERT INTO cve_quarantine AS q (record_key, cve_id, action, reason, source)
SELECT r.record_key, r.cve_id, r.action, r.reason, $2
FROM jsonb_to_recordset($1) AS r(record_key text, cve_id text, action text, reason text)
ON CONFLICT (record_key) DO UPDATE SET
    cve_id = EXCLUDED.cve_id, action = EXCLUDED.action, reason = EXCLUDED.reason,
    source = EXCLUDED.source, last_seen_at = now(), times_seen = q.times_seen + 1
RETURNING record_key, xmax = 0 AS first_seen
