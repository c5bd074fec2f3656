-- Cancel: locks the scan and reads what its answer needs, and its trace context (the cancel
-- is traced in the scan's trace).
-- $1 scan_id: uuid
SELECT state, organization_id, client_id, idempotency_key, trace_context
FROM scans WHERE id = $1 FOR UPDATE
