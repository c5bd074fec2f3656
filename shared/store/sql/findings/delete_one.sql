-- `palisade finding delete`: removes one finding when its revision (and, when given, its
-- scan's collection revision) is the expected one and its scan is not active (a job still
-- running could write it again). The deletion is recorded in finding_history (which keeps
-- it), the scan's collection revision moves and its finding count drops, in one statement;
-- rows locked as set_status.sql locks them. No row: no such finding.
-- $1 finding_id: uuid
-- $2 organization_id: uuid — NULL: any
-- $3 expected_revision: int4
-- $4 expected_collection_revision: int4 — NULL: not checked
-- $5 reason: text
-- $6 actor: text
-- $7 delete_change: text — FindingChange::Delete.as_str()
-- $8 active_scan_states: text[] — the active scan states (ScanState::ACTIVE)
WITH target AS (
    SELECT f.id, f.scan_id, f.organization_id, f.finding_key, f.status, f.revision,
           s.findings_revision, s.state AS scan_state
    FROM findings f JOIN scans s ON s.id = f.scan_id
    WHERE f.id = $1 AND ($2::uuid IS NULL OR f.organization_id = $2)
    FOR UPDATE OF f, s
), deleted AS (
    DELETE FROM findings f
    USING target t
    WHERE f.id = t.id AND t.revision = $3 AND ($4::integer IS NULL OR t.findings_revision = $4)
      AND NOT (t.scan_state = ANY($8))
    RETURNING f.id, f.scan_id, f.organization_id, f.finding_key, f.revision, f.status
), history AS (
    INSERT INTO finding_history (finding_id, scan_id, organization_id, finding_key, action,
                                 revision, from_status, to_status, reason, actor)
    SELECT id, scan_id, organization_id, finding_key, $7, revision, status, status, $5, $6
    FROM deleted
), collection AS (
    UPDATE scans s SET findings_revision = s.findings_revision + 1,
                       finding_count = greatest(s.finding_count - 1, 0), updated_at = now()
    FROM deleted d WHERE s.id = d.scan_id
    RETURNING s.findings_revision
)
SELECT t.revision AS current_revision, t.findings_revision AS current_collection_revision,
       t.scan_state, (SELECT findings_revision FROM collection) AS collection_revision
FROM target t
