//! `secrets`: secrets committed to a directory tree. The target is `file:///path/to/dir` or an
//! absolute path (a single file works too). Each hit is a high-severity finding on `path:line`
//! whose evidence is the line with the secret masked.
//!
//! Bounded: at most [`FILES_MAX`] files, none over [`FILE_BYTES_MAX`], text files only
//! (binary and non-UTF-8 files are skipped), symbolic links not followed, `.git` skipped.
//!
//! Rules ([`RULES`]): one per kind of secret, on the `file_line` a hit is on (`path:line`, not
//! reported as an asset: a line is where a secret was found, not something the scan has), and
//! `secrets-scan-truncated` on the target. Each line with a hit reads FAIL for that rule, after
//! its finding; the target reads PASS when the whole tree was read within the limits, else
//! FAIL after the informational finding (on the target) that says a limit stopped it.

use std::path::Path;
use std::sync::LazyLock;

use regex::Regex;
use tokio_util::sync::CancellationToken;
use walkdir::WalkDir;
use worker::{BoxFuture, Plugin, PluginError, ResultSink, Rule, TaskInput, v1};

/// Files read per task.
pub const FILES_MAX: usize = 10_000;
/// Larger files are skipped: secrets live in configuration and source, not in data dumps.
pub const FILE_BYTES_MAX: u64 = 1024 * 1024;
/// Hits reported per task; more mean the tree is a fixture or a leak too large to list.
pub const FINDINGS_MAX: usize = 10_000;
/// Evidence shows at most this many characters of the line.
const EVIDENCE_CHARS_MAX: usize = 200;
/// A file with a NUL byte in its first this-many bytes is binary.
const BINARY_SNIFF_BYTES: usize = 8 * 1024;
/// Directories never worth reading.
const SKIPPED_DIRECTORIES: [&str; 1] = [".git"];

/// The kind of resource a hit is on: `path:line`.
pub const LINE_KIND: &str = "file_line";
/// The rule of the finding that says a limit stopped the walk, on the target.
pub const TRUNCATED_RULE_ID: &str = "secrets-scan-truncated";

const LINE_KINDS: &[&str] = &[LINE_KIND];

/// What it checks: each kind of secret (its patterns, in order) on the lines it reads, and
/// whether the walk read the whole tree.
pub const RULES: [Rule; 8] = [
    Rule {
        id: PATTERNS[0].rule_id,
        applies_to: LINE_KINDS,
    },
    Rule {
        id: PATTERNS[1].rule_id,
        applies_to: LINE_KINDS,
    },
    Rule {
        id: PATTERNS[2].rule_id,
        applies_to: LINE_KINDS,
    },
    Rule {
        id: PATTERNS[3].rule_id,
        applies_to: LINE_KINDS,
    },
    Rule {
        id: PATTERNS[4].rule_id,
        applies_to: LINE_KINDS,
    },
    Rule {
        id: PATTERNS[5].rule_id,
        applies_to: LINE_KINDS,
    },
    Rule {
        id: PATTERNS[6].rule_id,
        applies_to: LINE_KINDS,
    },
    Rule {
        id: TRUNCATED_RULE_ID,
        applies_to: &[messages::TARGET_RESOURCE_KIND],
    },
];

pub struct Secrets;

/// One kind of secret: the `secret` group of its regex is what gets masked.
struct Pattern {
    rule_id: &'static str,
    title: &'static str,
    regex: &'static str,
    /// Leading characters of the secret that are not secret (`AKIA`, `ghp_`) and stay visible.
    visible_prefix_chars: usize,
}

