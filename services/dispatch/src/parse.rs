//! Decoding and validating what dispatch receives (hello, acquire, renew, release, cancel),
//! pure: no I/O, no clock. Each function performs the checks of its verb before the
//! transaction, in the order of docs/protocol/reference.md section 6, and returns either what
//! the handler acts on or the refusal the sender gets.

use messages::bounded::decode_counted;
use messages::limits::{
    ACQUIRE_TASKS_MAX, ACQUIRE_WAIT_MS_MAX, ENROLLMENT_ORGANIZATIONS_MAX,
    ENROLLMENT_SECRET_BYTES_MAX, IDENTIFIER_BYTES_MAX, RENEW_LEASES_MAX, RESOURCE_KIND_BYTES_MAX,
    RULE_KINDS_MAX, WORKER_CAPABILITIES_MAX, WORKER_CAPACITY_MAX, WORKER_RULES_MAX,
};
use messages::validate::{invalid, malformed, schema_version as schema, worker_id};
use messages::{ErrorCode, Subjects, v1};
use prost::Message as _;
use store::LeaseClaim;
use store::cancel::CancelTarget;
use store::lease::{HelloParams, RenewClaims};
use uuid::Uuid;

/// Longest release or cancel reason kept, in characters (release) or accepted, in bytes
/// (cancel).
pub const REASON_MAX: usize = 512;

/// `HelloRequest.capabilities`' field number: counted before the strings are held.
const HELLO_CAPABILITIES_TAG: u32 = 5;
/// `RenewRequest.more_leases`' field number: counted before the leases are held.
const RENEW_MORE_LEASES_TAG: u32 = 4;
/// `EnrollRequest.capabilities`' field number: counted before the strings are held.
const ENROLL_CAPABILITIES_TAG: u32 = 7;
/// `HelloRequest.rules`' field number: counted before anything is decoded.
const HELLO_RULES_TAG: u32 = 7;

/// A hello that passed checks 1–7 of reference 6.3.
#[derive(Debug, Clone, PartialEq)]
pub struct Hello {
    pub worker_id: Uuid,
    pub software_version: String,
    pub protocol_version: String,
    pub capabilities: Vec<String>,
    pub capacity: i32,
    pub rules: Vec<v1::RuleDeclaration>,
}

impl Hello {
    /// What the store records for it.
    pub fn params(&self) -> HelloParams<'_> {
        HelloParams {
            worker_id: self.worker_id,
            software_version: &self.software_version,
            protocol_version: &self.protocol_version,
            capabilities: &self.capabilities,
            capacity: self.capacity,
            rules: &self.rules,
        }
    }
}

/// An acquire that passed checks 1–6 of reference 6.4.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acquire {
    pub worker_id: Uuid,
    pub request_id: Uuid,
    pub max_tasks: u32,
    pub wait_ms: u32,
}

/// A renew that passed checks 1–7 of reference 6.5.
#[derive(Debug, Clone)]
pub struct Renew {
    pub claims: RenewClaims,
    /// The request had `more_leases`: its reply lists one renewal per lease.
    pub batch: bool,
}

/// A release that passed checks 1–4 of reference 6.6.
#[derive(Debug, Clone, PartialEq)]
pub struct Release {
    pub claim: LeaseClaim,
    /// NULs removed, cut to [`REASON_MAX`] characters.
    pub reason: String,
}

/// A cancel that passed the checks of reference 6.2 before its transaction.
#[derive(Debug, Clone, PartialEq)]
pub struct Cancel {
    pub organization_id: Uuid,
    pub target: CancelTarget,
    /// The sender's reason, or `cancelled on request`.
    pub reason: String,
}

/// An enrollment that passed the checks of reference 6.18 before its transaction.
#[derive(Debug, Clone, PartialEq)]
pub struct Enroll {
    pub worker_id: Uuid,
    pub token_id: Uuid,
    /// SHA-256 of the secret sent.
    pub secret_sha256: Vec<u8>,
    /// A NATS user public key (`U…`, checksum checked).
    pub public_key: String,
    pub organization_ids: Vec<Uuid>,
    pub capabilities: Vec<String>,
}

