//! The state of every stateful row, one enum each. Each variant says which service moves rows
//! into and out of it; `docs/state_machine.md` draws the transitions, and a test checks each enum
//! against its table's `CHECK` constraint.
//!
//! SQL never spells a state: statements bind `as_str()` of these enums (`state = $n`, or
//! `state = ANY($n)` with an array), so renaming a state is a compile error and a search for a
//! variant finds every statement that moves rows into or out of it. A unit test
//! (`sql_spells_no_state` below) fails when a quoted state name appears in the crate's source;
//! the migrations (`CHECK` constraints, partial-index predicates, the one trigger) are the only
//! SQL that names states. Bound states cost no plan quality: every statement is planned for its
//! own arguments (each runs as the unnamed statement, see `sql.rs`), so a partial index whose
//! predicate names states is used just as with literals.

macro_rules! string_enum {
    ($(#[$meta:meta])* $name:ident, $table_constraint:literal { $($(#[$vmeta:meta])* $variant:ident => $text:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vmeta])* $variant,)+ }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];
            /// `as_str()` of each of [`Self::ALL`], in the same order.
            pub const NAMES: &'static [&'static str] = &[$($text,)+];
            /// `table.constraint` holding the allowed values in the schema.
            pub const CHECK_CONSTRAINT: &'static str = $table_constraint;

            pub const fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text,)+ }
            }

            pub fn parse(text: &str) -> Option<Self> {
                Self::ALL.iter().copied().find(|state| state.as_str() == text)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

string_enum! {
    /// A scan, as its submitter sees it.
    ScanState, "scans.scans_state_check" {
        /// Admission creates it here, and the row stays here until the scan ends: a lease
        /// writes only its attempt. Reported while no task of the scan was ever leased.
        Pending => "pending",
        /// Reported once a task of the scan was leased (see [`ScanState::reported`]). Not stored
        /// any more; an older build stored it at the first lease, and every statement that
        /// ends a scan still accepts it.
        Running => "running",
        /// Ingestion, when the last plugin's task completes. Terminal.
        Completed => "completed",
        /// Ingestion (terminal task failure) or the reaper (budget spent). Terminal.
        Failed => "failed",
        /// Cancellation. Terminal.
        Cancelled => "cancelled",
    }
}

impl ScanState {
    /// Not ended yet: at most one such scan per (organization, target).
    pub const ACTIVE: [ScanState; 2] = [ScanState::Pending, ScanState::Running];

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            ScanState::Completed | ScanState::Failed | ScanState::Cancelled
        )
    }

    /// The state a reader is told, from the stored one and whether a task of the scan was
    /// ever leased (an attempt exists): an unfinished scan is `running` from its first lease
    /// to its end, `pending` before. Nothing writes the row at a lease, so this is where
    /// `running` comes from.
    pub fn reported(self, started: bool) -> ScanState {
        match self {
            ScanState::Pending | ScanState::Running if started => ScanState::Running,
            ScanState::Pending | ScanState::Running => ScanState::Pending,
            ended => ended,
        }
    }
}

string_enum! {
    /// One plugin's execution within a scan (user-visible).
    ScanJobState, "scan_jobs.scan_jobs_state_check" {
        /// Created by admission (first plugin) or ingestion (next plugin); the row stays here
        /// until the job ends. Reported while its task holds no lease.
        Pending => "pending",
        /// Reported while its task is leased (see [`ScanJobState::reported`]). Not stored
        /// any more; an older build stored it at each lease, and every statement that ends a
        /// job still accepts it.
        Running => "running",
        /// Ingestion, with its evidence published in the same transaction. Terminal.
        Completed => "completed",
        /// Ingestion or the reaper, when the task fails terminally. Terminal.
        Failed => "failed",
        /// Cancellation. Terminal.
        Cancelled => "cancelled",
    }
}

impl ScanJobState {
    /// The state a reader is told, from the stored one and its task's: an unfinished job is
    /// `running` while its task holds a lease, `pending` otherwise.
    pub fn reported(self, task: Option<TaskState>) -> ScanJobState {
        match self {
            ScanJobState::Pending | ScanJobState::Running
                if task.is_some_and(|task| TaskState::LEASED.contains(&task)) =>
            {
                ScanJobState::Running
            }
            ScanJobState::Pending | ScanJobState::Running => ScanJobState::Pending,
            ended => ended,
        }
    }
}

