//! Admission (SPEC §4.1): one scan per (organization, client, key), one active scan per
//! target, the hourly quota, and the first plugin's scan job and task, in one transaction.

use messages::v1;
use messages::{ErrorCode, EventKind, Subjects};
use prost::Message as _;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::StoreError;
use crate::outbox::{self, OutboxEvent};
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

#[derive(sqlx::FromRow)]
struct ExistingScan {
    id: Uuid,
    request_fingerprint: String,
    state: String,
}

/// Admits one request inside the caller's transaction. Takes a transaction-scoped advisory
/// lock on (organization, target), held until the caller commits.
pub async fn admit(
    conn: &mut PgConnection,
    subjects: &Subjects,
    params: &AdmitParams<'_>,
) -> Result<AdmitOutcome, StoreError> {
    // Replays are the common repeat: answer them without taking any lock.
    if let Some(existing) = find_by_key(conn, params).await? {
        return replay_outcome(existing, params);
    }

    let quota: Option<Option<i32>> =
        sqlx::query_scalar("SELECT hourly_scan_quota FROM organizations WHERE id = $1")
            .bind(params.organization_id)
            .fetch_optional(&mut *conn)
            .await?;
    let Some(quota) = quota else {
        return Ok(AdmitOutcome::Refused(v1::Error::new(
            ErrorCode::UnknownOrganization,
            format!("organization {} does not exist", params.organization_id),
        )));
    };

    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1::text || '/' || $2, 0))")
        .bind(params.organization_id)
        .bind(params.target)
        .execute(&mut *conn)
        .await?;

    // Under the lock, a concurrent request with the same key has either committed (and is
    // visible now) or will conflict on the unique constraint below.
    if let Some(existing) = find_by_key(conn, params).await? {
        return replay_outcome(existing, params);
    }

    let target_id: Uuid = sqlx::query_scalar(
        r#"
        INSERT INTO targets (id, organization_id, locator) VALUES ($1, $2, $3)
        ON CONFLICT (organization_id, locator) DO UPDATE SET locator = EXCLUDED.locator
        RETURNING id
        "#,
    )
    .bind(Uuid::now_v7())
    .bind(params.organization_id)
    .bind(params.target)
    .fetch_one(&mut *conn)
    .await?;

    let active: Option<Uuid> = sqlx::query_scalar(
        "SELECT id FROM scans WHERE organization_id = $1 AND target_id = $2 AND state IN ('pending', 'running')",
    )
    .bind(params.organization_id)
    .bind(target_id)
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(active_scan_id) = active {
        let mut error = v1::Error::new(
            ErrorCode::ScanAlreadyActive,
            format!(
                "target already has active scan {active_scan_id}; wait for it to finish or cancel it"
            ),
        );
        error.active_scan_id = active_scan_id.to_string();
        return Ok(AdmitOutcome::Refused(error));
    }

    if let Some(quota) = quota {
        // Serialize this organization's admissions only when it has a quota to count.
        sqlx::query("SELECT 1 FROM organizations WHERE id = $1 FOR NO KEY UPDATE")
            .bind(params.organization_id)
            .execute(&mut *conn)
            .await?;
        let recent: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM scans WHERE organization_id = $1 AND created_at > now() - interval '1 hour'",
        )
        .bind(params.organization_id)
        .fetch_one(&mut *conn)
        .await?;
        if recent >= i64::from(quota) {
            return Ok(AdmitOutcome::Refused(v1::Error::new(
                ErrorCode::QuotaExceeded,
                format!(
                    "organization admitted {recent} scans in the last hour, its quota is {quota}; retry later or raise the quota"
                ),
            )));
        }
    }

    let scan_id = Uuid::now_v7();
    let inserted: Option<i64> = sqlx::query_scalar(
        r#"
        INSERT INTO scans (id, organization_id, target_id, client_id, idempotency_key,
                           request_fingerprint, plugins, priority, execution_deadline_seconds,
                           trace_context)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
        ON CONFLICT (organization_id, client_id, idempotency_key) DO NOTHING
        RETURNING (extract(epoch FROM created_at) * 1000)::bigint
        "#,
    )
    .bind(scan_id)
    .bind(params.organization_id)
    .bind(target_id)
    .bind(params.client_id)
    .bind(params.idempotency_key)
    .bind(params.fingerprint)
    .bind(params.plugins)
    .bind(params.priority)
    .bind(params.execution_deadline_seconds)
    .bind(params.trace_context)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(admitted_at_unix_ms) = inserted else {
        // Same key committed by a concurrent request for another target.
        let existing = find_by_key(conn, params).await?.ok_or_else(|| {
            StoreError::Corrupt("idempotency conflict without a conflicting row".into())
        })?;
        return replay_outcome(existing, params);
    };

    let first_plugin = params
        .plugins
        .first()
        .ok_or_else(|| StoreError::Corrupt("admitted a scan without plugins".into()))?;
    let task_id = crate::progress::create_jobs(
        conn,
        &[crate::progress::NewScanJob {
            scan_id,
            organization_id: params.organization_id,
            position: 0,
            plugin: first_plugin,
            target: params.target,
            priority: params.priority,
            execution_deadline_seconds: params.execution_deadline_seconds,
            max_attempts: params.max_attempts,
        }],
    )
    .await?
    .into_iter()
    .next()
    .ok_or_else(|| StoreError::Corrupt("no task created for the first plugin".into()))?;

    let admitted = v1::ScanAdmitted {
        scan_id: scan_id.to_string(),
        organization_id: params.organization_id.to_string(),
        client_id: params.client_id.to_owned(),
        idempotency_key: params.idempotency_key.to_owned(),
        target: params.target.to_owned(),
        plugins: params.plugins.to_vec(),
        admitted_at_unix_ms,
    };
    let ready = v1::TaskReady {
        task_id: task_id.to_string(),
        scan_id: scan_id.to_string(),
        organization_id: params.organization_id.to_string(),
        plugin: first_plugin.clone(),
        required_capabilities: vec![first_plugin.clone()],
    };
    outbox::enqueue(
        conn,
        &[
            OutboxEvent::new(
                subjects.event(EventKind::ScanAdmitted),
                admitted.encode_to_vec(),
            )
            .in_trace_of(scan_id),
            OutboxEvent::new(subjects.event(EventKind::TaskReady), ready.encode_to_vec())
                .in_trace_of(scan_id),
        ],
    )
    .await?;
    Ok(AdmitOutcome::Admitted { scan_id, task_id })
}

