-- `palisade finding show`: a finding's changes, oldest first.
-- $1 finding_id: uuid
SELECT action, revision, from_status, to_status, reason, actor, changed_at
FROM finding_history
WHERE finding_id = $1
ORDER BY id
