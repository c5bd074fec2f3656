-- Creating a schedule: locks its organization's row first, so that two creates count each
-- other's schedules against the organization's limit. No row: no such organization.
-- $1 organization_id: uuid
SELECT id FROM organizations WHERE id = $1 FOR NO KEY UPDATE
