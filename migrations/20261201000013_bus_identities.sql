-- Identities on the bus (issue 10): the clients that submit scans, bound to organizations, and
-- the public key of every NATS credential palisade issued, so that revoking a worker or a
-- client (or replacing a credential) can be pushed to NATS as a revocation list. Private keys
-- are never stored here: they live with their holders.
CREATE TABLE IF NOT EXISTS clients (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL DEFAULT '',
    organization_ids UUID[] NOT NULL DEFAULT '{}',
    revoked_at TIMESTAMPTZ NULL,
    revocation_reason TEXT NOT NULL DEFAULT '',
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- A client id is a token of its subjects.
    CONSTRAINT clients_id_is_a_subject_token CHECK (id ~ '^[A-Za-z0-9_-]{1,64}$')
);

CREATE TABLE IF NOT EXISTS nats_users (
    public_key TEXT PRIMARY KEY,
    worker_id UUID NULL REFERENCES workers(id) ON DELETE CASCADE,
    client_id TEXT NULL REFERENCES clients(id) ON DELETE CASCADE,
    issued_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- Set when a newer credential replaced this one: refused from then on.
    retired_at TIMESTAMPTZ NULL,
    CONSTRAINT nats_users_one_holder CHECK ((worker_id IS NULL) <> (client_id IS NULL)),
    CONSTRAINT nats_users_user_key CHECK (public_key ~ '^U[A-Z2-7]{55}$')
);

CREATE INDEX IF NOT EXISTS nats_users_worker_idx ON nats_users (worker_id) WHERE worker_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS nats_users_client_idx ON nats_users (client_id) WHERE client_id IS NOT NULL;