/// A renewal of credentials that passed the checks of reference 6.19.
#[derive(Debug, Clone, PartialEq)]
pub struct Renewal {
    pub worker_id: Uuid,
    pub public_key: String,
}

/// Reference 6.18, checks 1–6.
pub fn enroll(subject_worker: Option<&str>, payload: &[u8]) -> Result<Enroll, v1::Error> {
    let counted = decode_counted::<v1::EnrollRequest>(
        payload,
        ENROLL_CAPABILITIES_TAG,
        WORKER_CAPABILITIES_MAX,
    )
    .map_err(|error| malformed("EnrollRequest", error))?;
    let request = counted.message;
    schema(request.schema_version)?;
    let worker_id = worker_id(subject_worker, &request.worker_id)?;
    let token_id =
        Uuid::parse_str(&request.token_id).map_err(|_| invalid("token_id must be a UUID"))?;
    if request.secret.is_empty() || request.secret.len() > ENROLLMENT_SECRET_BYTES_MAX {
        return Err(invalid(format!(
            "secret must be 1..={ENROLLMENT_SECRET_BYTES_MAX} bytes: the token's"
        )));
    }
    let public_key = user_public_key(request.public_key)?;
    if request.organization_ids.len() > ENROLLMENT_ORGANIZATIONS_MAX {
        return Err(invalid(format!(
            "organization_ids: at most {ENROLLMENT_ORGANIZATIONS_MAX}"
        )));
    }
    let organization_ids = request
        .organization_ids
        .iter()
        .map(|id| Uuid::parse_str(id))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| invalid("organization_ids must be UUIDs"))?;
    capabilities(counted.count, &request.capabilities)?;
    Ok(Enroll {
        worker_id,
        token_id,
        secret_sha256: identity::enrollment::secret_digest(&request.secret),
        public_key,
        organization_ids,
        capabilities: request.capabilities,
    })
}

/// Reference 6.19, checks 1–4.
pub fn credentials(subject_worker: Option<&str>, payload: &[u8]) -> Result<Renewal, v1::Error> {
    let request = v1::CredentialsRequest::decode(payload)
        .map_err(|error| malformed("CredentialsRequest", error))?;
    schema(request.schema_version)?;
    let worker_id = worker_id(subject_worker, &request.worker_id)?;
    Ok(Renewal {
        worker_id,
        public_key: user_public_key(request.public_key)?,
    })
}

/// Capabilities as hello and enroll take them: at most [`WORKER_CAPABILITIES_MAX`] (`count`,
/// counted before they were held), each 1..=[`IDENTIFIER_BYTES_MAX`] bytes without NUL.
fn capabilities(count: usize, capabilities: &[String]) -> Result<(), v1::Error> {
    if count > WORKER_CAPABILITIES_MAX
        || capabilities
            .iter()
            .any(|c| c.is_empty() || c.len() > IDENTIFIER_BYTES_MAX || c.contains('\0'))
    {
        return Err(invalid(format!(
            "capabilities: at most {WORKER_CAPABILITIES_MAX}, each 1..={IDENTIFIER_BYTES_MAX} bytes without NUL"
        )));
    }
    Ok(())
}

