-- `palisade scan list` and the `scans` verb, when a page after a scan came back empty: whether
-- that scan exists within the organization (any, when NULL). A cursor naming no scan, or
-- another organization's, is refused `not_found` rather than answered with an empty page.
-- $1 scan_id: uuid
-- $2 organization_id: uuid
SELECT EXISTS (
    SELECT 1 FROM scans WHERE id = $1 AND ($2::uuid IS NULL OR organization_id = $2)
)
