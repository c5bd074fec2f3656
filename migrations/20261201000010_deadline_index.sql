-- The execution-deadline sweep (store::recover::fail_overdue) reads only tasks that have a
-- deadline. Without an index for them, the planner, estimating that almost no task has one,
-- read every task sequentially to find them on some sweeps (caught by
-- `tests/tests/system/flat.rs`, once in a few runs, on 25,000 tasks of history); this index
-- holds only tasks with a deadline, so that path costs what it returns.
CREATE INDEX IF NOT EXISTS worker_tasks_deadline_idx
    ON worker_tasks (id)
    WHERE execution_deadline_seconds IS NOT NULL;
