//! TLS to NATS: which certificate authority a process trusts for the server, the client
//! certificate it presents to servers that verify them, and whether TLS is required.

use std::path::{Path, PathBuf};

/// A TLS setting that is malformed: which one, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {setting}: {reason}")]
pub struct TlsSettingError {
    pub setting: &'static str,
    pub reason: String,
}

/// `NATS_TLS_CA`, `NATS_TLS_CERT`, `NATS_TLS_KEY`, `NATS_TLS_REQUIRED`. A `tls://` URL in
/// `NATS_URL` requires TLS too; the default (nothing set) trusts the platform's roots for
/// a server that offers TLS and connects in clear to one that does not.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NatsTls {
    /// PEM file of the certificate authorities that may sign the server's certificate,
    /// instead of the platform's roots.
    pub ca: Option<PathBuf>,
    /// PEM client certificate and its key, for servers that verify clients (`verify: true`).
    pub client: Option<ClientCertificate>,
    /// Refuse a server that does not offer TLS.
    pub required: bool,
}

/// A client certificate and its private key, both PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCertificate {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl NatsTls {
    /// Reads the four settings through `var` (the environment, in a process).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, TlsSettingError> {
        let path = |name: &'static str| -> Result<Option<PathBuf>, TlsSettingError> {
            let Some(value) = var(name).filter(|value| !value.is_empty()) else {
                return Ok(None);
            };
            let path = PathBuf::from(&value);
            readable(name, &path)?;
            Ok(Some(path))
        };
        let ca = path("NATS_TLS_CA")?;
        let client = match (path("NATS_TLS_CERT")?, path("NATS_TLS_KEY")?) {
            (Some(cert), Some(key)) => Some(ClientCertificate { cert, key }),
            (None, None) => None,
            (Some(_), None) | (None, Some(_)) => {
                return Err(TlsSettingError {
                    setting: "NATS_TLS_CERT",
                    reason: "NATS_TLS_CERT and NATS_TLS_KEY go together: set both (a client \
                             certificate and its key) or neither"
                        .into(),
                });
            }
        };
        let required = match var("NATS_TLS_REQUIRED").as_deref() {
            None | Some("" | "false" | "0" | "off") => false,
            Some("true" | "1" | "on") => true,
            Some(other) => {
                return Err(TlsSettingError {
                    setting: "NATS_TLS_REQUIRED",
                    reason: format!("{other:?} is not a boolean: use true or false"),
                });
            }
        };
        Ok(Self {
            ca,
            client,
            required,
        })
    }

    /// From the process's environment.
    pub fn from_env() -> Result<Self, TlsSettingError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// Whether anything asks for TLS (a CA, a client certificate, or required).
    pub fn is_configured(&self) -> bool {
        self.ca.is_some() || self.client.is_some() || self.required
    }

    /// `options` with these settings; `url` is the server list (a `tls://` entry requires TLS).
    pub fn apply(
        &self,
        url: &str,
        options: async_nats::ConnectOptions,
    ) -> async_nats::ConnectOptions {
        let mut options = options;
        if let Some(ca) = &self.ca {
            options = options.add_root_certificates(ca.clone());
        }
        if let Some(client) = &self.client {
            options = options.add_client_certificate(client.cert.clone(), client.key.clone());
        }
        let tls_url = url
            .split(',')
            .any(|entry| entry.trim().to_ascii_lowercase().starts_with("tls://"));
        options.require_tls(self.required || tls_url)
    }
}

fn readable(setting: &'static str, path: &Path) -> Result<(), TlsSettingError> {
    std::fs::File::open(path)
        .map(drop)
        .map_err(|error| TlsSettingError {
            setting,
            reason: format!("cannot read {}: {error}", path.display()),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(set: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            set.iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| (*value).to_owned())
        }
    }

    #[test]
    fn nothing_set_is_no_tls() {
        let tls = NatsTls::from_vars(vars(&[])).unwrap();
        assert_eq!(tls, NatsTls::default());
        assert!(!tls.is_configured());
    }

    #[test]
    fn a_certificate_needs_its_key_and_files_must_exist() {
        let file = std::env::current_exe().unwrap();
        let file = file.to_str().unwrap();
        let error = NatsTls::from_vars(vars(&[("NATS_TLS_CERT", file)])).unwrap_err();
        assert!(error.to_string().contains("NATS_TLS_KEY"), "{error}");
        let error = NatsTls::from_vars(vars(&[("NATS_TLS_CA", "/no/such/ca.pem")])).unwrap_err();
        assert!(error.to_string().contains("NATS_TLS_CA"), "{error}");
        let error = NatsTls::from_vars(vars(&[("NATS_TLS_REQUIRED", "yes please")])).unwrap_err();
        assert!(error.to_string().contains("true or false"), "{error}");
        let tls = NatsTls::from_vars(vars(&[
            ("NATS_TLS_CA", file),
            ("NATS_TLS_CERT", file),
            ("NATS_TLS_KEY", file),
            ("NATS_TLS_REQUIRED", "true"),
        ]))
        .unwrap();
        assert!(tls.required && tls.client.is_some() && tls.ca.is_some());
    }
}
