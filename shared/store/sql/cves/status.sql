-- `palisade cve status`: the local CVE table's size (known and unknown ids, by source) and the
-- NVD sync's watermark and holder.
-- $1 sync_source: text — the sync row's source (store::cves::NVD_SYNC)
-- $2 import_origin: text — CveOrigin::Import.as_str()
SELECT (SELECT count(*) FILTER (WHERE known) FROM cves) AS known,
       (SELECT count(*) FILTER (WHERE NOT known) FROM cves) AS unknown,
       (SELECT count(*) FILTER (WHERE source = $2) FROM cves) AS imported,
       s.synced_through, s.holder_job_id, s.updated_at
FROM cve_sync s
WHERE s.source = $1
