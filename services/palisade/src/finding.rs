//! `palisade finding`: findings: list a scan's, show one, set a disposition, delete one.

use runtime::CommonSettings;
use uuid::Uuid;

use crate::cli_support::{Output, parse_severity};

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
            let text = format!("finding {} is {status}", change.finding_id);
            print_answer(change.output, &answer, &text);
        }
        FindingCommand::Delete { change } => {
            let answer = crate::commands::delete_finding(&pool, &change.change()).await?;
            let text = format!("finding {} deleted", change.finding_id);
            print_answer(change.output, &answer, &text);
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
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&page)?),
        Output::Text => {
            println!(
                "scan {scan} ({}), collection revision {}",
                page.scan_state, page.collection_revision
            );
            for finding in &page.findings {
                println!(
                    "{}  r{}  {:<14} {:<8} {}  {}",
                    finding.id,
                    finding.revision,
                    finding.status,
                    finding.severity,
                    finding.title,
                    finding.resource
                );
            }
            if let Some(next) = &page.next_after {
                println!("more: --after {next}");
            }
        }
    }
    Ok(())
}

/// `palisade finding show`.
async fn show(pool: &store::PgPool, finding_id: Uuid, output: Output) -> anyhow::Result<()> {
    let detail = crate::commands::show_finding(pool, finding_id).await?;
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&detail)?),
        Output::Text => {
            let finding = &detail.finding;
            println!(
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
            );
            for entry in &detail.history {
                println!(
                    "  {} r{} {} -> {} by {} at {}: {}",
                    entry.action,
                    entry.revision,
                    entry.from_status,
                    entry.to_status,
                    entry.actor,
                    entry.changed_at,
                    entry.reason
                );
            }
            println!(
                "  occurrences in this target's scans: {}",
                detail.occurrences.len()
            );
        }
    }
    Ok(())
}

fn print_answer(output: Output, answer: &serde_json::Value, text: &str) {
    match output {
        Output::Json => println!("{answer}"),
        Output::Text => println!("{text}: {answer}"),
    }
}
