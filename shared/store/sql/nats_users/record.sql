-- Records the public key of a credential issued to a worker or a client, signed by the
-- identity's own NATS account.
-- $1: public_key
-- $2: worker_id (or NULL)
-- $3: client_id (or NULL)
INSERT INTO nats_users (public_key, worker_id, client_id, own_account) VALUES ($1, $2, $3, true)
