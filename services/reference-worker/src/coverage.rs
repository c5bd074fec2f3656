//! What the plugins conclude, found or not (reference 6.7 "Evaluations", 13): each plugin
//! declares its rules ([`worker::Plugin::rules`]) and reports an evaluation of each on every
//! resource it checks; these build them. A FAIL always follows its finding and names it (same
//! rule and resource, the finding's discriminator).

use worker::{Rule, v1};

/// The evaluation of each of `rules` on `resource` after a check whose findings are
/// `findings`: FAIL naming the first finding of the rule on `resource`; else what `otherwise`
/// says for the rule (NOT_APPLICABLE or ERROR where the check was not made); else PASS.
pub fn concluded(
    rules: &[Rule],
    resource: &str,
    findings: &[v1::Finding],
    otherwise: impl Fn(&str) -> Option<v1::Evaluation>,
) -> Vec<v1::Evaluation> {
    rules
        .iter()
        .map(|rule| {
            match findings
                .iter()
                .find(|finding| finding.rule_id == rule.id && finding.resource == resource)
            {
                Some(finding) => v1::Evaluation::fail(rule.id, resource, &finding.discriminator),
                None => {
                    otherwise(rule.id).unwrap_or_else(|| v1::Evaluation::pass(rule.id, resource))
                }
            }
        })
        .collect()
}

/// A FAIL for each distinct (rule, resource) of `findings`, naming the first finding of each:
/// for plugins whose findings land on resources no declaration requires (a line of a file, a
/// lockfile's advisory).
pub fn failed(findings: &[v1::Finding]) -> Vec<v1::Evaluation> {
    let mut seen = std::collections::HashSet::new();
    findings
        .iter()
        .filter(|finding| seen.insert((finding.rule_id.as_str(), finding.resource.as_str())))
        .map(|finding| {
            v1::Evaluation::fail(&finding.rule_id, &finding.resource, &finding.discriminator)
        })
        .collect()
}

/// ERROR for each of `rules` on `resource`: the check could not be made, for `reason_code`.
pub fn errors(
    rules: &[Rule],
    resource: &str,
    reason_code: &str,
    evidence: &str,
) -> Vec<v1::Evaluation> {
    rules
        .iter()
        .map(|rule| v1::Evaluation::error(rule.id, resource, reason_code).with_evidence(evidence))
        .collect()
}

/// NOT_APPLICABLE for each of `rules` on `resource`, for `reason_code`.
pub fn not_applicable(rules: &[Rule], resource: &str, reason_code: &str) -> Vec<v1::Evaluation> {
    rules
        .iter()
        .map(|rule| v1::Evaluation::not_applicable(rule.id, resource, reason_code))
        .collect()
}

/// For plugin tests: what a run's results say about coverage.
#[cfg(test)]
pub mod testing {
    use std::collections::BTreeMap;

    use worker::{ResultItem, Rule, TaskInput, v1};

    /// Each evaluation's status (and reason), by (rule, resource); the last one wins, as in
    /// the store.
    pub fn statuses(items: &[ResultItem]) -> BTreeMap<(String, String), (String, String)> {
        items
            .iter()
            .filter_map(|item| match item {
                ResultItem::Evaluation(evaluation) => Some((
                    (evaluation.rule_id.clone(), evaluation.resource.clone()),
                    (evaluation.status.clone(), evaluation.reason_code.clone()),
                )),
                ResultItem::Finding(_) | ResultItem::Asset(_) => None,
            })
            .collect()
    }

    /// The statuses of the evaluations on `resource`, by rule.
    pub fn on<'a>(items: &'a [ResultItem], resource: &str) -> BTreeMap<&'a str, &'a str> {
        items
            .iter()
            .filter_map(|item| match item {
                ResultItem::Evaluation(evaluation) if evaluation.resource == resource => {
                    Some((evaluation.rule_id.as_str(), evaluation.status.as_str()))
                }
                _ => None,
            })
            .collect()
    }

    /// Checks what coverage would: every declared rule is evaluated on each resource of its
    /// kinds the run had (the target, the task's discovered assets, the assets it reported),
    /// every status is one of the four with a reason where one is due, and every FAIL comes
    /// after the finding it names. Panics saying what is missing.
    pub fn assert_covered(rules: &[Rule], task: &TaskInput, items: &[ResultItem]) {
        let mut resources = vec![(
            messages::TARGET_RESOURCE_KIND.to_owned(),
            task.target.clone(),
        )];
        resources.extend(
            task.discovered_assets
                .iter()
                .map(|asset| (asset.kind.clone(), asset.value.clone())),
        );
        let mut findings: Vec<&v1::Finding> = vec![];
        for item in items {
            match item {
                ResultItem::Asset(asset) => {
                    resources.push((asset.kind.clone(), asset.value.clone()))
                }
                ResultItem::Finding(finding) => findings.push(finding),
                ResultItem::Evaluation(evaluation) => {
                    assert!(
                        messages::EVALUATION_STATUSES.contains(&evaluation.status.as_str()),
                        "{evaluation:?}"
                    );
                    let reason_due =
                        matches!(evaluation.status.as_str(), "error" | "not_applicable");
                    assert_eq!(
                        !evaluation.reason_code.is_empty(),
                        reason_due,
                        "{evaluation:?}"
                    );
                    if evaluation.status == "fail" {
                        assert!(
                            findings
                                .iter()
                                .any(|finding| finding.rule_id == evaluation.rule_id
                                    && finding.resource == evaluation.resource
                                    && finding.discriminator == evaluation.finding_discriminator),
                            "a FAIL names a finding sent before it: {evaluation:?}"
                        );
                    }
                }
            }
        }
        let evaluated = statuses(items);
        for rule in rules {
            for (kind, resource) in &resources {
                if rule.applies_to.contains(&kind.as_str()) {
                    assert!(
                        evaluated.contains_key(&(rule.id.to_owned(), resource.clone())),
                        "{} is not evaluated on the {kind} {resource:?}: {evaluated:?}",
                        rule.id
                    );
                }
            }
        }
    }
}
