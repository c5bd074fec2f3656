-- Admission: for each request, the scan its idempotency key already names, whether its client is
-- registered and revoked, the active scan on its target, and its organization's admissions in the
-- last hour. The batch's registered clients are read `FOR SHARE`, in id order:
-- `client revoke`'s `UPDATE` waits for this transaction, so no scan is admitted for a client after
-- its revocation commits. A client id with no `clients` row is not revoked.
-- $1 organizations: uuid[]
-- $2 clients: text[]
-- $3 keys: text[]
-- $4 targets: text[]
-- $5 counted: uuid[]
-- $6 active: text[]
WITH input AS (
    SELECT * FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[])
        WITH ORDINALITY AS u(organization_id, client_id, idempotency_key, locator, position)
), registered AS MATERIALIZED (
    SELECT id, revoked_at
    FROM clients
    WHERE id = ANY($2)
    ORDER BY id
    FOR SHARE
), recent AS (
    SELECT organization_id, count(*) AS admitted
    FROM scans
    WHERE organization_id = ANY($5) AND created_at > now() - interval '1 hour'
    GROUP BY organization_id
)
SELECT k.id AS key_scan_id, k.request_fingerprint AS key_fingerprint, k.state AS key_state,
       -- A task of the key's scan was ever leased (`states::ScanState::reported`).
       k.id IS NOT NULL AND EXISTS (SELECT 1 FROM worker_tasks kt
                                    WHERE kt.scan_id = k.id AND kt.last_attempt_number > 0)
           AS key_started,
       c.revoked_at IS NOT NULL AS client_revoked,
       a.id AS active_scan_id, coalesce(r.admitted, 0) AS recent
FROM input u
LEFT JOIN scans k ON k.organization_id = u.organization_id AND k.client_id = u.client_id
                 AND k.idempotency_key = u.idempotency_key
LEFT JOIN registered c ON c.id = u.client_id
LEFT JOIN targets t ON t.organization_id = u.organization_id AND t.locator = u.locator
LEFT JOIN scans a ON a.organization_id = u.organization_id AND a.target_id = t.id
                 AND a.state = ANY($6)
LEFT JOIN recent r ON r.organization_id = u.organization_id
ORDER BY u.position
