-- Cancel: ends the scan.
-- $1 scan_id: uuid
-- $2 reason: text
-- $3 cancelled_scan_state: text — ScanState::Cancelled.as_str()
-- $4 failure_code: text — CANCELLED, the failure code of everything a cancel ends
UPDATE scans SET state = $3, failure_code = $4, failure_reason = $2,
       finished_at = now(), updated_at = now()
WHERE id = $1
RETURNING (extract(epoch FROM finished_at) * 1000)::bigint
