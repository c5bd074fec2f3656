//! `synthetic`: a plugin for load and fault tests. Its target carries its behaviour:
//! `synthetic://anything?duration_ms=5&findings=3&fail=0.1&crash=0.01&retryable=true`.
//!
//! It emits `findings` findings spread over `duration_ms`, then fails with probability `fail`
//! (retryable unless `retryable=false`); with probability `crash` it aborts the whole process
//! halfway, for tests that kill workers. Rule ids are `synthetic-{i}` on the target as the
//! resource, so a replay yields the same finding keys. A target that is not a `synthetic://`
//! URL runs with the defaults: no delay, one finding, no failure, no crash.
//!
//! It declares the rules `synthetic-0` to `synthetic-4` ([`RULES`], one per severity) on the
//! target, and evaluates them there: each finding `synthetic-{i}` is followed by its FAIL (also
//! beyond the declared five, shown but not required), and each declared rule it emitted no
//! finding for reads PASS once the findings are out.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use worker::{BoxFuture, Plugin, PluginError, ResultSink, Rule, TaskInput, v1};

/// Longest run a target can ask for (one hour).
pub const DURATION_MS_MAX: u64 = 3_600_000;
/// Most findings a target can ask for: a hundred full batches.
pub const FINDINGS_MAX: u32 = 100_000;

const SEVERITIES: [&str; 5] = ["info", "low", "medium", "high", "critical"];

/// The rules it declares, on the target: the first five findings' (one per severity).
pub const RULES: [Rule; 5] = [
    Rule {
        id: "synthetic-0",
        applies_to: &[messages::TARGET_RESOURCE_KIND],
    },
    Rule {
        id: "synthetic-1",
        applies_to: &[messages::TARGET_RESOURCE_KIND],
    },
    Rule {
        id: "synthetic-2",
        applies_to: &[messages::TARGET_RESOURCE_KIND],
    },
    Rule {
        id: "synthetic-3",
        applies_to: &[messages::TARGET_RESOURCE_KIND],
    },
    Rule {
        id: "synthetic-4",
        applies_to: &[messages::TARGET_RESOURCE_KIND],
    },
];

pub struct Synthetic;

/// What a synthetic target asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    pub duration: Duration,
    pub findings: u32,
    pub fail_probability: f64,
    pub crash_probability: f64,
    pub retryable: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            duration: Duration::ZERO,
            findings: 1,
            fail_probability: 0.0,
            crash_probability: 0.0,
            retryable: true,
        }
    }
}

impl Options {
    /// The options in a `synthetic://` target's query; the defaults for any other target.
    /// An unknown option or a value out of range is a permanent `invalid_target`.
    pub fn parse(target: &str) -> Result<Self, PluginError> {
        let mut options = Self::default();
        if !target.starts_with("synthetic://") {
            return Ok(options);
        }
        let invalid = |why: String| {
            PluginError::permanent(
                "invalid_target",
                format!("synthetic target {target:?}: {why}"),
            )
        };
        let url = url::Url::parse(target).map_err(|error| invalid(error.to_string()))?;
        for (name, value) in url.query_pairs() {
            let number = || -> Result<f64, PluginError> {
                value
                    .parse::<f64>()
                    .ok()
                    .filter(|number| number.is_finite() && *number >= 0.0)
                    .ok_or_else(|| invalid(format!("{name}={value} is not a non-negative number")))
            };
            let probability = || {
                number().and_then(|p| {
                    if p <= 1.0 {
                        Ok(p)
                    } else {
                        Err(invalid(format!(
                            "{name}={value} is not a probability in 0..=1"
                        )))
                    }
                })
            };
            match name.as_ref() {
                "duration_ms" => {
                    let millis = value
                        .parse::<u64>()
                        .ok()
                        .filter(|millis| *millis <= DURATION_MS_MAX)
                        .ok_or_else(|| {
                            invalid(format!(
                                "duration_ms={value} is not in 0..={DURATION_MS_MAX}"
                            ))
                        })?;
                    options.duration = Duration::from_millis(millis);
                }
                "findings" => {
                    options.findings = value
                        .parse::<u32>()
                        .ok()
                        .filter(|count| *count <= FINDINGS_MAX)
                        .ok_or_else(|| {
                            invalid(format!("findings={value} is not in 0..={FINDINGS_MAX}"))
                        })?;
                }
                "fail" | "fail_probability" => options.fail_probability = probability()?,
                "crash" | "crash_probability" => options.crash_probability = probability()?,
                "retryable" => {
                    options.retryable = value
                        .parse()
                        .map_err(|_| invalid(format!("retryable={value} is not true or false")))?;
                }
                other => return Err(invalid(format!("unknown option {other:?}"))),
            }
        }
        Ok(options)
    }
}

