//! Reading settings from environment variables, with errors that name the variable.

use std::str::FromStr;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum SettingsError {
    #[error("{name}={value:?} is invalid: {reason}")]
    Invalid {
        name: &'static str,
        value: String,
        reason: String,
    },
    #[error("{name} is required: {hint}")]
    Missing {
        name: &'static str,
        hint: &'static str,
    },
}

/// The variable's value, or `default` when unset or empty.
pub fn string(name: &'static str, default: &str) -> String {
    optional_string(name).unwrap_or_else(|| default.to_owned())
}

/// The variable's value, or `None` when unset or empty.
pub fn optional_string(name: &'static str) -> Option<String> {
    std::env::var(name)
        .ok()
        .filter(|value| !value.trim().is_empty())
}

/// The variable parsed as `T`, or `default` when unset or empty.
pub fn parse<T>(name: &'static str, default: T) -> Result<T, SettingsError>
where
    T: FromStr,
    T::Err: std::fmt::Display,
{
    match std::env::var(name) {
        Ok(value) if !value.trim().is_empty() => {
            value
                .trim()
                .parse()
                .map_err(|error: T::Err| SettingsError::Invalid {
                    name,
                    value,
                    reason: error.to_string(),
                })
        }
        _ => Ok(default),
    }
}

/// The variable parsed as `T`, or `default` when unset or empty; an error naming it and the
/// range when the value is outside `range`.
pub fn parse_in<T>(
    name: &'static str,
    default: T,
    range: std::ops::RangeInclusive<T>,
) -> Result<T, SettingsError>
where
    T: FromStr + PartialOrd + std::fmt::Display,
    T::Err: std::fmt::Display,
{
    let value = parse(name, default)?;
    if range.contains(&value) {
        Ok(value)
    } else {
        Err(SettingsError::Invalid {
            name,
            value: value.to_string(),
            reason: format!("must be {}..={}", range.start(), range.end()),
        })
    }
}

/// The variable parsed as `T`; an error naming it when unset.
pub fn required<T>(name: &'static str, hint: &'static str) -> Result<T, SettingsError>
where
    T: FromStr,
    T::Err: std::fmt::Display,
{
    match std::env::var(name) {
        Ok(value) if !value.trim().is_empty() => {
            value
                .trim()
                .parse()
                .map_err(|error: T::Err| SettingsError::Invalid {
                    name,
                    value,
                    reason: error.to_string(),
                })
        }
        _ => Err(SettingsError::Missing { name, hint }),
    }
}

/// A durable consumer's tuning, read from four variables named by the service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumerTuning {
    /// Messages decided per transaction, 1..=1000.
    pub batch_size: usize,
    /// Redelivery after this long without an acknowledgement.
    pub ack_wait: std::time::Duration,
    /// Deliveries before a message is recorded dead.
    pub max_deliver: i64,
    /// Batches decided at once, 1..=16.
    pub batches_in_flight: usize,
    /// How often the stream's interest retention is checked (not read from the environment:
    /// `bus::ConsumerSpec::RETENTION_CHECK_DEFAULT`; tests shorten it).
    pub retention_check: std::time::Duration,
}

/// The variable names of one consumer's [`ConsumerTuning`].
#[derive(Debug, Clone, Copy)]
pub struct ConsumerVars {
    pub batch_size: &'static str,
    pub ack_wait_ms: &'static str,
    pub max_deliver: &'static str,
    pub batches_in_flight: &'static str,
}

impl ConsumerTuning {
    /// Reads and validates the four variables (defaults from `bus::ConsumerSpec`).
    pub fn from_env(vars: ConsumerVars) -> Result<Self, SettingsError> {
        use bus::ConsumerSpec;
        let batch_size = parse_in(vars.batch_size, ConsumerSpec::BATCH_SIZE_DEFAULT, 1..=1_000)?;
        let max_deliver = parse_in(
            vars.max_deliver,
            ConsumerSpec::MAX_DELIVER_DEFAULT,
            1..=i64::MAX,
        )?;
        let batches_in_flight = parse_in(
            vars.batches_in_flight,
            ConsumerSpec::BATCHES_IN_FLIGHT_DEFAULT,
            1..=16,
        )?;
        Ok(Self {
            batch_size,
            batches_in_flight,
            ack_wait: std::time::Duration::from_millis(parse(
                vars.ack_wait_ms,
                ConsumerSpec::ACK_WAIT_DEFAULT.as_millis() as u64,
            )?),
            max_deliver,
            retention_check: ConsumerSpec::RETENTION_CHECK_DEFAULT,
        })
    }

    /// Applies the tuning to a consumer spec.
    pub fn apply(&self, spec: &mut bus::ConsumerSpec) {
        spec.batch_size = self.batch_size;
        spec.ack_wait = self.ack_wait;
        spec.max_deliver = self.max_deliver;
        spec.batches_in_flight = self.batches_in_flight;
        spec.retention_check = self.retention_check;
    }
}
