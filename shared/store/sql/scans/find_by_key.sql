-- The scan an (organization, client, idempotency key) names.
-- $1: request.organization_id
-- $2: request.client_id
-- $3: request.idempotency_key
SELECT id, request_fingerprint, state FROM scans
WHERE organization_id = $1 AND client_id = $2 AND idempotency_key = $3