/// A hello's declared rules (reference 6.3, check 8): each of one of its capabilities, its
/// rule id 1..=[`IDENTIFIER_BYTES_MAX`] bytes, 1..=[`RULE_KINDS_MAX`] resource kinds each
/// 1..=[`RESOURCE_KIND_BYTES_MAX`] bytes, none with NUL; a (plugin, rule) declared once.
fn declared_rules(capabilities: &[String], rules: &[v1::RuleDeclaration]) -> Result<(), v1::Error> {
    let mut seen = std::collections::HashSet::new();
    for rule in rules {
        if !capabilities.contains(&rule.plugin) {
            return Err(invalid(format!(
                "rules: {:?} is declared for plugin {:?}, which is not among the capabilities",
                rule.rule_id, rule.plugin
            )));
        }
        let bad_text =
            |text: &str, max: usize| text.is_empty() || text.len() > max || text.contains('\0');
        if bad_text(&rule.rule_id, IDENTIFIER_BYTES_MAX) {
            return Err(invalid(format!(
                "rules: a rule_id must be 1..={IDENTIFIER_BYTES_MAX} bytes without NUL"
            )));
        }
        if rule.resource_kinds.is_empty()
            || rule.resource_kinds.len() > RULE_KINDS_MAX
            || rule
                .resource_kinds
                .iter()
                .any(|kind| bad_text(kind, RESOURCE_KIND_BYTES_MAX))
        {
            return Err(invalid(format!(
                "rules: {:?} of {:?} must apply to 1..={RULE_KINDS_MAX} resource kinds, each \
                 1..={RESOURCE_KIND_BYTES_MAX} bytes without NUL (\"{}\" is the target itself)",
                rule.rule_id,
                rule.plugin,
                messages::TARGET_RESOURCE_KIND
            )));
        }
        if !seen.insert((rule.plugin.as_str(), rule.rule_id.as_str())) {
            return Err(invalid(format!(
                "rules: {:?} of {:?} is declared twice",
                rule.rule_id, rule.plugin
            )));
        }
    }
    Ok(())
}

fn user_public_key(key: String) -> Result<String, v1::Error> {
    if identity::enrollment::is_user_public_key(&key) {
        Ok(key)
    } else {
        Err(invalid(
            "public_key must be a NATS user public key (U…, 56 characters) the worker generated",
        ))
    }
}

/// Reference 6.3, checks 1–7.
pub fn hello(subject_worker: Option<&str>, payload: &[u8]) -> Result<Hello, v1::Error> {
    let rules = messages::bounded::count_elements(payload, HELLO_RULES_TAG)
        .map_err(|error| malformed("HelloRequest", error))?;
    if rules > WORKER_RULES_MAX {
        return Err(invalid(format!(
            "rules: {rules} declared, at most {WORKER_RULES_MAX} are accepted"
        )));
    }
    let counted = decode_counted::<v1::HelloRequest>(
        payload,
        HELLO_CAPABILITIES_TAG,
        WORKER_CAPABILITIES_MAX,
    )
    .map_err(|error| malformed("HelloRequest", error))?;
    let request = counted.message;
    schema(request.schema_version)?;
    let worker_id = worker_id(subject_worker, &request.worker_id)?;
    if request.protocol_version != messages::PROTOCOL_VERSION {
        return Err(v1::Error::new(
            ErrorCode::UnsupportedSchemaVersion,
            format!(
                "protocol_version {:?} is not supported; this dispatch speaks {:?}",
                request.protocol_version,
                messages::PROTOCOL_VERSION
            ),
        ));
    }
    if request.software_version.len() > IDENTIFIER_BYTES_MAX
        || request.software_version.contains('\0')
    {
        return Err(invalid(format!(
            "software_version must be at most {IDENTIFIER_BYTES_MAX} bytes without NUL"
        )));
    }
    if request.capacity == 0 || request.capacity > WORKER_CAPACITY_MAX {
        return Err(invalid(format!(
            "capacity must be 1..={WORKER_CAPACITY_MAX}"
        )));
    }
    capabilities(counted.count, &request.capabilities)?;
    declared_rules(&request.capabilities, &request.rules)?;
    Ok(Hello {
        worker_id,
        software_version: request.software_version,
        protocol_version: request.protocol_version,
        capabilities: request.capabilities,
        capacity: request.capacity as i32,
        rules: request.rules,
    })
}

