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
    match std::env::var(name) {
        Ok(value) if !value.trim().is_empty() => value,
        _ => default.to_owned(),
    }
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
