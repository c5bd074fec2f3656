//! The admission decision script (SPEC §4.1): a fetched batch of validated scan requests decided
//! in one transaction with a fixed number of statements, whatever the batch holds.
//!
//! 1. `lock`: one statement takes every advisory lock the batch needs, in key order: one per
//!    (organization, target), the key admission has always taken (I6), and one per
//!    (organization, client, key), so that two transactions never admit one key (I5);
//! 2. `organizations`: one statement reads the batch's organizations and locks
//!    (`FOR NO KEY UPDATE`, in id order) those with a quota, so that quota counts are
//!    serialized per organization;
//! 3. `look_up`: one statement reads, per request, the scan its key names, whether its client
//!    is revoked (the batch's registered clients read `FOR SHARE`, so a revocation waits for
//!    the decision and none is admitted after it commits), its target's active scan and its
//!    organization's admissions of the last hour;
//! 4. `decide_in_order`: each request is decided in Rust, in the order given, against that
//!    snapshot and what the requests before it in the batch admitted (`AdmittedSoFar`): the
//!    answer it would get decided alone, after them (replay, `client_revoked`,
//!    `unknown_organization`, `scan_already_active`, `quota_exceeded`, in that order);
//! 5. `write`: the admitted requests' targets and scans are written with one statement
//!    (`write_scans`), their first scan jobs and tasks with one ([`progress::create_jobs`]),
//!    their events (`admitted_events`) with one.
//!
//! A refused or replayed request writes nothing. [`decide_each`] runs the same script one
//! request at a time, each in a savepoint: the caller's fallback when a set-wise statement fails
//! for a reason retrying cannot fix, so that the request at fault is refused alone.

use std::collections::HashMap;

use messages::v1;
use messages::{ErrorCode, EventKind, Subjects};
use prost::Message as _;
use sqlx::{PgConnection, Postgres, Transaction};
use uuid::Uuid;

use crate::StoreError;
use crate::outbox::{self, OutboxEvent, Staged};
use crate::progress::{self, NewScanJob};
use crate::sql;
use crate::states::ScanState;

/// A scan request that passed validation.
#[derive(Debug, Clone)]
pub struct AdmitParams<'a> {
    pub organization_id: Uuid,
    pub target: &'a str,
    pub plugins: &'a [String],
    pub priority: i32,
    pub execution_deadline_seconds: Option<i32>,
    pub client_id: &'a str,
    pub idempotency_key: &'a str,
    /// `messages::scan_request_fingerprint` of the request.
    pub fingerprint: &'a str,
    /// Attempt budget of every task of the scan.
    pub max_attempts: i32,
    /// W3C `traceparent` of the admitting span, stored so the scan's later steps join its trace.
    pub trace_context: Option<&'a str>,
}

/// What admission decided.
#[derive(Debug, Clone, PartialEq)]
pub enum AdmitOutcome {
    /// A new scan, its first scan job and task were written.
    Admitted { scan_id: Uuid, task_id: Uuid },
    /// The request was seen before: the original scan, whatever its state.
    Duplicate { scan_id: Uuid, state: ScanState },
    /// Refused; nothing was written.
    Refused(v1::Error),
}

/// The admission script over `requests`, for [`crate::decide_batch`].
pub struct Admit<'a, 'r> {
    pub subjects: &'a Subjects,
    pub requests: &'a [AdmitParams<'r>],
}

impl crate::Script for Admit<'_, '_> {
    type Outcomes = Vec<Result<AdmitOutcome, StoreError>>;

    async fn set_wise(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        staged: &mut Staged,
    ) -> Result<Self::Outcomes, StoreError> {
        Ok(decide(tx, staged, self.subjects, self.requests)
            .await?
            .into_iter()
            .map(Ok)
            .collect())
    }

    fn one_by_one(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        staged: &mut Staged,
    ) -> impl Future<Output = Result<Self::Outcomes, StoreError>> + Send {
        decide_each(tx, staged, self.subjects, self.requests)
    }
}

