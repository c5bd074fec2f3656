-- The scan an (organization, client, idempotency key) names.
-- $1 organization_id: uuid
-- $2 client_id: text
-- $3 idempotency_key: text
-- `started`: a task of it was ever leased (`states::ScanState::reported`).
SELECT id, request_fingerprint, state,
       EXISTS (SELECT 1 FROM worker_tasks t WHERE t.scan_id = scans.id AND t.last_attempt_number > 0)
           AS started
FROM scans
WHERE organization_id = $1 AND client_id = $2 AND idempotency_key = $3
