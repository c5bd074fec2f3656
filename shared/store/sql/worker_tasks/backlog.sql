-- `palisade queue`: the unfinished tasks by organization, plugin and state, with how many are
-- due now and how long the oldest due one has waited. Reads the live tasks only (their states'
-- partial indexes), not the history.
-- $1 unfinished_states: text[] — [TaskState::Pending, RetryWait, Leased, Running].as_str()
SELECT t.organization_id, coalesce(t.payload->>'plugin', '') AS plugin, t.state,
       count(*) AS tasks,
       count(*) FILTER (WHERE t.available_at <= now()) AS due,
       coalesce(extract(epoch FROM now() - min(t.available_at)
                FILTER (WHERE t.available_at <= now()))::float8, 0) AS oldest_due_age_seconds
FROM worker_tasks t
WHERE t.state = ANY($1)
GROUP BY t.organization_id, plugin, t.state
ORDER BY t.organization_id, plugin, t.state
