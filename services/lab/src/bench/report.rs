//! What the benchmark reports: its checks, the table it prints, and the JSON document.

use std::collections::BTreeMap;

use anyhow::Context as _;
use serde_json::json;
use telemetry::cost::LaneCost;

use super::ceiling::{CEILING_STATEMENTS_PER_STEP, Ceiling};
use super::stages::Stages;
use super::{BenchReport, BurnDown, Steady, TableWrites, cpu, round, statements};
use crate::harness::{print_cost, total_cost};

/// A named check and whether it held.
type Check = (String, bool);

/// Every check of the report.
pub fn checks(report: &BenchReport) -> Vec<Check> {
    let mut checks = Vec::new();
    if let Some(ceiling) = &report.ceiling {
        checks.push((
            "ceiling: every fenced UPDATE matched its lease, a stale token matched none".into(),
            ceiling.fence_misses == 0
                && ceiling.batched.fence_misses == 0
                && ceiling.stale_token_refused,
        ));
        let steps = (ceiling.steps + ceiling.batched.steps) as i64;
        checks.push((
            "ceiling: one result row and one outbox row per committed step".into(),
            ceiling.result_rows == steps && ceiling.outbox_rows == steps,
        ));
    }
    for (name, run) in [
        ("burn-down", &report.burn_down),
        ("burn-down (large)", &report.large_burn_down),
        ("profile", &report.profile),
    ] {
        if let Some(run) = run {
            checks.push((
                format!("{name}: every scan completed exactly once"),
                run.completed == run.scans
                    && run.failed == 0
                    && run.rejected == 0
                    && run.completion_events_repeated == 0
                    && run.database_completed == run.scans as i64,
            ));
            checks.push((
                format!("{name}: every scan has every stage's timestamps"),
                run.stages.incomplete_timestamps == 0,
            ));
        }
    }
    if let Some(steady) = &report.steady {
        checks.push((
            "steady: every scan completed exactly once".into(),
            steady.completed == steady.scans
                && steady.failed == 0
                && steady.rejected == 0
                && steady.completion_events_repeated == 0
                && steady.database_completed == steady.scans as i64,
        ));
        checks.push((
            "steady: every scan has every stage's timestamps".into(),
            steady.stages.incomplete_timestamps == 0,
        ));
    }
    checks
}

/// The width of the benchmark's table.
const TABLE_WIDTH: usize = 78;

/// The steps per second of the ceiling's two phases, when it ran: what throughputs are
/// compared with.
type CeilingRates = Option<(f64, f64)>;

/// Prints the report as a table; returns whether every check held.
pub fn print_report(report: &BenchReport) -> bool {
    let ceiling = report
        .ceiling
        .as_ref()
        .map(|ceiling| (ceiling.steps_per_second, ceiling.batched.steps_per_second));
    print_setting(report);
    if let Some(ceiling) = &report.ceiling {
        print_ceiling(ceiling);
    }
    for (name, run) in [
        ("burn-down", &report.burn_down),
        ("burn-down (large)", &report.large_burn_down),
        ("profile", &report.profile),
    ] {
        if let Some(run) = run {
            print_burn_down(name, run, ceiling);
        }
    }
    if let Some((small, large, ratio)) = growth(report) {
        println!(
            "growth: {large} scans at once ran at {ratio:.2} × the rate of {small} at once (1.00 is flat)"
        );
        rule();
    }
    if let Some(steady) = &report.steady {
        print_steady(steady, ceiling);
    }
    println!("total {:.1} s", report.total_seconds);
    let mut all = true;
    for (name, held) in checks(report) {
        println!("{name:<72} {}", if held { "yes" } else { "NO" });
        all &= held;
    }
    all
}

/// The growth scenario's sizes and the ratio of the large burn-down's rate to the small one's.
fn growth(report: &BenchReport) -> Option<(usize, usize, f64)> {
    let small = report.burn_down.as_ref()?;
    let large = report.large_burn_down.as_ref()?;
    (small.scans_per_second > 0.0).then(|| {
        (
            small.scans,
            large.scans,
            large.scans_per_second / small.scans_per_second,
        )
    })
}

