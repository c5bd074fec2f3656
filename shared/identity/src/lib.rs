//! palisade's identities on the bus, as NATS decentralized authentication (operator mode).
//!
//! One **authority** holds three keys: the operator's, the system account's (the server's own
//! account, used here only to push accounts) and the palisade account's. The services, the
//! operator's command and the streams live in the **palisade account**; every worker and every
//! client gets an **account of its own**, whose key is derived from the palisade account's seed
//! and the identity (nothing new to keep secret, nothing stored), and which imports from the
//! palisade account exactly the subjects of that identity (`messages::access`: exports and
//! imports). So the account is the blast radius of one credential: a requester's answers cross
//! back through the server's response mapping into its own account, whatever reply subject it
//! names, and no worker or client account has JetStream.
//!
//! Each identity connects as a **user** of its account: a user JWT signed by that account,
//! carrying the subject permissions of its role, and never a bearer token: connecting also
//! takes the user's private seed, which only its holder has. The authority's seeds live in
//! files (a Kubernetes secret), never in PostgreSQL; PostgreSQL keeps only public keys.
//!
//! **Revocation** is a list in the account JWT (user public key → time): the authority signs
//! the identity's account again with its revoked keys from PostgreSQL and pushes it to the
//! servers through the system account, and the servers close those users' connections at once
//! and refuse new ones. The list is rebuilt from PostgreSQL on every push, so a push is
//! idempotent and a re-enabled identity leaves the list. Revoking a worker or a client ends
//! its whole account: the list refuses every user (`*`), whoever signed it and whenever, so a
//! leaked account key mints nothing the servers accept; re-enabling refuses every user issued
//! before it, and fresh credentials are issued.
//!
//! **Enrollment** ([`enrollment`]): a worker joins with a one-time token instead of the
//! authority. Each worker's account lists the installation's **enrollment key** as a signing
//! key scoped to that worker's permissions, so dispatch, which holds only that key, can sign
//! users of enrolled workers' accounts and nothing else: no account, no client, no service.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub mod enrollment;

use hmac::{Hmac, KeyInit as _, Mac as _};
use messages::{Crossing, Identity, Permissions, Subjects};
use nats_io_jwt::{
    Account, Claims, Export, ExportType, Exports, Import, Imports, Operator, OperatorLimits,
    Permission, ResponsePermission, ResponseType, RevocationList, RevocationListKey, ScopeType,
    SigningKeys, SigningKeysItem, Token, User, UserPermissionLimits, UserScope,
};
use nkeys::{KeyPair, KeyPairType};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum IdentityError {
    #[error(
        "cannot read the NATS authority in {dir}: {reason}; create one with `palisade nats init --dir {dir}` or set PALISADE_NATS_AUTHORITY to its directory"
    )]
    Read { dir: PathBuf, reason: String },
    #[error("cannot write {path}: {reason}")]
    Write { path: PathBuf, reason: String },
    #[error("{0:?} is not a NATS user public key (it starts with U and is 56 characters)")]
    NotAUserKey(String),
    #[error(
        "the NATS authority in {dir} has no enrollment key ({file}): add one with `palisade nats enrollment-key`, then `palisade nats push`"
    )]
    NoEnrollmentKey { dir: PathBuf, file: &'static str },
    #[error(
        "not an enrollment token: {0}; give the whole token `palisade worker token create` printed"
    )]
    NotAToken(String),
    #[error(
        "cannot push the account {account} to NATS at {url}: {reason}; what PostgreSQL recorded stands, run `palisade nats push` once NATS answers"
    )]
    Push {
        url: String,
        account: String,
        reason: String,
    },
}

/// File names inside an authority directory.
const OPERATOR_SEED: &str = "operator.nk";
const SYSTEM_SEED: &str = "system-account.nk";
const ACCOUNT_SEED: &str = "account.nk";
/// The enrollment key's seed: what dispatch signs enrolled workers' users with
/// (`PALISADE_NATS_ENROLLMENT_KEY`). Authorities written before enrollment have none.
pub const ENROLLMENT_SEED: &str = "enrollment.nk";