const PATTERNS: [Pattern; 7] = [
    Pattern {
        rule_id: "aws-access-key-id",
        title: "AWS access key id",
        regex: r"\b(?P<secret>(?:AKIA|ASIA)[0-9A-Z]{16})\b",
        visible_prefix_chars: 4,
    },
    Pattern {
        rule_id: "private-key",
        title: "Private key",
        regex: r"-----BEGIN (?:(?:RSA|DSA|EC|OPENSSH|ENCRYPTED|PGP) )?PRIVATE KEY(?: BLOCK)?-----",
        visible_prefix_chars: 0,
    },
    Pattern {
        rule_id: "github-token",
        title: "GitHub token",
        regex: r"\b(?P<secret>gh[pousr]_[A-Za-z0-9]{36,255})\b",
        visible_prefix_chars: 4,
    },
    Pattern {
        rule_id: "aws-secret-access-key",
        title: "AWS secret access key",
        regex: r#"(?i)\baws_?secret_?access_?key["']?\s*[:=]\s*["']?(?P<secret>[A-Za-z0-9/+=]{40})\b"#,
        visible_prefix_chars: 0,
    },
    Pattern {
        rule_id: "gitlab-token",
        title: "GitLab token",
        regex: r"\b(?P<secret>glpat-[A-Za-z0-9_-]{20,255})\b",
        visible_prefix_chars: 6,
    },
    Pattern {
        rule_id: "slack-token",
        title: "Slack token",
        regex: r"\b(?P<secret>xox[abposre]-[A-Za-z0-9-]{10,255})\b",
        visible_prefix_chars: 5,
    },
    // A quoted value assigned to a key whose last word is password, passwd, pwd, secret,
    // token or api key (`db_password`, `clientSecret`, `"apiKey"`), but not an AWS secret
    // access key (its own rule above).
    Pattern {
        rule_id: "hardcoded-password",
        title: "Hard-coded password",
        regex: r#"(?i)\b(?:[A-Za-z0-9]+[_.-]?)*?(?:password|passwd|pwd|secret|token|api_?key)["']?\s*[:=]\s*["'](?P<secret>[^"'\s$]{4,})["']"#,
        visible_prefix_chars: 0,
    },
];

static COMPILED: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    PATTERNS
        .iter()
        .map(|pattern| Regex::new(pattern.regex).expect("secret patterns are valid regexes"))
        .collect()
});

impl Plugin for Secrets {
    fn name(&self) -> &'static str {
        "secrets"
    }

    fn rules(&self) -> &'static [Rule] {
        &RULES
    }

    fn run<'a>(
        &'a self,
        task: TaskInput,
        sink: ResultSink,
        cancel: CancellationToken,
    ) -> BoxFuture<'a, Result<String, PluginError>> {
        Box::pin(async move {
            let root = crate::target::local_path(&task.target)?;
            let target = task.target.clone();
            let report = crate::target::run_blocking("scan", &cancel, move |cancel| {
                scan_tree(&root, &target, cancel)
            })
            .await?;
            for finding in report.findings.iter().cloned() {
                sink.finding(finding).await?;
            }
            for evaluation in evaluations(&report, &task.target) {
                sink.evaluation(evaluation).await?;
            }
            Ok(format!(
                "{} secrets in {} files ({} skipped){}",
                report.findings.len(),
                report.files_scanned,
                report.files_skipped,
                if report.truncated {
                    ", stopped at a limit"
                } else {
                    ""
                }
            ))
        })
    }
}

/// What one walk found.
#[derive(Debug, Default)]
struct Report {
    findings: Vec<v1::Finding>,
    files_scanned: usize,
    files_skipped: usize,
    /// A limit stopped the walk; an informational finding says so.
    truncated: bool,
}

/// The evaluations of a walk of `target` that gave `report`: FAIL for each (rule, line) with a
/// hit, and `secrets-scan-truncated` on the target.
fn evaluations(report: &Report, target: &str) -> Vec<v1::Evaluation> {
    let mut evaluations = crate::coverage::failed(&report.findings);
    if !report.truncated {
        evaluations.push(
            v1::Evaluation::pass(TRUNCATED_RULE_ID, target).with_evidence(format!(
                "{} files read, {} skipped",
                report.files_scanned, report.files_skipped
            )),
        );
    }
    evaluations
}