string_enum! {
    /// The leasing envelope of one scan job.
    TaskState, "worker_tasks.worker_tasks_state_check" {
        /// Due now. Created by admission/ingestion; back here on release.
        Pending => "pending",
        /// Dispatch granted an attempt; no result has arrived yet.
        Leased => "leased",
        /// The attempt renewed or sent a batch.
        Running => "running",
        /// Cancellation requested while leased; the worker learns at its next renew.
        Cancelling => "cancelling",
        /// Terminal.
        Cancelled => "cancelled",
        /// Ingestion accepted the completion. Terminal.
        Completed => "completed",
        /// A failed or expired attempt with budget left; due again at `available_at`.
        RetryWait => "retry_wait",
        /// Budget spent, or a failure that retrying cannot help. Terminal.
        FailedTerminal => "failed_terminal",
    }
}

impl TaskState {
    /// Where a task stays once it got there.
    pub const TERMINAL: [TaskState; 3] = [
        TaskState::Completed,
        TaskState::FailedTerminal,
        TaskState::Cancelled,
    ];
    /// A live attempt holds the task.
    pub const LEASED: [TaskState; 2] = [TaskState::Leased, TaskState::Running];

    pub fn is_terminal(self) -> bool {
        Self::TERMINAL.contains(&self)
    }
}

string_enum! {
    /// One lease of a task to one worker.
    AttemptStatus, "worker_task_attempts.worker_task_attempts_status_check" {
        /// Dispatch created it at acquire.
        Leased => "leased",
        /// The worker renewed or sent a batch.
        Running => "running",
        /// Ingestion accepted its completion.
        Succeeded => "succeeded",
        /// Ingestion accepted its failure report.
        Failed => "failed",
        /// Its task was cancelled.
        Cancelled => "cancelled",
        /// The reaper found its lease expired.
        Expired => "expired",
        /// Reserved: replaced without expiring (operator action).
        Superseded => "superseded",
        /// The worker gave it back (shutdown); the attempt budget is refunded.
        Released => "released",
    }
}

impl AttemptStatus {
    /// Holding its task's lease: at most one per task.
    pub const LIVE: [AttemptStatus; 2] = [AttemptStatus::Leased, AttemptStatus::Running];

    pub fn is_live(self) -> bool {
        Self::LIVE.contains(&self)
    }
}

string_enum! {
    /// The one enrichment job of a completed scan.
    EnrichmentJobState, "enrichment_jobs.enrichment_jobs_state_check" {
        /// Ingestion creates it here when the scan has findings with CVE ids.
        Pending => "pending",
        /// Enrichment claimed it under a fenced lease.
        Running => "running",
        /// Enrichment finished it; ingestion creates it here when there is nothing to enrich.
        Completed => "completed",
        /// Its executions are spent, or one failed not retryably. Terminal until enrichment
        /// is requested again.
        Failed => "failed",
    }
}

string_enum! {
    /// One result batch a worker sent for an attempt.
    ResultBatchStatus, "worker_result_batches.worker_result_batches_status_check" {
        /// Reserved: received, not yet persisted.
        Accepted => "accepted",
        /// Ingestion inserts it here, with its evidence, in the transaction that accepts it.
        Persisted => "persisted",
        /// Reserved: a repeat of a batch already persisted (repeats are answered, not stored).
        Duplicate => "duplicate",
        /// Reserved: persisting failed.
        Failed => "failed",
    }
}

string_enum! {
    /// One artifact upload session of an attempt.
    UploadStatus, "worker_artifact_uploads.worker_artifact_uploads_status_check" {
        /// Opened by a worker holding its lease; its chunks may be arriving.
        Prepared => "prepared",
        /// Committed by the worker, its chunks matching the commit's count and size: its file
        /// is streaming into the artifact store, its sha256 checked on the way (a mismatch
        /// fails it). Ingestion stores no more chunks for it.
        Uploaded => "uploaded",
        /// In the artifact store and part of the scan's evidence.
        Committed => "committed",
        /// The reaper, when a `prepared` or `uploaded` session passes its expiry.
        Expired => "expired",
        /// What arrived is not what the commit described (size, digest or chunks).
        Failed => "failed",
    }
}