/// Reference 6.4, checks 1–6.
pub fn acquire(subject_worker: Option<&str>, payload: &[u8]) -> Result<Acquire, v1::Error> {
    let request =
        v1::AcquireRequest::decode(payload).map_err(|error| malformed("AcquireRequest", error))?;
    schema(request.schema_version)?;
    let worker_id = worker_id(subject_worker, &request.worker_id)?;
    let request_id =
        Uuid::parse_str(&request.request_id).map_err(|_| invalid("request_id must be a UUID"))?;
    if request.max_tasks == 0 || request.max_tasks > ACQUIRE_TASKS_MAX {
        return Err(invalid(format!(
            "max_tasks must be 1..={ACQUIRE_TASKS_MAX}"
        )));
    }
    if request.wait_ms > ACQUIRE_WAIT_MS_MAX {
        return Err(invalid(format!(
            "wait_ms must be at most {ACQUIRE_WAIT_MS_MAX}"
        )));
    }
    Ok(Acquire {
        worker_id,
        request_id,
        max_tasks: request.max_tasks,
        wait_ms: request.wait_ms,
    })
}

/// Reference 6.5, checks 1–7. At most [`RENEW_LEASES_MAX`] of `more_leases` are held while
/// decoding; a request naming more is refused as `too_large` by `RenewClaims::from_wire`,
/// which then sees one lease over the limit, whatever the number sent.
pub fn renew(subject_worker: Option<&str>, payload: &[u8]) -> Result<Renew, v1::Error> {
    let counted =
        decode_counted::<v1::RenewRequest>(payload, RENEW_MORE_LEASES_TAG, RENEW_LEASES_MAX)
            .map_err(|error| malformed("RenewRequest", error))?;
    let request = counted.message;
    schema(request.schema_version)?;
    let worker_id = worker_id(subject_worker, &request.worker_id)?;
    let claims = RenewClaims::from_wire(worker_id, request.lease.as_ref(), &request.more_leases)?;
    Ok(Renew {
        claims,
        batch: counted.count > 0,
    })
}

/// Reference 6.6, checks 1–4.
pub fn release(subject_worker: Option<&str>, payload: &[u8]) -> Result<Release, v1::Error> {
    let request =
        v1::ReleaseRequest::decode(payload).map_err(|error| malformed("ReleaseRequest", error))?;
    schema(request.schema_version)?;
    let worker_id = worker_id(subject_worker, &request.worker_id)?;
    let claim = LeaseClaim::from_wire(worker_id, request.lease.as_ref())?;
    let reason = request
        .reason
        .chars()
        .filter(|c| *c != '\0')
        .take(REASON_MAX)
        .collect();
    Ok(Release { claim, reason })
}

/// Reference 6.2, the checks before the transaction: a cancel on `subject`.
pub fn cancel(subjects: &Subjects, subject: &str, payload: &[u8]) -> Result<Cancel, v1::Error> {
    let request =
        v1::CancelRequest::decode(payload).map_err(|error| malformed("CancelRequest", error))?;
    schema(request.schema_version)?;
    let Some(organization_id) = subjects
        .client_of(subject)
        .and_then(|tokens| Uuid::parse_str(tokens.organization_id).ok())
    else {
        return Err(invalid(format!(
            "{subject:?} names no organization: cancel on <prefix>.v1.org.<organization_id>.client.<client_id>.cancel"
        )));
    };
    let target = match (request.scan_id.is_empty(), request.task_id.is_empty()) {
        (false, true) => Uuid::parse_str(&request.scan_id).map(CancelTarget::Scan),
        (true, false) => Uuid::parse_str(&request.task_id).map(CancelTarget::Task),
        _ => return Err(invalid("set exactly one of scan_id and task_id")),
    };
    let Ok(target) = target else {
        return Err(invalid("scan_id / task_id must be a UUID"));
    };
    if request.reason.len() > REASON_MAX || request.reason.contains('\0') {
        return Err(invalid("reason must be at most 512 bytes without NUL"));
    }
    let reason = if request.reason.is_empty() {
        "cancelled on request".to_owned()
    } else {
        request.reason
    };
    Ok(Cancel {
        organization_id,
        target,
        reason,
    })
}

#[cfg(test)]
mod tests;
