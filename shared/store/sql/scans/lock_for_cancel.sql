-- Cancel: locks the scan and reads what its answer needs.
-- $1 scan_id: uuid
SELECT state, organization_id, client_id, idempotency_key FROM scans WHERE id = $1 FOR UPDATE
