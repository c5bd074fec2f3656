//! `palisade scan`: submit a scan (and with `--wait` follow it to its end), show one, list
//! them, cancel one, ask for its enrichment, check its gate.

use std::time::Duration;

use anyhow::Context as _;
use messages::v1;
use runtime::CommonSettings;
use tracing::Instrument as _;
use uuid::Uuid;

use crate::cli_support::{Json, Output, field, parse_severity, print, table};
use crate::{exit, scans};

/// `palisade scan …`.
#[derive(Debug, clap::Subcommand)]
pub enum ScanCommand {
    /// Submit a scan request and print admission's answer.
    Submit(SubmitArgs),
    /// Show a scan, its plugin jobs, its findings and its coverage.
    Show {
        scan_id: Uuid,
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Scans newest first by admission, filtered; a page at a time (`--after` the last id of
    /// the previous page gives the next).
    List(ListArgs),
    /// Cancel a scan: its unfinished tasks end now, a running worker stops at its next renew.
    Cancel {
        scan_id: Uuid,
        #[arg(long, default_value = "cancelled from the command line")]
        reason: String,
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Ask for a completed scan's enrichment: a failed job is requeued with a fresh retry
    /// budget; a pending, running or completed one is left as it is. Prints what was done;
    /// with `--output json`, the answer a client gets on the wire, {scan_id, job_id, status,
    /// outcome, message}, on one line.
    Enrich {
        scan_id: Uuid,
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// The scan's finding summary and gate: its state, whether it is complete (every plugin
    /// completed with its evidence), and whether the gate passes (complete, and no open or
    /// needs_review finding at or above --threshold); exits 5 when it does not.
    Gate {
        scan_id: Uuid,
        #[arg(long, default_value = "high", value_parser = parse_severity)]
        threshold: store::states::Severity,
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// What changed between two scans of one target, BASE and the later SCAN: findings new,
    /// still present, no longer seen (only where SCAN completed and evaluated the finding's
    /// rule on its resource as a pass), and unknown (nothing says it was fixed).
    Diff {
        base: Uuid,
        scan: Uuid,
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
}

// `palisade scan submit`'s arguments (its help is the variant's).
#[derive(Debug, clap::Args)]
pub struct SubmitArgs {
    #[arg(long)]
    pub org: Uuid,
    #[arg(long)]
    pub target: String,
    /// Comma-separated plugins, run in order.
    #[arg(long, value_delimiter = ',')]
    pub plugins: Vec<String>,
    /// The client the request is from. With a client's credentials (NATS_CREDS from `palisade
    /// client add`), that client's id; with the operator's, any.
    #[arg(long, default_value = "cli")]
    pub client: String,
    /// Idempotency key; a fresh one when omitted.
    #[arg(long)]
    pub key: Option<String>,
    #[arg(long, default_value_t = 0)]
    pub priority: i32,
    #[arg(long, default_value_t = 0)]
    pub deadline_secs: u32,
    /// Follow the scan to its end (progress on standard error; reads it from PostgreSQL,
    /// so DATABASE_URL too), then print it as `scan show` does: exits 0 when it
    /// completed, 5 when it failed or was cancelled.
    #[arg(long)]
    pub wait: bool,
    /// With --wait: give up (exit 1) after this long; the scan goes on.
    #[arg(long, default_value_t = 3_600, requires = "wait")]
    pub timeout_secs: u64,
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

// `palisade scan list`'s arguments (its help is the variant's).
#[derive(Debug, clap::Args)]
pub struct ListArgs {
    #[arg(long)]
    pub org: Option<Uuid>,
    /// The target, exactly as submitted.
    #[arg(long)]
    pub target: Option<String>,
    /// pending, running, completed, failed or cancelled (as `scan show` reports it).
    #[arg(long)]
    pub state: Option<String>,
    /// Scans whose profile runs this plugin.
    #[arg(long)]
    pub plugin: Option<String>,
    /// Admitted at or after this instant (RFC 3339, e.g. 2026-12-01T00:00:00Z).
    #[arg(long)]
    pub since: Option<chrono::DateTime<chrono::Utc>>,
    /// Admitted before this instant (RFC 3339).
    #[arg(long)]
    pub until: Option<chrono::DateTime<chrono::Utc>>,
    /// Requested by this client id.
    #[arg(long)]
    pub client: Option<String>,
    #[arg(long)]
    pub after: Option<Uuid>,
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(i64).range(1..=1000))]
    pub limit: i64,
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

/// Runs one `palisade scan` command.
pub async fn run(common: &CommonSettings, command: ScanCommand) -> anyhow::Result<()> {
    match command {
        ScanCommand::Submit(args) => submit(common, args).await,
        ScanCommand::Show { scan_id, output } => show(common, scan_id, output).await,
        ScanCommand::List(args) => list(common, args).await,
        ScanCommand::Cancel {
            scan_id,
            reason,
            output,
        } => {
            let target = store::cancel::CancelTarget::Scan(scan_id);
            cancel(common, target, &reason, output).await
        }
        ScanCommand::Enrich { scan_id, output } => enrich(common, scan_id, output).await,
        ScanCommand::Gate {
            scan_id,
            threshold,
            output,
        } => gate(common, scan_id, threshold, output).await,
        ScanCommand::Diff { base, scan, output } => diff(common, base, scan, output).await,
    }
}

/// `palisade scan submit`.
async fn submit(common: &CommonSettings, args: SubmitArgs) -> anyhow::Result<()> {
    let SubmitArgs {
        org,
        target,
        plugins,
        client,
        key,
        priority,
        deadline_secs,
        wait,
        timeout_secs,
        output,
    } = args;
    // With --wait, PostgreSQL is checked before anything is submitted.
    let pool = if wait {
        Some(store::connect(&common.database).await?)
    } else {
        None
    };
    let bus = crate::commands::client_bus(common, &client, org).await?;
    let client = ::client::Client::new(bus, client);
    let key = key.unwrap_or_else(|| Uuid::new_v4().to_string());
    let plugin_names: Vec<&str> = plugins.iter().map(String::as_str).collect();
    let mut request = client.request(&org.to_string(), &target, &plugin_names, &key);
    request.priority = priority;
    request.execution_deadline_seconds = deadline_secs;
    let timeout = Duration::from_secs(timeout_secs);
    // The command's span is the root of the scan's trace: its id is printed with the
    // answer, for the tracing UI.
    let span = tracing::info_span!(
        "scan submit",
        otel.name = "palisade scan submit",
        palisade.service = "cli",
    );
    let trace_id = bus::trace::trace_id_of(&span);
    let reply = match client
        .submit_or_queue(&request)
        .instrument(span.clone())
        .await?
    {
        ::client::Submitted::Answered(reply) => reply,
        ::client::Submitted::Queued { reason } if wait => {
            eprintln!(
                "queued {key}: admission did not answer ({reason}); asking again until it does"
            );
            ask_until_answered(&client, &request, &span, &key, timeout_secs).await?
        }
        ::client::Submitted::Queued { reason } => {
            return print_queued(&key, &reason, trace_id, output);
        }
    };
    if let Some(error) = reply.error {
        return Err(exit::refused(format!(
            "refused: {} ({})",
            error.message, error.code
        )));
    }
    if let Some(pool) = pool {
        return follow(&pool, &reply, timeout, output).await;
    }
    print_submitted(&reply, trace_id, output)
}

/// `scan submit --wait` when admission did not answer: the same request again until it does,
/// for at most `timeout_secs`.
async fn ask_until_answered(
    client: &::client::Client,
    request: &v1::ScanRequest,
    span: &tracing::Span,
    key: &str,
    timeout_secs: u64,
) -> anyhow::Result<v1::ScanRequestReply> {
    let timeout = Duration::from_secs(timeout_secs);
    Ok(tokio::time::timeout(timeout, async {
        loop {
            match client.submit(request).instrument(span.clone()).await {
                Err(::client::ClientError::NoAnswer { .. }) => continue,
                answered => return answered,
            }
        }
    })
    .await
    .with_context(|| {
        format!("admission did not answer within {timeout_secs} s; the request {key} stays queued")
    })??)
}

/// `scan submit` without `--wait` when admission did not answer: the request is queued.
fn print_queued(
    key: &str,
    reason: &str,
    trace_id: Option<String>,
    output: Output,
) -> anyhow::Result<()> {
    let message = format!(
        "queued {key}: admission did not answer ({reason}); the request is on the \
         durable stream and will be decided once admission can; run the same \
         command with `--key {key}` to see its scan (a replay answers with it)"
    );
    let answer = serde_json::json!({ "queued": true, "idempotency_key": key, "message": message, "trace_id": trace_id });
    print(output, Json::Line, &answer, |_| message.clone())
}

/// `scan submit --wait` once admitted: follows the scan to its end and prints it.
async fn follow(
    pool: &store::PgPool,
    reply: &v1::ScanRequestReply,
    timeout: Duration,
    output: Output,
) -> anyhow::Result<()> {
    let scan_id: Uuid = reply
        .scan_id
        .parse()
        .context("admission answered with a scan id that is not a UUID")?;
    let detail = scans::follow(pool, scan_id, timeout, |line| eprintln!("{line}")).await?;
    print(output, Json::Pretty, &detail, |detail| {
        format!("{} {}", detail.scan.id, detail.scan.state)
    })?;
    scans::outcome(&detail)
}

/// `scan submit`'s answer without `--wait`.
fn print_submitted(
    reply: &v1::ScanRequestReply,
    trace_id: Option<String>,
    output: Output,
) -> anyhow::Result<()> {
    // A replay's scan is in the trace of the request that created it (`scan show`).
    let trace_id = trace_id.filter(|_| !reply.deduplicated);
    let answer = serde_json::json!({
        "scan_id": reply.scan_id,
        "state": reply.state,
        "deduplicated": reply.deduplicated,
        "trace_id": trace_id,
    });
    print(output, Json::Line, &answer, |_| {
        let note = match &trace_id {
            _ if reply.deduplicated => {
                " (replay: the original scan; `scan show` names its trace)".to_owned()
            }
            Some(trace_id) => format!(" trace {trace_id}"),
            None => String::new(),
        };
        format!("{} {}{note}", reply.scan_id, reply.state)
    })
}

/// `palisade scan list`.
async fn list(common: &CommonSettings, args: ListArgs) -> anyhow::Result<()> {
    let ListArgs {
        org,
        target,
        state,
        plugin,
        since,
        until,
        client,
        after,
        limit,
        output,
    } = args;
    let state = state
        .map(|state| {
            store::states::ScanState::parse(&state).ok_or_else(|| {
                exit::refused(format!(
                    "invalid_field: --state {state:?} is not one of pending, running, completed, failed, cancelled"
                ))
            })
        })
        .transpose()?;
    let filter = store::admin::ScanFilter {
        organization_id: org,
        target,
        state,
        plugin,
        admitted_from: since,
        admitted_before: until,
        client_id: client,
        after,
        limit,
    };
    let pool = store::connect(&common.database).await?;
    let Some(scans) = store::admin::scans(&pool, &filter).await? else {
        return Err(exit::not_found(format!(
            "--after {}: no such scan{}; give the last id of the previous page",
            after.map(|id| id.to_string()).unwrap_or_default(),
            org.map(|org| format!(" in organization {org}"))
                .unwrap_or_default()
        )));
    };
    print(output, Json::Pretty, &scans, |scans| {
        table(
            &format!(
                "{:<36} {:<10} {:>8} {:<25} {:<24} target",
                "id", "state", "findings", "admitted", "plugins"
            ),
            scans.iter().map(|scan| {
                format!(
                    "{:<36} {:<10} {:>8} {:<25} {:<24} {}",
                    scan.id,
                    scan.state,
                    scan.finding_count,
                    scan.created_at.format("%Y-%m-%dT%H:%M:%SZ"),
                    scan.plugins.join(","),
                    scan.target
                )
            }),
        )
    })
}

/// `palisade scan gate`: exits 5 when the gate does not pass.
async fn gate(
    common: &CommonSettings,
    scan_id: Uuid,
    threshold: store::states::Severity,
    output: Output,
) -> anyhow::Result<()> {
    let pool = store::connect(&common.database).await?;
    let gate = crate::commands::scan_gate(&pool, scan_id, threshold).await?;
    print(output, Json::Pretty, &gate, |gate| gate_text(scan_id, gate))?;
    match gate.gate_refusal {
        None => Ok(()),
        Some(refusal) => Err(exit::failure(
            exit::Status::NotPassed,
            format!("gate not passed: {refusal}"),
        )),
    }
}

/// `palisade scan gate` as text: the scan's state and gate, then its coverage.
fn gate_text(scan_id: Uuid, gate: &store::findings::Summary) -> String {
    format!(
        "scan {scan_id}: {} ({}), {} of {} plugins complete; gate at {}: {} ({} blocking; counted {:?}, exempt {}, suppressed {})\ncoverage: {}",
        gate.scan_state,
        if gate.complete {
            "complete"
        } else {
            "incomplete"
        },
        gate.plugins_complete,
        gate.plugins,
        gate.threshold,
        if gate.gate_passed {
            "passed"
        } else {
            "not passed"
        },
        gate.blocking,
        gate.gate_counted,
        gate.gate_exempt,
        gate.suppressed,
        crate::coverage::summary_line(&gate.coverage)
    )
}

/// `palisade scan diff`: exits 3 when a scan is missing, 4 when the two cannot be compared.
async fn diff(
    common: &CommonSettings,
    base: Uuid,
    scan: Uuid,
    output: Output,
) -> anyhow::Result<()> {
    use store::coverage::DiffRefusal;
    let pool = store::connect(&common.database).await?;
    let mut conn = pool.acquire().await?;
    let diff = match store::coverage::diff(&mut conn, None, base, scan).await? {
        Ok(diff) => diff,
        Err(DiffRefusal::NotFound) => {
            return Err(exit::not_found(format!(
                "scan {base} or {scan} is not in this database"
            )));
        }
        Err(DiffRefusal::OtherTargets) => {
            return Err(exit::failure(
                exit::Status::Refused,
                format!(
                    "scans {base} and {scan} scan different targets; compare scans of one target"
                ),
            ));
        }
        Err(DiffRefusal::NotLater) => {
            return Err(exit::failure(
                exit::Status::Refused,
                format!("scan {scan} was admitted before {base}; name the older scan first"),
            ));
        }
    };
    print(output, Json::Pretty, &diff, |diff| {
        diff_text(base, scan, diff)
    })
}

/// `palisade scan diff` as text: the target, then each class of findings.
fn diff_text(base: Uuid, scan: Uuid, diff: &store::coverage::Diff) -> String {
    let mut lines = vec![format!(
        "target {}: {base} -> {scan}{}",
        diff.target,
        if diff.scan_complete {
            ""
        } else {
            " (not completed: nothing can be no longer seen)"
        }
    )];
    for (class, findings) in [
        ("new", &diff.new),
        ("still present", &diff.still_present),
        ("no longer seen", &diff.no_longer_seen),
        ("unknown", &diff.unknown),
    ] {
        lines.push(format!("\n{} {class}", findings.len()));
        for finding in findings {
            lines.push(format!(
                "  [{:<8}] {:<14} {:<32} {} ({})",
                finding.severity, finding.plugin, finding.rule_id, finding.resource, finding.status
            ));
        }
    }
    lines.join("\n")
}

/// Cancels in PostgreSQL, as dispatch's cancel does (the operator may cancel any
/// organization's scan); the event goes out through a running service's outbox relay. Prints
/// `scan <id>: <state> (<outcome>)`, or `{scan_id, state, outcome}` as JSON.
pub async fn cancel(
    common: &CommonSettings,
    target: store::cancel::CancelTarget,
    reason: &str,
    output: Output,
) -> anyhow::Result<()> {
    use store::cancel::CancelOutcome;
    let pool = store::connect(&common.database).await?;
    // The command's span is a trace of its own, linked from the scan's `cancel` span.
    let span = tracing::info_span!(
        "scan cancel",
        otel.name = "palisade scan cancel",
        palisade.service = "cli",
    );
    let outcome = store::cancel::cancel(&pool, &common.subjects, None, target, reason)
        .instrument(span.clone())
        .await?;
    let (scan_id, state, outcome) = match outcome {
        CancelOutcome::Cancelled {
            scan_id,
            trace_context,
        } => {
            span.in_scope(|| {
                runtime::trace_cancel(scan_id, trace_context.as_deref(), "operator", reason)
            });
            (scan_id, "cancelled".to_owned(), "cancelled")
        }
        CancelOutcome::AlreadyTerminal { scan_id, state } => (scan_id, state, "already_terminal"),
        CancelOutcome::NotFound => return Err(exit::not_found("no such scan or task")),
    };
    let answer = serde_json::json!({ "scan_id": scan_id, "state": state, "outcome": outcome });
    print(output, Json::Pretty, &answer, |_| {
        format!("scan {scan_id}: {state} ({outcome})")
    })
}

/// `palisade scan enrich`: the answer a client gets on the wire, for any organization's scan.
async fn enrich(common: &CommonSettings, scan_id: Uuid, output: Output) -> anyhow::Result<()> {
    let pool = store::connect(&common.database).await?;
    let answer = crate::commands::enrich(&pool, scan_id).await?;
    print(output, Json::Line, &answer, |answer| {
        let text = |key: &str| answer[key].as_str().unwrap_or_default().to_owned();
        format!(
            "scan {scan_id}: enrichment job {} {} ({}): {}",
            text("job_id"),
            text("outcome"),
            text("status"),
            text("message")
        )
    })
}

/// `palisade scan show`.
async fn show(common: &CommonSettings, scan_id: Uuid, output: Output) -> anyhow::Result<()> {
    let pool = store::connect(&common.database).await?;
    let detail = scans::show(&pool, scan_id).await?;
    print(output, Json::Pretty, &detail, show_text)
}

/// `palisade scan show` as text: the scan a field a line, its jobs, up to 50 findings, its
/// coverage.
fn show_text(detail: &scans::ScanDetail) -> String {
    let scan = &detail.scan;
    let mut lines = vec![
        field("scan", scan.id),
        field("state", &scan.state),
        field("target", &scan.target),
        field("profile", scan.plugins.join(" -> ")),
        field(
            "client/key",
            format!("{} / {}", scan.client_id, scan.idempotency_key),
        ),
        field("admitted", scan.created_at),
    ];
    lines.extend(scan.started_at.map(|started| field("started", started)));
    lines.extend(scan.finished_at.map(|finished| field("finished", finished)));
    if !scan.failure_code.is_empty() {
        lines.push(field(
            "failure",
            format!("{}: {}", scan.failure_code, scan.failure_reason),
        ));
    }
    lines.extend(
        scan.trace_id
            .as_ref()
            .map(|trace_id| field("trace", trace_id)),
    );
    lines.push(format!(
        "\n{:<4} {:<16} {:<10} {:<16} {:>8} {:>9} {:>7}",
        "#", "plugin", "job", "task", "attempts", "findings", "assets"
    ));
    for job in &detail.jobs {
        lines.push(format!(
            "{:<4} {:<16} {:<10} {:<16} {:>8} {:>9} {:>7}",
            job.position,
            job.plugin,
            job.state,
            job.task_state.as_deref().unwrap_or_default(),
            job.attempt_count.unwrap_or_default(),
            job.finding_count,
            job.asset_count
        ));
        lines.extend(job.task_id.map(|task_id| format!("     task {task_id}")));
        if !job.error_code.is_empty() {
            lines.push(format!(
                "     error {}: {}",
                job.error_code, job.error_message
            ));
        }
    }
    lines.push(format!("\n{} findings", detail.findings.len()));
    for finding in detail.findings.iter().take(50) {
        lines.push(format!(
            "  [{:<8}] {:<14} {:<32} {}",
            finding.severity, finding.plugin, finding.rule_id, finding.resource
        ));
    }
    lines.push(format!("\n{}", crate::coverage::text(&detail.coverage)));
    lines.join("\n")
}
