-- The W3C traceparent of the span that admitted each scan: later steps (leases, worker
-- execution, ingestion, outbox events) are triggered by messages without the scan's context
-- and join the scan's trace through this column. NULL when tracing export was off.

ALTER TABLE scans ADD COLUMN IF NOT EXISTS trace_context TEXT;
