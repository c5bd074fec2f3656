//! Enrollment: how a worker joins without the authority.
//!
//! An operator issues a one-time **enrollment token** (`palisade worker token create`) with
//! the authority at hand: it allocates the worker's id, signs and pushes the worker's own
//! account, and puts in the token the credentials of a user of that account that may only send
//! `enroll` (expiring with the token), with the token's id and a secret whose hash PostgreSQL
//! keeps. The worker generates its own key pair, connects as the token's user and sends its
//! public key with the token's id and secret; dispatch checks the token in PostgreSQL (unused,
//! unexpired, unrevoked, asking no more than it carries), marks it used and answers a user JWT
//! signed by the [`Enroller`] key. That key is listed in every worker's account as a signing
//! key **scoped** to that worker's permissions: the servers ignore whatever permissions a JWT
//! it signs claims and apply the worker's. So dispatch can mint users of workers' accounts
//! with workers' rights, and nothing else.
//!
//! The token's text is part of the protocol (reference 6.18): `palisade-enroll-1.` followed by
//! the unpadded base64url of a JSON object ([`EnrollmentToken`]).

use std::path::Path;

use data_encoding::BASE64URL_NOPAD;
use nats_io_jwt::{Claims, Token, User};
use nkeys::KeyPair;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::IdentityError;

/// How an enrollment token's text starts.
pub const TOKEN_PREFIX: &str = "palisade-enroll-1.";

/// What an enrollment token carries: everything a worker needs to enroll, and nothing that
/// outlives the token (its NATS user may only send `enroll`, and expires with it).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnrollmentToken {
    pub worker_id: Uuid,
    pub token_id: Uuid,
    /// Sent back in `EnrollRequest.secret`; PostgreSQL keeps only its SHA-256.
    pub secret: String,
    pub organization_ids: Vec<Uuid>,
    pub capabilities: Vec<String>,
    pub expires_at_unix_ms: i64,
    /// The `.creds` text of the token's NATS user; empty on a server without authentication.
    pub creds: String,
}

impl std::fmt::Debug for EnrollmentToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnrollmentToken")
            .field("worker_id", &self.worker_id)
            .field("token_id", &self.token_id)
            .field("organization_ids", &self.organization_ids)
            .field("capabilities", &self.capabilities)
            .field("expires_at_unix_ms", &self.expires_at_unix_ms)
            .finish_non_exhaustive()
    }
}

impl EnrollmentToken {
    /// A fresh secret: 32 random bytes, base64url.
    pub fn new_secret() -> String {
        BASE64URL_NOPAD.encode(&rand::random::<[u8; 32]>())
    }

    /// The token's text, as `palisade worker token create` prints it.
    pub fn encode(&self) -> String {
        let json = serde_json::to_vec(self).expect("a token serializes");
        format!("{TOKEN_PREFIX}{}", BASE64URL_NOPAD.encode(&json))
    }

    /// Reads a token's text (surrounding whitespace ignored).
    pub fn decode(text: &str) -> Result<Self, IdentityError> {
        let body = text
            .trim()
            .strip_prefix(TOKEN_PREFIX)
            .ok_or_else(|| IdentityError::NotAToken(format!("it does not start {TOKEN_PREFIX}")))?;
        let json = BASE64URL_NOPAD
            .decode(body.as_bytes())
            .map_err(|error| IdentityError::NotAToken(format!("not base64url: {error}")))?;
        serde_json::from_slice(&json)
            .map_err(|error| IdentityError::NotAToken(format!("unreadable: {error}")))
    }
}

/// Whether `key` is a NATS user public key (`U…`, its checksum right).
pub fn is_user_public_key(key: &str) -> bool {
    key.len() == 56 && key.starts_with('U') && KeyPair::from_public_key(key).is_ok()
}

/// SHA-256 of a token's secret, as PostgreSQL keeps it.
pub fn secret_digest(secret: &str) -> Vec<u8> {
    use sha2::Digest as _;
    sha2::Sha256::digest(secret.as_bytes()).to_vec()
}

/// The enrollment key: signs users of workers' accounts, which list it as a signing key
/// scoped to each worker's own permissions. Dispatch holds it (`PALISADE_NATS_ENROLLMENT_KEY`).
pub struct Enroller {
    key: KeyPair,
}

impl std::fmt::Debug for Enroller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Enroller")
            .field("public_key", &self.key.public_key())
            .finish_non_exhaustive()
    }
}

impl Enroller {
    pub(crate) fn from_seed(seed: &str) -> Result<Self, nkeys::error::Error> {
        Ok(Self {
            key: KeyPair::from_seed(seed.trim())?,
        })
    }

    /// Reads the seed file `palisade nats init` wrote (`enrollment.nk`).
    pub fn read(path: &Path) -> Result<Self, IdentityError> {
        let error = |reason: String| IdentityError::Read {
            dir: path.parent().unwrap_or(Path::new(".")).to_owned(),
            reason: format!("{}: {reason}", path.display()),
        };
        let text = std::fs::read_to_string(path).map_err(|failure| error(failure.to_string()))?;
        let enroller = Self::from_seed(&text).map_err(|failure| error(failure.to_string()))?;
        if !enroller.key.public_key().starts_with('A') {
            return Err(error("not an account signing key's seed (SA…)".into()));
        }
        Ok(enroller)
    }

    pub fn public_key(&self) -> String {
        self.key.public_key()
    }

    /// A user JWT for `public_key` in the account `account` (its `A…` key), expiring at
    /// `expires_at_unix_secs`. It states no permissions: the account's scope for this key
    /// gives it the worker's.
    pub fn sign_user(
        &self,
        account: &str,
        public_key: &str,
        name: &str,
        expires_at_unix_secs: i64,
    ) -> Result<String, IdentityError> {
        if !is_user_public_key(public_key) {
            return Err(IdentityError::NotAUserKey(public_key.to_owned()));
        }
        // The server takes a scoped signer's user only with no permissions and no limits at
        // all (every one the zero value, not "unlimited"): the scope's template gives both.
        let user = User {
            bearer_token: false,
            issuer_account: Some(account.to_owned()),
            data: 0,
            payload: 0,
            subs: 0,
            ..User::default()
        };
        Ok(Token::new(public_key.to_owned())
            .name(name)
            .claims(Claims::User(user))
            .expires(expires_at_unix_secs)
            .sign(&self.key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_survives_its_text_and_hides_its_secrets_in_debug() {
        let token = EnrollmentToken {
            worker_id: Uuid::new_v4(),
            token_id: Uuid::new_v4(),
            secret: EnrollmentToken::new_secret(),
            organization_ids: vec![Uuid::new_v4()],
            capabilities: vec!["tcp_connect".into()],
            expires_at_unix_ms: 1_800_000_000_000,
            creds: "creds".into(),
        };
        let text = token.encode();
        assert!(text.starts_with(TOKEN_PREFIX));
        assert_eq!(
            EnrollmentToken::decode(&format!(" {text}\n")).unwrap(),
            token
        );
        let shown = format!("{token:?}");
        assert!(
            !shown.contains(&token.secret) && !shown.contains("creds"),
            "{shown}"
        );
        assert!(EnrollmentToken::decode("palisade-enroll-1.!!").is_err());
        assert!(EnrollmentToken::decode(&text[1..]).is_err());
    }

    #[test]
    fn secrets_differ() {
        assert_ne!(EnrollmentToken::new_secret(), EnrollmentToken::new_secret());
        assert_eq!(secret_digest("a").len(), 32);
    }
}
