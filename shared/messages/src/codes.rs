//! Wire error codes: the `code` of every `palisade.v1.Error`.

/// Every refusal palisade sends has one of these codes. The string forms are the wire
/// contract (docs/protocol/reference.md lists what each means and whether a retry can help).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The bytes are not a valid protobuf message of the expected type.
    MalformedMessage,
    /// `schema_version` is not one this build understands.
    UnsupportedSchemaVersion,
    /// A required field is missing, empty, or not of its documented form.
    InvalidField,
    /// A field or the whole message is over its documented limit.
    TooLarge,
    /// The organization does not exist.
    UnknownOrganization,
    /// The client is registered and revoked (`palisade client revoke`).
    ClientRevoked,
    /// The worker id is not registered.
    UnknownWorker,
    /// The worker is disabled or revoked.
    WorkerDisabled,
    /// The worker is not assigned to the task's organization.
    WorkerNotAssigned,
    /// A plugin of the profile is not known.
    UnknownPlugin,
    /// Same idempotency key, different request.
    IdempotencyConflict,
    /// The target already has a pending or running scan.
    ScanAlreadyActive,
    /// The organization's hourly scan quota is spent.
    QuotaExceeded,
    /// The attempt is not the task's live one (superseded, expired, wrong token, task ended).
    LeaseLost,
    /// The task was cancelled; the worker must stop.
    CancelRequested,
    /// Same batch key, different checksum.
    BatchConflict,
    /// The payload does not hash to its `payload_sha256`.
    ChecksumMismatch,
    /// Completion named more batches than were persisted.
    BatchMissing,
    /// A sequence number outside 0..=`BATCH_SEQUENCE_MAX`, or at or above a completed batch count.
    SequenceOutOfRange,
    /// The scan job's evidence was already published by another attempt.
    EvidenceConflict,
    /// The scan or task named does not exist.
    NotFound,
    /// Enrichment was asked for a scan that has not completed (pending, running, failed or
    /// cancelled): only a completed scan's findings are enriched.
    ScanNotCompleted,
    /// A finding changed since the revision (or its scan's findings since the collection
    /// revision) the change named: nothing was changed.
    RevisionConflict,
    /// An enrollment (or a renewal of credentials) was refused: the token is unknown, used,
    /// expired or revoked, its secret does not match, it asks for more than the token carries,
    /// the worker is revoked, or this installation enrolls no workers. The message says which,
    /// never anything about another token.
    EnrollmentRefused,
    /// Something failed inside palisade; the sender may retry.
    Internal,
}

impl ErrorCode {
    /// Every code, for documentation and exhaustive tests.
    pub const ALL: [ErrorCode; 25] = [
        ErrorCode::MalformedMessage,
        ErrorCode::UnsupportedSchemaVersion,
        ErrorCode::InvalidField,
        ErrorCode::TooLarge,
        ErrorCode::UnknownOrganization,
        ErrorCode::ClientRevoked,
        ErrorCode::UnknownWorker,
        ErrorCode::WorkerDisabled,
        ErrorCode::WorkerNotAssigned,
        ErrorCode::UnknownPlugin,
        ErrorCode::IdempotencyConflict,
        ErrorCode::ScanAlreadyActive,
        ErrorCode::QuotaExceeded,
        ErrorCode::LeaseLost,
        ErrorCode::CancelRequested,
        ErrorCode::BatchConflict,
        ErrorCode::ChecksumMismatch,
        ErrorCode::BatchMissing,
        ErrorCode::SequenceOutOfRange,
        ErrorCode::EvidenceConflict,
        ErrorCode::NotFound,
        ErrorCode::ScanNotCompleted,
        ErrorCode::RevisionConflict,
        ErrorCode::EnrollmentRefused,
        ErrorCode::Internal,
    ];

    /// The wire form.
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorCode::MalformedMessage => "malformed_message",
            ErrorCode::UnsupportedSchemaVersion => "unsupported_schema_version",
            ErrorCode::InvalidField => "invalid_field",
            ErrorCode::TooLarge => "too_large",
            ErrorCode::UnknownOrganization => "unknown_organization",
            ErrorCode::ClientRevoked => "client_revoked",
            ErrorCode::UnknownWorker => "unknown_worker",
            ErrorCode::WorkerDisabled => "worker_disabled",
            ErrorCode::WorkerNotAssigned => "worker_not_assigned",
            ErrorCode::UnknownPlugin => "unknown_plugin",
            ErrorCode::IdempotencyConflict => "idempotency_conflict",
            ErrorCode::ScanAlreadyActive => "scan_already_active",
            ErrorCode::QuotaExceeded => "quota_exceeded",
            ErrorCode::LeaseLost => "lease_lost",
            ErrorCode::CancelRequested => "cancel_requested",
            ErrorCode::BatchConflict => "batch_conflict",
            ErrorCode::ChecksumMismatch => "checksum_mismatch",
            ErrorCode::BatchMissing => "batch_missing",
            ErrorCode::SequenceOutOfRange => "sequence_out_of_range",
            ErrorCode::EvidenceConflict => "evidence_conflict",
            ErrorCode::NotFound => "not_found",
            ErrorCode::ScanNotCompleted => "scan_not_completed",
            ErrorCode::RevisionConflict => "revision_conflict",
            ErrorCode::EnrollmentRefused => "enrollment_refused",
            ErrorCode::Internal => "internal",
        }
    }

    /// Parses the wire form.
    pub fn parse(code: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|known| known.as_str() == code)
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_are_distinct() {
        let mut seen = std::collections::HashSet::new();
        for code in ErrorCode::ALL {
            assert_eq!(ErrorCode::parse(code.as_str()), Some(code));
            assert!(seen.insert(code.as_str()), "duplicate code {code}");
        }
    }
}
