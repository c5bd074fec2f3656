-- Admission: upserts the batch's targets and inserts its scans.
-- $1 scan_ids: uuid[]
-- $2 target_ids: uuid[]
-- $3 organizations: uuid[]
-- $4 locators: text[]
-- $5 clients: text[]
-- $6 keys: text[]
-- $7 fingerprints: text[]
-- $8 plugins: jsonb[]
-- $9 priorities: int4[]
-- $10 deadlines: int4[]
-- $11 trace_contexts: text[]
-- $12 pending_scan_state: text — ScanState::Pending.as_str()
WITH input AS (
    SELECT * FROM UNNEST($1::uuid[], $2::uuid[], $3::uuid[], $4::text[], $5::text[],
                         $6::text[], $7::text[], $8::jsonb[], $9::int[], $10::int[],
                         $11::text[])
        WITH ORDINALITY
        AS u(scan_id, target_id, organization_id, locator, client_id, idempotency_key,
             fingerprint, plugins, priority, deadline, trace_context, position)
), upserted AS (
    INSERT INTO targets (id, organization_id, locator)
    SELECT target_id, organization_id, locator FROM input ORDER BY position
    ON CONFLICT (organization_id, locator) DO UPDATE SET locator = EXCLUDED.locator
    RETURNING id, organization_id, locator
)
INSERT INTO scans (id, organization_id, target_id, client_id, idempotency_key,
                   request_fingerprint, plugins, priority, execution_deadline_seconds,
                   trace_context, state)
SELECT u.scan_id, u.organization_id, t.id, u.client_id, u.idempotency_key, u.fingerprint,
       ARRAY(SELECT jsonb_array_elements_text(u.plugins)), u.priority, u.deadline,
       u.trace_context, $12
FROM input u
JOIN upserted t ON t.organization_id = u.organization_id AND t.locator = u.locator
ORDER BY u.position
ON CONFLICT (organization_id, client_id, idempotency_key) DO NOTHING
RETURNING id, (extract(epoch FROM created_at) * 1000)::bigint