/// The palisade account's name in its JWT.
const ACCOUNT_NAME: &str = "palisade";

/// How long a service may take to answer a request it received (`allow_responses`, and the
/// response threshold of the palisade account's exports); dispatch's long-polled acquire is
/// the longest.
const RESPONSE_TTL: Duration = Duration::from_secs(120);

/// Where an identity account's key comes from: HMAC-SHA-256 of this label and the identity's
/// token, keyed with the palisade account's seed.
const DERIVATION_LABEL: &[u8] = b"palisade identity account v1\0";

/// A user's credentials: what `NATS_CREDS` points at, the user JWT and its seed.
#[derive(Clone)]
pub struct Credentials {
    /// The user's public key (`U…`), which PostgreSQL records for revocation.
    pub public_key: String,
    /// The `.creds` file text (JWT and seed), as `nsc` writes it.
    pub file: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("public_key", &self.public_key)
            .finish_non_exhaustive()
    }
}

/// A signed account JWT and the account it describes, ready to push to the servers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedAccount {
    /// The account's public key (`A…`).
    pub public_key: String,
    pub jwt: String,
}

/// The operator, system account and palisade account keys, and the enrollment key.
pub struct Authority {
    operator: KeyPair,
    system: KeyPair,
    account: KeyPair,
    /// Listed in every worker's account as a signing key scoped to that worker's permissions.
    enrollment: Option<KeyPair>,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority")
            .field("operator", &self.operator.public_key())
            .field("account", &self.account.public_key())
            .finish_non_exhaustive()
    }
}

/// A revoked user: its public key and when (unix seconds): every JWT of that key issued at
/// or before it is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revoked {
    pub public_key: String,
    pub at_unix_secs: i64,
}

/// 2100-01-01: later than any JWT palisade issues.
const FOREVER_UNIX_SECS: i64 = 4_102_444_800;

impl Revoked {
    /// Every JWT of `public_key`, whenever issued: palisade never issues a key twice, so a
    /// revoked key stays revoked until it leaves the list.
    pub fn key(public_key: impl Into<String>) -> Self {
        Self {
            public_key: public_key.into(),
            at_unix_secs: FOREVER_UNIX_SECS,
        }
    }

    /// Every user of the account, whoever signed it and whenever: a revoked identity's
    /// account refuses even a user minted later with its key.
    pub fn every_user() -> Self {
        Self::every_user_issued_by(FOREVER_UNIX_SECS)
    }

    /// Every user of the account issued at or before `at_unix_secs` (a re-enabled identity:
    /// only credentials issued after it are accepted).
    pub fn every_user_issued_by(at_unix_secs: i64) -> Self {
        Self {
            // The server's wildcard entry of an account's revocation list.
            public_key: "*".to_owned(),
            at_unix_secs,
        }
    }
}

impl Authority {
    /// Fresh keys.
    pub fn generate() -> Self {
        Self {
            operator: KeyPair::new_operator(),
            system: KeyPair::new_account(),
            account: KeyPair::new_account(),
            enrollment: Some(KeyPair::new_account()),
        }
    }

    /// Reads the keys [`Authority::write`] wrote.
    pub fn read(dir: &Path) -> Result<Self, IdentityError> {
        let seed = |name: &str| -> Result<KeyPair, IdentityError> {
            let path = dir.join(name);
            let text = std::fs::read_to_string(&path).map_err(|error| IdentityError::Read {
                dir: dir.to_owned(),
                reason: format!("{}: {error}", path.display()),
            })?;
            KeyPair::from_seed(text.trim()).map_err(|error| IdentityError::Read {
                dir: dir.to_owned(),
                reason: format!("{}: {error}", path.display()),
            })
        };
        let enrollment = if dir.join(ENROLLMENT_SEED).exists() {
            Some(seed(ENROLLMENT_SEED)?)
        } else {
            None
        };
        Ok(Self {
            operator: seed(OPERATOR_SEED)?,
            system: seed(SYSTEM_SEED)?,
            account: seed(ACCOUNT_SEED)?,
            enrollment,
        })
    }

