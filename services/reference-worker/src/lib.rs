//! palisade's reference worker: the plugins it ships ([`plugins`]) and the process around
//! them ([`Settings`], [`run`]), so `main.rs` only wires signals and logging.
//!
//! Every plugin works offline. `tcp_connect` discovers `http_service` assets that
//! `http_headers` then checks: a profile `[tcp_connect, http_headers]` is the asset-discovery
//! pipeline. `dependency_audit` reads lockfiles on the worker's disk and matches them against a
//! local OSV advisory database (`PALISADE_OSV_DIR`); its findings carry CVE ids for enrichment.
//!
//! Every plugin declares its rules ([`worker::Plugin::rules`]) and reports an evaluation of
//! each rule on each resource it checks ([`coverage`]), so a scan's coverage shows what was
//! checked, found or not.

pub mod coverage;
pub mod dependency_audit;
pub mod http_headers;
pub mod sbom;
pub mod secrets;
pub mod synthetic;
pub mod target;
pub mod tcp_connect;
pub mod tls_certificate;

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use messages::Subjects;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Every plugin this worker runs, with the default [`PluginSettings`] (no advisory database,
/// so `dependency_audit` fails its tasks); their names are its capabilities.
pub fn plugins() -> Vec<Arc<dyn worker::Plugin>> {
    configured_plugins(&PluginSettings::default())
}

/// Every plugin this worker runs, configured by `settings`; their names are its capabilities.
pub fn configured_plugins(settings: &PluginSettings) -> Vec<Arc<dyn worker::Plugin>> {
    vec![
        Arc::new(synthetic::Synthetic),
        Arc::new(tcp_connect::TcpConnect),
        Arc::new(http_headers::HttpHeaders),
        Arc::new(secrets::Secrets),
        Arc::new(dependency_audit::DependencyAudit::new(
            settings.osv_dir.clone(),
        )),
        Arc::new(tls_certificate::TlsCertificate::new(
            settings.tls_trust.clone(),
        )),
        Arc::new(sbom::Sbom),
    ]
}

/// What plugins take from the worker's settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PluginSettings {
    /// `PALISADE_OSV_DIR`: a directory of OSV JSON advisories (one per file, in any
    /// subdirectories) that `dependency_audit` matches lockfiles against; unset, that plugin
    /// fails its tasks.
    pub osv_dir: Option<PathBuf>,
    /// `PALISADE_TLS_TRUST`: a PEM file of authorities `tls_certificate` trusts besides the
    /// web's roots (an organization's internal CA); its certificates, read once.
    pub tls_trust: Vec<rustls::pki_types::CertificateDer<'static>>,
}

impl PluginSettings {
    /// From the process's environment (`PALISADE_OSV_DIR`).
    pub fn from_env() -> Result<Self, SettingsError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the plugins' settings through `lookup`.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, SettingsError> {
        let osv_dir = match lookup("PALISADE_OSV_DIR").filter(|value| !value.trim().is_empty()) {
            None => None,
            Some(value) => {
                let path = PathBuf::from(value.trim());
                if !(path.is_absolute() && path.is_dir()) {
                    return Err(SettingsError::InvalidOsvDir { value });
                }
                Some(path)
            }
        };
        let tls_trust = match lookup("PALISADE_TLS_TRUST").filter(|value| !value.trim().is_empty())
        {
            None => Vec::new(),
            Some(value) => {
                use rustls::pki_types::pem::PemObject as _;
                let certificates: Result<Vec<_>, _> =
                    rustls::pki_types::CertificateDer::pem_file_iter(value.trim())
                        .and_then(|certificates| certificates.collect());
                match certificates {
                    Ok(certificates) if !certificates.is_empty() => certificates,
                    Ok(_) => {
                        return Err(SettingsError::InvalidTlsTrust {
                            value,
                            reason: "it holds no certificate".into(),
                        });
                    }
                    Err(error) => {
                        return Err(SettingsError::InvalidTlsTrust {
                            value,
                            reason: error.to_string(),
                        });
                    }
                }
            }
        };
        Ok(Self { osv_dir, tls_trust })
    }
}