/// PostgreSQL's costliest statements of a run, per completed scan, or why they are unknown.
fn print_statements(run: &BurnDown) {
    match &run.statements {
        None => {}
        Some(Err(reason)) => println!("  per statement: unknown: {reason}"),
        Some(Ok(statements)) => {
            println!("  per statement (pg_stat_statements), costliest first, per scan:");
            let scans = run.completed.max(1) as f64;
            for statement in statements.iter().take(statements::LISTED) {
                let text: String = statement.query.chars().take(TABLE_WIDTH - 30).collect();
                println!(
                    "    {:>8.3} ms {:>6.2} calls  {text}",
                    statement.total_ms / scans,
                    statement.calls as f64 / scans,
                );
            }
        }
    }
}

/// A throughput as a ratio to both ceilings (nothing when the ceiling did not run).
fn ratio(per_second: f64, ceiling: CeilingRates) -> String {
    match ceiling {
        Some((steps, batched)) if steps > 0.0 && batched > 0.0 => format!(
            "{:.3} × ceiling, {:.3} × batched",
            per_second / steps,
            per_second / batched
        ),
        _ => String::new(),
    }
}

/// A line across the table.
fn rule() {
    println!("{}", "-".repeat(TABLE_WIDTH));
}

/// The table's head: when, on what, with how many workers and how much history.
fn print_setting(report: &BenchReport) {
    let host = &report.host;
    println!();
    println!("palisade bench, {}", host.date);
    println!(
        "host: {} cores, load average {} before, {} after; PostgreSQL {}, NATS {}",
        host.cores, host.load_before, host.load_after, host.postgresql, host.nats
    );
    println!(
        "everything in one process: five services, {} workers × {} leases; requests by client.publish ({} awaiting PubAck at once)",
        report.workers, report.worker_capacity, report.in_flight
    );
    println!(
        "history: {} completed scans in the tables before the scenarios ran",
        report.history
    );
    rule();
}

/// The ceiling's rows: both phases' steps per second.
fn print_ceiling(ceiling: &Ceiling) {
    println!(
        "{:<46} {:>12.0} steps/s",
        format!(
            "ceiling: fenced step, {} connections, {:.1} s",
            ceiling.connections, ceiling.seconds
        ),
        ceiling.steps_per_second
    );
    println!("  (UPDATE lease WHERE token AND expiry, INSERT result, INSERT outbox, COMMIT)");
    println!(
        "{:<46} {:>12.0} steps/s",
        format!(
            "ceiling, batched: {} steps per commit, {:.1} s",
            ceiling.batched.per_commit, ceiling.batched.seconds
        ),
        ceiling.batched.steps_per_second
    );
    println!("  (the same three statements set-wise over the batch's leases, COMMIT)");
    rule();
}

/// A burn-down's rows: throughput, outcomes, latency, the bound the ceiling sets, the stages,
/// the cost, the writes, the CPU and the consumers' batches.
fn print_burn_down(name: &str, run: &BurnDown, ceiling: CeilingRates) {
    println!(
        "{:<46} {:>12.1} scans/s  {}",
        format!("{name}: {} scans at once", run.scans),
        run.scans_per_second,
        ratio(run.scans_per_second, ceiling)
    );
    println!(
        "  {}: completed {} failed {} refused {} in {:.1} s; {} findings",
        run.profile.join(" → "),
        run.completed,
        run.failed,
        run.rejected,
        run.seconds,
        run.findings
    );
    println!(
        "  request → completion event  p50 {:.0} ms  p95 {:.0} ms  p99 {:.0} ms",
        run.latency_ms.p50, run.latency_ms.p95, run.latency_ms.p99
    );
    let total = total_cost(&run.cost);
    let per_scan = |count: u64| count as f64 / run.completed.max(1) as f64;
    if let Some((steps, _)) = ceiling {
        println!(
            "  bound by the ceiling's PostgreSQL: {:.0} scans/s by statements ({} per step), {:.0} by commits",
            steps * CEILING_STATEMENTS_PER_STEP as f64 / per_scan(total.statements).max(0.001),
            CEILING_STATEMENTS_PER_STEP,
            steps / per_scan(total.commits).max(0.001),
        );
    }
    print_stages(&run.stages);
    let (handed, later) = run.handed_on;
    if later > 0 {
        println!("  later plugins leased with their predecessor's completion: {handed} of {later}");
    }
    println!(
        "  workers' results refused at their quota of waiting results (published again): {} ({:.2} per scan)",
        run.quota_refused,
        per_scan(run.quota_refused)
    );
    print_cost(&run.cost, run.completed, TABLE_WIDTH);
    print_evaluations(run);
    print_writes(&run.writes, run.completed);
    print_statements(run);
    if let Some(cpu) = &run.cpu {
        println!("  CPU of the machine: {}", cpu.line());
    }
    for (consumer, spent) in &run.consumers {
        println!(
            "  consumer {consumer}: {:.0} batches, {:.1} messages and {:.1} ms each",
            spent.batches,
            spent.messages / spent.batches.max(1.0),
            spent.handler_seconds * 1000.0 / spent.batches.max(1.0),
        );
    }
}

