//! How the commands show a scan's coverage as text (docs/protocol/reference.md section 13): one
//! summary line, then the entries that are not a pass.

use store::coverage::{Coverage, CoverageStatus, CoverageSummary};

/// Entries listed by `scan show`, at most; the JSON output has them all.
const ENTRIES_SHOWN_MAX: usize = 50;

/// `fail, score 66.7 % (2 pass, 1 fail, 0 error, 0 unknown; 1 not applicable), required
/// coverage complete`.
pub fn summary_line(summary: &CoverageSummary) -> String {
    let count = |status| summary.counts.get(&status).copied().unwrap_or(0);
    let score = match summary.score {
        Some(score) => format!("score {:.1} %", score * 100.0),
        None => "no score".to_owned(),
    };
    let completeness = match summary.refusal() {
        None => "required coverage complete".to_owned(),
        Some(refusal) => refusal,
    };
    format!(
        "{}, {score} ({} pass, {} fail, {} error, {} unknown; {} not applicable), {completeness}",
        summary.status,
        count(CoverageStatus::Pass),
        count(CoverageStatus::Fail),
        count(CoverageStatus::Error),
        count(CoverageStatus::Unknown),
        count(CoverageStatus::NotApplicable),
    )
}

/// The summary line (after `coverage`, as a [`crate::cli_support::field`]), then every entry
/// that is not a pass (worst first, at most [`ENTRIES_SHOWN_MAX`]).
pub fn text(coverage: &Coverage) -> String {
    let mut lines = vec![crate::cli_support::field(
        "coverage",
        summary_line(&coverage.summary),
    )];
    let mut shown: Vec<_> = coverage
        .entries
        .iter()
        .filter(|entry| entry.status != CoverageStatus::Pass)
        .collect();
    shown.sort_by_key(|entry| entry.status);
    for entry in shown.iter().take(ENTRIES_SHOWN_MAX) {
        let rule = if entry.rule_id.is_empty() {
            "(every rule)"
        } else {
            entry.rule_id.as_str()
        };
        let reason = if entry.reason_code.is_empty() {
            String::new()
        } else {
            format!(" ({})", entry.reason_code)
        };
        let required = if entry.required { "" } else { ", not required" };
        lines.push(format!(
            "  [{:<14}] {:<14} {:<32} {}{reason}{required}",
            entry.status.as_str(),
            entry.plugin,
            rule,
            entry.resource
        ));
    }
    if shown.len() > ENTRIES_SHOWN_MAX {
        lines.push(format!(
            "  … {} more (`--output json` lists every entry)",
            shown.len() - ENTRIES_SHOWN_MAX
        ));
    }
    lines.join("\n")
}