    /// Adds an enrollment key to an authority written before enrollment existed, and writes
    /// it into `dir`; false when it had one.
    pub fn add_enrollment_key(&mut self, dir: &Path) -> Result<bool, IdentityError> {
        if self.enrollment.is_some() {
            return Ok(false);
        }
        let key = KeyPair::new_account();
        write_secret(&dir.join(ENROLLMENT_SEED), &seed_of(&key))?;
        self.enrollment = Some(key);
        Ok(true)
    }

    /// What dispatch signs enrolled workers' users with, when this authority has it.
    pub fn enroller(&self) -> Option<enrollment::Enroller> {
        self.enrollment
            .as_ref()
            .map(|key| enrollment::Enroller::from_seed(&seed_of(key)).expect("a key's own seed"))
    }

    /// Writes the seeds (mode 0600) into `dir`, which is created.
    pub fn write(&self, dir: &Path) -> Result<(), IdentityError> {
        std::fs::create_dir_all(dir).map_err(|error| IdentityError::Write {
            path: dir.to_owned(),
            reason: error.to_string(),
        })?;
        for (name, key) in [
            (OPERATOR_SEED, Some(&self.operator)),
            (SYSTEM_SEED, Some(&self.system)),
            (ACCOUNT_SEED, Some(&self.account)),
            (ENROLLMENT_SEED, self.enrollment.as_ref()),
        ] {
            if let Some(key) = key {
                write_secret(&dir.join(name), &seed_of(key))?;
            }
        }
        Ok(())
    }

    /// The palisade account's public key (`A…`).
    pub fn account_public_key(&self) -> String {
        self.account.public_key()
    }

    /// The public key of the account `identity` connects in: the palisade account for the
    /// services and the operator, its own for a worker or a client.
    pub fn account_of(&self, identity: &Identity) -> String {
        self.account_key(identity).public_key()
    }

    /// The key of the account `identity`'s users are signed by.
    fn account_key(&self, identity: &Identity) -> KeyPair {
        match identity {
            Identity::Service(_) | Identity::Operator => {
                KeyPair::from_seed(&seed_of(&self.account)).expect("a seed just written")
            }
            Identity::Worker { .. } | Identity::Client { .. } => {
                let (_, master) =
                    nkeys::decode_seed(&seed_of(&self.account)).expect("the account's own seed");
                let mut mac =
                    Hmac::<sha2::Sha256>::new_from_slice(&master).expect("HMAC takes any key");
                mac.update(DERIVATION_LABEL);
                mac.update(identity.token().as_bytes());
                let raw: [u8; 32] = mac.finalize().into_bytes().into();
                KeyPair::new_from_raw(KeyPairType::Account, raw)
                    .expect("32 bytes make an account key")
            }
        }
    }

    /// The operator JWT (self-signed), naming the system account.
    pub fn operator_jwt(&self) -> String {
        let mut operator = Operator::default();
        operator.system_account = Some(self.system.public_key().into());
        operator.signing_keys = Some(SigningKeys::from(&self.operator));
        Token::new(self.operator.public_key())
            .name("palisade-operator")
            .claims(Claims::Operator(operator))
            .sign(&self.operator)
    }

    /// The system account's JWT.
    pub fn system_account_jwt(&self) -> String {
        // Connections unlimited (the push connects here); no JetStream, which the server
        // refuses for its system account.
        let account = Account {
            limits: Some(no_jetstream(OperatorLimits::default())),
            ..Account::default()
        };
        Token::new(self.system.public_key())
            .name("SYS")
            .claims(Claims::Account(account))
            .sign(&self.operator)
    }