/// Walks `root` (which the target `target` names) and scans each text file. Blocking: runs on
/// the blocking pool.
fn scan_tree(root: &Path, target: &str, cancel: &CancellationToken) -> Result<Report, PluginError> {
    let mut report = Report::default();
    let walk = WalkDir::new(root)
        .follow_links(false)
        .into_iter()
        .filter_entry(|entry| {
            !(entry.file_type().is_dir()
                && SKIPPED_DIRECTORIES
                    .iter()
                    .any(|skipped| entry.file_name() == *skipped))
        });
    for entry in walk {
        if cancel.is_cancelled() {
            return Ok(report);
        }
        let entry = match entry {
            Ok(entry) => entry,
            Err(error) => {
                tracing::debug!(error = %telemetry::chain(&error), "unreadable entry skipped");
                report.files_skipped += 1;
                continue;
            }
        };
        if !entry.file_type().is_file() {
            continue;
        }
        if report.files_scanned + report.files_skipped >= FILES_MAX
            || report.findings.len() >= FINDINGS_MAX
        {
            report.truncated = true;
            break;
        }
        match read_text(entry.path()) {
            Some(text) => {
                report.files_scanned += 1;
                let room = FINDINGS_MAX - report.findings.len();
                report.findings.extend(
                    scan_text(&entry.path().display().to_string(), &text)
                        .into_iter()
                        .take(room),
                );
            }
            None => report.files_skipped += 1,
        }
    }
    if report.truncated {
        report.findings.push(v1::Finding {
            rule_id: TRUNCATED_RULE_ID.into(),
            resource: target.to_owned(),
            severity: "info".into(),
            title: "Secret scan stopped at a limit".into(),
            description: format!(
                "The scan stops after {FILES_MAX} files or {FINDINGS_MAX} findings; part of the tree was not read."
            ),
            ..Default::default()
        });
    }
    Ok(report)
}

/// The file's text, or `None` for files that are too large, binary, not UTF-8 or unreadable.
fn read_text(path: &Path) -> Option<String> {
    let metadata = std::fs::metadata(path).ok()?;
    if metadata.len() > FILE_BYTES_MAX {
        return None;
    }
    let bytes = std::fs::read(path).ok()?;
    if bytes.iter().take(BINARY_SNIFF_BYTES).any(|byte| *byte == 0) {
        return None;
    }
    String::from_utf8(bytes).ok()
}

/// Every secret in `text`, one finding per hit, on `{file}:{line}`.
fn scan_text(file: &str, text: &str) -> Vec<v1::Finding> {
    let mut findings = vec![];
    for (line_index, line) in text.lines().enumerate() {
        for (pattern, regex) in PATTERNS.iter().zip(COMPILED.iter()) {
            for (hit_index, captures) in regex.captures_iter(line).enumerate() {
                let masked = match captures.name("secret") {
                    Some(secret) => format!(
                        "{}{}{}",
                        &line[..secret.start()],
                        mask(secret.as_str(), pattern.visible_prefix_chars),
                        &line[secret.end()..]
                    ),
                    None => line.to_owned(),
                };
                findings.push(v1::Finding {
                    rule_id: pattern.rule_id.into(),
                    resource: format!("{file}:{}", line_index + 1),
                    // Two hits of one rule on one line are told apart by their order.
                    discriminator: if hit_index == 0 { String::new() } else { hit_index.to_string() },
                    severity: "high".into(),
                    title: format!("{} in source", pattern.title),
                    description: format!(
                        "A {} is stored in plain text. Revoke it, remove it from the tree and its history, and load it from a secret store.",
                        pattern.title.to_lowercase()
                    ),
                    evidence: masked.trim().chars().take(EVIDENCE_CHARS_MAX).collect(),
                    ..Default::default()
                });
            }
        }
    }
    findings
}

