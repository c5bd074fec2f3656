-- `palisade scan list`: scans newest first by admission time, a page after the scan $8, with
-- the filters given (NULL: any). A scan's state is the reported one (`ScanState::reported`): an
-- unfinished scan is `running` once any task of it was leased, `pending` before. Served by
-- `scans_org_created_idx` when an organization is given, `scans_target_created_idx` when a
-- target is.
-- $1 organization_id: uuid
-- $2 target: text — its locator, exact
-- $3 state: text — as reported
-- $4 plugin: text — the scan runs it
-- $5 admitted_from: timestamptz — admitted at or after
-- $6 admitted_before: timestamptz
-- $7 client_id: text — who requested it
-- $8 after_scan_id: uuid — the last scan of the previous page (of the organization $1: another's
--    reads as none, an empty page, which the caller refuses through scans/cursor_known.sql)
-- $9 limit: int8
-- $10 unfinished_scan_states: text[] — [ScanState::Pending.as_str(), ScanState::Running.as_str()] (stored while unfinished)
-- $11 running_scan_state: text — ScanState::Running.as_str()
-- $12 pending_scan_state: text — ScanState::Pending.as_str()
SELECT s.id, s.organization_id, t.locator AS target, s.client_id, s.idempotency_key, s.plugins,
       CASE WHEN s.state = ANY($10) THEN CASE WHEN started.at IS NULL THEN $12 ELSE $11 END
            ELSE s.state END AS state,
       s.failure_code, s.failure_reason, s.finding_count, s.created_at,
       coalesce(s.started_at, started.at) AS started_at,
       s.finished_at, NULLIF(split_part(s.trace_context, '-', 2), '') AS trace_id
FROM scans s
JOIN targets t ON t.id = s.target_id
CROSS JOIN LATERAL (
    SELECT min(a.started_at) AS at FROM worker_tasks wt
    JOIN worker_task_attempts a ON a.task_id = wt.id
    WHERE wt.scan_id = s.id
) started
WHERE ($1::uuid IS NULL OR s.organization_id = $1)
  AND ($2::text IS NULL OR t.locator = $2)
  AND ($3::text IS NULL
       OR ($3 = $11 AND s.state = ANY($10) AND (s.started_at IS NOT NULL OR started.at IS NOT NULL))
       OR ($3 = $12 AND s.state = ANY($10) AND s.started_at IS NULL AND started.at IS NULL)
       OR ($3 <> ALL($10) AND s.state = $3))
  AND ($4::text IS NULL OR $4 = ANY(s.plugins))
  AND ($5::timestamptz IS NULL OR s.created_at >= $5)
  AND ($6::timestamptz IS NULL OR s.created_at < $6)
  AND ($7::text IS NULL OR s.client_id = $7)
  AND ($8::uuid IS NULL
       OR (s.created_at, s.id) < (SELECT p.created_at, p.id FROM scans p
                                  WHERE p.id = $8 AND ($1::uuid IS NULL OR p.organization_id = $1)))
ORDER BY s.created_at DESC, s.id DESC
LIMIT $9
