-- Creates an organization, or changes the name and quota of an existing one.
-- $1 id: uuid
-- $2 name: text
-- $3 hourly_scan_quota: int4
INSERT INTO organizations (id, name, hourly_scan_quota) VALUES ($1, $2, $3)
ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name, hourly_scan_quota = EXCLUDED.hourly_scan_quota,
                               updated_at = now()