/// The steady scenario's rows: achieved throughput, outcomes, latency and the stages.
fn print_steady(steady: &Steady, ceiling: CeilingRates) {
    println!(
        "{:<46} {:>12.1} scans/s  {}",
        format!(
            "steady: {:.0} scans/s offered for {:.0} s",
            steady.offered_per_second, steady.duration_seconds
        ),
        steady.achieved_per_second,
        ratio(steady.achieved_per_second, ceiling)
    );
    println!(
        "  {} sent in {:.1} s; completed {} failed {} refused {}, the last {:.1} s after the first request",
        steady.scans,
        steady.send_seconds,
        steady.completed,
        steady.failed,
        steady.rejected,
        steady.seconds
    );
    println!(
        "  request → completion event  p50 {:.1} ms  p95 {:.1} ms  p99 {:.1} ms",
        steady.latency_ms.p50, steady.latency_ms.p95, steady.latency_ms.p99
    );
    print_stages(&steady.stages);
    rule();
}

/// Part of the statement that writes evaluations (`sql/evaluations/upsert_many.sql`), as
/// `pg_stat_statements` shows it.
const EVALUATIONS_UPSERT: &str = "INSERT INTO evaluations";

/// Evaluations stored per completed scan (rows inserted into `evaluations`) and, where
/// `pg_stat_statements` is read, what their upsert cost PostgreSQL per scan.
fn print_evaluations(run: &BurnDown) {
    let scans = run.completed.max(1) as f64;
    let written = run.writes.get("evaluations").copied().unwrap_or_default();
    let cost = match &run.statements {
        Some(Ok(spent)) => match statements::of(spent, EVALUATIONS_UPSERT) {
            Some(upsert) => format!(
                "their upsert {:.3} ms and {:.2} calls per scan",
                upsert.total_ms / scans,
                upsert.calls as f64 / scans
            ),
            None => "their upsert did not run".to_owned(),
        },
        _ => "their upsert's time unknown (no pg_stat_statements)".to_owned(),
    };
    println!(
        "  evaluations per scan {:.1} stored, {:.1} replaced; {cost}",
        written.inserted as f64 / scans,
        written.updated as f64 / scans,
    );
}

/// Row versions written per completed scan, in all and per table.
fn print_writes(writes: &BTreeMap<String, TableWrites>, completed: usize) {
    let per_scan = |count: i64| count as f64 / completed.max(1) as f64;
    let mut total = TableWrites::default();
    for table in writes.values() {
        total.add(table);
    }
    println!(
        "  row versions per scan {:.1}: inserted {:.1}, updated {:.1} ({:.1} HOT); deleted {:.1}",
        per_scan(total.row_versions()),
        per_scan(total.inserted),
        per_scan(total.updated),
        per_scan(total.hot_updated),
        per_scan(total.deleted),
    );
    for (table, spent) in writes {
        println!(
            "    {table:<28} {:>6.2} = {:.2} inserted + {:.2} updated ({:.2} HOT); {:.2} deleted",
            per_scan(spent.row_versions()),
            per_scan(spent.inserted),
            per_scan(spent.updated),
            per_scan(spent.hot_updated),
            per_scan(spent.deleted),
        );
    }
}

/// Pickup and the stages, as rows of the table.
fn print_stages(stages: &Stages) {
    println!(
        "  pickup (request → leased)   p50 {:.1} ms  p99 {:.1} ms",
        stages.pickup_ms.p50, stages.pickup_ms.p99
    );
    println!(
        "  {:<13} {:>9} {:>9}  from → to (PostgreSQL's now(): the writing transaction's start)",
        "stage", "p50 ms", "p99 ms"
    );
    for stage in &stages.stages {
        println!(
            "  {:<13} {:>9.1} {:>9.1}  {}",
            stage.name, stage.ms.p50, stage.ms.p99, stage.span
        );
    }
    if stages.incomplete_timestamps > 0 {
        println!(
            "  {} scans lack a timestamp and are left out of the stages",
            stages.incomplete_timestamps
        );
    }
}