impl Plugin for Synthetic {
    fn name(&self) -> &'static str {
        "synthetic"
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
            let options = Options::parse(&task.target)?;
            // Drawn up front so one attempt behaves one way throughout.
            let fails = rand::random::<f64>() < options.fail_probability;
            let crashes = rand::random::<f64>() < options.crash_probability;
            let steps = options.findings.max(1);
            let step = options.duration / steps;
            for index in 0..steps {
                tokio::select! {
                    () = cancel.cancelled() => return Err(PluginError::retryable("cancelled", "cancelled")),
                    () = tokio::time::sleep(step) => {}
                }
                if crashes && index == steps / 2 {
                    tracing::warn!(target = %task.target, "synthetic crash: aborting the process");
                    std::process::abort();
                }
                if index < options.findings {
                    let finding = finding(&task.target, index);
                    let failed = v1::Evaluation::fail(
                        &finding.rule_id,
                        &finding.resource,
                        &finding.discriminator,
                    );
                    sink.finding(finding).await?;
                    sink.evaluation(failed).await?;
                }
            }
            for rule in RULES.iter().skip(options.findings as usize) {
                sink.evaluation(v1::Evaluation::pass(rule.id, &task.target))
                    .await?;
            }
            sink.asset(v1::Asset {
                kind: "synthetic".into(),
                value: task.target.clone(),
            })
            .await?;
            if fails {
                return Err(PluginError {
                    code: "synthetic_failure".into(),
                    message: format!("synthetic failure after {} findings", options.findings),
                    retryable: options.retryable,
                });
            }
            Ok(format!("emitted {} synthetic findings", options.findings))
        })
    }
}

