//! What several `palisade` command groups share on the command line: how a command prints its
//! answer (`--output`: [`print`], the one place every answer is printed, a page of a list, a
//! table, a record's fields), who makes a change and why
//! (`--reason`, `--by`), and the severity parser (`scan gate --threshold`, `finding list
//! --severity`).

/// How a command prints its answer (`--output`): text for a person, the default; JSON for a
/// script.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
}

/// How an answer is laid out as JSON: each command keeps the layout it has always printed, since
/// scripts parse it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Json {
    /// Indented, over several lines: the reads and most changes.
    Pretty,
    /// One line: `scan submit`, `scan enrich`, `cve import`, `org set`, `finding set` / `delete`.
    Line,
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

/// Prints a command's answer on standard output, the one place every command does: as JSON,
/// `answer` laid out as `json` says (a `serde_json::Value` with its keys in alphabetical order, a
/// struct in its fields' order: whichever the command has always printed); as text, what `text`
/// makes of it (a table for a list, a [`field`] a line for a record, a sentence for a change).
pub fn print<T: serde::Serialize + ?Sized>(
    output: Output,
    json: Json,
    answer: &T,
    text: impl FnOnce(&T) -> String,
) -> anyhow::Result<()> {
    let printed = match (output, json) {
        (Output::Json, Json::Pretty) => serde_json::to_string_pretty(answer)?,
        (Output::Json, Json::Line) => serde_json::to_string(answer)?,
        (Output::Text, _) => text(answer),
    };
    println!("{printed}");
    Ok(())
}

/// A page of a list read in id order (`worker list`, `schedule list`, …): as JSON, its rows
/// (through a `serde_json::Value`, so each row's keys in alphabetical order, as `dead-letter
/// list` and `schedule list` have always printed them); as text, a [`table`] and, when the page
/// is full, how to ask for the next (`more: --after <the last row's id>`, as `finding list`
/// says).
pub fn print_page<T: serde::Serialize>(
    output: Output,
    rows: &[T],
    limit: i64,
    header: &str,
    line: impl Fn(&T) -> String,
    id: impl Fn(&T) -> String,
) -> anyhow::Result<()> {
    print(output, Json::Pretty, &serde_json::to_value(rows)?, |_| {
        let mut text = table(header, rows.iter().map(line));
        if let Some(last) = rows.last().filter(|_| rows.len() as i64 >= limit) {
            text.push_str(&format!("\nmore: --after {}", id(last)));
        }
        text
    })
}

/// A table as text: its header line, then a line per row.
pub fn table(header: &str, rows: impl IntoIterator<Item = String>) -> String {
    let mut text = header.to_owned();
    for row in rows {
        text.push('\n');
        text.push_str(&row);
    }
    text
}

/// One field of a record as text: its name in a column of 11, then its value
/// (`state       running`).
pub fn field(name: &str, value: impl std::fmt::Display) -> String {
    format!("{name:<11} {value}")
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
