-- One chunk of history: completed scans finished an hour or two ago (inside the retention
-- window, so the reaper keeps them), each with its job (requiring the synthetic-0 rule on its
-- target), task, attempt, batch, finding and its failed evaluation, asset, enrichment job (its published events left the outbox when they were published).
-- $1 organization_id: uuid
-- $2 first_number: int8 — the first scan's number in the history
-- $3 last_number: int8 — the last scan's number
-- $4 worker_id: uuid — which held every attempt
-- $5 completed_scan_state: text — ScanState::Completed.as_str()
-- $6 completed_job_state: text — ScanJobState::Completed.as_str()
-- $7 completed_state: text — TaskState::Completed.as_str()
-- $8 succeeded_status: text — AttemptStatus::Succeeded.as_str()
-- $9 persisted_status: text — ResultBatchStatus::Persisted.as_str()
-- $10 completed_enrichment_state: text — EnrichmentJobState::Completed.as_str()
-- $11 low_severity: text — Severity::Low.as_str()
-- $12 fail_status: text — EvaluationStatus::Fail.as_str()
WITH s AS (
    SELECT i, gen_random_uuid() AS scan_id, gen_random_uuid() AS target_id,
           gen_random_uuid() AS job_id, gen_random_uuid() AS task_id,
           gen_random_uuid() AS attempt_id, gen_random_uuid() AS asset_id,
           now() - interval '2 hours' + make_interval(secs => i * 0.001) AS at
    FROM generate_series($2::bigint, $3::bigint) AS i
), targets AS (
    INSERT INTO targets (id, organization_id, locator, created_at)
    SELECT target_id, $1, 'synthetic://history/' || i, at FROM s
), scans AS (
    INSERT INTO scans (id, organization_id, target_id, client_id, idempotency_key, request_fingerprint,
                       plugins, state, finding_count, created_at, started_at, finished_at, updated_at)
    SELECT scan_id, $1, target_id, 'history', 'history-' || i, repeat('0', 64), ARRAY['synthetic'],
           $5, 1, at, at, at, at
    FROM s
), jobs AS (
    INSERT INTO scan_jobs (id, scan_id, organization_id, position, plugin, state, evidence_published_at,
                           finding_count, required_rules, created_at, started_at, finished_at,
                           updated_at)
    SELECT job_id, scan_id, $1, 0, 'synthetic', $6, at, 1,
           '[{"rule": "synthetic-0", "kinds": ["target"]}]'::jsonb, at, at, at, at FROM s
), tasks AS (
    INSERT INTO worker_tasks (id, organization_id, scan_id, scan_job_id, required_capabilities, payload,
                              state, attempt_count, last_attempt_number, current_attempt_id,
                              completed_at, available_at, created_at, updated_at)
    SELECT task_id, $1, scan_id, job_id, ARRAY['synthetic'],
           jsonb_build_object('plugin', 'synthetic', 'target', 'synthetic://history/' || i, 'position', 0),
           $7, 1, 1, attempt_id, at, at, at, at
    FROM s
), attempts AS (
    INSERT INTO worker_task_attempts (id, task_id, worker_id, attempt_number, lease_token,
                                      acquire_request_id, status, lease_expires_at, started_at,
                                      finished_at, created_at, updated_at)
    SELECT attempt_id, task_id, $4, 1, replace(attempt_id::text, '-', ''), gen_random_uuid(),
           $8, at, at, at, at, at
    FROM s
), batches AS (
    INSERT INTO worker_result_batches (id, task_id, attempt_id, sequence_number, idempotency_key,
                                       payload_sha256, status, finding_count, persisted_at, received_at)
    SELECT gen_random_uuid(), task_id, attempt_id, 0, attempt_id::text || ':0', repeat('0', 64),
           $9, 1, at, at
    FROM s
), findings AS (
    INSERT INTO findings (id, organization_id, scan_id, scan_job_id, attempt_id, finding_key, plugin,
                          rule_id, resource, severity, title, created_at, updated_at)
    SELECT gen_random_uuid(), $1, scan_id, job_id, attempt_id, md5(i::text) || md5(i::text),
           'synthetic', 'synthetic-0', 'synthetic://history/' || i, $11, 'history', at, at
    FROM s
), evaluations AS (
    INSERT INTO evaluations (id, organization_id, scan_id, scan_job_id, attempt_id, evaluation_key,
                             plugin, rule_id, resource, status, finding_key, created_at, updated_at)
    SELECT gen_random_uuid(), $1, scan_id, job_id, attempt_id, md5(i::text) || md5(i::text),
           'synthetic', 'synthetic-0', 'synthetic://history/' || i, $12,
           md5(i::text) || md5(i::text), at, at
    FROM s
), assets AS (
    INSERT INTO assets (id, organization_id, kind, value, first_seen_at, last_seen_at)
    SELECT asset_id, $1, 'http_service', 'synthetic://history/' || i, at, at FROM s
), scan_assets AS (
    INSERT INTO scan_assets (scan_id, asset_id, scan_job_id, attempt_id)
    SELECT scan_id, asset_id, job_id, attempt_id FROM s
)
INSERT INTO enrichment_jobs (id, scan_id, organization_id, state, finished_at, created_at, updated_at)
SELECT gen_random_uuid(), scan_id, $1, $10, at, at, at FROM s
