-- Records the public key of a credential issued to a worker or a client.
-- $1: public_key
-- $2: worker_id (or NULL)
-- $3: client_id (or NULL)
INSERT INTO nats_users (public_key, worker_id, client_id) VALUES ($1, $2, $3)
