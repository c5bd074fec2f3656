//! `palisade target show`: a target's latest scans with their coverage, and its latest
//! completed scan's findings with their occurrences across its scans (first and last seen, how
//! many scans), each with its own disposition.

use runtime::CommonSettings;
use uuid::Uuid;

use crate::cli_support::{Json, Output, field, print};
use crate::exit;

#[derive(Debug, clap::Subcommand)]
pub enum TargetCommand {
    /// A target (its locator, as scan requests name it), its latest scans and their coverage,
    /// and its latest completed scan's findings with their occurrence history.
    Show {
        locator: String,
        /// Only this organization's target (a locator may be scanned by several).
        #[arg(long)]
        org: Option<Uuid>,
        /// How many of its latest scans to show.
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(i64).range(1..=1000))]
        scans: i64,
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
}

pub async fn run(common: &CommonSettings, command: TargetCommand) -> anyhow::Result<()> {
    let TargetCommand::Show {
        locator,
        org,
        scans,
        output,
    } = command;
    let pool = store::connect(&common.database).await?;
    let mut conn = pool.acquire().await?;
    let targets = store::coverage::target_history(&mut conn, org, &locator, scans).await?;
    if targets.is_empty() {
        return Err(exit::not_found(format!(
            "no target {locator:?}{} in this database: a target is recorded when a scan of it is admitted",
            org.map(|org| format!(" in organization {org}"))
                .unwrap_or_default()
        )));
    }
    print(output, Json::Pretty, &targets, |targets| {
        targets
            .iter()
            .map(target_text)
            .collect::<Vec<_>>()
            .join("\n\n")
    })
}

fn at(unix_ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(unix_ms)
        .map(|at| at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_default()
}

/// One target as text: its locator and organization, its scans with their coverage, and its
/// latest completed scan's findings with their occurrences.
fn target_text(target: &store::coverage::TargetHistory) -> String {
    let mut lines = vec![
        field("target", format!("{} ({})", target.locator, target.id)),
        field("org", target.organization_id),
        format!(
            "\n{:<36} {:<10} {:<20} coverage",
            "scan", "state", "admitted"
        ),
    ];
    for scan in &target.scans {
        lines.push(format!(
            "{:<36} {:<10} {:<20} {}",
            scan.id,
            scan.state,
            at(scan.created_at_unix_ms),
            crate::coverage::summary_line(&scan.coverage)
        ));
    }
    let Some(scan_id) = target.latest_completed else {
        lines.push("\nno completed scan yet".to_owned());
        return lines.join("\n");
    };
    lines.push(format!(
        "\n{} findings in the latest completed scan {scan_id}",
        target.findings.len()
    ));
    for finding in &target.findings {
        lines.push(format!(
            "  [{:<8}] {:<14} {:<28} {:<40} {:<14} seen in {} scan(s), first {}, last {}",
            finding.severity,
            finding.plugin,
            finding.rule_id,
            finding.resource,
            finding.status,
            finding.scans,
            at(finding.first_seen_unix_ms),
            at(finding.last_seen_unix_ms)
        ));
    }
    lines.join("\n")
}