/// The worker's settings, all from environment variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `NATS_URL`, default [`Settings::NATS_URL_DEFAULT`].
    pub nats_url: String,
    /// `NATS_CREDS`: the `.creds` file `palisade worker add` wrote for this worker; unset when
    /// it enrolls with a token, or against a server without authentication.
    pub nats_credentials: Option<std::path::PathBuf>,
    /// `PALISADE_ENROLLMENT_TOKEN`, or the contents of the file `PALISADE_ENROLLMENT_TOKEN_FILE`
    /// names: the one-time token `palisade worker token create` printed. Used once; the
    /// credentials it gives are kept in `state_dir`.
    pub enrollment_token: Option<String>,
    /// `PALISADE_WORKER_STATE_DIR`: where an enrolled worker keeps its key, its credentials and
    /// its id (default `$XDG_STATE_HOME/palisade-worker`, else `~/.local/state/palisade-worker`,
    /// else `./palisade-worker`).
    pub state_dir: PathBuf,
    /// `NATS_TLS_CA`, `NATS_TLS_CERT`, `NATS_TLS_KEY`, `NATS_TLS_REQUIRED` ([`bus::NatsTls`]).
    pub nats_tls: bus::NatsTls,
    /// `PALISADE_SUBJECT_PREFIX`, default `palisade`.
    pub subjects: Subjects,
    /// `PALISADE_WORKER_ID`: the id `palisade worker add` printed; an enrolled worker's id
    /// comes from its token.
    pub worker_id: Option<Uuid>,
    /// `PALISADE_WORKER_CAPACITY`, default [`Settings::CAPACITY_DEFAULT`].
    pub capacity: u32,
    /// `PALISADE_WORKER_LEASE_NEXT`, default `true`: [`worker::WorkerConfig::lease_next`].
    pub lease_next: bool,
    /// `PALISADE_OSV_DIR`, `PALISADE_TLS_TRUST` ([`PluginSettings`]).
    pub plugins: PluginSettings,
}

