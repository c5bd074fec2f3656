-- Issue 44: workers join with a one-time enrollment token instead of the authority's keys,
-- and revoking a worker or a client ends its whole NATS account.
--
-- A token is issued by an operator (`palisade worker token create`) for one worker id, bound
-- to organizations and capabilities, and expires. PostgreSQL keeps the SHA-256 of its secret,
-- never the secret. Dispatch uses it once (`store::enrollment::enroll`, under `FOR UPDATE`):
-- the worker is registered, assigned, limited to the token's capabilities, and its key recorded.
CREATE TABLE IF NOT EXISTS enrollment_tokens (
    id UUID PRIMARY KEY,
    worker_id UUID NOT NULL,
    worker_name TEXT NOT NULL,
    capacity INT NOT NULL,
    secret_sha256 BYTEA NOT NULL,
    organization_ids UUID[] NOT NULL,
    capabilities TEXT[] NOT NULL,
    -- The public key (A…) of the worker's own NATS account, whose users dispatch signs.
    account_public_key TEXT NOT NULL,
    issued_by TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at TIMESTAMPTZ NOT NULL,
    used_at TIMESTAMPTZ NULL,
    used_by_key TEXT NULL,
    revoked_at TIMESTAMPTZ NULL,
    revoked_by TEXT NULL,
    CONSTRAINT enrollment_tokens_secret_check CHECK (octet_length(secret_sha256) = 32),
    CONSTRAINT enrollment_tokens_capacity_check CHECK (capacity BETWEEN 1 AND 1024),
    CONSTRAINT enrollment_tokens_expiry_check CHECK (expires_at > created_at)
);

CREATE INDEX IF NOT EXISTS enrollment_tokens_worker_idx ON enrollment_tokens (worker_id);

-- The capabilities an enrolled worker may declare in its hello (NULL: any, as `worker add`
-- registers), and its account's key, which dispatch signs renewed credentials for.
ALTER TABLE workers ADD COLUMN IF NOT EXISTS allowed_capabilities TEXT[] NULL;
ALTER TABLE workers ADD COLUMN IF NOT EXISTS nats_account TEXT NULL;

-- Re-enabling a worker or a client refuses every credential of its account issued until then
-- (its account's revocation list: `*` at this time); NULL: none refused that way.
ALTER TABLE workers ADD COLUMN IF NOT EXISTS credentials_issued_after TIMESTAMPTZ NULL;
ALTER TABLE clients ADD COLUMN IF NOT EXISTS credentials_issued_after TIMESTAMPTZ NULL;

ALTER TABLE admin_changes DROP CONSTRAINT IF EXISTS admin_changes_action_check;
ALTER TABLE admin_changes ADD CONSTRAINT admin_changes_action_check CHECK (action IN (
    'revoke_worker', 'enable_worker', 'assign_worker', 'revoke_assignment',
    'register_client', 'revoke_client', 'enable_client', 'set_organization_limits',
    'create_enrollment_token', 'revoke_enrollment_token', 'enroll_worker'));

-- Older builds never read the new table or columns, and write only actions the check still
-- takes. A worker enrolled meanwhile declares capabilities an older dispatch does not limit.
INSERT INTO backward_compatible_migrations (version, reason)
VALUES (20261206000031, 'adds a table and nullable columns older builds never read')
ON CONFLICT (version) DO NOTHING;