/// Decides `requests` inside the caller's transaction; the outcomes are in the order of
/// `requests`. The advisory locks are held until the caller commits.
///
/// Fails with [`StoreError::Raced`] in one case the locks cannot exclude (a replica that does
/// not take the key locks committed one of the batch's keys meanwhile): the caller then decides
/// the batch again with [`decide_each`].
pub async fn decide(
    conn: &mut PgConnection,
    staged: &mut Staged,
    subjects: &Subjects,
    requests: &[AdmitParams<'_>],
) -> Result<Vec<AdmitOutcome>, StoreError> {
    if requests.is_empty() {
        return Ok(Vec::new());
    }
    lock(conn, requests).await?;
    let quotas = organizations(conn, requests).await?;
    let found = look_up(conn, requests, &quotas).await?;
    let (mut outcomes, admitted) = decide_in_order(requests, &found, &quotas)?;

    for (index, scan_id, task_id) in write(conn, staged, subjects, requests, &admitted).await? {
        outcomes[index] = Some(match task_id {
            Some(task_id) => AdmitOutcome::Admitted { scan_id, task_id },
            None => {
                // A batch of one only: its key was committed concurrently (see `write`).
                let seen = find_by_key(conn, &requests[index]).await?.ok_or_else(|| {
                    StoreError::Corrupt("idempotency conflict without a conflicting row".into())
                })?;
                replay_outcome(seen.borrowed()?, &requests[index])
            }
        });
    }
    Ok(outcomes
        .into_iter()
        .map(|outcome| outcome.expect("every request decided"))
        .collect())
}

/// Decides `requests` one at a time, each in its own savepoint kept only when the request was
/// admitted: the fallback when a set-wise statement failed for a reason retrying cannot fix,
/// so that the request at fault fails alone. An `Err` in one outcome is that request's own
/// failure; the outer `Err` fails the transaction.
pub async fn decide_each(
    tx: &mut Transaction<'_, Postgres>,
    staged: &mut Staged,
    subjects: &Subjects,
    requests: &[AdmitParams<'_>],
) -> Result<Vec<Result<AdmitOutcome, StoreError>>, StoreError> {
    let mut outcomes = Vec::with_capacity(requests.len());
    for request in requests {
        let mark = staged.mark();
        let mut savepoint = crate::savepoint(tx).await?;
        let outcome = decide(
            &mut savepoint,
            staged,
            subjects,
            std::slice::from_ref(request),
        )
        .await
        .map(|mut outcomes| outcomes.pop().expect("one outcome per request"));
        match outcome {
            Ok(AdmitOutcome::Admitted { .. }) => savepoint.commit().await?,
            _ => {
                savepoint.rollback().await?;
                staged.roll_back_to(mark);
            }
        }
        outcomes.push(outcome);
    }
    Ok(outcomes)
}

/// A scan a request's key already names: in the database, or admitted earlier in the batch.
#[derive(Debug, Clone, Copy)]
struct Seen<'a> {
    id: Uuid,
    fingerprint: &'a str,
    state: ScanState,
}

/// What the requests decided so far admitted: the part of the batch a later request is decided
/// against besides the snapshot.
#[derive(Default)]
struct AdmittedSoFar<'r> {
    keys: HashMap<(Uuid, &'r str, &'r str), Seen<'r>>,
    targets: HashMap<(Uuid, &'r str), Uuid>,
    per_organization: HashMap<Uuid, i64>,
    scans: AdmittedScans,
}

/// Per admitted request, its index in the batch and its new scan's id.
type AdmittedScans = Vec<(usize, Uuid)>;

/// Decides each request in Rust, in the order given, against the snapshot (`found`, `quotas`)
/// and what the requests before it admitted. Returns each request's outcome, `None` for an
/// admitted one (filled in once it is written), and the admitted requests' indices and new
/// scan ids.
fn decide_in_order<'r>(
    requests: &'r [AdmitParams<'_>],
    found: &'r [Found],
    quotas: &HashMap<Uuid, Option<i32>>,
) -> Result<(Vec<Option<AdmitOutcome>>, AdmittedScans), StoreError> {
    let mut so_far = AdmittedSoFar::default();
    let mut outcomes = Vec::with_capacity(requests.len());
    for (index, (request, found)) in requests.iter().zip(found).enumerate() {
        let outcome = so_far.replay_or_refusal(request, found, quotas)?;
        if outcome.is_none() {
            so_far.admit(index, request);
        }
        outcomes.push(outcome);
    }
    Ok((outcomes, so_far.scans))
}

