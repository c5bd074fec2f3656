-- Creating a schedule that was not inserted: how many the organization has (at the limit, or
-- its name is taken).
-- $1 organization_id: uuid
SELECT count(*) FROM scan_schedules WHERE organization_id = $1
