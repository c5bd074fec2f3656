//! `palisade scan`: submit a scan (and with `--wait` follow it to its end), show one, list
//! them, cancel one, ask for its enrichment, check its gate.

use std::time::Duration;

use anyhow::Context as _;
use messages::v1;
use runtime::CommonSettings;
use tracing::Instrument as _;
use uuid::Uuid;

use crate::cli_support::{Output, parse_severity};
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
    },
    /// Ask for a completed scan's enrichment: prints {scan_id, job_id, status, outcome,
    /// message} as JSON. A failed job is requeued with a fresh retry budget; a pending,
    /// running or completed one is left as it is.
    Enrich { scan_id: Uuid },
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
        ScanCommand::Cancel { scan_id, reason } => {
            cancel(common, store::cancel::CancelTarget::Scan(scan_id), &reason).await
        }
        ScanCommand::Enrich { scan_id } => enrich(common, scan_id).await,
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
            print_queued(&key, &reason, trace_id, output);
            return Ok(());
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
    print_submitted(&reply, trace_id, output);
    Ok(())
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
fn print_queued(key: &str, reason: &str, trace_id: Option<String>, output: Output) {
    let message = format!(
        "queued {key}: admission did not answer ({reason}); the request is on the \
         durable stream and will be decided once admission can; run the same \
         command with `--key {key}` to see its scan (a replay answers with it)"
    );
    match output {
        Output::Json => println!(
            "{}",
            serde_json::json!({ "queued": true, "idempotency_key": key, "message": message, "trace_id": trace_id })
        ),
        Output::Text => println!("{message}"),
    }
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
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&detail)?),
        Output::Text => println!("{} {}", detail.scan.id, detail.scan.state),
    }
    scans::outcome(&detail)
}

/// `scan submit`'s answer without `--wait`.
fn print_submitted(reply: &v1::ScanRequestReply, trace_id: Option<String>, output: Output) {
    // A replay's scan is in the trace of the request that created it (`scan show`).
    let trace_id = trace_id.filter(|_| !reply.deduplicated);
    match output {
        Output::Json => println!(
            "{}",
            serde_json::json!({
                "scan_id": reply.scan_id,
                "state": reply.state,
                "deduplicated": reply.deduplicated,
                "trace_id": trace_id,
            })
        ),
        Output::Text => {
            let note = match &trace_id {
                _ if reply.deduplicated => {
                    " (replay: the original scan; `scan show` names its trace)".to_owned()
                }
                Some(trace_id) => format!(" trace {trace_id}"),
                None => String::new(),
            };
            println!("{} {}{note}", reply.scan_id, reply.state);
        }
    }
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
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&scans)?),
        Output::Text => {
            println!(
                "{:<36} {:<10} {:>8} {:<25} {:<24} target",
                "id", "state", "findings", "admitted", "plugins"
            );
            for scan in &scans {
                println!(
                    "{:<36} {:<10} {:>8} {:<25} {:<24} {}",
                    scan.id,
                    scan.state,
                    scan.finding_count,
                    scan.created_at.format("%Y-%m-%dT%H:%M:%SZ"),
                    scan.plugins.join(","),
                    scan.target
                );
            }
        }
    }
    Ok(())
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
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&gate)?),
        Output::Text => {
            println!(
                "scan {scan_id}: {} ({}), {} of {} plugins complete; gate at {}: {} ({} blocking; counted {:?}, exempt {}, suppressed {})",
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
                gate.suppressed
            );
            println!(
                "coverage: {}",
                crate::coverage::summary_line(&gate.coverage)
            );
        }
    }
    match gate.gate_refusal {
        None => Ok(()),
        Some(refusal) => Err(exit::failure(
            exit::Status::NotPassed,
            format!("gate not passed: {refusal}"),
        )),
    }
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
    if output == Output::Json {
        println!("{}", serde_json::to_string_pretty(&diff)?);
        return Ok(());
    }
    println!(
        "target {}: {base} -> {scan}{}",
        diff.target,
        if diff.scan_complete {
            ""
        } else {
            " (not completed: nothing can be no longer seen)"
        }
    );
    for (class, findings) in [
        ("new", &diff.new),
        ("still present", &diff.still_present),
        ("no longer seen", &diff.no_longer_seen),
        ("unknown", &diff.unknown),
    ] {
        println!("\n{} {class}", findings.len());
        for finding in findings {
            println!(
                "  [{:<8}] {:<14} {:<32} {} ({})",
                finding.severity, finding.plugin, finding.rule_id, finding.resource, finding.status
            );
        }
    }
    Ok(())
}

