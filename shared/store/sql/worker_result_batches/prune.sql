-- Retention: deletes a slice of batches received before the cutoff whose task has ended.
-- $1 retention_seconds: float8 — the cutoff, this long before now
-- $2 limit: int8
-- $3 terminal_states: text[] — TaskState::TERMINAL.map(TaskState::as_str)
DELETE FROM worker_result_batches WHERE id = ANY(ARRAY(
    SELECT b.id FROM worker_result_batches b
    CROSS JOIN LATERAL (
        SELECT 1 FROM worker_tasks t
        WHERE t.id = b.task_id AND t.state = ANY($3)
          AND t.completed_at < now() - make_interval(secs => $1)
        OFFSET 0
    ) ended
    WHERE b.received_at < now() - make_interval(secs => $1)
    ORDER BY b.received_at LIMIT $2
))