async fn find_by_key(
    conn: &mut PgConnection,
    params: &AdmitParams<'_>,
) -> Result<Option<ExistingScan>, StoreError> {
    Ok(sqlx::query_as::<_, ExistingScan>(
        r#"
        SELECT id, request_fingerprint, state FROM scans
        WHERE organization_id = $1 AND client_id = $2 AND idempotency_key = $3
        "#,
    )
    .bind(params.organization_id)
    .bind(params.client_id)
    .bind(params.idempotency_key)
    .fetch_optional(conn)
    .await?)
}

fn replay_outcome(
    existing: ExistingScan,
    params: &AdmitParams<'_>,
) -> Result<AdmitOutcome, StoreError> {
    if existing.request_fingerprint != params.fingerprint {
        return Ok(AdmitOutcome::Refused(v1::Error::new(
            ErrorCode::IdempotencyConflict,
            format!(
                "idempotency key {:?} of client {:?} was used for scan {} with a different request; use a new key for a new request",
                params.idempotency_key, params.client_id, existing.id
            ),
        )));
    }
    let state = ScanState::parse(&existing.state)
        .ok_or_else(|| StoreError::Corrupt(format!("scan state {:?}", existing.state)))?;
    Ok(AdmitOutcome::Duplicate {
        scan_id: existing.id,
        state,
    })
}