/// Cancels in PostgreSQL, as dispatch's cancel does (the operator may cancel any
/// organization's scan); the event goes out through a running service's outbox relay.
pub async fn cancel(
    common: &CommonSettings,
    target: store::cancel::CancelTarget,
    reason: &str,
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
    match outcome {
        CancelOutcome::Cancelled {
            scan_id,
            trace_context,
        } => {
            span.in_scope(|| {
                runtime::trace_cancel(scan_id, trace_context.as_deref(), "operator", reason)
            });
            println!("scan {scan_id}: cancelled (cancelled)")
        }
        CancelOutcome::AlreadyTerminal { scan_id, state } => {
            println!("scan {scan_id}: {state} (already_terminal)")
        }
        CancelOutcome::NotFound => return Err(exit::not_found("no such scan or task")),
    }
    Ok(())
}

/// `palisade scan enrich`: the answer a client gets on the wire, for any organization's scan.
async fn enrich(common: &CommonSettings, scan_id: Uuid) -> anyhow::Result<()> {
    let pool = store::connect(&common.database).await?;
    println!("{}", crate::commands::enrich(&pool, scan_id).await?);
    Ok(())
}

/// `palisade scan show`.
async fn show(common: &CommonSettings, scan_id: Uuid, output: Output) -> anyhow::Result<()> {
    let pool = store::connect(&common.database).await?;
    let detail = scans::show(&pool, scan_id).await?;
    if output == Output::Json {
        println!("{}", serde_json::to_string_pretty(&detail)?);
        return Ok(());
    }
    let scan = &detail.scan;
    println!("scan        {}", scan.id);
    println!("state       {}", scan.state);
    println!("target      {}", scan.target);
    println!("profile     {}", scan.plugins.join(" -> "));
    println!("client/key  {} / {}", scan.client_id, scan.idempotency_key);
    println!("admitted    {}", scan.created_at);
    if let Some(started) = scan.started_at {
        println!("started     {started}");
    }
    if let Some(finished) = scan.finished_at {
        println!("finished    {finished}");
    }
    if !scan.failure_code.is_empty() {
        println!("failure     {}: {}", scan.failure_code, scan.failure_reason);
    }
    if let Some(trace_id) = &scan.trace_id {
        println!("trace       {trace_id}");
    }
    println!(
        "\n{:<4} {:<16} {:<10} {:<16} {:>8} {:>9} {:>7}",
        "#", "plugin", "job", "task", "attempts", "findings", "assets"
    );
    for job in &detail.jobs {
        println!(
            "{:<4} {:<16} {:<10} {:<16} {:>8} {:>9} {:>7}",
            job.position,
            job.plugin,
            job.state,
            job.task_state.as_deref().unwrap_or_default(),
            job.attempt_count.unwrap_or_default(),
            job.finding_count,
            job.asset_count
        );
        if let Some(task_id) = job.task_id {
            println!("     task {task_id}");
        }
        if !job.error_code.is_empty() {
            println!("     error {}: {}", job.error_code, job.error_message);
        }
    }
    let findings = &detail.findings;
    println!("\n{} findings", findings.len());
    for finding in findings.iter().take(50) {
        println!(
            "  [{:<8}] {:<14} {:<32} {}",
            finding.severity, finding.plugin, finding.rule_id, finding.resource
        );
    }
    println!();
    crate::coverage::print(&detail.coverage);
    Ok(())
}
