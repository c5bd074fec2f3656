-- The relay's poll reads the rows it may claim, in the order they became claimable: a row
-- nobody claimed since it was written (`created_at`), or one whose claim lapsed
-- (`claimed_until`). Rows a committer holds for its hand-off are in neither part of that
-- order yet, so a poll no longer walks past every event being published to find none (the
-- index it replaces, `(created_at)`, made each poll read every unpublished row).
CREATE INDEX IF NOT EXISTS outbox_claimable_idx
    ON outbox ((coalesce(claimed_until, created_at)))
    WHERE published_at IS NULL;

DROP INDEX IF EXISTS outbox_unpublished_idx;