    /// The palisade account's JWT: JetStream enabled, bearer tokens refused, every worker and
    /// client subject exported (each identity's account imports only its own), and `revoked`
    /// users refused (the worker and client credentials it signed before each identity had an
    /// account of its own).
    pub fn palisade_account(&self, subjects: &Subjects, revoked: &[Revoked]) -> SignedAccount {
        let Crossing { services, streams } = subjects.exports();
        let export = |subject: String, kind: ExportType| Export {
            subject: Some(subject.into()),
            type_: Some(kind),
            response_type: (kind == ExportType::Service).then_some(ResponseType::Singleton),
            response_threshold: (kind == ExportType::Service)
                .then_some(RESPONSE_TTL.as_nanos() as i64),
            ..Export::default()
        };
        let exports: Vec<Export> = services
            .into_iter()
            .map(|subject| export(subject, ExportType::Service))
            .chain(
                streams
                    .into_iter()
                    .map(|subject| export(subject, ExportType::Stream)),
            )
            .collect();
        let account = Account {
            limits: Some(OperatorLimits {
                disallow_bearer: true,
                ..OperatorLimits::default()
            }),
            exports: Some(Exports::from(exports)),
            revocations: revocation_list(revoked),
            ..Account::default()
        };
        SignedAccount {
            public_key: self.account.public_key(),
            jwt: Token::new(self.account.public_key())
                .name(ACCOUNT_NAME)
                .claims(Claims::Account(account))
                .sign(&self.operator),
        }
    }

    /// The JWT of `identity`'s own account: no JetStream, bearer tokens refused, its own
    /// subjects imported from the palisade account, and `revoked` users refused. `None` for
    /// the services and the operator, which live in the palisade account.
    pub fn identity_account(
        &self,
        subjects: &Subjects,
        identity: &Identity,
        revoked: &[Revoked],
    ) -> Option<SignedAccount> {
        let Crossing { services, streams } = subjects.imports(identity)?;
        let palisade = self.account.public_key();
        let import = |subject: String, kind: ExportType| Import {
            account: Some(palisade.clone()),
            subject: Some(subject.into()),
            type_: Some(kind),
            ..Import::default()
        };
        let imports: Vec<Import> = services
            .into_iter()
            .map(|subject| import(subject, ExportType::Service))
            .chain(
                streams
                    .into_iter()
                    .map(|subject| import(subject, ExportType::Stream)),
            )
            .collect();
        // A worker's account lets the enrollment key sign its users, only with its permissions.
        let signing_keys = match (identity, &self.enrollment) {
            (Identity::Worker { .. }, Some(enrollment)) => {
                Some(SigningKeys::from(vec![SigningKeysItem::UserScope(
                    UserScope {
                        description: Some("palisade enrollment: this worker's users".into()),
                        key: Some(enrollment.public_key()),
                        kind: ScopeType::UserScope,
                        role: Some("worker".into()),
                        template: Some(scope_template(&subjects.permissions(identity))),
                    },
                )]))
            }
            _ => None,
        };
        let account = Account {
            limits: Some(no_jetstream(OperatorLimits {
                disallow_bearer: true,
                ..OperatorLimits::default()
            })),
            imports: Some(Imports::from(imports)),
            revocations: revocation_list(revoked),
            signing_keys,
            ..Account::default()
        };
        let key = self.account_key(identity);
        Some(SignedAccount {
            public_key: key.public_key(),
            jwt: Token::new(key.public_key())
                .name(identity.token())
                .claims(Claims::Account(account))
                .sign(&self.operator),
        })
    }

    /// The part of a `nats-server` configuration that makes it trust this authority: a control
    /// line long enough for every identity's credentials
    /// ([`messages::limits::NATS_MAX_CONTROL_LINE`]), operator, system account, a full account resolver storing JWTs in `resolver_dir`
    /// (pushed accounts survive restarts there), and the system and palisade accounts
    /// preloaded. Worker and client accounts are pushed when they are issued.
    pub fn server_config(&self, subjects: &Subjects, resolver_dir: &Path) -> String {
        let palisade = self.palisade_account(subjects, &[]);
        format!(
            "max_control_line: {control_line}\noperator: {operator}\nsystem_account: {system}\nresolver: {{\n  type: full\n  dir: {dir:?}\n  allow_delete: false\n  interval: \"2m\"\n}}\nresolver_preload: {{\n  {system}: {system_jwt}\n  {account}: {account_jwt}\n}}\n",
            control_line = messages::limits::NATS_MAX_CONTROL_LINE,
            operator = self.operator_jwt(),
            system = self.system.public_key(),
            dir = resolver_dir.display().to_string(),
            system_jwt = self.system_account_jwt(),
            account = palisade.public_key,
            account_jwt = palisade.jwt,
        )
    }

