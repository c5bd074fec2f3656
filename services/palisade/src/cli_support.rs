//! What several `palisade` command groups share on the command line: how a command prints its
//! answer (`--output`, and a page of a list as text or JSON), who makes a change and why
//! (`--reason`, `--by`), and the severity parser (`scan gate --threshold`, `finding list
//! --severity`).

/// How a command prints its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
}

/// Which page of a list in id order to print, and how (`worker list`, `org list`).
#[derive(Debug, clap::Args)]
pub struct PageArgs {
    /// The next page: the last id of the previous one.
    #[arg(long)]
    pub after: Option<uuid::Uuid>,
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(i64).range(1..=1000))]
    pub limit: i64,
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

/// A page of a list read in id order (`worker list`, `schedule list`, …): as JSON, its rows
/// (through a `serde_json::Value`, so each row's keys in alphabetical order, as `dead-letter
/// list` and `schedule list` have always printed them); as text, `header`, a `line` per row and, when the page is full, how to ask for the next
/// (`more: --after <the last row's id>`, as `finding list` says).
pub fn print_page<T: serde::Serialize>(
    output: Output,
    rows: &[T],
    limit: i64,
    header: &str,
    line: impl Fn(&T) -> String,
    id: impl Fn(&T) -> String,
) -> anyhow::Result<()> {
    match output {
        Output::Json => println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::to_value(rows)?)?
        ),
        Output::Text => {
            println!("{header}");
            for row in rows {
                println!("{}", line(row));
            }
            if let Some(last) = rows.last().filter(|_| rows.len() as i64 >= limit) {
                println!("more: --after {}", id(last));
            }
        }
    }
    Ok(())
}

/// An instant as text output prints it, to the second: `2026-12-07T07:05:00Z`.
pub fn instant(at: &chrono::DateTime<chrono::Utc>) -> String {
    at.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// An instant that may be unset, `-` when it is.
pub fn instant_or_dash(at: Option<&chrono::DateTime<chrono::Utc>>) -> String {
    at.map_or_else(|| "-".to_owned(), instant)
}

/// Ids comma-separated, `-` for none.
pub fn ids_or_dash(ids: &[uuid::Uuid]) -> String {
    if ids.is_empty() {
        return "-".to_owned();
    }
    ids.iter()
        .map(uuid::Uuid::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// A change of one record that must say why (`schedule pause` / `resume`, `dead-letter replay`
/// / `discard`), and how to print its answer.
#[derive(Debug, clap::Args)]
pub struct ChangeArgs {
    pub id: uuid::Uuid,
    /// Why (kept with it).
    #[arg(long)]
    pub reason: String,
    /// Who (default: $USER).
    #[arg(long)]
    pub by: Option<String>,
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

/// Who makes a change and why, recorded with it (`worker show`, `org show`).
#[derive(Debug, clap::Args)]
pub struct Why {
    /// Why (recorded with the change).
    #[arg(long, default_value = "")]
    pub reason: String,
    /// Who (default: $USER).
    #[arg(long)]
    pub by: Option<String>,
}

/// Parses a severity argument.
pub fn parse_severity(text: &str) -> Result<store::states::Severity, String> {
    store::states::Severity::parse(text).ok_or_else(|| {
        format!(
            "{text:?} is not a severity: {}",
            store::states::Severity::NAMES.join(", ")
        )
    })
}
