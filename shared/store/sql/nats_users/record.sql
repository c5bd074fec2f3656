-- Records the public key of a credential issued to a worker or a client, signed by the
-- identity's own NATS account.
-- $1 public_key: text
-- $2 worker_id: uuid — may be NULL
-- $3 client_id: text — may be NULL
INSERT INTO nats_users (public_key, worker_id, client_id, own_account) VALUES ($1, $2, $3, true)
