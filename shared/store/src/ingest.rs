//! The ingestion decision script (SPEC §4.3): a fetched batch of worker messages decided in one
//! transaction with a fixed number of statements, whatever the batch holds.
//!
//! The common shape of a batch, result batches of many attempts each followed by at most one
//! completion, is decided set-wise:
//! 1. one statement locks every named attempt and its task (`FOR UPDATE`, in task order) and
//!    reads their scan jobs; one reads the batch rows the results could collide with;
//! 2. the fence, replays, checksum and sequence conflicts are decided in Rust against that
//!    snapshot, message by message in order, so each message gets the answer it would get alone;
//! 3. accepted batches, their assets and their findings are written with one statement each;
//! 4. one statement counts each completing attempt's batches; completions that pass move their
//!    attempt, task and scan job in one statement, and [`progress`] advances their scans.
//!
//! Everything else (failures, and a second message for an attempt that already completed or
//! failed in this batch) is decided afterwards one by one, each in a savepoint, by the
//! functions of [`one_by_one`], which see what the set-wise part wrote. When a set-wise
//! statement fails for a reason that retrying cannot fix (a row the schema refuses), the
//! caller decides the batch again with [`decide_each`], so one bad message cannot fail its
//! neighbours.

pub mod one_by_one;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use messages::v1;
use messages::{EventKind, Subjects};
use prost::Message as _;
use sqlx::{PgConnection, Postgres, Transaction};
use uuid::Uuid;

use crate::StoreError;
use crate::evidence::{finding_key, redact};
use crate::fence::{LeaseClaim, LockedAttempt, lease_lost};
use crate::outbox::{self, OutboxEvent, Staged};
use crate::progress::{self, CompletedJob};
use crate::sql;
use crate::states::{AttemptStatus, ResultBatchStatus, ScanJobState, TaskState};
pub use one_by_one::{BatchParams, FailParams, IngestOutcome};

/// One message of a batch, validated.
#[derive(Debug, Clone)]
pub enum Message<'a> {
    Result(BatchParams<'a>),
    Complete(CompleteParams<'a>),
    Fail(FailParams<'a>),
}

impl Message<'_> {
    pub fn claim(&self) -> &LeaseClaim {
        match self {
            Message::Result(params) => params.claim,
            Message::Complete(params) => params.claim,
            Message::Fail(params) => params.claim,
        }
    }
}

/// The ingestion script over `messages`, for [`crate::decide_batch`].
pub struct Ingest<'a, 'm> {
    pub subjects: &'a Subjects,
    pub messages: &'a [Message<'m>],
}

impl crate::Script for Ingest<'_, '_> {
    type Outcomes = Vec<Result<IngestOutcome, StoreError>>;

    fn set_wise(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        staged: &mut Staged,
    ) -> impl Future<Output = Result<Self::Outcomes, StoreError>> + Send {
        decide(tx, staged, self.subjects, self.messages)
    }

    fn one_by_one(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        staged: &mut Staged,
    ) -> impl Future<Output = Result<Self::Outcomes, StoreError>> + Send {
        decide_each(tx, staged, self.subjects, self.messages)
    }
}

/// A completion: every batch below `batch_count` must be persisted.
#[derive(Debug, Clone)]
pub struct CompleteParams<'a> {
    pub claim: &'a LeaseClaim,
    pub batch_count: i32,
    pub summary: &'a str,
}

