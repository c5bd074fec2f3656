//! Why a worker stopped: the errors [`crate::Worker::new`] and [`crate::Worker::run`] return.
//! Problems of one lease never end the worker; they are logged and counted instead.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum WorkerError {
    #[error("invalid worker configuration: {reason}")]
    InvalidConfig { reason: String },
    #[error(transparent)]
    Bus(#[from] bus::BusError),
    /// Dispatch refused this worker in a way retrying cannot fix.
    #[error("dispatch refused {verb}: {code}: {message}{hint}")]
    Refused {
        verb: &'static str,
        code: String,
        message: String,
        /// What the operator can do, with a leading separator; empty when there is nothing.
        hint: &'static str,
    },
    /// Enrolling or renewing credentials failed (`enrollment`).
    #[error("enrollment: {reason}")]
    Enrollment { reason: String },
    #[error("dispatch's hello reply is unusable: {reason}")]
    InvalidHelloReply { reason: String },
    #[error(
        "cannot decode dispatch's {what} reply: {source}; is dispatch running the same protocol version?"
    )]
    Decode {
        what: &'static str,
        #[source]
        source: prost::DecodeError,
    },
}

impl WorkerError {
    pub(crate) fn refused(verb: &'static str, error: &messages::v1::Error) -> Self {
        let hint = match error.error_code() {
            Some(messages::ErrorCode::UnknownWorker) => {
                "; register it with `palisade worker add` and use the id it prints"
            }
            Some(messages::ErrorCode::WorkerDisabled) => {
                "; enable the worker or give it a new registration"
            }
            Some(messages::ErrorCode::UnsupportedSchemaVersion) => {
                "; upgrade the worker or dispatch so they share a protocol version"
            }
            _ => "",
        };
        Self::Refused {
            verb,
            code: error.code.clone(),
            message: error.message.clone(),
            hint,
        }
    }
}
