//! The state of every stateful row, one enum each. Each variant says which service moves rows
//! into and out of it; `docs/state_machine.md` draws the transitions, and a test checks each enum
//! against its table's `CHECK` constraint.

macro_rules! string_enum {
    ($(#[$meta:meta])* $name:ident, $table_constraint:literal { $($(#[$vmeta:meta])* $variant:ident => $text:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vmeta])* $variant,)+ }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];
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
        /// Admission creates it here; nothing has been leased yet.
        Pending => "pending",
        /// Dispatch moves it here when its first task is leased.
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
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            ScanState::Completed | ScanState::Failed | ScanState::Cancelled
        )
    }
}

string_enum! {
    /// One plugin's execution within a scan (user-visible).
    ScanJobState, "scan_jobs.scan_jobs_state_check" {
        /// Created by admission (first plugin) or ingestion (next plugin); back here on retry.
        Pending => "pending",
        /// Dispatch, when a task attempt is leased.
        Running => "running",
        /// Ingestion, with its evidence published in the same transaction. Terminal.
        Completed => "completed",
        /// Ingestion or the reaper, when the task fails terminally. Terminal.
        Failed => "failed",
        /// Cancellation. Terminal.
        Cancelled => "cancelled",
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
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Cancelled | TaskState::Completed | TaskState::FailedTerminal
        )
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
    pub fn is_live(self) -> bool {
        matches!(self, AttemptStatus::Leased | AttemptStatus::Running)
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
        /// Reserved: attempts spent (the enrichment issue). Terminal.
        Failed => "failed",
    }
}
