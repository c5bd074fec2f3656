//! The NATS servers tests run against: the shared one or one of the test's own with accounts
//! and credentials ([`TestNats`], [`OwnNats`]).

use super::*;

/// The NATS a test system runs on: by default a server of its own that authenticates every
/// connection and enforces each credential's permissions, so every system test runs with
/// credentials on; `NATS_URL` (or a test's own settings) points it at an open server instead.
pub struct TestNats {
    pub(crate) url: String,
    pub(crate) subjects: Subjects,
    /// `None` for an open server.
    pub authority: Option<Arc<identity::Authority>>,
    pub(crate) server: Option<servers::NatsServer>,
    /// Credential files written for child processes.
    pub(crate) files: tempfile::TempDir,
    /// The worker and client accounts pushed so far.
    pub(crate) pushed: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl TestNats {
    /// The server's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Credentials for `identity`; none on an open server. A worker's or client's own account
    /// is pushed to the server the first time (as `worker add` and `client add` do).
    pub async fn credentials(&self, identity: &messages::Identity) -> bus::NatsCredentials {
        match &self.authority {
            Some(authority) => {
                self.ensure_account(identity).await;
                bus::NatsCredentials::from_creds(
                    authority.issue(&self.subjects, identity).file.as_str(),
                )
            }
            None => bus::NatsCredentials::none(),
        }
    }

    /// Pushes the account of `identity` (a worker or a client) unless this system already did:
    /// a later push would replace whatever revocations a test pushed for it since.
    pub async fn ensure_account(&self, identity: &messages::Identity) {
        let Some(authority) = &self.authority else {
            return;
        };
        let account = authority.account_of(identity);
        if account == authority.account_public_key()
            || !self.pushed.lock().expect("not poisoned").insert(account)
        {
            return;
        }
        push_account(authority, &self.subjects, &self.url, identity).await;
    }

    /// Panics unless the server authenticates: a test of confinement means nothing on an open
    /// server.
    pub fn assert_secured(&self) {
        assert!(
            self.authority.is_some(),
            "this test needs a server that authenticates: unset NATS_URL so the test system runs its own"
        );
    }

    /// Credentials allowed everything: the test's own connection, which plays every part.
    pub(crate) fn unrestricted(&self) -> bus::NatsCredentials {
        match &self.authority {
            Some(authority) => unrestricted_credentials(authority),
            None => bus::NatsCredentials::none(),
        }
    }

    /// A connection as `identity` with its own credentials.
    pub async fn connect(&self, identity: &messages::Identity) -> Bus {
        let credentials = self.credentials(identity).await;
        let tls = bus::NatsTls::default();
        connect_patiently(|| {
            Bus::connect(
                &self.url,
                &credentials,
                &tls,
                self.subjects.clone(),
                identity,
            )
        })
        .await
        .unwrap_or_else(|error| panic!("{identity:?} cannot connect: {error}"))
    }

    /// `NATS_URL` and, on a server that authenticates, `NATS_CREDS` (a file of `identity`'s
    /// credentials, its account pushed) for a child process.
    pub async fn child_env(&self, identity: &messages::Identity) -> Vec<(&'static str, String)> {
        let mut env = vec![("NATS_URL", self.url.clone())];
        if let Some(authority) = &self.authority {
            self.ensure_account(identity).await;
            let path = write_credentials(authority, &self.subjects, identity, self.files.path());
            env.push(("NATS_CREDS", path.display().to_string()));
        }
        env
    }

    /// The secured server's log (empty for an open server).
    pub fn server_log(&self) -> String {
        self.server
            .as_ref()
            .map(servers::NatsServer::log)
            .unwrap_or_default()
    }

    /// Signs and pushes what PostgreSQL records of `holder`'s account (its refused
    /// credentials), as `palisade worker revoke`, `client revoke` and the rest do.
    pub async fn push_recorded(&self, pool: &PgPool, holder: &store::bus_identities::Holder) {
        let authority = self
            .authority
            .as_ref()
            .expect("a server that authenticates");
        palisade::accounts::push(
            authority,
            &self.subjects,
            &self.url,
            &bus::NatsTls::default(),
            pool,
            Some(holder),
        )
        .await
        .expect("account pushed");
    }
}

/// Pushes the account of `identity` (a worker or a client), with nothing revoked, to the
/// server at `url`.
pub async fn push_account(
    authority: &identity::Authority,
    subjects: &Subjects,
    url: &str,
    identity: &messages::Identity,
) {
    let account = authority
        .identity_account(subjects, identity, &[])
        .expect("a worker or a client has an account of its own");
    authority
        .push(url, &bus::NatsTls::default(), &[account])
        .await
        .unwrap_or_else(|error| panic!("the account of {identity:?} was not pushed: {error}"));
}

/// Credentials allowed everything, for a test's (or the chaos suite's) own connection, which
/// plays every part.
/// A NATS of a test's own (a cluster, a server it stops) that authenticates like the one
/// [`TestSystem::spawn`] starts: the test takes an [`OwnNats::installation`], starts its
/// servers for it ([`servers::NatsServer::start_secured`],
/// [`servers::NatsCluster::start_secured`]) and hands them to [`TestSystem::spawn_on`].
pub struct OwnNats {
    /// One server, or a cluster's comma-separated list.
    pub url: String,
    pub authority: Arc<identity::Authority>,
    pub subjects: Subjects,
}

impl OwnNats {
    /// A fresh authority and subject prefix, for the servers to start with.
    pub fn installation() -> (Arc<identity::Authority>, Subjects) {
        let id = Uuid::new_v4().simple().to_string();
        (
            Arc::new(identity::Authority::generate()),
            Subjects::new(&format!("t{}", &id[..12])).expect("valid prefix"),
        )
    }
}

pub fn unrestricted_credentials(authority: &identity::Authority) -> bus::NatsCredentials {
    let everything = messages::Permissions {
        publish: vec![">".into()],
        subscribe: vec![">".into()],
        responses: true,
    };
    bus::NatsCredentials::from_creds(authority.issue_with("test", &everything).file.as_str())
}

/// Writes a `.creds` file of `identity`'s own credentials into `dir`, for a child process's
/// `NATS_CREDS`.
pub fn write_credentials(
    authority: &identity::Authority,
    subjects: &Subjects,
    identity: &messages::Identity,
    dir: &std::path::Path,
) -> std::path::PathBuf {
    let path = dir.join(format!("{}-{}.creds", identity.token(), Uuid::new_v4()));
    identity::write_secret(&path, &authority.issue(subjects, identity).file)
        .expect("credentials written");
    path
}
