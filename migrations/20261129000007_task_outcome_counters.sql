-- Counters behind /metrics' `palisade_task_retries_total` and
-- `palisade_tasks_failed_terminal_total`: how many times a task entered `retry_wait`, and how
-- many tasks entered `failed_terminal`, by any path (ingestion, stale recovery, execution
-- deadlines, and any added later), counted from this migration on. A sequence per counter,
-- advanced by a trigger: reading one costs the same whatever the size of worker_tasks, and
-- nextval takes no row lock, so transactions that fail tasks never wait on each other (or
-- deadlock) over a counter row.
--
-- nextval is not rolled back: a transaction that moves a task and then aborts (a crash
-- before its commit, a lost deadlock whose messages are then decided again) counts it
-- anyway, and PostgreSQL may skip up to 32 values after its own crash. The counters may
-- over-count, never under-count, and never decrease.

CREATE SEQUENCE IF NOT EXISTS worker_tasks_retries_seq;
CREATE SEQUENCE IF NOT EXISTS worker_tasks_failed_terminal_seq;

CREATE OR REPLACE FUNCTION worker_tasks_count_outcome() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state = 'retry_wait' THEN
        PERFORM nextval('worker_tasks_retries_seq');
    ELSIF NEW.state = 'failed_terminal' THEN
        PERFORM nextval('worker_tasks_failed_terminal_seq');
    END IF;
    RETURN NULL;
END;
$$;

-- The WHEN clause keeps every other update of worker_tasks free of the function call.
CREATE OR REPLACE TRIGGER worker_tasks_count_outcome
    AFTER UPDATE OF state ON worker_tasks
    FOR EACH ROW
    WHEN (NEW.state IN ('retry_wait', 'failed_terminal') AND OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION worker_tasks_count_outcome();
