-- Registers a client bound to organizations, or changes the name and organizations of a
-- registered one.
-- $1: id
-- $2: name
-- $3: organization_ids
INSERT INTO clients (id, name, organization_ids) VALUES ($1, $2, $3)
ON CONFLICT (id) DO UPDATE
SET name = EXCLUDED.name, organization_ids = EXCLUDED.organization_ids, updated_at = now()