    /// New credentials for `identity` (a fresh key pair; the seed is only in the file). A
    /// worker's or client's account must be pushed ([`Authority::push`]) before it connects.
    pub fn issue(&self, subjects: &Subjects, identity: &Identity) -> Credentials {
        let user = KeyPair::new_user();
        let jwt = self.user_jwt(
            &self.account_key(identity),
            &user.public_key(),
            &identity.token(),
            &subjects.permissions(identity),
        );
        Credentials {
            public_key: user.public_key(),
            file: creds_file(&jwt, &seed_of(&user)),
        }
    }

    /// A user JWT for `identity` over a public key its holder generated (`nsc`/`nk -gen
    /// user`): the private seed never leaves the holder.
    pub fn issue_for_key(
        &self,
        subjects: &Subjects,
        identity: &Identity,
        public_key: &str,
    ) -> Result<String, IdentityError> {
        if !public_key.starts_with('U') || nkeys::KeyPair::from_public_key(public_key).is_err() {
            return Err(IdentityError::NotAUserKey(public_key.to_owned()));
        }
        Ok(self.user_jwt(
            &self.account_key(identity),
            public_key,
            &identity.token(),
            &subjects.permissions(identity),
        ))
    }

    /// The credentials of a worker's enrollment token: a user of the worker's own account that
    /// may only send `enroll` (and read its answer), expiring with the token. The worker's
    /// account must be pushed before it connects.
    pub fn enrollment_user(
        &self,
        subjects: &Subjects,
        worker_id: uuid::Uuid,
        expires_at_unix_secs: i64,
    ) -> Credentials {
        let user = KeyPair::new_user();
        let identity = Identity::Worker { worker_id };
        let jwt = self.user_jwt_expiring(
            &self.account_key(&identity),
            &user.public_key(),
            &format!("{}-enrollment", identity.token()),
            &subjects.enrollment_permissions(worker_id),
            Some(expires_at_unix_secs),
        );
        Credentials {
            public_key: user.public_key(),
            file: creds_file(&jwt, &seed_of(&user)),
        }
    }

    /// New credentials in the palisade account with explicit permissions (the system tests'
    /// own unrestricted user).
    pub fn issue_with(&self, name: &str, permissions: &Permissions) -> Credentials {
        let user = KeyPair::new_user();
        let jwt = self.user_jwt(&self.account, &user.public_key(), name, permissions);
        Credentials {
            public_key: user.public_key(),
            file: creds_file(&jwt, &seed_of(&user)),
        }
    }

    fn user_jwt(
        &self,
        account: &KeyPair,
        public_key: &str,
        name: &str,
        permissions: &Permissions,
    ) -> String {
        self.user_jwt_expiring(account, public_key, name, permissions, None)
    }

    fn user_jwt_expiring(
        &self,
        account: &KeyPair,
        public_key: &str,
        name: &str,
        permissions: &Permissions,
        expires_at_unix_secs: Option<i64>,
    ) -> String {
        let limits = scope_template(permissions);
        let user = User {
            bearer_token: false,
            pub_: limits.pub_,
            sub: limits.sub,
            resp: limits.resp,
            ..User::default()
        };
        let token = Token::new(public_key.to_owned())
            .name(name)
            .claims(Claims::User(user));
        match expires_at_unix_secs {
            Some(at) => token.expires(at),
            None => token,
        }
        .sign(account)
    }

