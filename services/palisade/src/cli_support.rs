//! What several `palisade` command groups share on the command line: how a command prints its
//! answer (`--output`), who makes a change and why (`--reason`, `--by`), and the severity
//! parser (`scan gate --threshold`, `finding list --severity`).

/// How a command prints its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
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