/// Pickup and the stages as JSON fields.
fn stages_json(stages: &Stages) -> serde_json::Value {
    let by_name: serde_json::Map<String, serde_json::Value> = stages
        .stages
        .iter()
        .map(|stage| {
            (
                stage.name.to_owned(),
                json!({
                    "span": stage.span,
                    "samples": stage.samples,
                    "p50_ms": round(stage.ms.p50),
                    "p99_ms": round(stage.ms.p99),
                }),
            )
        })
        .collect();
    json!({
        "pickup_ms": { "p50": round(stages.pickup_ms.p50), "p99": round(stages.pickup_ms.p99) },
        "stages": by_name,
        "incomplete_timestamps": stages.incomplete_timestamps,
    })
}

/// The report as one JSON document.
pub fn to_json(report: &BenchReport) -> serde_json::Value {
    let ceiling = report.ceiling.as_ref();
    let checks: Vec<serde_json::Value> = checks(report)
        .into_iter()
        .map(|(name, held)| json!({ "name": name, "held": held }))
        .collect();
    let ok = checks.iter().all(|check| check["held"] == true);
    json!({
        "date": report.host.date,
        "host": {
            "cores": report.host.cores,
            "load_average_before": report.host.load_before,
            "load_average_after": report.host.load_after,
            "postgresql": report.host.postgresql,
            "nats": report.host.nats,
            "one_host": true,
        },
        "settings": {
            "workers": report.workers,
            "worker_capacity": report.worker_capacity,
            "submission": "client.publish (durable, JetStream PubAck)",
            "in_flight": report.in_flight,
            "history_completed_scans": report.history,
        },
        "ceiling": ceiling.map(ceiling_json),
        "burn_down": report.burn_down.as_ref().map(|run| burn_down_json(run, ceiling)),
        "large_burn_down": report.large_burn_down.as_ref().map(|run| burn_down_json(run, ceiling)),
        "growth_ratio": growth(report).map(|(_, _, ratio)| round(ratio)),
        "profile": report.profile.as_ref().map(|run| burn_down_json(run, ceiling)),
        "steady": report.steady.as_ref().map(|steady| steady_json(steady, ceiling)),
        "total_seconds": round(report.total_seconds),
        "checks": checks,
        "ok": ok,
    })
}

/// `per_second` as a ratio to `steps_per_second`, when that was measured.
fn ratio_to(per_second: f64, steps_per_second: Option<f64>) -> Option<f64> {
    steps_per_second
        .filter(|steps| *steps > 0.0)
        .map(|steps| per_second / steps)
}

/// The ceiling's two phases as JSON.
fn ceiling_json(ceiling: &Ceiling) -> serde_json::Value {
    json!({
        "step": "UPDATE lease WHERE id AND token AND expires_at > now(); INSERT result; INSERT outbox; COMMIT",
        "connections": ceiling.connections,
        "seconds": round(ceiling.seconds),
        "steps": ceiling.steps,
        "steps_per_second": round(ceiling.steps_per_second),
        "batched": {
            "steps_per_commit": ceiling.batched.per_commit,
            "seconds": round(ceiling.batched.seconds),
            "steps": ceiling.batched.steps,
            "steps_per_second": round(ceiling.batched.steps_per_second),
        },
    })
}