/// The secret with everything after its visible prefix replaced by a fixed-width mask (the
/// width tells nothing about the secret's length).
fn mask(secret: &str, visible_prefix_chars: usize) -> String {
    let prefix: String = secret.chars().take(visible_prefix_chars).collect();
    format!("{prefix}********")
}

#[cfg(test)]
mod tests {
    use worker::ResultItem;

    use super::*;

    const AWS_KEY: &str = "AKIAIOSFODNN7EXAMPLE";
    const GITHUB_TOKEN: &str = "ghp_abcdefghijklmnopqrstuvwxyz0123456789";

    #[test]
    fn finds_each_kind_of_secret_and_masks_it() {
        let text = format!(
            "aws_key = {AWS_KEY}\n-----BEGIN RSA PRIVATE KEY-----\ntoken: {GITHUB_TOKEN}\npassword = \"hunter22\"\nnothing here\n"
        );
        let findings = scan_text("/repo/config", &text);
        let hits: Vec<_> = findings
            .iter()
            .map(|finding| {
                (
                    finding.rule_id.as_str(),
                    finding.resource.as_str(),
                    finding.evidence.as_str(),
                )
            })
            .collect();
        assert_eq!(
            hits,
            [
                (
                    "aws-access-key-id",
                    "/repo/config:1",
                    "aws_key = AKIA********"
                ),
                (
                    "private-key",
                    "/repo/config:2",
                    "-----BEGIN RSA PRIVATE KEY-----"
                ),
                ("github-token", "/repo/config:3", "token: ghp_********"),
                (
                    "hardcoded-password",
                    "/repo/config:4",
                    "password = \"********\""
                ),
            ]
        );
        for finding in &findings {
            assert_eq!(finding.severity, "high");
            assert!(!finding.evidence.contains("hunter22") && !finding.evidence.contains(AWS_KEY));
        }
    }

    /// The line the issue found missed, next to a token, and the other kinds the reference
    /// worker knows.
    #[test]
    fn finds_aws_secret_keys_forge_and_chat_tokens_and_named_passwords() {
        let text = concat!(
            "aws_secret_access_key = \"wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\"\n",
            "token: ghp_abcdefghijklmnopqrstuvwxyz0123456789\n",
            "CI_TOKEN=glpat-xR7vQm2Lz9TkWp4Bn8Yc\n",
            "slack = xoxb-2048204820-4096409640-Zx9Yw8Xv7Ut6\n",
            "db_password: 'Tr0ub4dor&3'\n",
            "\"clientSecret\": \"s3cr3t-v4lue\"\n",
            "secretary = \"Bob\"\n",
        );
        let findings = scan_text("/repo/.env", text);
        let rules: Vec<&str> = findings
            .iter()
            .map(|finding| finding.rule_id.as_str())
            .collect();
        assert_eq!(
            rules,
            [
                "aws-secret-access-key",
                "github-token",
                "gitlab-token",
                "slack-token",
                "hardcoded-password",
                "hardcoded-password",
            ]
        );
        for finding in &findings {
            for secret in [
                "wJalrXUtnFEMI",
                "xR7vQm2Lz9",
                "Zx9Yw8Xv7",
                "Tr0ub4dor",
                "s3cr3t",
            ] {
                assert!(!finding.evidence.contains(secret), "{finding:?}");
            }
        }
    }

    #[test]
    fn two_hits_on_one_line_are_told_apart() {
        let findings = scan_text("f", &format!("{AWS_KEY} {AWS_KEY}"));
        let discriminators: Vec<_> = findings
            .iter()
            .map(|finding| finding.discriminator.as_str())
            .collect();
        assert_eq!(discriminators, ["", "1"]);
    }

    #[test]
    fn ordinary_text_is_not_a_secret() {
        let text = "password = \"\"\nlet akia = 1;\nghp_short\nsecret: ${SECRET_FROM_ENV}\n";
        assert!(scan_text("f", text).is_empty());
    }

