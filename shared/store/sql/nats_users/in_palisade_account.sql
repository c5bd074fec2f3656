-- The worker and client keys issued before each identity had an account of its own, signed
-- by palisade's account: palisade's account refuses every one of them.
SELECT public_key FROM nats_users WHERE NOT own_account ORDER BY public_key
