-- Registers a client bound to organizations, or changes the name and organizations of a
-- registered one, and records the change with the organizations it acts for.
-- $1 id: text
-- $2 name: text
-- $3 organization_ids: uuid[]
-- $4 change_id: uuid — the change's id (Uuid::now_v7())
-- $5 who: text
-- $6 why: text
-- $7 client_registered_action: text — AdminAction::ClientRegistered
WITH registered AS (
    INSERT INTO clients (id, name, organization_ids) VALUES ($1, $2, $3)
    ON CONFLICT (id) DO UPDATE
    SET name = EXCLUDED.name, organization_ids = EXCLUDED.organization_ids, updated_at = now()
    RETURNING id, organization_ids
), recorded AS (
    INSERT INTO admin_changes (id, actor, reason, action, client_id, detail)
    SELECT $4, $5, $6, $7, id, jsonb_build_object('organization_ids', organization_ids)
    FROM registered
)
SELECT id FROM registered
