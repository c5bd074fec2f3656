-- Writes events in the deciding transaction; a row's trace headers come from its scan when it has
-- none; a staged row is already claimed by its committer.
-- $1: ids
-- $2: subjects
-- $3: payloads
-- $4: headers
-- $5: trace_scan_ids
-- $6: claimed_for.map(crate::seconds)
INSERT INTO outbox (id, subject, payload, headers, claimed_until)
SELECT e.id, e.subject, e.payload,
       CASE WHEN e.headers = '{}'::jsonb AND s.trace_context IS NOT NULL
            THEN jsonb_build_object('traceparent', s.trace_context)
            ELSE e.headers END,
       now() + make_interval(secs => $6)
FROM UNNEST($1::uuid[], $2::text[], $3::bytea[], $4::jsonb[], $5::uuid[])
     AS e(id, subject, payload, headers, trace_scan_id)
LEFT JOIN scans s ON s.id = e.trace_scan_id
RETURNING id, headers
