-- Writes the events one decision makes as one row, in the deciding transaction; an event's
-- trace headers come from its scan when it has none; a staged row is already claimed by its
-- committer. Returns the headers as stored, in the order of the events.
-- $1 id: uuid
-- $2 event_ids: uuid[]
-- $3 subjects: text[]
-- $4 payloads: bytea[]
-- $5 headers: jsonb[]
-- $6 trace_scan_ids: uuid[]
-- $7 claimed_for_seconds: float8 — claimed_for.map(crate::seconds)
INSERT INTO outbox_batches (id, event_ids, subjects, payloads, headers, claimed_until)
SELECT $1,
       array_agg(e.id ORDER BY e.position),
       array_agg(e.subject ORDER BY e.position),
       array_agg(e.payload ORDER BY e.position),
       array_agg(CASE WHEN e.headers = '{}'::jsonb AND s.trace_context IS NOT NULL
                      THEN jsonb_build_object('traceparent', s.trace_context)
                      ELSE e.headers END ORDER BY e.position),
       now() + make_interval(secs => $7)
FROM UNNEST($2::uuid[], $3::text[], $4::bytea[], $5::jsonb[], $6::uuid[]) WITH ORDINALITY
     AS e(id, subject, payload, headers, trace_scan_id, position)
LEFT JOIN scans s ON s.id = e.trace_scan_id
RETURNING headers