    #[tokio::test]
    async fn walks_a_tree_skipping_binary_large_and_git_files() {
        let directory = tempfile::tempdir().unwrap();
        let root = directory.path();
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::create_dir_all(root.join(".git")).unwrap();
        std::fs::write(root.join("src/settings.py"), format!("KEY = '{AWS_KEY}'\n")).unwrap();
        std::fs::write(root.join(".git/config"), format!("{AWS_KEY}\n")).unwrap();
        std::fs::write(
            root.join("blob.bin"),
            [AWS_KEY.as_bytes(), &[0, 1, 2]].concat(),
        )
        .unwrap();
        let large = format!("{AWS_KEY}\n{}", "x".repeat(FILE_BYTES_MAX as usize));
        std::fs::write(root.join("dump.sql"), large).unwrap();

        let (sink, mut receiver) = ResultSink::channel(64);
        let target = format!("file://{}", root.display());
        let task = TaskInput::for_target("secrets", &target);
        let summary = Secrets
            .run(task.clone(), sink, CancellationToken::new())
            .await
            .unwrap();
        assert_eq!(summary, "1 secrets in 1 files (2 skipped)");
        let mut items = vec![];
        while let Ok(item) = receiver.try_recv() {
            items.push(item);
        }
        let ResultItem::Finding(finding) = &items[0] else {
            panic!("a finding first: {items:?}")
        };
        let line = format!("{}:1", root.join("src/settings.py").display());
        assert_eq!(finding.resource, line);
        assert_eq!(finding.evidence, "KEY = 'AKIA********'");
        crate::coverage::testing::assert_covered(&RULES, &task, &items);
        assert_eq!(
            crate::coverage::testing::statuses(&items),
            [
                (
                    ("aws-access-key-id".to_owned(), line),
                    ("fail".to_owned(), String::new())
                ),
                (
                    (TRUNCATED_RULE_ID.to_owned(), target),
                    ("pass".to_owned(), String::new())
                ),
            ]
            .into()
        );
    }

    #[test]
    fn each_line_with_a_hit_fails_once_per_rule_and_a_truncated_walk_fails_on_the_target() {
        let findings = scan_text("/repo/f", &format!("{AWS_KEY} {AWS_KEY}\n{GITHUB_TOKEN}\n"));
        let mut report = Report {
            findings,
            files_scanned: 1,
            ..Report::default()
        };
        let statuses = |report: &Report| -> Vec<(String, String, String, String)> {
            evaluations(report, "/repo")
                .into_iter()
                .map(|evaluation| {
                    (
                        evaluation.rule_id,
                        evaluation.resource,
                        evaluation.status,
                        evaluation.finding_discriminator,
                    )
                })
                .collect()
        };
        let row = |rule: &str, resource: &str, status: &str| {
            (
                rule.to_owned(),
                resource.to_owned(),
                status.to_owned(),
                String::new(),
            )
        };
        assert_eq!(
            statuses(&report),
            [
                row("aws-access-key-id", "/repo/f:1", "fail"),
                row("github-token", "/repo/f:2", "fail"),
                row(TRUNCATED_RULE_ID, "/repo", "pass"),
            ]
        );
        report.truncated = true;
        report.findings.push(v1::Finding {
            rule_id: TRUNCATED_RULE_ID.into(),
            resource: "/repo".into(),
            ..Default::default()
        });
        assert_eq!(
            statuses(&report).last().unwrap(),
            &row(TRUNCATED_RULE_ID, "/repo", "fail")
        );
    }

    #[test]
    fn every_pattern_is_a_declared_rule() {
        let ids: Vec<&str> = RULES.iter().map(|rule| rule.id).collect();
        let patterns: Vec<&str> = PATTERNS.iter().map(|pattern| pattern.rule_id).collect();
        assert_eq!(ids[..PATTERNS.len()], patterns[..]);
        assert_eq!(ids[PATTERNS.len()..], [TRUNCATED_RULE_ID]);
    }
}
