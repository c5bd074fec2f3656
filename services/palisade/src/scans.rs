//! `palisade scan show` and `palisade scan submit --wait`: a scan read from PostgreSQL with its
//! plugin jobs, findings and coverage, and following one until it ends, saying on the way how many of
//! its plugins are in which state.

use std::time::Duration;

use serde::Serialize;
use store::PgPool;
use store::admin::{FindingView, ScanJobView, ScanView};
use store::states::{ScanJobState, ScanState, TaskState};
use uuid::Uuid;

use crate::exit;

/// How often `--wait` reads the scan again: a scan takes seconds, one read is three indexed
/// statements.
pub const FOLLOW_INTERVAL: Duration = Duration::from_millis(500);

/// A scan as `palisade scan show --output json` prints it (and `scan submit --wait --output
/// json` once the scan ended).
#[derive(Debug, Clone, Serialize)]
pub struct ScanDetail {
    #[serde(flatten)]
    pub scan: ScanView,
    /// Its plugin jobs, in plugin order (a job is created when its plugin's turn comes).
    pub jobs: Vec<ScanJobView>,
    pub findings: Vec<FindingView>,
    /// What it checked (docs/protocol/reference.md section 13).
    pub coverage: store::coverage::Coverage,
}

impl ScanDetail {
    /// Ended: completed, failed or cancelled.
    pub fn is_terminal(&self) -> bool {
        ScanState::parse(&self.scan.state).is_some_and(ScanState::is_terminal)
    }

    /// `scan <id> running: 1/3 plugins completed, 1 running, 1 not started`: what `--wait`
    /// prints whenever it changes.
    pub fn progress(&self) -> String {
        let mut counts: Vec<String> = Vec::new();
        let plugins = self.scan.plugins.len();
        let count_of = |state: ScanJobState| {
            self.jobs
                .iter()
                .filter(|job| job.state == state.as_str())
                .count()
        };
        let completed = count_of(ScanJobState::Completed);
        for state in ScanJobState::ALL {
            let count = count_of(*state);
            if *state != ScanJobState::Completed && count > 0 {
                counts.push(format!("{count} {state}"));
            }
        }
        let not_started = plugins.saturating_sub(self.jobs.len());
        if not_started > 0 {
            counts.push(format!("{not_started} not started"));
        }
        let retrying = self
            .jobs
            .iter()
            .filter(|job| job.task_state.as_deref() == Some(TaskState::RetryWait.as_str()))
            .count();
        if retrying > 0 {
            counts.push(format!("{retrying} waiting to retry"));
        }
        let mut line = format!(
            "scan {} {}: {completed}/{plugins} plugins completed",
            self.scan.id, self.scan.state
        );
        for count in counts {
            line.push_str(", ");
            line.push_str(&count);
        }
        line
    }
}

/// The scan, or exit 3 when there is none.
pub async fn show(pool: &PgPool, scan_id: Uuid) -> anyhow::Result<ScanDetail> {
    let Some(scan) = store::admin::scan(pool, scan_id).await? else {
        return Err(exit::not_found(format!(
            "no scan {scan_id} in this database"
        )));
    };
    let mut conn = pool.acquire().await?;
    let coverage = store::coverage::of_scan(&mut conn, None, scan_id)
        .await?
        .map(|(_, coverage)| coverage)
        .ok_or_else(|| exit::not_found(format!("no scan {scan_id} in this database")))?;
    Ok(ScanDetail {
        scan,
        jobs: store::admin::scan_jobs(pool, scan_id).await?,
        findings: store::admin::findings(pool, scan_id).await?,
        coverage,
    })
}

/// Reads the scan every [`FOLLOW_INTERVAL`] until it ends, telling `progress` each change;
/// gives up after `timeout` (exit 1, saying how to keep following).
pub async fn follow(
    pool: &PgPool,
    scan_id: Uuid,
    timeout: Duration,
    mut progress: impl FnMut(&str),
) -> anyhow::Result<ScanDetail> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last = String::new();
    loop {
        let detail = show(pool, scan_id).await?;
        let line = detail.progress();
        if line != last {
            progress(&line);
            last = line;
        }
        if detail.is_terminal() {
            return Ok(detail);
        }
        if tokio::time::Instant::now() + FOLLOW_INTERVAL > deadline {
            anyhow::bail!(
                "scan {scan_id} is still {} after {} s: `palisade scan show {scan_id}` reads it, a larger --timeout-secs waits longer",
                detail.scan.state,
                timeout.as_secs()
            );
        }
        tokio::time::sleep(FOLLOW_INTERVAL).await;
    }
}

/// Exit 5 unless the ended scan completed.
pub fn outcome(detail: &ScanDetail) -> anyhow::Result<()> {
    if detail.scan.state == ScanState::Completed.as_str() {
        return Ok(());
    }
    let reason = if detail.scan.failure_code.is_empty() {
        String::new()
    } else {
        format!(
            ": {} ({})",
            detail.scan.failure_reason, detail.scan.failure_code
        )
    };
    Err(exit::failure(
        exit::Status::NotPassed,
        format!(
            "scan {} ended {}{reason}; `palisade scan show {}` has each plugin's error",
            detail.scan.id, detail.scan.state, detail.scan.id
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(position: i32, state: ScanJobState, task_state: &str) -> ScanJobView {
        ScanJobView {
            task_id: Some(Uuid::nil()),
            position,
            plugin: format!("plugin-{position}"),
            state: state.as_str().to_owned(),
            task_state: Some(task_state.to_owned()),
            attempt_count: Some(1),
            finding_count: 0,
            asset_count: 0,
            error_code: String::new(),
            error_message: String::new(),
        }
    }

    fn detail(state: ScanState, jobs: Vec<ScanJobView>) -> ScanDetail {
        ScanDetail {
            scan: ScanView {
                id: Uuid::nil(),
                organization_id: Uuid::nil(),
                target: "http://x".into(),
                client_id: "cli".into(),
                idempotency_key: "k".into(),
                plugins: vec!["a".into(), "b".into(), "c".into()],
                state: state.as_str().to_owned(),
                failure_code: String::new(),
                failure_reason: String::new(),
                finding_count: 0,
                created_at: chrono::Utc::now(),
                started_at: None,
                finished_at: None,
                trace_id: None,
            },
            jobs,
            findings: Vec::new(),
            coverage: store::coverage::assemble("http://x", &[], &[], Vec::new())
                .expect("empty coverage"),
        }
    }

    #[test]
    fn progress_counts_plugins_by_state() {
        let running = detail(
            ScanState::Running,
            vec![
                job(0, ScanJobState::Completed, TaskState::Completed.as_str()),
                job(1, ScanJobState::Pending, TaskState::RetryWait.as_str()),
            ],
        );
        assert_eq!(
            running.progress(),
            format!(
                "scan {} running: 1/3 plugins completed, 1 pending, 1 not started, 1 waiting to retry",
                Uuid::nil()
            )
        );
        assert!(!running.is_terminal());
        let failed = detail(ScanState::Failed, Vec::new());
        assert!(failed.is_terminal());
        assert_eq!(exit::Status::of(&outcome(&failed).unwrap_err()).code(), 5);
        assert!(outcome(&detail(ScanState::Completed, Vec::new())).is_ok());
    }
}