impl UploadStatus {
    /// Not committed yet, so it can still expire.
    pub const OPEN: [UploadStatus; 2] = [UploadStatus::Prepared, UploadStatus::Uploaded];
}

string_enum! {
    /// A finding's disposition: the evidence guide's seven review states, each selectable from
    /// any other (not a workflow). `palisade finding set` (`store::findings::set_status`)
    /// moves a finding between them; ingestion creates every finding `open`.
    FindingStatus, "findings.findings_status_check" {
        /// Every new finding, at revision 1. Counts toward the gate.
        Open => "open",
        /// Counts toward the gate.
        NeedsReview => "needs_review",
        /// Shown, not counted toward the gate. Needs a reason.
        GateExempt => "gate_exempt",
        /// Shown, not counted toward the gate. Needs a reason.
        AcceptedRisk => "accepted_risk",
        /// Suppressed. Needs a reason.
        Ignore => "ignore",
        /// Suppressed. Needs a reason.
        FalsePositive => "false_positive",
        /// Suppressed. Needs a reason. Marking it does not look at the target: the next scan's
        /// finding starts `open` again if the issue is still there.
        Fixed => "fixed",
    }
}

impl FindingStatus {
    /// `open` and `needs_review` count toward the gate.
    pub const GATE_COUNTED: [FindingStatus; 2] = [FindingStatus::Open, FindingStatus::NeedsReview];
    /// `ignore`, `false_positive` and `fixed` suppress the finding.
    pub const SUPPRESSING: [FindingStatus; 3] = [
        FindingStatus::Ignore,
        FindingStatus::FalsePositive,
        FindingStatus::Fixed,
    ];

    pub fn counts_toward_gate(self) -> bool {
        Self::GATE_COUNTED.contains(&self)
    }

    pub fn suppresses(self) -> bool {
        Self::SUPPRESSING.contains(&self)
    }

    /// The five exclusions need a non-blank reason.
    pub fn needs_reason(self) -> bool {
        !self.counts_toward_gate()
    }
}

string_enum! {
    /// A finding's severity, lowest first.
    Severity, "findings.findings_severity_check" {
        Info => "info",
        Low => "low",
        Medium => "medium",
        High => "high",
        Critical => "critical",
    }
}

impl Severity {
    /// The severities at or above `self`.
    pub fn and_above(self) -> Vec<Severity> {
        Self::ALL
            .iter()
            .copied()
            .filter(|severity| *severity >= self)
            .collect()
    }
}

impl PartialOrd for Severity {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Severity {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (*self as u8).cmp(&(*other as u8))
    }
}

string_enum! {
    /// A plugin's verdict on one rule and resource (`evaluations.status`, written by ingestion
    /// as the worker reported it). What was required and never reported reads
    /// [`crate::coverage::CoverageStatus::Unknown`]: it is never stored.
    EvaluationStatus, "evaluations.evaluations_status_check" {
        /// Checked, and it holds.
        Pass => "pass",
        /// Checked, and it does not: the evaluation names the finding it produced.
        Fail => "fail",
        /// The check could not be made (a reason code says why).
        Error => "error",
        /// The rule does not apply to the resource (a reason code says why).
        NotApplicable => "not_applicable",
    }
}

impl EvaluationStatus {
    /// Whether the status needs a reason code.
    pub fn needs_reason(self) -> bool {
        matches!(self, Self::Error | Self::NotApplicable)
    }
}

string_enum! {
    /// A change in a finding's history (`finding_history.action`).
    FindingChange, "finding_history.finding_history_action_check" {
        /// Its disposition was set.
        Set => "set",
        /// It was deleted (the row is gone; its history stays).
        Delete => "delete",
    }
}

string_enum! {
    /// What was done with an upstream CVE record palisade could not keep as served
    /// (`cve_quarantine.action`, written by enrichment and `palisade cve import`).
    QuarantineAction, "cve_quarantine.cve_quarantine_action_check" {
        /// Stored, changed so PostgreSQL accepts it (`cves::CveRecord::sanitise`).
        Sanitised => "sanitised",
        /// Not stored: it could not be read.
        SetAside => "set_aside",
    }
}

string_enum! {
    /// How an operator resolved a dead letter (`dead_letters.resolution`; open while NULL).
    DeadLetterResolution, "dead_letters.dead_letters_resolution_check" {
        /// Published again on its subject, decided by the ordinary path.
        Replayed => "replayed",
        /// Closed without being decided.
        Discarded => "discarded",
    }
}