/// A setting that is missing or malformed.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error(
        "PALISADE_WORKER_ID is not set: enroll the worker with a token (`palisade worker token create`, then PALISADE_ENROLLMENT_TOKEN), or register it with `palisade worker add` and set the id it prints"
    )]
    MissingWorkerId,
    #[error("PALISADE_ENROLLMENT_TOKEN_FILE {path:?} cannot be read: {reason}")]
    TokenFile { path: String, reason: String },

    #[error("PALISADE_WORKER_ID {value:?} is not a UUID")]
    InvalidWorkerId { value: String },
    #[error("PALISADE_WORKER_CAPACITY {value:?} is not a number in 1..={max}")]
    InvalidCapacity { value: String, max: u32 },
    #[error("PALISADE_WORKER_LEASE_NEXT {value:?} is neither true nor false")]
    InvalidLeaseNext { value: String },
    #[error(
        "PALISADE_OSV_DIR {value:?} is not an absolute path to a directory: point it at a directory of OSV JSON advisories, or unset it"
    )]
    InvalidOsvDir { value: String },
    #[error(
        "PALISADE_TLS_TRUST {value:?} is not a PEM file of certificates ({reason}): point it at the authorities tls_certificate should trust, or unset it"
    )]
    InvalidTlsTrust { value: String, reason: String },
    #[error("PALISADE_SUBJECT_PREFIX: {0}")]
    InvalidPrefix(#[from] messages::subjects::InvalidPrefix),
    #[error(transparent)]
    Tls(#[from] bus::TlsSettingError),
}

impl Settings {
    pub const NATS_URL_DEFAULT: &str = "nats://127.0.0.1:4222";
    pub const CAPACITY_DEFAULT: u32 = 4;

    pub fn from_env() -> Result<Self, SettingsError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads settings through `lookup` (the environment, or a map in tests).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, SettingsError> {
        let set = |name: &str| lookup(name).filter(|value| !value.trim().is_empty());
        let nats_url = set("NATS_URL").unwrap_or_else(|| Self::NATS_URL_DEFAULT.to_owned());
        let prefix = set("PALISADE_SUBJECT_PREFIX");
        let subjects = Subjects::new(prefix.as_deref().unwrap_or(Subjects::DEFAULT_PREFIX))?;
        let worker_id = match set("PALISADE_WORKER_ID") {
            None => None,
            Some(value) => Some(
                Uuid::parse_str(value.trim())
                    .ok()
                    .filter(|id| !id.is_nil())
                    .ok_or(SettingsError::InvalidWorkerId { value })?,
            ),
        };
        let enrollment_token = enrollment_token(&set)?;
        let state_dir = state_dir(&set);
        let state_present = state_dir.join("worker.json").exists();
        if worker_id.is_none() && enrollment_token.is_none() && !state_present {
            return Err(SettingsError::MissingWorkerId);
        }
        let capacity = match set("PALISADE_WORKER_CAPACITY") {
            None => Self::CAPACITY_DEFAULT,
            Some(value) => value
                .trim()
                .parse()
                .ok()
                .filter(|capacity| (1..=messages::limits::WORKER_CAPACITY_MAX).contains(capacity))
                .ok_or(SettingsError::InvalidCapacity {
                    value,
                    max: messages::limits::WORKER_CAPACITY_MAX,
                })?,
        };
        let lease_next = match set("PALISADE_WORKER_LEASE_NEXT") {
            None => true,
            Some(value) => match value.trim() {
                "true" => true,
                "false" => false,
                _ => return Err(SettingsError::InvalidLeaseNext { value }),
            },
        };
        let plugins = PluginSettings::from_lookup(&lookup)?;
        Ok(Self {
            nats_url,
            nats_credentials: set("NATS_CREDS").map(std::path::PathBuf::from),
            enrollment_token,
            state_dir,
            nats_tls: bus::NatsTls::from_vars(&lookup)?,
            subjects,
            worker_id,
            capacity,
            lease_next,
            plugins,
        })
    }
}

/// `PALISADE_ENROLLMENT_TOKEN`, else the contents of `PALISADE_ENROLLMENT_TOKEN_FILE`.
fn enrollment_token(
    set: &impl Fn(&str) -> Option<String>,
) -> Result<Option<String>, SettingsError> {
    Ok(
        match (
            set("PALISADE_ENROLLMENT_TOKEN"),
            set("PALISADE_ENROLLMENT_TOKEN_FILE"),
        ) {
            (Some(token), _) => Some(token.trim().to_owned()),
            (None, Some(path)) => Some(
                std::fs::read_to_string(path.trim())
                    .map_err(|error| SettingsError::TokenFile {
                        path,
                        reason: error.to_string(),
                    })?
                    .trim()
                    .to_owned(),
            ),
            (None, None) => None,
        },
    )
}

/// `PALISADE_WORKER_STATE_DIR`, else `$XDG_STATE_HOME/palisade-worker`, else
/// `~/.local/state/palisade-worker`, else `./palisade-worker`.
fn state_dir(set: &impl Fn(&str) -> Option<String>) -> PathBuf {
    match set("PALISADE_WORKER_STATE_DIR") {
        Some(dir) => PathBuf::from(dir.trim()),
        None => set("XDG_STATE_HOME")
            .map(PathBuf::from)
            .or_else(|| set("HOME").map(|home| PathBuf::from(home).join(".local/state")))
            .unwrap_or_else(|| PathBuf::from("."))
            .join("palisade-worker"),
    }
}

/// Connects to NATS and runs the worker with every plugin until `shutdown`, then releases
/// the leases still running.
pub async fn run(settings: Settings, shutdown: CancellationToken) -> anyhow::Result<()> {
    let (worker_id, credentials, enrolled) = credentials(&settings).await?;
    let bus = bus::Bus::connect(
        &settings.nats_url,
        &credentials,
        &settings.nats_tls,
        settings.subjects.clone(),
        &messages::Identity::Worker { worker_id },
    )
    .await
    .context("failed to connect to NATS")?;
    let plugins = allowed_plugins(
        configured_plugins(&settings.plugins),
        enrolled
            .as_ref()
            .map(|enrolled| &enrolled.state.capabilities[..]),
    )?;
    let renewing = enrolled.map(|enrolled| {
        tokio::spawn(worker::enrollment::keep_renewed(
            bus.clone(),
            enrolled,
            shutdown.child_token(),
        ))
    });
    let mut config = worker::WorkerConfig::new(worker_id, settings.capacity);
    config.software_version = format!("palisade-worker/{}", env!("CARGO_PKG_VERSION"));
    config.lease_next = settings.lease_next;
    let worker =
        worker::Worker::new(bus, config, plugins).context("failed to set up the worker")?;
    let result = worker.run(shutdown.clone()).await.context("worker stopped");
    shutdown.cancel();
    if let Some(renewing) = renewing {
        let _ = renewing.await;
    }
    result
}

/// The plugins an enrolled worker runs: those among the capabilities its token granted (its
/// hellos may declare no others). Every plugin for a worker registered otherwise.
fn allowed_plugins(
    plugins: Vec<Arc<dyn worker::Plugin>>,
    granted: Option<&[String]>,
) -> anyhow::Result<Vec<Arc<dyn worker::Plugin>>> {
    let Some(granted) = granted else {
        return Ok(plugins);
    };
    let (kept, left): (Vec<_>, Vec<_>) = plugins
        .into_iter()
        .partition(|plugin| granted.iter().any(|name| name == plugin.name()));
    anyhow::ensure!(
        !kept.is_empty(),
        "the enrollment granted none of this worker's plugins (it granted {}): issue a token with --capabilities naming some of {}",
        granted.join(","),
        left.iter()
            .map(|plugin| plugin.name())
            .collect::<Vec<_>>()
            .join(",")
    );
    if !left.is_empty() {
        tracing::info!(
            not_granted = %left.iter().map(|plugin| plugin.name()).collect::<Vec<_>>().join(","),
            "plugins this worker will not run: its enrollment token did not grant them"
        );
    }
    Ok(kept)
}

/// The worker's id and credentials: those it enrolled with earlier (its state directory),
/// else a new enrollment with its token, else `NATS_CREDS` and `PALISADE_WORKER_ID`. With the
/// enrollment, to keep renewed.
async fn credentials(
    settings: &Settings,
) -> anyhow::Result<(
    Uuid,
    bus::NatsCredentials,
    Option<worker::enrollment::Enrolled>,
)> {
    let token = settings
        .enrollment_token
        .as_deref()
        .map(identity::enrollment::EnrollmentToken::decode)
        .transpose()
        .context("PALISADE_ENROLLMENT_TOKEN")?;
    let stored = worker::enrollment::Enrolled::load(&settings.state_dir)?;
    // Enrolled before with this token (or with no token given now): what it kept.
    let reuse = stored.as_ref().is_some_and(|stored| {
        token
            .as_ref()
            .is_none_or(|token| token.token_id == stored.state.token_id)
    });
    let enrolled = match (stored, token) {
        (Some(stored), _) if reuse => {
            anyhow::ensure!(
                !stored.expired(),
                "the credentials in {} expired (at unix ms {}): enroll again with a new token (`palisade worker token create --worker {}`)",
                settings.state_dir.display(),
                stored.state.expires_at_unix_ms,
                stored.state.worker_id
            );
            stored
        }
        (_, Some(token)) => {
            if let Some(id) = settings.worker_id {
                anyhow::ensure!(
                    id == token.worker_id,
                    "PALISADE_WORKER_ID {id} is not the token's worker {}: unset it",
                    token.worker_id
                );
            }
            let address = worker::enrollment::BusAddress {
                url: &settings.nats_url,
                tls: &settings.nats_tls,
                subjects: &settings.subjects,
            };
            worker::enrollment::enroll(&address, &token, &settings.state_dir)
                .await
                .context("failed to enroll")?
        }
        (_, None) => {
            let worker_id = settings.worker_id.ok_or(SettingsError::MissingWorkerId)?;
            let credentials = match &settings.nats_credentials {
                Some(path) => bus::NatsCredentials::from_file(path)?,
                None => {
                    tracing::warn!(
                        "NATS_CREDS is not set: connecting without credentials, which only a server without authentication accepts"
                    );
                    bus::NatsCredentials::none()
                }
            };
            return Ok((worker_id, credentials, None));
        }
    };
    Ok((
        enrolled.state.worker_id,
        enrolled.credentials.clone(),
        Some(enrolled),
    ))
}

/// Cancels `shutdown` on SIGINT or SIGTERM.
pub fn cancel_on_signal(shutdown: CancellationToken) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).context("failed to listen for SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("failed to listen for SIGINT")?;
    tokio::spawn(async move {
        tokio::select! {
            _ = terminate.recv() => tracing::info!("SIGTERM received, releasing leases"),
            _ = interrupt.recv() => tracing::info!("SIGINT received, releasing leases"),
        }
        shutdown.cancel();
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn settings(vars: &[(&str, &str)]) -> Result<Settings, SettingsError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect();
        Settings::from_lookup(|name| vars.get(name).cloned())
    }

    const ID: &str = "0193c3c4-0000-7000-8000-000000000001";

    #[test]
    fn defaults_everything_but_the_worker_id() {
        let settings = settings(&[("PALISADE_WORKER_ID", ID), ("HOME", "/home/w")]).unwrap();
        assert_eq!(settings.nats_url, Settings::NATS_URL_DEFAULT);
        assert_eq!(settings.subjects.prefix(), "palisade");
        assert_eq!(settings.worker_id.unwrap().to_string(), ID);
        assert_eq!(
            settings.state_dir,
            PathBuf::from("/home/w/.local/state/palisade-worker")
        );
        assert_eq!(settings.capacity, 4);
        assert_eq!(settings.plugins, PluginSettings::default());
    }

    #[test]
    fn reads_the_advisory_database_directory() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().display().to_string();
        let configured = settings(&[("PALISADE_WORKER_ID", ID), ("PALISADE_OSV_DIR", &path)]);
        assert_eq!(
            configured.unwrap().plugins.osv_dir.as_deref(),
            Some(directory.path())
        );
        let file = directory.path().join("advisory.json");
        std::fs::write(&file, "{}").unwrap();
        for bad in [
            "relative/osv",
            "/does/not/exist",
            &file.display().to_string(),
        ] {
            let error = settings(&[("PALISADE_WORKER_ID", ID), ("PALISADE_OSV_DIR", bad)])
                .unwrap_err()
                .to_string();
            assert!(error.starts_with("PALISADE_OSV_DIR"), "{error}");
        }
    }

    #[test]
    fn refuses_bad_settings_with_advice() {
        let missing = settings(&[("HOME", "/nowhere")]).unwrap_err().to_string();
        assert!(
            missing.contains("palisade worker token create"),
            "{missing}"
        );
        assert!(settings(&[("PALISADE_WORKER_ID", "w1")]).is_err());
        let nil = "00000000-0000-0000-0000-000000000000";
        assert!(settings(&[("PALISADE_WORKER_ID", nil)]).is_err());
        for capacity in ["0", "1025", "four"] {
            let result = settings(&[
                ("PALISADE_WORKER_ID", ID),
                ("PALISADE_WORKER_CAPACITY", capacity),
            ]);
            assert!(result.is_err(), "{capacity}");
        }
        let result = settings(&[
            ("PALISADE_WORKER_ID", ID),
            ("PALISADE_SUBJECT_PREFIX", "a.b"),
        ]);
        assert!(result.is_err());
    }

    /// What a hello accepts of a declaration (reference 6.3, step 7a), for every plugin.
    #[test]
    fn every_plugin_declares_rules_a_hello_accepts() {
        for plugin in plugins() {
            let rules = plugin.rules();
            assert!(!rules.is_empty(), "{} declares no rules", plugin.name());
            let ids: std::collections::HashSet<_> = rules.iter().map(|rule| rule.id).collect();
            assert_eq!(
                ids.len(),
                rules.len(),
                "{} declares a rule twice",
                plugin.name()
            );
            for rule in rules {
                assert!((1..=128).contains(&rule.id.len()), "{rule:?}");
                assert!((1..=16).contains(&rule.applies_to.len()), "{rule:?}");
                assert!(
                    rule.applies_to
                        .iter()
                        .all(|kind| (1..=64).contains(&kind.len())),
                    "{rule:?}"
                );
            }
        }
    }

    #[test]
    fn plugin_names_are_unique() {
        let names: std::collections::HashSet<_> =
            plugins().iter().map(|plugin| plugin.name()).collect();
        assert_eq!(names.len(), plugins().len());
        assert!(names.contains("synthetic") && names.contains("secrets"));
        assert!(names.contains("dependency_audit"));
    }
}
