-- The finding lifecycle (issue 12): who last set a finding's disposition and when, the scan's
-- collection revision (bumped by every change to its findings, so a page read before a change
-- cannot be used to overwrite it), the history of every change, and an index for a finding's
-- occurrences across the scans of its target.

ALTER TABLE findings ADD COLUMN IF NOT EXISTS reviewed_by TEXT NOT NULL DEFAULT '';
ALTER TABLE findings ADD COLUMN IF NOT EXISTS reviewed_at TIMESTAMPTZ NULL;

ALTER TABLE scans ADD COLUMN IF NOT EXISTS findings_revision INTEGER NOT NULL DEFAULT 0;

CREATE TABLE IF NOT EXISTS finding_history (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- No reference: a deleted finding's history stays (with its scan's).
    finding_id UUID NOT NULL,
    scan_id UUID NOT NULL REFERENCES scans(id) ON DELETE CASCADE,
    organization_id UUID NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    finding_key TEXT NOT NULL,
    action TEXT NOT NULL,
    -- The finding's revision the change made (a deletion: the revision deleted).
    revision INTEGER NOT NULL CHECK (revision > 0),
    from_status TEXT NOT NULL,
    to_status TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '' CHECK (length(reason) <= 2048),
    actor TEXT NOT NULL CHECK (length(actor) BETWEEN 1 AND 256),
    changed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT finding_history_action_check CHECK (action IN ('set', 'delete'))
);

CREATE INDEX IF NOT EXISTS finding_history_finding_idx ON finding_history (finding_id, id);
CREATE INDEX IF NOT EXISTS finding_history_scan_idx ON finding_history (scan_id);

-- A finding's occurrences: the same key in other scans of the organization.
CREATE INDEX IF NOT EXISTS findings_occurrence_idx ON findings (organization_id, finding_key);
