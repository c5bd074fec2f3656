//! The `palisade` command's exit statuses, the one place they are decided (README's
//! "Exit status" lists them): a command that fails for a reason a script may act on returns an
//! error carrying its [`Status`] ([`Failure`]); any other error exits 1.

use std::fmt;

/// What a `palisade` command's exit status says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// 0: done; the answer is on standard output.
    Ok,
    /// 1: failed (cannot connect, invalid settings, a database error…); the message says why.
    Error,
    /// 2: the command line is wrong (clap's own status).
    Usage,
    /// 3: what the command names does not exist (a scan, task, finding, target, worker, client).
    NotFound,
    /// 4: refused: admission refused the scan, a finding change was refused, `scan diff` of
    /// scans of different targets or in the wrong order, the migrate preflight refused the
    /// database (PostgreSQL too old, a privilege missing, a schema newer than this build),
    /// enrichment refused.
    Refused,
    /// 5: the answer is "no": `scan submit --wait` followed a scan that ended other than
    /// completed, `scan gate` did not pass.
    NotPassed,
    /// 6: `migrate --check`: migrations are pending (listed on standard output).
    Pending,
}

impl Status {
    pub const fn code(self) -> u8 {
        match self {
            Status::Ok => 0,
            Status::Error => 1,
            Status::Usage => 2,
            Status::NotFound => 3,
            Status::Refused => 4,
            Status::NotPassed => 5,
            Status::Pending => 6,
        }
    }

    /// The status an error exits with: that of the first [`Failure`] in its chain, 4 for the
    /// database refusing a migration or this build (`store::schema`), else 1.
    pub fn of(error: &anyhow::Error) -> Self {
        error
            .chain()
            .find_map(|cause| {
                if let Some(failure) = cause.downcast_ref::<Failure>() {
                    return Some(failure.status);
                }
                match cause.downcast_ref::<store::StoreError>() {
                    Some(
                        store::StoreError::Schema(_) | store::StoreError::CreateDatabase { .. },
                    ) => Some(Status::Refused),
                    _ => None,
                }
            })
            .unwrap_or(Status::Error)
    }
}

/// An error that exits with its own status; its message goes to standard error.
#[derive(Debug)]
pub struct Failure {
    pub status: Status,
    pub message: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

/// Exit 3 with `message`.
pub fn not_found(message: impl Into<String>) -> anyhow::Error {
    failure(Status::NotFound, message)
}

/// Exit 4 with `message`.
pub fn refused(message: impl Into<String>) -> anyhow::Error {
    failure(Status::Refused, message)
}

pub fn failure(status: Status, message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Failure {
        status,
        message: message.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context as _;

    #[test]
    fn an_error_exits_with_the_status_it_carries_else_1() {
        assert_eq!(
            Status::of(&anyhow::anyhow!("cannot connect")),
            Status::Error
        );
        let wrapped = Err::<(), _>(not_found("no scan x"))
            .context("while showing")
            .unwrap_err();
        assert_eq!(Status::of(&wrapped), Status::NotFound);
        assert_eq!(Status::of(&refused("no")).code(), 4);
    }

    #[test]
    fn statuses_are_distinct() {
        let all = [
            Status::Ok,
            Status::Error,
            Status::Usage,
            Status::NotFound,
            Status::Refused,
            Status::NotPassed,
            Status::Pending,
        ];
        let codes: std::collections::BTreeSet<u8> = all.iter().map(|s| s.code()).collect();
        assert_eq!(codes.len(), all.len());
    }
}