fn finding(target: &str, index: u32) -> v1::Finding {
    v1::Finding {
        rule_id: format!("synthetic-{index}"),
        resource: target.to_owned(),
        severity: SEVERITIES[index as usize % SEVERITIES.len()].into(),
        title: format!("Synthetic finding {index}"),
        description: "Emitted by the synthetic plugin for load and fault tests.".into(),
        evidence: format!("finding {index} of a synthetic run"),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use worker::ResultItem;

    use super::*;

    #[test]
    fn parses_options_from_the_query() {
        let options = Options::parse(
            "synthetic://load?duration_ms=5&findings=3&fail=0.25&crash=0&retryable=false",
        )
        .unwrap();
        assert_eq!(
            options,
            Options {
                duration: Duration::from_millis(5),
                findings: 3,
                fail_probability: 0.25,
                crash_probability: 0.0,
                retryable: false,
            }
        );
        let aliases =
            Options::parse("synthetic://x?fail_probability=1&crash_probability=0.5").unwrap();
        assert_eq!(
            (aliases.fail_probability, aliases.crash_probability),
            (1.0, 0.5)
        );
    }

    #[test]
    fn other_targets_get_the_defaults() {
        for target in ["http://127.0.0.1", "host:22", "", "synthetic://plain"] {
            assert_eq!(
                Options::parse(target).unwrap(),
                Options::default(),
                "{target}"
            );
        }
    }

    #[test]
    fn refuses_bad_options() {
        for target in [
            "synthetic://x?fail=2",
            "synthetic://x?crash=-1",
            "synthetic://x?findings=many",
            "synthetic://x?findings=100001",
            "synthetic://x?duration_ms=3600001",
            "synthetic://x?retryable=maybe",
            "synthetic://x?colour=blue",
        ] {
            let error = Options::parse(target).unwrap_err();
            assert_eq!(
                (error.code.as_str(), error.retryable),
                ("invalid_target", false),
                "{target}"
            );
        }
    }

    /// Runs the plugin on `target`: its result and everything it sent, checked for coverage
    /// (every declared rule evaluated on the target).
    async fn run(target: &str) -> (Result<String, PluginError>, Vec<ResultItem>) {
        let (sink, mut receiver) = ResultSink::channel(64);
        let task = TaskInput::for_target("synthetic", target);
        let result = Synthetic
            .run(task.clone(), sink, CancellationToken::new())
            .await;
        let mut items = vec![];
        while let Ok(item) = receiver.try_recv() {
            items.push(item);
        }
        crate::coverage::testing::assert_covered(&RULES, &task, &items);
        (result, items)
    }

    #[tokio::test]
    async fn emits_stable_findings() {
        let target = "synthetic://x?findings=3&duration_ms=3";
        let (result, first) = run(target).await;
        assert_eq!(result.unwrap(), "emitted 3 synthetic findings");
        let rules: Vec<_> = first
            .iter()
            .filter_map(|item| match item {
                ResultItem::Finding(finding) => Some(finding.rule_id.clone()),
                ResultItem::Asset(_) | ResultItem::Evaluation(_) => None,
            })
            .collect();
        assert_eq!(rules, ["synthetic-0", "synthetic-1", "synthetic-2"]);
        assert_eq!(
            crate::coverage::testing::on(&first, target),
            [
                ("synthetic-0", "fail"),
                ("synthetic-1", "fail"),
                ("synthetic-2", "fail"),
                ("synthetic-3", "pass"),
                ("synthetic-4", "pass"),
            ]
            .into()
        );
        let (_, second) = run(target).await;
        assert_eq!(first, second, "a replay emits the same results");
    }

    #[tokio::test]
    async fn the_default_run_fails_its_one_rule_and_passes_the_others() {
        let target = "http://127.0.0.1:8080/";
        let (result, items) = run(target).await;
        assert_eq!(result.unwrap(), "emitted 1 synthetic findings");
        let statuses = crate::coverage::testing::on(&items, target);
        assert_eq!(statuses["synthetic-0"], "fail");
        assert_eq!(statuses.len(), RULES.len());
        assert!(RULES[1..].iter().all(|rule| statuses[rule.id] == "pass"));
    }

    #[tokio::test]
    async fn findings_beyond_the_declared_rules_fail_too() {
        let target = "synthetic://x?findings=7";
        let (_, items) = run(target).await;
        let statuses = crate::coverage::testing::on(&items, target);
        assert_eq!(statuses.len(), 7);
        assert!(statuses.values().all(|status| *status == "fail"));
        let (_, none) = run("synthetic://x?findings=0").await;
        let statuses = crate::coverage::testing::on(&none, "synthetic://x?findings=0");
        assert_eq!(statuses.len(), RULES.len());
        assert!(statuses.values().all(|status| *status == "pass"));
    }

    #[tokio::test]
    async fn fails_as_asked() {
        let (result, _) = run("synthetic://x?fail=1").await;
        let error = result.unwrap_err();
        assert_eq!(
            (error.code.as_str(), error.retryable),
            ("synthetic_failure", true)
        );
        let (result, _) = run("synthetic://x?fail=1&retryable=false").await;
        assert!(!result.unwrap_err().retryable);
    }

    #[tokio::test]
    async fn stops_when_cancelled() {
        let (sink, _receiver) = ResultSink::channel(8);
        let cancel = CancellationToken::new();
        cancel.cancel();
        let task = TaskInput::for_target("synthetic", "synthetic://x?duration_ms=3600000");
        let result =
            tokio::time::timeout(Duration::from_secs(5), Synthetic.run(task, sink, cancel))
                .await
                .expect("returns at once");
        assert_eq!(result.unwrap_err().code, "cancelled");
    }
}