/// A burn-down as JSON, its throughput also as ratios to the ceiling's phases.
fn burn_down_json(run: &BurnDown, ceiling: Option<&Ceiling>) -> serde_json::Value {
    let per_scan = |count: i64| round(count as f64 / run.completed.max(1) as f64);
    json!({
        "profile": run.profile,
        "scans": run.scans,
        "completed": run.completed,
        "failed": run.failed,
        "refused": run.rejected,
        "completion_events_repeated": run.completion_events_repeated,
        "database_completed": run.database_completed,
        "findings": run.findings,
        "seconds": round(run.seconds),
        "scans_per_second": round(run.scans_per_second),
        "ratio_to_ceiling": ratio_to(
            run.scans_per_second,
            ceiling.map(|ceiling| ceiling.steps_per_second),
        ),
        "ratio_to_batched_ceiling": ratio_to(
            run.scans_per_second,
            ceiling.map(|ceiling| ceiling.batched.steps_per_second),
        ),
        "latency_ms": run.latency_ms.to_json(),
        "later_plugins_handed_on": run.handed_on.0,
        "later_plugins": run.handed_on.1,
        "quota_refused": run.quota_refused,
        "evaluations_per_scan": round(
            run.writes.get("evaluations").map_or(0, |written| written.inserted) as f64
                / run.completed.max(1) as f64
        ),
        "time": stages_json(&run.stages),
        "cost_per_scan": cost_json(&run.cost, run.completed),
        "writes_per_scan": run.writes.iter().map(|(table, spent)| {
            (table.clone(), json!({
                "row_versions": per_scan(spent.row_versions()),
                "inserted": per_scan(spent.inserted),
                "updated": per_scan(spent.updated),
                "hot_updated": per_scan(spent.hot_updated),
                "deleted": per_scan(spent.deleted),
            }))
        }).collect::<serde_json::Map<_, _>>(),
        "cpu": run.cpu.map(cpu::CpuSplit::to_json),
        "statements_per_scan": match &run.statements {
            None => serde_json::Value::Null,
            Some(Err(reason)) => json!({ "unknown": reason }),
            Some(Ok(statements)) => json!(statements.iter().take(statements::LISTED).map(|statement| json!({
                "query": statement.query,
                "calls": round(statement.calls as f64 / run.completed.max(1) as f64),
                "ms": round(statement.total_ms / run.completed.max(1) as f64),
            })).collect::<Vec<_>>()),
        },
        "consumers": run.consumers.iter().map(|(consumer, spent)| (consumer.clone(), json!({
            "batches": spent.batches,
            "messages_per_batch": round(spent.messages / spent.batches.max(1.0)),
            "ms_per_batch": round(spent.handler_seconds * 1000.0 / spent.batches.max(1.0)),
        }))).collect::<serde_json::Map<_, _>>(),
    })
}

/// What each lane spent per completed scan, and all lanes together, as JSON; lanes that spent
/// nothing left out.
fn cost_json(cost: &BTreeMap<&'static str, LaneCost>, completed: usize) -> serde_json::Value {
    let per_scan = |count: u64| round(count as f64 / completed.max(1) as f64);
    let lane = |cost: &LaneCost| {
        json!({
            "statements": per_scan(cost.statements),
            "commits": per_scan(cost.commits),
            "messages_sent": per_scan(cost.messages_sent),
            "messages_received": per_scan(cost.messages_received),
        })
    };
    let lanes: serde_json::Map<String, serde_json::Value> = cost
        .iter()
        .filter(|(_, cost)| **cost != LaneCost::default())
        .map(|(name, cost)| ((*name).to_owned(), lane(cost)))
        .collect();
    json!({ "lanes": lanes, "total": lane(&total_cost(cost)) })
}

/// The steady scenario as JSON, its throughput also as a ratio to the ceiling.
fn steady_json(steady: &Steady, ceiling: Option<&Ceiling>) -> serde_json::Value {
    json!({
        "offered_per_second": steady.offered_per_second,
        "duration_seconds": steady.duration_seconds,
        "scans": steady.scans,
        "send_seconds": round(steady.send_seconds),
        "completed": steady.completed,
        "failed": steady.failed,
        "refused": steady.rejected,
        "completion_events_repeated": steady.completion_events_repeated,
        "database_completed": steady.database_completed,
        "seconds": round(steady.seconds),
        "achieved_per_second": round(steady.achieved_per_second),
        "ratio_to_ceiling": ratio_to(
            steady.achieved_per_second,
            ceiling.map(|ceiling| ceiling.steps_per_second),
        ),
        "latency_ms": steady.latency_ms.to_json(),
        "time": stages_json(&steady.stages),
    })
}

/// Prints the JSON document after a line `JSON:`, and writes it to `path` when given.
pub fn emit_json(report: &BenchReport, path: Option<&std::path::Path>) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(&to_json(report))?;
    if let Some(path) = path {
        std::fs::write(path, format!("{text}\n"))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    println!("JSON:");
    println!("{text}");
    Ok(())
}
