-- Issue 27, item 5: who changed a tenant's access and limits, and why. Every assignment,
-- revocation and re-enable of a worker, every registration, revocation and re-enable of a
-- client and every change of an organization's limits writes one row here, in the statement
-- that makes the change (`store::audit`); `palisade worker show` and `org show` read them.
CREATE TABLE IF NOT EXISTS admin_changes (
    id UUID PRIMARY KEY,
    at TIMESTAMPTZ NOT NULL DEFAULT now(),
    actor TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    action TEXT NOT NULL,
    worker_id UUID NULL,
    organization_id UUID NULL,
    client_id TEXT NULL,
    -- What changed, where the action alone does not say (limits before and after, a client's
    -- organizations).
    detail JSONB NOT NULL DEFAULT '{}'::jsonb,
    CONSTRAINT admin_changes_action_check CHECK (action IN (
        'revoke_worker', 'enable_worker', 'assign_worker', 'revoke_assignment',
        'register_client', 'revoke_client', 'enable_client', 'set_organization_limits'))
);

-- `worker show`, `org show` and `client`'s changes, newest first (ids are UUIDv7s).
CREATE INDEX IF NOT EXISTS admin_changes_worker_idx ON admin_changes (worker_id, id DESC)
    WHERE worker_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS admin_changes_organization_idx ON admin_changes (organization_id, id DESC)
    WHERE organization_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS admin_changes_client_idx ON admin_changes (client_id, id DESC)
    WHERE client_id IS NOT NULL;

-- A new table: older builds never read or write it (their changes go unrecorded meanwhile).
INSERT INTO backward_compatible_migrations (version, reason)
VALUES (20261205000030, 'adds a table older builds never read')
ON CONFLICT (version) DO NOTHING;
