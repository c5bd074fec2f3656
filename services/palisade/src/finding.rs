//! `palisade finding`: findings: list a scan's, show one, set a disposition, delete one.

use runtime::CommonSettings;
use uuid::Uuid;

use crate::cli_support::{Json, Output, parse_severity, print};

/// `palisade finding …`.
#[derive(Debug, clap::Subcommand)]
pub enum FindingCommand {
    /// A page of a scan's findings in finding-key order, with the collection revision it was
    /// read at (pass it to `set --collection-revision` to refuse a change if any finding of the
    /// scan changed since).
    List {
        #[arg(long)]
        scan: Uuid,
        /// Only these dispositions (comma-separated).
        #[arg(long, value_delimiter = ',', value_parser = parse_status)]
        status: Vec<store::states::FindingStatus>,
        /// Only these severities (comma-separated).
        #[arg(long, value_delimiter = ',', value_parser = parse_severity)]
        severity: Vec<store::states::Severity>,
        /// The finding key after which the page starts (the previous page's `next_after`).
        #[arg(long, default_value = "")]
        after: String,
        #[arg(long, default_value_t = 100)]
        limit: i64,
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// One finding with its history and its occurrences in the target's scans.
    Show {
        finding_id: Uuid,
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Set a finding's disposition: open, needs_review, gate_exempt, accepted_risk, ignore,
    /// false_positive or fixed (the last five need --reason). --revision is the finding's
    /// revision you decided on; a stale one is refused (revision_conflict).
    Set {
        #[arg(long, value_parser = parse_status)]
        status: store::states::FindingStatus,
        #[command(flatten)]
        change: ChangeArgs,
    },
    /// Delete a finding (its history stays); refused while its scan is pending or running.
    Delete {
        #[command(flatten)]
        change: ChangeArgs,
    },
}

/// What names a change of a finding (`finding set`, `finding delete`).
#[derive(Debug, clap::Args)]
pub struct ChangeArgs {
    finding_id: Uuid,
    /// The finding's revision you decided on.
    #[arg(long)]
    revision: i32,
    /// Also refuse unless the scan's findings are still at this collection revision.
    #[arg(long)]
    collection_revision: Option<i32>,
    #[arg(long, default_value = "")]
    reason: String,
    /// Who decides (recorded in the history); by default $USER.
    #[arg(long, env = "USER")]
    actor: String,
    #[arg(long, value_enum, default_value_t = Output::Text)]
    output: Output,
}

impl ChangeArgs {
    /// The change, of any organization (the operator's command).
    fn change(&self) -> store::findings::Change {
        store::findings::Change {
            finding_id: self.finding_id,
            organization_id: None,
            expected_revision: self.revision,
            expected_collection_revision: self.collection_revision,
            reason: self.reason.clone(),
            actor: self.actor.clone(),
        }
    }
}

fn parse_status(text: &str) -> Result<store::states::FindingStatus, String> {
    store::states::FindingStatus::parse(text).ok_or_else(|| {
        format!(
            "{text:?} is not a disposition: {}",
            store::states::FindingStatus::NAMES.join(", ")
        )
    })
}

/// Runs one `palisade finding` command.
pub async fn run(common: &CommonSettings, command: FindingCommand) -> anyhow::Result<()> {
    let pool = store::connect(&common.database).await?;
    match command {
        FindingCommand::List {
            scan,
            status,
            severity,
            after,
            limit,
            output,
        } => {
            let filter = store::findings::Filter {
                statuses: status,
                severities: severity,
            };
            list(&pool, scan, &filter, &after, limit, output).await?;
        }
        FindingCommand::Show { finding_id, output } => show(&pool, finding_id, output).await?,
        FindingCommand::Set { status, change } => {
            let answer =
                crate::commands::set_finding_status(&pool, &change.change(), status).await?;
            print_change(
                change.output,
                &answer,
                &format!("finding {} is {status}", change.finding_id),
            )?;
        }
        FindingCommand::Delete { change } => {
            let answer = crate::commands::delete_finding(&pool, &change.change()).await?;
            print_change(
                change.output,
                &answer,
                &format!("finding {} deleted", change.finding_id),
            )?;
        }
    }
    Ok(())
}

/// `palisade finding list`.
async fn list(
    pool: &store::PgPool,
    scan: Uuid,
    filter: &store::findings::Filter,
    after: &str,
    limit: i64,
    output: Output,
) -> anyhow::Result<()> {
    let page = crate::commands::list_findings(pool, scan, filter, after, limit).await?;
    print(output, Json::Pretty, &page, |page| {
        let mut lines = vec![format!(
            "scan {scan} ({}), collection revision {}",
            page.scan_state, page.collection_revision
        )];
        for finding in &page.findings {
            lines.push(format!(
                "{}  r{}  {:<14} {:<8} {}  {}",
                finding.id,
                finding.revision,
                finding.status,
                finding.severity,
                finding.title,
                finding.resource
            ));
        }
        lines.extend(
            page.next_after
                .as_ref()
                .map(|next| format!("more: --after {next}")),
        );
        lines.join("\n")
    })
}

/// `palisade finding show`.
async fn show(pool: &store::PgPool, finding_id: Uuid, output: Output) -> anyhow::Result<()> {
    let detail = crate::commands::show_finding(pool, finding_id).await?;
    print(output, Json::Pretty, &detail, show_text)
}

/// `palisade finding show` as text: the finding, its history, how often its target's scans
/// found it.
fn show_text(detail: &store::findings::Detail) -> String {
    let finding = &detail.finding;
    let mut lines = vec![format!(
        "{} [{}] {}\n  {} at revision {} (collection revision {}){}\n  {} {} {}",
        finding.id,
        finding.severity,
        finding.title,
        finding.status,
        finding.revision,
        detail.collection_revision,
        if finding.status_reason.is_empty() {
            String::new()
        } else {
            format!(": {}", finding.status_reason)
        },
        finding.plugin,
        finding.rule_id,
        finding.resource
    )];
    for entry in &detail.history {
        lines.push(format!(
            "  {} r{} {} -> {} by {} at {}: {}",
            entry.action,
            entry.revision,
            entry.from_status,
            entry.to_status,
            entry.actor,
            entry.changed_at,
            entry.reason
        ));
    }
    lines.push(format!(
        "  occurrences in this target's scans: {}",
        detail.occurrences.len()
    ));
    lines.join("\n")
}

/// `finding set` / `delete`: as JSON, the outcome on one line, as they have always printed it;
/// as text, what happened and the revisions to decide on next.
fn print_change(output: Output, answer: &serde_json::Value, done: &str) -> anyhow::Result<()> {
    print(output, Json::Line, answer, |answer| {
        let revision = match &answer["revision"] {
            serde_json::Value::Null => String::new(),
            revision => format!("revision {revision}, "),
        };
        format!(
            "{done}: {revision}collection revision {}",
            answer["collection_revision"]
        )
    })
}
