-- How many scans there are, and how many of them are in one state.
-- $1 completed_scan_state: text — crate::states::ScanState::Completed.as_str()
SELECT count(*), count(*) FILTER (WHERE state = $1) FROM scans
