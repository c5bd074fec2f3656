-- Indexes for the set-wise hot path (issue 8): every statement a completion runs is served by
-- an index, whatever the tables hold.
--
-- Completion counts a scan job's assets, and removes what superseded attempts of the job left
-- behind, by scan job: without this index both read all of scan_assets.
CREATE INDEX IF NOT EXISTS scan_assets_scan_job_idx ON scan_assets (scan_job_id);