    /// Credentials of a system-account user, to push accounts with.
    fn system_user(&self) -> Credentials {
        let user = KeyPair::new_user();
        let jwt = Token::new(user.public_key())
            .name("palisade-push")
            .claims(Claims::User(User {
                bearer_token: false,
                ..User::default()
            }))
            .sign(&self.system);
        Credentials {
            public_key: user.public_key(),
            file: creds_file(&jwt, &seed_of(&user)),
        }
    }

    /// Pushes `accounts` to the NATS servers at `url` (one URL or a comma-separated list; a
    /// cluster passes them on), a new account or a new version of one alike. Once this
    /// returns, every connection of a user an account now revokes has been closed and no new
    /// one is accepted.
    pub async fn push(
        &self,
        url: &str,
        tls: &bus::NatsTls,
        accounts: &[SignedAccount],
    ) -> Result<(), IdentityError> {
        let push_error = |account: &str, reason: String| IdentityError::Push {
            url: url.to_owned(),
            account: account.to_owned(),
            reason,
        };
        let servers: Vec<async_nats::ServerAddr> = url
            .split(',')
            .map(|server| server.trim().parse())
            .collect::<Result<_, _>>()
            .map_err(|error: std::io::Error| push_error("-", error.to_string()))?;
        let options = async_nats::ConnectOptions::with_credentials(&self.system_user().file)
            .map_err(|error| push_error("-", error.to_string()))?;
        let client = tls
            .apply(url, options)
            .name("palisade-push")
            .connection_timeout(Duration::from_secs(5))
            .connect(servers)
            .await
            .map_err(|error| push_error("-", error.to_string()))?;
        for account in accounts {
            let error = |reason: String| push_error(&account.public_key, reason);
            // The server's claims update takes a new account as well as a new version.
            let reply = tokio::time::timeout(
                Duration::from_secs(10),
                client.request("$SYS.REQ.CLAIMS.UPDATE", account.jwt.clone().into()),
            )
            .await
            .map_err(|_| error("no answer within 10 s".into()))?
            .map_err(|failure| error(failure.to_string()))?;
            let answer: serde_json::Value = serde_json::from_slice(&reply.payload)
                .map_err(|failure| error(format!("unreadable answer: {failure}")))?;
            if let Some(failure) = answer.get("error") {
                return Err(error(failure.to_string()));
            }
        }
        Ok(())
    }
}

/// A user's permissions as a JWT states them (and as a scoped signing key's template).
fn scope_template(permissions: &Permissions) -> UserPermissionLimits {
    let list = |subjects: &[String]| Permission {
        allow: Some(subjects.to_vec().into()),
        deny: None,
    };
    UserPermissionLimits {
        bearer_token: false,
        pub_: Some(list(&permissions.publish)),
        sub: Some(list(&permissions.subscribe)),
        resp: permissions.responses.then(|| ResponsePermission {
            max: Some(1),
            ttl: Some(RESPONSE_TTL.as_nanos() as i64),
        }),
        ..UserPermissionLimits::default()
    }
}

/// An account's list of refused users, none when empty.
fn revocation_list(revoked: &[Revoked]) -> Option<RevocationList> {
    let revocations: HashMap<RevocationListKey, i64> = revoked
        .iter()
        .filter_map(|revoked| {
            let key = revoked.public_key.parse::<RevocationListKey>().ok()?;
            Some((key, revoked.at_unix_secs))
        })
        .collect();
    (!revocations.is_empty()).then(|| RevocationList::from(revocations))
}

/// `limits` with JetStream off: no storage, no streams, no consumers.
fn no_jetstream(limits: OperatorLimits) -> OperatorLimits {
    OperatorLimits {
        disk_storage: 0,
        mem_storage: 0,
        streams: 0,
        consumer: 0,
        ..limits
    }
}

/// The `.creds` file format of `nsc` and the NATS clients.
pub fn creds_file(jwt: &str, seed: &str) -> String {
    format!(
        "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n\
         ************************* IMPORTANT *************************\n\
         NKEY Seed printed below can be used to sign and prove identity.\n\
         NKEYs are sensitive and should be treated as secrets.\n\n\
         -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n\n\
         *************************************************************\n"
    )
}

