-- `palisade cve status`: the quarantined records seen most recently, and how many there are.
-- $1 limit: int8 — how many to list
SELECT record_key, cve_id, action, reason, source, first_seen_at, last_seen_at, times_seen,
       count(*) OVER () AS total
FROM cve_quarantine
ORDER BY last_seen_at DESC, record_key
LIMIT $1