impl<'r> AdmittedSoFar<'r> {
    /// The answer `request` gets when it is not admitted, the first that applies: a replay,
    /// `client_revoked`, `unknown_organization`, `scan_already_active`, `quota_exceeded`.
    /// `None` when it is admitted.
    fn replay_or_refusal(
        &self,
        request: &AdmitParams<'r>,
        found: &Found,
        quotas: &HashMap<Uuid, Option<i32>>,
    ) -> Result<Option<AdmitOutcome>, StoreError> {
        let key = (
            request.organization_id,
            request.client_id,
            request.idempotency_key,
        );
        let seen = match (&found.key_scan_id, &found.key_fingerprint, &found.key_state) {
            (Some(id), Some(fingerprint), Some(state)) => Some(Seen {
                id: *id,
                fingerprint: fingerprint.as_str(),
                state: reported(state, found.key_started)?,
            }),
            _ => self.keys.get(&key).copied(),
        };
        if let Some(seen) = seen {
            return Ok(Some(replay_outcome(seen, request)));
        }
        // Decided against the registration now, not when the request was queued: a request
        // PubAcked before `client revoke` is refused after it. A client id without a
        // registration is not refused (an open server's clients need none).
        if found.client_revoked {
            return Ok(Some(AdmitOutcome::Refused(client_revoked(request))));
        }
        let Some(quota) = quotas.get(&request.organization_id) else {
            return Ok(Some(AdmitOutcome::Refused(unknown_organization(request))));
        };
        let active = found.active_scan_id.or_else(|| {
            self.targets
                .get(&(request.organization_id, request.target))
                .copied()
        });
        if let Some(active_scan_id) = active {
            return Ok(Some(AdmitOutcome::Refused(scan_already_active(
                active_scan_id,
            ))));
        }
        if let Some(quota) = quota {
            let recent = found.recent
                + self
                    .per_organization
                    .get(&request.organization_id)
                    .copied()
                    .unwrap_or_default();
            if recent >= i64::from(*quota) {
                return Ok(Some(AdmitOutcome::Refused(quota_exceeded(recent, *quota))));
            }
        }
        Ok(None)
    }

    /// Admits the request at `index`: a new scan that later requests of its key, target and
    /// organization are decided against.
    fn admit(&mut self, index: usize, request: &AdmitParams<'r>) {
        let scan_id = Uuid::now_v7();
        self.keys.insert(
            (
                request.organization_id,
                request.client_id,
                request.idempotency_key,
            ),
            Seen {
                id: scan_id,
                fingerprint: request.fingerprint,
                state: ScanState::Pending,
            },
        );
        self.targets
            .insert((request.organization_id, request.target), scan_id);
        *self
            .per_organization
            .entry(request.organization_id)
            .or_default() += 1;
        self.scans.push((index, scan_id));
    }
}

