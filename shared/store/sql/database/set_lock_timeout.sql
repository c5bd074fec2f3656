-- Sets `lock_timeout` for the rest of the current transaction (a savepoint rolled back undoes
-- it) and returns the value it had, to set back.
-- $1 lock_timeout: text — PostgreSQL's form, e.g. '100ms'
WITH previous AS MATERIALIZED (SELECT current_setting('lock_timeout') AS value)
SELECT previous.value, set_config('lock_timeout', $1, true) AS now FROM previous