/// Writes `text` readable by its owner only (mode 0600), whether or not `path` existed: a new
/// file of mode 0600 in the same directory is written, synced and renamed over `path`, so an
/// existing file's looser mode never applies to the secret and a reader never sees half of it.
pub fn write_secret(path: &Path, text: &str) -> Result<(), IdentityError> {
    use std::io::Write as _;
    let error = |error: std::io::Error| IdentityError::Write {
        path: path.to_owned(),
        reason: error.to_string(),
    };
    // `Path::parent` of a bare file name is the empty path: the current directory.
    let dir = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let mut file = tempfile::NamedTempFile::new_in(dir).map_err(error)?;
    // `tempfile` creates it 0600 already; said here so the guarantee does not rest on a default.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        file.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(error)?;
    }
    file.write_all(text.as_bytes()).map_err(error)?;
    file.as_file().sync_all().map_err(error)?;
    file.persist(path).map_err(|persist| error(persist.error))?;
    // The rename itself is durable once the directory is.
    #[cfg(unix)]
    std::fs::File::open(dir)
        .and_then(|dir| dir.sync_all())
        .map_err(error)?;
    Ok(())
}

fn seed_of(key: &KeyPair) -> String {
    key.seed()
        .expect("generated and read key pairs hold their seed")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_authority_survives_its_directory() {
        let dir = std::env::temp_dir().join(format!("palisade-authority-{}", std::process::id()));
        let authority = Authority::generate();
        authority.write(&dir).unwrap();
        let read = Authority::read(&dir).unwrap();
        assert_eq!(read.account_public_key(), authority.account_public_key());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Every identity's `CONNECT` line (its user JWT, signature and options) fits the control
    /// line the server is configured with, with the longest prefix a deployment may choose.
    #[test]
    fn every_identitys_credentials_fit_the_servers_control_line() {
        /// What a `CONNECT` line holds besides the JWT: the nonce's signature, the client's
        /// name, version, language and options (about 400 bytes with async-nats).
        const CONNECT_BESIDES_JWT: usize = 1_024;
        let authority = Authority::generate();
        let subjects = Subjects::new(&"p".repeat(32)).unwrap();
        let mut identities: Vec<Identity> = messages::Service::ALL.map(Identity::Service).to_vec();
        identities.extend([
            Identity::Operator,
            Identity::Worker {
                worker_id: uuid::Uuid::new_v4(),
            },
            Identity::Client {
                client_id: "c".repeat(64),
                organizations: vec![uuid::Uuid::new_v4(); 8],
            },
        ]);
        for identity in &identities {
            let credentials = authority.issue(&subjects, identity);
            let jwt = credentials.file.lines().nth(1).unwrap();
            assert!(
                jwt.len() + CONNECT_BESIDES_JWT <= messages::limits::NATS_MAX_CONTROL_LINE,
                "{identity:?}: a {}-byte JWT",
                jwt.len()
            );
        }
    }

    #[test]
    fn credentials_are_never_bearer_tokens() {
        let authority = Authority::generate();
        let subjects = Subjects::new("p").unwrap();
        let credentials = authority.issue(&subjects, &Identity::Operator);
        let jwt = credentials.file.lines().nth(1).unwrap();
        let claims = jwt.split('.').nth(1).unwrap();
        let claims = data_encoding::BASE64URL_NOPAD
            .decode(claims.as_bytes())
            .unwrap();
        let claims = String::from_utf8(claims).unwrap();
        assert!(claims.contains("\"bearer_token\":false"), "{claims}");
        // The public key is random base32 and may hold "SU" anywhere; the seed is the one line
        // of the file that starts with it.
        let seed = credentials
            .file
            .lines()
            .find(|line| line.starts_with("SU"))
            .expect("the file holds the user's seed");
        assert!(
            !format!("{credentials:?}").contains(seed),
            "no seed in Debug"
        );
    }
}