/// Takes the transaction-scoped advisory locks of every (organization, target) and every
/// (organization, client, key) of the batch, in key order, in one statement.
async fn lock(conn: &mut PgConnection, requests: &[AdmitParams<'_>]) -> Result<(), StoreError> {
    let organizations: Vec<Uuid> = requests.iter().map(|r| r.organization_id).collect();
    let targets: Vec<&str> = requests.iter().map(|r| r.target).collect();
    let clients: Vec<&str> = requests.iter().map(|r| r.client_id).collect();
    let keys: Vec<&str> = requests.iter().map(|r| r.idempotency_key).collect();
    // Seed 0 is the target lock older admissions take; seed 1 keeps the key locks apart.
    sql::scans::LockAdmissionKeys {
        organizations: &organizations,
        targets: &targets,
        clients: &clients,
        keys: &keys,
    }
    .query()
    .execute(conn)
    .await?;
    Ok(())
}

/// The batch's organizations that exist, with their quota; locks those with a quota.
async fn organizations(
    conn: &mut PgConnection,
    requests: &[AdmitParams<'_>],
) -> Result<HashMap<Uuid, Option<i32>>, StoreError> {
    let mut ids: Vec<Uuid> = requests.iter().map(|r| r.organization_id).collect();
    ids.sort_unstable();
    ids.dedup();
    let rows: Vec<(Uuid, Option<i32>)> = sql::organizations::ForAdmission { ids: &ids }
        .query_as()
        .fetch_all(conn)
        .await?;
    Ok(rows.into_iter().collect())
}

/// What the database holds for one request, read under the locks.
#[derive(Debug, sqlx::FromRow)]
struct Found {
    key_scan_id: Option<Uuid>,
    key_fingerprint: Option<String>,
    key_state: Option<String>,
    key_started: bool,
    /// The request's client is registered and revoked.
    client_revoked: bool,
    active_scan_id: Option<Uuid>,
    /// The organization's scans created in the last hour, when it has a quota.
    recent: i64,
}

/// Per request, in order: the scan its key names, whether its client is revoked (the batch's
/// registered clients locked `FOR SHARE`), its target's active scan, and its organization's
/// admissions of the last hour (counted for organizations with a quota only).
async fn look_up(
    conn: &mut PgConnection,
    requests: &[AdmitParams<'_>],
    quotas: &HashMap<Uuid, Option<i32>>,
) -> Result<Vec<Found>, StoreError> {
    let organizations: Vec<Uuid> = requests.iter().map(|r| r.organization_id).collect();
    let clients: Vec<&str> = requests.iter().map(|r| r.client_id).collect();
    let keys: Vec<&str> = requests.iter().map(|r| r.idempotency_key).collect();
    let targets: Vec<&str> = requests.iter().map(|r| r.target).collect();
    let counted: Vec<Uuid> = quotas
        .iter()
        .filter(|(_, quota)| quota.is_some())
        .map(|(id, _)| *id)
        .collect();
    // The states in which a scan occupies its target (I6).
    let active = ScanState::ACTIVE.map(ScanState::as_str);
    let found: Vec<Found> = sql::scans::LookUpForAdmission {
        organizations: &organizations,
        clients: &clients,
        keys: &keys,
        targets: &targets,
        counted: &counted,
        active,
    }
    .query_as()
    .fetch_all(conn)
    .await?;
    if found.len() != requests.len() {
        return Err(StoreError::Corrupt(format!(
            "{} rows read for {} scan requests",
            found.len(),
            requests.len()
        )));
    }
    Ok(found)
}

/// Writes the admitted requests' targets, scans, first scan jobs and tasks, and events.
/// Returns per admitted request its index, scan id and task id; no task id when its key was
/// committed concurrently (possible only in a batch of one: a larger batch fails with
/// [`StoreError::Raced`] and is decided again one by one).
async fn write(
    conn: &mut PgConnection,
    staged: &mut Staged,
    subjects: &Subjects,
    requests: &[AdmitParams<'_>],
    admitted: &[(usize, Uuid)],
) -> Result<Vec<(usize, Uuid, Option<Uuid>)>, StoreError> {
    if admitted.is_empty() {
        return Ok(Vec::new());
    }
    // In target order, so that concurrent upserts of shared targets lock them in one order.
    let mut ordered: Vec<(usize, Uuid)> = admitted.to_vec();
    ordered.sort_by_key(|(index, _)| (requests[*index].organization_id, requests[*index].target));
    let n = ordered.len();
    let admitted_at = write_scans(&mut *conn, requests, &ordered).await?;
    if admitted_at.len() != n {
        // The key locks exclude every admission that takes them: a replica that does not
        // (an older version, mid-rollout) committed one of these keys for another target.
        if requests.len() > 1 {
            return Err(StoreError::Raced(format!(
                "{} of {n} scans were not inserted: their keys were committed concurrently",
                n - admitted_at.len()
            )));
        }
        return Ok(ordered
            .into_iter()
            .map(|(index, scan_id)| (index, scan_id, None))
            .collect());
    }

    let jobs = first_jobs(requests, &ordered)?;
    let task_ids = progress::create_jobs(conn, &jobs).await?;

    let events = admitted_events(subjects, requests, &ordered, &jobs, &task_ids, &admitted_at);
    outbox::stage(conn, staged, events).await?;
    Ok(ordered
        .iter()
        .zip(&task_ids)
        .map(|((index, scan_id), task_id)| (*index, *scan_id, Some(*task_id)))
        .collect())
}

/// Writes the targets and scans of the admitted requests (`ordered`, in target order) in one
/// statement. Returns each inserted scan's admission time (Unix ms); a scan whose key was
/// committed concurrently is missing.
async fn write_scans(
    conn: &mut PgConnection,
    requests: &[AdmitParams<'_>],
    ordered: &[(usize, Uuid)],
) -> Result<HashMap<Uuid, i64>, StoreError> {
    let n = ordered.len();
    let mut scan_ids = Vec::with_capacity(n);
    let mut target_ids = Vec::with_capacity(n);
    let mut organizations = Vec::with_capacity(n);
    let mut locators = Vec::with_capacity(n);
    let mut clients = Vec::with_capacity(n);
    let mut keys = Vec::with_capacity(n);
    let mut fingerprints = Vec::with_capacity(n);
    let mut plugins = Vec::with_capacity(n);
    let mut priorities = Vec::with_capacity(n);
    let mut deadlines = Vec::with_capacity(n);
    let mut trace_contexts = Vec::with_capacity(n);
    for (index, scan_id) in ordered {
        let request = &requests[*index];
        scan_ids.push(*scan_id);
        target_ids.push(Uuid::now_v7());
        organizations.push(request.organization_id);
        locators.push(request.target);
        clients.push(request.client_id);
        keys.push(request.idempotency_key);
        fingerprints.push(request.fingerprint);
        plugins.push(serde_json::json!(request.plugins));
        priorities.push(request.priority);
        deadlines.push(request.execution_deadline_seconds);
        trace_contexts.push(request.trace_context);
    }
    let inserted: Vec<(Uuid, i64)> = sql::scans::AdmitMany {
        scan_ids: &scan_ids,
        target_ids: &target_ids,
        organizations: &organizations,
        locators: &locators,
        clients: &clients,
        keys: &keys,
        fingerprints: &fingerprints,
        plugins: &plugins,
        priorities: &priorities,
        deadlines: &deadlines,
        trace_contexts: &trace_contexts,
        pending_scan_state: ScanState::Pending.as_str(),
    }
    .query_as()
    .fetch_all(conn)
    .await?;
    Ok(inserted.into_iter().collect())
}

/// The first scan job of each admitted request (`ordered`): its first plugin at position 0.
fn first_jobs<'r>(
    requests: &'r [AdmitParams<'_>],
    ordered: &[(usize, Uuid)],
) -> Result<Vec<NewScanJob<'r>>, StoreError> {
    ordered
        .iter()
        .map(|(index, scan_id)| {
            let request = &requests[*index];
            let plugin = request.plugins.first().ok_or_else(|| {
                StoreError::Corrupt(format!("scan request {index} names no plugin"))
            })?;
            Ok(NewScanJob {
                scan_id: *scan_id,
                organization_id: request.organization_id,
                position: 0,
                plugin,
                target: request.target,
                priority: request.priority,
                execution_deadline_seconds: request.execution_deadline_seconds,
                max_attempts: request.max_attempts,
            })
        })
        .collect()
}

/// Per admitted request (`ordered`, with its first job and task), its `ScanAdmitted` and its
/// task's `TaskReady`.
fn admitted_events(
    subjects: &Subjects,
    requests: &[AdmitParams<'_>],
    ordered: &[(usize, Uuid)],
    jobs: &[NewScanJob<'_>],
    task_ids: &[Uuid],
    admitted_at: &HashMap<Uuid, i64>,
) -> Vec<OutboxEvent> {
    let mut events = Vec::with_capacity(2 * ordered.len());
    for (((index, scan_id), job), task_id) in ordered.iter().zip(jobs).zip(task_ids) {
        let request = &requests[*index];
        let admitted = v1::ScanAdmitted {
            scan_id: scan_id.to_string(),
            organization_id: request.organization_id.to_string(),
            client_id: request.client_id.to_owned(),
            idempotency_key: request.idempotency_key.to_owned(),
            target: request.target.to_owned(),
            plugins: request.plugins.to_vec(),
            admitted_at_unix_ms: admitted_at[scan_id],
        };
        let ready = v1::TaskReady {
            task_id: task_id.to_string(),
            scan_id: scan_id.to_string(),
            organization_id: request.organization_id.to_string(),
            plugin: job.plugin.to_owned(),
            required_capabilities: vec![job.plugin.to_owned()],
        };
        events.push(
            OutboxEvent::for_tenant(
                subjects,
                &request.organization_id,
                EventKind::ScanAdmitted,
                admitted.encode_to_vec(),
            )
            .in_trace_of(*scan_id),
        );
        events.push(
            OutboxEvent::new(subjects, EventKind::TaskReady, ready.encode_to_vec())
                .in_trace_of(*scan_id),
        );
    }
    events
}

#[derive(sqlx::FromRow)]
struct ExistingScan {
    id: Uuid,
    request_fingerprint: String,
    state: String,
    started: bool,
}

impl ExistingScan {
    fn borrowed(&self) -> Result<Seen<'_>, StoreError> {
        Ok(Seen {
            id: self.id,
            fingerprint: &self.request_fingerprint,
            state: reported(&self.state, self.started)?,
        })
    }
}

/// A stored scan state as a replay reports it.
fn reported(stored: &str, started: bool) -> Result<ScanState, StoreError> {
    ScanState::parse(stored)
        .map(|state| state.reported(started))
        .ok_or_else(|| StoreError::Corrupt(format!("scan state {stored:?}")))
}

async fn find_by_key(
    conn: &mut PgConnection,
    request: &AdmitParams<'_>,
) -> Result<Option<ExistingScan>, StoreError> {
    Ok(sql::scans::FindByKey {
        organization_id: request.organization_id,
        client_id: request.client_id,
        idempotency_key: request.idempotency_key,
    }
    .query_as::<ExistingScan>()
    .fetch_optional(conn)
    .await?)
}

/// A repeated key: the original scan when the request is the same, else a conflict.
fn replay_outcome(seen: Seen<'_>, request: &AdmitParams<'_>) -> AdmitOutcome {
    if seen.fingerprint != request.fingerprint {
        return AdmitOutcome::Refused(v1::Error::new(
            ErrorCode::IdempotencyConflict,
            format!(
                "idempotency key {:?} of client {:?} was used for scan {} with a different request; use a new key for a new request",
                request.idempotency_key, request.client_id, seen.id
            ),
        ));
    }
    AdmitOutcome::Duplicate {
        scan_id: seen.id,
        state: seen.state,
    }
}

fn unknown_organization(request: &AdmitParams<'_>) -> v1::Error {
    v1::Error::new(
        ErrorCode::UnknownOrganization,
        format!("organization {} does not exist", request.organization_id),
    )
}

fn client_revoked(request: &AdmitParams<'_>) -> v1::Error {
    v1::Error::new(
        ErrorCode::ClientRevoked,
        format!(
            "client {:?} is revoked: its requests are refused, also those queued before the revocation; an operator can enable it again (`palisade client enable`)",
            request.client_id
        ),
    )
}

fn scan_already_active(active_scan_id: Uuid) -> v1::Error {
    let mut error = v1::Error::new(
        ErrorCode::ScanAlreadyActive,
        format!(
            "target already has active scan {active_scan_id}; wait for it to finish or cancel it"
        ),
    );
    error.active_scan_id = active_scan_id.to_string();
    error
}

fn quota_exceeded(recent: i64, quota: i32) -> v1::Error {
    v1::Error::new(
        ErrorCode::QuotaExceeded,
        format!(
            "organization admitted {recent} scans in the last hour, its quota is {quota}; retry later or raise the quota"
        ),
    )
}
