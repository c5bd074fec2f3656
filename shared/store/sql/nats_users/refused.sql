-- Every credential NATS must refuse: replaced ones, and all of a revoked worker's or client's.
SELECT u.public_key
FROM nats_users u
LEFT JOIN workers w ON w.id = u.worker_id
LEFT JOIN clients c ON c.id = u.client_id
WHERE u.retired_at IS NOT NULL OR w.revoked_at IS NOT NULL OR c.revoked_at IS NOT NULL
ORDER BY u.public_key