string_enum! {
    /// What a schedule's slot does while its target still has an active scan (issue 27).
    ScheduleOverlap, "scan_schedules.scan_schedules_overlap_check" {
        /// The slot is recorded as skipped, naming the active scan; the next slot fires as usual.
        Skip => "skip",
        /// The slot waits, retried at every sweep, and fires once the target is free (later
        /// slots that pass meanwhile are folded into it by the catch-up rule).
        Queue => "queue",
    }
}

string_enum! {
    /// How a schedule's slot was fired: the reaper's leader writes it once per slot.
    ScheduleFireOutcome, "schedule_fires.schedule_fires_outcome_check" {
        /// Admission admitted the slot's scan.
        Admitted => "admitted",
        /// The slot's idempotency key already named a scan (no second scan).
        Duplicate => "duplicate",
        /// The target had an active scan and the schedule's overlap policy is `skip`.
        Skipped => "skipped",
        /// Admission refused it (`quota_exceeded`, `client_revoked`, …: the detail says).
        Refused => "refused",
    }
}

string_enum! {
    /// What an operator changed about a tenant's access or limits (`admin_changes`, issue 27).
    AdminAction, "admin_changes.admin_changes_action_check" {
        WorkerRevoked => "revoke_worker",
        WorkerEnabled => "enable_worker",
        AssignmentAdded => "assign_worker",
        AssignmentRevoked => "revoke_assignment",
        ClientRegistered => "register_client",
        ClientRevoked => "revoke_client",
        ClientEnabled => "enable_client",
        /// An organization's hourly quota or cap on tasks in flight (the detail says which).
        OrganizationLimitsSet => "set_organization_limits",
        /// An enrollment token issued (`palisade worker token create`).
        EnrollmentTokenCreated => "create_enrollment_token",
        /// An enrollment token revoked before it was used.
        EnrollmentTokenRevoked => "revoke_enrollment_token",
        /// A worker enrolled with a token; the actor names the token and who issued it.
        WorkerEnrolled => "enroll_worker",
    }
}

/// The text of every state of every enum above, sorted, each once: what SQL must never spell.
pub fn all_names() -> Vec<&'static str> {
    let mut names = [
        ScanState::NAMES,
        ScanJobState::NAMES,
        TaskState::NAMES,
        AttemptStatus::NAMES,
        EnrichmentJobState::NAMES,
        ResultBatchStatus::NAMES,
        UploadStatus::NAMES,
        FindingStatus::NAMES,
        Severity::NAMES,
        FindingChange::NAMES,
        QuarantineAction::NAMES,
        DeadLetterResolution::NAMES,
        ScheduleOverlap::NAMES,
        ScheduleFireOutcome::NAMES,
        AdminAction::NAMES,
    ]
    .concat();
    names.sort_unstable();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn state_names_are_those_of_the_enums() {
        for (index, state) in TaskState::ALL.iter().enumerate() {
            assert_eq!(TaskState::NAMES[index], state.as_str());
        }
        let names = all_names();
        assert!(names.contains(&"retry_wait") && names.contains(&"expired"));
        assert!(
            names.windows(2).all(|pair| pair[0] < pair[1]),
            "sorted, no repeats"
        );
    }

    #[test]
    fn sql_spells_no_state() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files = crate::source_files(&root.join("src"), &["rs"]);
        files.extend(crate::source_files(&root.join("sql"), &["sql"]));
        files.sort();
        assert!(
            files.len() > 90,
            "found the crate's modules and statements: {files:?}"
        );
        let quoted: Vec<String> = all_names().iter().map(|name| format!("'{name}'")).collect();
        let mut spelled = Vec::new();
        for path in &files {
            let file = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let text = std::fs::read_to_string(path).unwrap();
            for (index, line) in text.lines().enumerate() {
                for state in quoted.iter().filter(|state| line.contains(state.as_str())) {
                    spelled.push(format!("{file}:{}: {state}", index + 1));
                }
            }
        }
        assert!(
            spelled.is_empty(),
            "SQL spells states; bind `as_str()` of their enums in states.rs instead:\n{}",
            spelled.join("\n")
        );
    }
}