/// Decides `messages` inside `tx`: set-wise where it can, then the rest one by one. The
/// outcomes are in the order of `messages`; an `Err` in one is that message's own failure (its
/// savepoint was rolled back), while the outer `Err` fails the whole transaction.
pub async fn decide(
    tx: &mut Transaction<'_, Postgres>,
    staged: &mut Staged,
    subjects: &Subjects,
    messages: &[Message<'_>],
) -> Result<Vec<Result<IngestOutcome, StoreError>>, StoreError> {
    let (set_wise, one_by_one) = split(messages);
    let mut outcomes: Vec<Option<Result<IngestOutcome, StoreError>>> =
        messages.iter().map(|_| None).collect();
    let decided = decide_set_wise(tx, staged, subjects, messages, &set_wise).await?;
    let mut deferred = one_by_one;
    for (index, outcome) in decided {
        match outcome {
            Some(outcome) => outcomes[index] = Some(Ok(outcome)),
            // Rows the set-wise path does not handle (a task without a scan job).
            None => deferred.push(index),
        }
    }
    deferred.sort_unstable();
    for index in deferred {
        outcomes[index] = Some(decide_one(tx, staged, subjects, &messages[index]).await?);
    }
    Ok(outcomes
        .into_iter()
        .map(|outcome| outcome.expect("every message decided"))
        .collect())
}

/// Decides `messages` one by one, each in a savepoint: the fallback when a set-wise statement
/// failed for a reason retrying cannot fix, so that the message at fault is found and refused
/// alone.
pub async fn decide_each(
    tx: &mut Transaction<'_, Postgres>,
    staged: &mut Staged,
    subjects: &Subjects,
    messages: &[Message<'_>],
) -> Result<Vec<Result<IngestOutcome, StoreError>>, StoreError> {
    let mut outcomes = Vec::with_capacity(messages.len());
    for message in messages {
        outcomes.push(decide_one(tx, staged, subjects, message).await?);
    }
    Ok(outcomes)
}

/// One message in its own savepoint; the savepoint is kept only when the message was accepted.
async fn decide_one(
    tx: &mut Transaction<'_, Postgres>,
    staged: &mut Staged,
    subjects: &Subjects,
    message: &Message<'_>,
) -> Result<Result<IngestOutcome, StoreError>, StoreError> {
    let mark = staged.mark();
    let mut savepoint = crate::savepoint(tx).await?;
    let outcome = match message {
        Message::Result(params) => one_by_one::accept_batch(&mut savepoint, params).await,
        Message::Complete(params) => {
            one_by_one::complete(
                &mut savepoint,
                staged,
                subjects,
                params.claim,
                params.batch_count,
                params.summary,
            )
            .await
        }
        Message::Fail(params) => one_by_one::fail(&mut savepoint, staged, subjects, params).await,
    };
    match outcome {
        Ok(IngestOutcome::Accepted) => savepoint.commit().await?,
        _ => {
            savepoint.rollback().await?;
            staged.roll_back_to(mark);
        }
    }
    Ok(outcome)
}

/// Which messages are decided set-wise: per attempt, its result batches up to and including
/// its first completion. Failures, and anything after an attempt's completion, go one by one.
fn split(messages: &[Message<'_>]) -> (Vec<usize>, Vec<usize>) {
    let mut closed: HashSet<Uuid> = HashSet::new();
    let (mut set_wise, mut one_by_one) = (Vec::new(), Vec::new());
    for (index, message) in messages.iter().enumerate() {
        let attempt_id = message.claim().attempt_id;
        match message {
            Message::Fail(_) => {
                closed.insert(attempt_id);
                one_by_one.push(index);
            }
            _ if closed.contains(&attempt_id) => one_by_one.push(index),
            Message::Complete(_) => {
                closed.insert(attempt_id);
                set_wise.push(index);
            }
            Message::Result(_) => set_wise.push(index),
        }
    }
    (set_wise, one_by_one)
}

/// An attempt and its task as locked by the batch, with the task's scan job.
#[derive(Debug, Clone, sqlx::FromRow)]
struct LockedRow {
    attempt_id: Uuid,
    attempt_task_id: Uuid,
    #[sqlx(flatten)]
    locked: LockedAttempt,
    position: Option<i32>,
    evidence_published: Option<bool>,
}

/// A batch row that a result of this batch may replay or collide with.
#[derive(Debug, sqlx::FromRow)]
struct BatchRow {
    task_id: Uuid,
    attempt_id: Uuid,
    sequence_number: i32,
    idempotency_key: String,
    payload_sha256: String,
}

/// The scan and scan job a live attempt writes into.
#[derive(Debug, Clone, Copy)]
struct Job {
    organization_id: Uuid,
    scan_id: Uuid,
    scan_job_id: Uuid,
    position: i32,
}

impl LockedRow {
    fn job(&self) -> Option<Job> {
        Some(Job {
            organization_id: self.locked.organization_id,
            scan_id: self.locked.scan_id?,
            scan_job_id: self.locked.scan_job_id?,
            position: self.position?,
        })
    }
}

/// Decides the set-wise messages; `None` for a message left to the one-by-one path.
async fn decide_set_wise(
    conn: &mut PgConnection,
    staged: &mut Staged,
    subjects: &Subjects,
    messages: &[Message<'_>],
    indices: &[usize],
) -> Result<Vec<(usize, Option<IngestOutcome>)>, StoreError> {
    if indices.is_empty() {
        return Ok(Vec::new());
    }
    let rows = lock(conn, messages, indices).await?;
    let batch_rows = colliding_batches(conn, messages, indices).await?;

    // The results, in order, against the snapshot and what earlier messages accepted.
    let mut keys: HashMap<(Uuid, &str), String> = HashMap::new();
    let mut sequences: HashSet<(Uuid, i32)> = HashSet::new();
    for row in &batch_rows {
        keys.insert(
            (row.task_id, row.idempotency_key.as_str()),
            row.payload_sha256.clone(),
        );
        sequences.insert((row.attempt_id, row.sequence_number));
    }
    let mut decided: Vec<(usize, Option<IngestOutcome>)> = Vec::with_capacity(indices.len());
    let mut accepted: Vec<(&BatchParams<'_>, &LockedRow, Job)> = Vec::new();
    let mut completing: Vec<(usize, &CompleteParams<'_>, &LockedRow, Job)> = Vec::new();
    for &index in indices {
        match &messages[index] {
            Message::Result(params) => {
                let claim = params.claim;
                if let Some(checksum) = keys.get(&(claim.task_id, params.idempotency_key)) {
                    decided.push((
                        index,
                        Some(one_by_one::same_checksum_or_conflict(checksum, params)),
                    ));
                    continue;
                }
                let (row, job) = match live_job(&rows, claim)? {
                    Ok(live) => live,
                    Err(decision) => {
                        decided.push((index, decision));
                        continue;
                    }
                };
                if !sequences.insert((claim.attempt_id, params.sequence_number)) {
                    decided.push((
                        index,
                        Some(IngestOutcome::Refused(one_by_one::sequence_taken(params))),
                    ));
                    continue;
                }
                keys.insert(
                    (claim.task_id, params.idempotency_key),
                    params.payload_sha256.to_owned(),
                );
                accepted.push((params, row, job));
                decided.push((index, Some(IngestOutcome::Accepted)));
            }
            Message::Complete(params) => {
                let claim = params.claim;
                match rows.get(&claim.attempt_id) {
                    Some(row)
                        if row.attempt_task_id == claim.task_id
                            && row.locked.is_presented_by(claim)
                            && row.locked.attempt_status()? == AttemptStatus::Succeeded =>
                    {
                        decided.push((index, Some(IngestOutcome::Duplicate)));
                        continue;
                    }
                    _ => {}
                }
                let (row, job) = match live_job(&rows, claim)? {
                    Ok(live) => live,
                    Err(decision) => {
                        decided.push((index, decision));
                        continue;
                    }
                };
                // Decided after the batches are written and counted: remember its slot.
                completing.push((decided.len(), params, row, job));
                decided.push((index, Some(IngestOutcome::Accepted)));
            }
            Message::Fail(_) => unreachable!("failures are decided one by one"),
        }
    }

    write_batches(conn, &accepted).await?;
    let counts = count_batches(conn, &completing).await?;
    let mut completed: Vec<(&CompleteParams<'_>, &LockedRow, Job)> = Vec::new();
    for (slot, params, row, job) in completing {
        let verdict = completion_verdict(conn, params, row, job, &counts).await?;
        match verdict {
            Some(refusal) => decided[slot].1 = Some(IngestOutcome::Refused(refusal)),
            None => completed.push((params, row, job)),
        }
    }

    let running: Vec<&LockedRow> = accepted.iter().map(|(_, row, _)| *row).collect();
    let published = finish_attempts(conn, &running, &completed).await?;
    let mut events = Vec::with_capacity(completed.len() * 2);
    let mut jobs = Vec::with_capacity(completed.len());
    for (params, row, job) in &completed {
        let (finding_count, asset_count) = published
            .get(&job.scan_job_id)
            .copied()
            .ok_or_else(|| StoreError::Corrupt(format!("scan job {} vanished", job.scan_job_id)))?;
        events.push(
            OutboxEvent::new(
                subjects,
                EventKind::TaskCompleted,
                v1::TaskCompleted {
                    task_id: params.claim.task_id.to_string(),
                    attempt_id: params.claim.attempt_id.to_string(),
                    scan_id: job.scan_id.to_string(),
                    plugin: row.locked.plugin.clone(),
                    finding_count: finding_count as u32,
                    asset_count: asset_count as u32,
                }
                .encode_to_vec(),
            )
            .in_trace_of(job.scan_id),
        );
        jobs.push(CompletedJob {
            organization_id: job.organization_id,
            scan_id: job.scan_id,
            position: job.position,
            max_attempts: row.locked.max_attempts,
        });
    }
    events.extend(progress::advance(conn, subjects, &jobs).await?);
    outbox::stage(conn, staged, events).await?;
    Ok(decided)
}

/// The fence (SPEC I1) against the locked rows, and the scan job the live attempt writes
/// into: `Err(Some(refusal))` when the claim may not write, `Err(None)` for a task without a
/// scan job (left to the one-by-one path).
fn live_job<'r>(
    rows: &'r HashMap<Uuid, LockedRow>,
    claim: &LeaseClaim,
) -> Result<Result<(&'r LockedRow, Job), Option<IngestOutcome>>, StoreError> {
    let Some(row) = rows
        .get(&claim.attempt_id)
        .filter(|row| row.attempt_task_id == claim.task_id)
    else {
        return Ok(Err(Some(IngestOutcome::Refused(lease_lost(claim)))));
    };
    if let Some(refusal) = row.locked.refusal(claim)? {
        return Ok(Err(Some(IngestOutcome::Refused(refusal))));
    }
    Ok(row.job().map(|job| (row, job)).ok_or(None))
}

/// Locks every named attempt and its task, in task order (the order every writer of tasks
/// locks in), and reads the task's scan job.
async fn lock(
    conn: &mut PgConnection,
    messages: &[Message<'_>],
    indices: &[usize],
) -> Result<HashMap<Uuid, LockedRow>, StoreError> {
    let attempt_ids: Vec<Uuid> = indices
        .iter()
        .map(|&index| messages[index].claim().attempt_id)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let rows: Vec<LockedRow> = sql::query_as(sql::worker_task_attempts::LOCK_FOR_INGEST)
        .bind(&attempt_ids)
        .fetch_all(conn)
        .await?;
    Ok(rows.into_iter().map(|row| (row.attempt_id, row)).collect())
}

/// The batch rows with the same (task, key) or (attempt, sequence number) as a result of this
/// batch. Read after `lock`: every batch row of a locked task is written under its lock.
async fn colliding_batches(
    conn: &mut PgConnection,
    messages: &[Message<'_>],
    indices: &[usize],
) -> Result<Vec<BatchRow>, StoreError> {
    let results: Vec<&BatchParams<'_>> = indices
        .iter()
        .filter_map(|&index| match &messages[index] {
            Message::Result(params) => Some(params),
            _ => None,
        })
        .collect();
    if results.is_empty() {
        return Ok(Vec::new());
    }
    let task_ids: Vec<Uuid> = results.iter().map(|params| params.claim.task_id).collect();
    let keys: Vec<&str> = results
        .iter()
        .map(|params| params.idempotency_key)
        .collect();
    let attempt_ids: Vec<Uuid> = results
        .iter()
        .map(|params| params.claim.attempt_id)
        .collect();
    let sequences: Vec<i32> = results
        .iter()
        .map(|params| params.sequence_number)
        .collect();
    Ok(sql::query_as(sql::worker_result_batches::COLLIDING)
        .bind(&task_ids)
        .bind(&keys)
        .bind(&attempt_ids)
        .bind(&sequences)
        .fetch_all(conn)
        .await?)
}

/// Writes the accepted batches with their assets and findings: one statement each.
async fn write_batches(
    conn: &mut PgConnection,
    accepted: &[(&BatchParams<'_>, &LockedRow, Job)],
) -> Result<(), StoreError> {
    if accepted.is_empty() {
        return Ok(());
    }
    let n = accepted.len();
    let mut ids = Vec::with_capacity(n);
    let mut task_ids = Vec::with_capacity(n);
    let mut attempt_ids = Vec::with_capacity(n);
    let mut sequences = Vec::with_capacity(n);
    let mut keys = Vec::with_capacity(n);
    let mut checksums = Vec::with_capacity(n);
    let mut finding_counts = Vec::with_capacity(n);
    let mut asset_counts = Vec::with_capacity(n);
    for (params, _, _) in accepted {
        ids.push(Uuid::now_v7());
        task_ids.push(params.claim.task_id);
        attempt_ids.push(params.claim.attempt_id);
        sequences.push(params.sequence_number);
        keys.push(params.idempotency_key);
        checksums.push(params.payload_sha256);
        finding_counts.push(params.findings.len() as i32);
        asset_counts.push(params.assets.len() as i32);
    }
    sql::query(sql::worker_result_batches::INSERT_MANY)
        .bind(&ids)
        .bind(&task_ids)
        .bind(&attempt_ids)
        .bind(&sequences)
        .bind(&keys)
        .bind(&checksums)
        .bind(&finding_counts)
        .bind(&asset_counts)
        .bind(ResultBatchStatus::Persisted.as_str())
        .execute(&mut *conn)
        .await?;
    let evidence: Vec<Evidence<'_, '_>> = accepted
        .iter()
        .map(|(params, row, job)| Evidence {
            params,
            plugin: &row.locked.plugin,
            organization_id: job.organization_id,
            scan_id: job.scan_id,
            scan_job_id: job.scan_job_id,
        })
        .collect();
    write_evidence(conn, &evidence).await
}

/// An accepted batch's evidence and where it belongs.
pub(crate) struct Evidence<'e, 'p> {
    pub params: &'e BatchParams<'p>,
    /// The task's plugin, part of every finding's key.
    pub plugin: &'e str,
    pub organization_id: Uuid,
    pub scan_id: Uuid,
    pub scan_job_id: Uuid,
}

/// Upserts the batches' assets (linked to their scans) and findings: one statement each,
/// whatever the number of batches. The one writer of evidence, set-wise and one by one.
pub(crate) async fn write_evidence(
    conn: &mut PgConnection,
    evidence: &[Evidence<'_, '_>],
) -> Result<(), StoreError> {
    write_assets(conn, evidence).await?;
    write_findings(conn, evidence).await
}

async fn write_assets(
    conn: &mut PgConnection,
    accepted: &[Evidence<'_, '_>],
) -> Result<(), StoreError> {
    // Assets once per (organization, kind, value), sorted, so that concurrent upserts lock
    // shared assets in one order; links once per (scan, asset), the last writer winning.
    let mut assets: BTreeSet<(Uuid, &str, &str)> = BTreeSet::new();
    let mut links: BTreeMap<(Uuid, Uuid, &str, &str), (Uuid, Uuid)> = BTreeMap::new();
    for batch in accepted {
        for asset in batch.params.assets {
            let identity = (
                batch.organization_id,
                asset.kind.as_str(),
                asset.value.as_str(),
            );
            assets.insert(identity);
            links.insert(
                (batch.scan_id, identity.0, identity.1, identity.2),
                (batch.scan_job_id, batch.params.claim.attempt_id),
            );
        }
    }
    if assets.is_empty() {
        return Ok(());
    }
    let asset_ids: Vec<Uuid> = assets.iter().map(|_| Uuid::now_v7()).collect();
    let organizations: Vec<Uuid> = assets.iter().map(|asset| asset.0).collect();
    let kinds: Vec<&str> = assets.iter().map(|asset| asset.1).collect();
    let values: Vec<&str> = assets.iter().map(|asset| asset.2).collect();
    let link_scans: Vec<Uuid> = links.keys().map(|link| link.0).collect();
    let link_organizations: Vec<Uuid> = links.keys().map(|link| link.1).collect();
    let link_kinds: Vec<&str> = links.keys().map(|link| link.2).collect();
    let link_values: Vec<&str> = links.keys().map(|link| link.3).collect();
    let link_jobs: Vec<Uuid> = links.values().map(|link| link.0).collect();
    let link_attempts: Vec<Uuid> = links.values().map(|link| link.1).collect();
    sql::query(sql::assets::UPSERT_MANY)
        .bind(&asset_ids)
        .bind(&organizations)
        .bind(&kinds)
        .bind(&values)
        .bind(&link_scans)
        .bind(&link_organizations)
        .bind(&link_kinds)
        .bind(&link_values)
        .bind(&link_jobs)
        .bind(&link_attempts)
        .execute(conn)
        .await?;
    Ok(())
}

async fn write_findings(
    conn: &mut PgConnection,
    accepted: &[Evidence<'_, '_>],
) -> Result<(), StoreError> {
    // One row per (scan, key), the last message winning, in key order: one statement never
    // touches a row twice, and concurrent writers lock in one order.
    let mut by_key: BTreeMap<(Uuid, String), (&v1::Finding, &Evidence<'_, '_>)> = BTreeMap::new();
    for batch in accepted {
        for finding in batch.params.findings {
            let key = finding_key(
                batch.plugin,
                &finding.rule_id,
                &finding.resource,
                &finding.discriminator,
            );
            by_key.insert((batch.scan_id, key), (finding, batch));
        }
    }
    if by_key.is_empty() {
        return Ok(());
    }
    let n = by_key.len();
    let mut ids = Vec::with_capacity(n);
    let mut organizations = Vec::with_capacity(n);
    let mut scans = Vec::with_capacity(n);
    let mut jobs = Vec::with_capacity(n);
    let mut attempts = Vec::with_capacity(n);
    let mut keys = Vec::with_capacity(n);
    let mut plugins = Vec::with_capacity(n);
    let mut rule_ids = Vec::with_capacity(n);
    let mut resources = Vec::with_capacity(n);
    let mut discriminators = Vec::with_capacity(n);
    let mut severities = Vec::with_capacity(n);
    let mut titles = Vec::with_capacity(n);
    let mut descriptions = Vec::with_capacity(n);
    let mut evidence = Vec::with_capacity(n);
    let mut cves = Vec::with_capacity(n);
    for ((scan_id, key), (finding, batch)) in &by_key {
        ids.push(Uuid::now_v7());
        organizations.push(batch.organization_id);
        scans.push(*scan_id);
        jobs.push(batch.scan_job_id);
        attempts.push(batch.params.claim.attempt_id);
        keys.push(key.as_str());
        plugins.push(batch.plugin);
        rule_ids.push(finding.rule_id.as_str());
        resources.push(redact(&finding.resource));
        discriminators.push(redact(&finding.discriminator));
        severities.push(finding.severity.as_str());
        titles.push(redact(&finding.title));
        descriptions.push(redact(&finding.description));
        evidence.push(redact(&finding.evidence));
        cves.push(finding.cve_ids.join(","));
    }
    sql::query(sql::findings::INSERT_MANY)
        .bind(&ids)
        .bind(&organizations)
        .bind(&scans)
        .bind(&jobs)
        .bind(&attempts)
        .bind(&keys)
        .bind(&plugins)
        .bind(&rule_ids)
        .bind(&resources)
        .bind(&discriminators)
        .bind(&severities)
        .bind(&titles)
        .bind(&descriptions)
        .bind(&evidence)
        .bind(&cves)
        .execute(conn)
        .await?;
    Ok(())
}

/// Per completing attempt: its batches below `batch_count`, and at or above it.
async fn count_batches(
    conn: &mut PgConnection,
    completing: &[(usize, &CompleteParams<'_>, &LockedRow, Job)],
) -> Result<HashMap<Uuid, (i64, i64)>, StoreError> {
    if completing.is_empty() {
        return Ok(HashMap::new());
    }
    let attempt_ids: Vec<Uuid> = completing
        .iter()
        .map(|(_, params, _, _)| params.claim.attempt_id)
        .collect();
    let batch_counts: Vec<i32> = completing
        .iter()
        .map(|(_, params, _, _)| params.batch_count)
        .collect();
    let rows: Vec<(Uuid, i64, i64)> =
        sql::query_as(sql::worker_result_batches::COUNT_FOR_COMPLETIONS)
            .bind(&attempt_ids)
            .bind(&batch_counts)
            .fetch_all(conn)
            .await?;
    Ok(rows
        .into_iter()
        .map(|(attempt_id, below, beyond)| (attempt_id, (below, beyond)))
        .collect())
}

/// Why a fenced completion is refused, in the order of [`one_by_one::complete`]: batches
/// missing, then batches beyond its count, then evidence already published.
async fn completion_verdict(
    conn: &mut PgConnection,
    params: &CompleteParams<'_>,
    row: &LockedRow,
    job: Job,
    counts: &HashMap<Uuid, (i64, i64)>,
) -> Result<Option<v1::Error>, StoreError> {
    let (below, beyond) = counts
        .get(&params.claim.attempt_id)
        .copied()
        .unwrap_or_default();
    if below < i64::from(params.batch_count) {
        // Rare: name the missing numbers (one statement for this message only).
        return Ok(Some(
            one_by_one::missing_batches(conn, params.claim.attempt_id, params.batch_count).await?,
        ));
    }
    if beyond > 0 {
        return Ok(Some(one_by_one::beyond_batch_count(
            beyond,
            params.batch_count,
        )));
    }
    if row.evidence_published == Some(true) {
        return Ok(Some(one_by_one::evidence_conflict(job.scan_job_id)));
    }
    Ok(None)
}

/// Marks attempts that sent a batch running and completed ones succeeded (with their tasks and
/// scan jobs), after removing what superseded attempts of the completed jobs left behind.
/// Returns each completed scan job's published finding and asset counts.
async fn finish_attempts(
    conn: &mut PgConnection,
    running: &[&LockedRow],
    completed: &[(&CompleteParams<'_>, &LockedRow, Job)],
) -> Result<HashMap<Uuid, (i32, i32)>, StoreError> {
    if running.is_empty() && completed.is_empty() {
        return Ok(HashMap::new());
    }
    // An attempt numbered 1 is its task's first: nothing was superseded.
    let superseded: Vec<&(&CompleteParams<'_>, &LockedRow, Job)> = completed
        .iter()
        .filter(|(_, row, _)| row.locked.attempt_number > 1)
        .collect();
    if !superseded.is_empty() {
        let jobs: Vec<Uuid> = superseded
            .iter()
            .map(|(_, _, job)| job.scan_job_id)
            .collect();
        let attempts: Vec<Uuid> = superseded
            .iter()
            .map(|(params, _, _)| params.claim.attempt_id)
            .collect();
        sql::query(sql::findings::DELETE_SUPERSEDED_MANY)
            .bind(&jobs)
            .bind(&attempts)
            .execute(&mut *conn)
            .await?;
    }

    // Per attempt and task: done (completed) wins over running.
    let mut done: BTreeMap<Uuid, (Uuid, bool)> = BTreeMap::new();
    for row in running {
        done.entry(row.attempt_id)
            .or_insert((row.attempt_task_id, false));
    }
    for (params, _, _) in completed {
        done.insert(params.claim.attempt_id, (params.claim.task_id, true));
    }
    let attempt_ids: Vec<Uuid> = done.keys().copied().collect();
    let task_ids: Vec<Uuid> = done.values().map(|(task_id, _)| *task_id).collect();
    let finished: Vec<bool> = done.values().map(|(_, finished)| *finished).collect();
    let job_ids: Vec<Uuid> = completed
        .iter()
        .map(|(_, _, job)| job.scan_job_id)
        .collect();
    let summaries: Vec<&str> = completed
        .iter()
        .map(|(params, _, _)| params.summary)
        .collect();
    let rows: Vec<(Uuid, i32, i32)> = sql::query_as(sql::worker_task_attempts::FINISH_MANY)
        .bind(&attempt_ids)
        .bind(&task_ids)
        .bind(&finished)
        .bind(&job_ids)
        .bind(&summaries)
        .bind(AttemptStatus::Succeeded.as_str())
        .bind(AttemptStatus::Running.as_str())
        .bind(AttemptStatus::Leased.as_str())
        .bind(TaskState::Completed.as_str())
        .bind(TaskState::Running.as_str())
        .bind(TaskState::Leased.as_str())
        .bind(ScanJobState::Completed.as_str())
        .fetch_all(conn)
        .await?;
    Ok(rows
        .into_iter()
        .map(|(id, findings, assets)| (id, (findings, assets)))
        .collect())
}
