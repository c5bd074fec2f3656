-- `palisade finding set`: sets one finding's disposition when its revision is the expected one
-- (and, when given, its scan's collection revision too). In one statement the finding moves
-- to the next revision, the change is recorded in finding_history, and the scan's collection
-- revision moves. The finding's and its scan's rows are locked (in that order), so changes of
-- one finding take turns: of two naming the same revision, the second sees the first's and
-- changes nothing. No row: no such finding (in the organization).
-- $1 finding_id: uuid
-- $2 organization_id: uuid — NULL: any, the operator's command
-- $3 expected_revision: int4
-- $4 expected_collection_revision: int4 — NULL: not checked
-- $5 status: text — the new status (FindingStatus::as_str())
-- $6 reason: text
-- $7 actor: text
-- $8 set_change: text — FindingChange::Set.as_str()
WITH target AS (
    SELECT f.id, f.scan_id, f.organization_id, f.finding_key, f.status, f.revision,
           s.findings_revision
    FROM findings f JOIN scans s ON s.id = f.scan_id
    WHERE f.id = $1 AND ($2::uuid IS NULL OR f.organization_id = $2)
    FOR UPDATE OF f, s
), changed AS (
    UPDATE findings f
    SET status = $5, status_reason = $6, revision = f.revision + 1, reviewed_by = $7,
        reviewed_at = now(), updated_at = now()
    FROM target t
    WHERE f.id = t.id AND t.revision = $3 AND ($4::integer IS NULL OR t.findings_revision = $4)
    RETURNING f.id, f.scan_id, f.organization_id, f.finding_key, f.revision, t.status AS from_status
), history AS (
    INSERT INTO finding_history (finding_id, scan_id, organization_id, finding_key, action,
                                 revision, from_status, to_status, reason, actor)
    SELECT id, scan_id, organization_id, finding_key, $8, revision, from_status, $5, $6, $7
    FROM changed
), collection AS (
    UPDATE scans s SET findings_revision = s.findings_revision + 1, updated_at = now()
    FROM changed c WHERE s.id = c.scan_id
    RETURNING s.findings_revision
)
SELECT t.revision AS current_revision, t.findings_revision AS current_collection_revision,
       (SELECT revision FROM changed) AS revision,
       (SELECT findings_revision FROM collection) AS collection_revision
FROM target t
