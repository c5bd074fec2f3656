//! The plugin end to end on `testdata/dependency_audit`: lockfiles found, advisories matched,
//! findings as ingestion takes them.

use worker::ResultItem;

use super::*;

fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/dependency_audit")
        .join(name)
}

fn plugin() -> DependencyAudit {
    DependencyAudit::new(Some(testdata("osv")))
}

async fn run(
    plugin: &DependencyAudit,
    target: &str,
) -> (Result<String, PluginError>, Vec<v1::Finding>) {
    let (result, items) = run_items(plugin, target).await;
    let mut findings = vec![];
    let mut evaluations = vec![];
    for item in &items {
        match item {
            ResultItem::Finding(finding) => findings.push(finding.clone()),
            ResultItem::Asset(asset) => panic!("no assets expected, got {asset:?}"),
            ResultItem::Evaluation(evaluation) => evaluations.push(evaluation.clone()),
        }
    }
    if result.is_ok() {
        let task = TaskInput::for_target("dependency_audit", target);
        crate::coverage::testing::assert_covered(&RULES, &task, &items);
        // Every (advisory, lockfile) found fails once, then the target passes.
        let mut expected = crate::coverage::failed(&findings);
        expected.push(v1::Evaluation::pass(TRUNCATED_RULE_ID, target));
        for evaluation in &mut evaluations {
            evaluation.evidence.clear();
        }
        assert_eq!(evaluations, expected);
    } else {
        assert!(evaluations.is_empty(), "{evaluations:?}");
    }
    (result, findings)
}

/// The result of a run on `target`, and everything it sent.
async fn run_items(
    plugin: &DependencyAudit,
    target: &str,
) -> (Result<String, PluginError>, Vec<ResultItem>) {
    let (sink, mut receiver) = ResultSink::channel(1024);
    let result = plugin
        .run(
            TaskInput::for_target("dependency_audit", target),
            sink,
            CancellationToken::new(),
        )
        .await;
    let mut items = vec![];
    while let Ok(item) = receiver.try_recv() {
        items.push(item);
    }
    (result, items)
}

/// (rule_id, discriminator, severity, cve_ids) of each finding, in order.
fn keys(findings: &[v1::Finding]) -> Vec<(&str, &str, &str, Vec<&str>)> {
    findings
        .iter()
        .map(|finding| {
            (
                finding.rule_id.as_str(),
                finding.discriminator.as_str(),
                finding.severity.as_str(),
                finding.cve_ids.iter().map(String::as_str).collect(),
            )
        })
        .collect()
}

#[tokio::test]
async fn audits_a_cargo_lock() {
    let target = testdata("rust/Cargo.lock");
    let (result, findings) = run(&plugin(), &target.display().to_string()).await;
    assert_eq!(
        result.unwrap(),
        "2 advisories on package versions in 1 lockfiles (4 packages, 3 advisories that name them)"
    );
    assert_eq!(
        keys(&findings),
        [
            (
                "RUSTSEC-2099-0002",
                "crates.io:smallvec@1.6.0",
                "critical",
                vec!["CVE-2099-0002"]
            ),
            (
                "RUSTSEC-2099-0001",
                "crates.io:time@0.1.43",
                "medium",
                vec!["CVE-2099-0001"]
            ),
        ],
        "hyper 0.14.10 is the fixed version and the tokio advisory is withdrawn"
    );
    let time = &findings[1];
    assert_eq!(time.resource, target.display().to_string());
    assert_eq!(
        time.title,
        "time 0.1.43: Potential segfault in the time crate"
    );
    assert_eq!(
        time.evidence,
        format!(
            "{} pins time 0.1.43; RUSTSEC-2099-0001 fixed in 0.2.23",
            target.display()
        )
    );
    assert!(time.description.contains("dangling pointer"));
    assert!(findings[0].evidence.ends_with("no fixed version is known"));
}

#[tokio::test]
async fn audits_package_locks_v3_and_v1() {
    let (result, v3) = run(
        &plugin(),
        &testdata("web/package-lock.json").display().to_string(),
    )
    .await;
    result.unwrap();
    assert_eq!(
        keys(&v3),
        [
            (
                "GHSA-9gxr-rhx6-4jgv",
                "npm:@example/left-pad@1.1.0",
                "medium",
                vec![]
            ),
            (
                "GHSA-35jh-r3h4-6jhm",
                "npm:lodash@4.17.20",
                "high",
                vec!["CVE-2099-0005"]
            ),
        ],
        "lodash 4.17.21 is fixed; minimist 1.2.5 is not in the explicit list"
    );
    let (result, v1) = run(
        &plugin(),
        &testdata("legacy/package-lock.json").display().to_string(),
    )
    .await;
    result.unwrap();
    assert_eq!(
        keys(&v1),
        [
            (
                "GHSA-35jh-r3h4-6jhm",
                "npm:lodash@4.17.20",
                "high",
                vec!["CVE-2099-0005"]
            ),
            (
                "GHSA-vh95-rmgr-6w4m",
                "npm:minimist@0.0.8",
                "critical",
                vec!["CVE-2099-0006", "CVE-2099-0007"]
            ),
        ]
    );
}

#[tokio::test]
async fn a_directory_target_finds_every_lockfile_outside_skipped_directories() {
    let directory = tempfile::tempdir().unwrap();
    let root = directory.path();
    for (from, to) in [
        ("rust/Cargo.lock", "Cargo.lock"),
        ("web/package-lock.json", "frontend/package-lock.json"),
        // Installed packages, build output and history hold lockfiles that are not the
        // project's: a search never enters them.
        (
            "legacy/package-lock.json",
            "frontend/node_modules/mkdirp/package-lock.json",
        ),
        (
            "legacy/package-lock.json",
            "target/package/app/package-lock.json",
        ),
        ("rust/Cargo.lock", ".git/Cargo.lock"),
    ] {
        let to = root.join(to);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(testdata(from), to).unwrap();
    }
    let (result, findings) = run(&plugin(), &format!("file://{}", root.display())).await;
    assert_eq!(
        result.unwrap(),
        "4 advisories on package versions in 2 lockfiles (9 packages, 6 advisories that name them)"
    );
    let resources: BTreeSet<_> = findings
        .iter()
        .map(|finding| finding.resource.clone())
        .collect();
    assert_eq!(
        resources,
        BTreeSet::from([
            root.join("Cargo.lock").display().to_string(),
            root.join("frontend/package-lock.json")
                .display()
                .to_string(),
        ])
    );
}

#[tokio::test]
async fn the_same_input_gives_identical_findings() {
    let target = testdata("").display().to_string();
    let (first_result, first) = run(&plugin(), &target).await;
    let (second_result, second) = run(&plugin(), &target).await;
    assert_eq!(first_result, second_result);
    assert_eq!(first.len(), 6, "{first:?}");
    assert_eq!(first, second);
    let identities: BTreeSet<_> = first
        .iter()
        .map(|finding| (&finding.rule_id, &finding.resource, &finding.discriminator))
        .collect();
    assert_eq!(
        identities.len(),
        first.len(),
        "every finding has its own key"
    );
}

#[tokio::test]
async fn findings_pass_ingestion_s_checks() {
    let (_, findings) = run(&plugin(), &testdata("").display().to_string()).await;
    for finding in &findings {
        assert!(!finding.rule_id.is_empty() && finding.rule_id.len() <= 128);
        assert!(!finding.resource.is_empty() && !finding.title.is_empty());
        assert!(["info", "low", "medium", "high", "critical"].contains(&finding.severity.as_str()));
        assert!(
            finding
                .cve_ids
                .iter()
                .all(|id| messages::validate::is_cve_id(id))
        );
    }
}

#[tokio::test]
async fn without_a_database_tasks_fail_saying_what_to_set() {
    let (result, findings) = run(
        &DependencyAudit::new(None),
        &testdata("rust/Cargo.lock").display().to_string(),
    )
    .await;
    let error = result.unwrap_err();
    assert_eq!(error.code, "advisory_database_missing");
    assert!(!error.retryable);
    assert!(
        error.message.contains("PALISADE_OSV_DIR"),
        "{}",
        error.message
    );
    assert!(findings.is_empty());
}

#[tokio::test]
async fn targets_are_validated_like_secrets_targets() {
    for (target, code) in [
        ("relative/Cargo.lock", "invalid_target"),
        ("/does/not/exist/Cargo.lock", "target_not_found"),
        ("http://host/Cargo.lock", "invalid_target"),
    ] {
        let error = run(&plugin(), target).await.0.unwrap_err();
        assert_eq!(
            (error.code.as_str(), error.retryable),
            (code, false),
            "{target}"
        );
    }
    let readme = testdata("osv/README.md").display().to_string();
    let error = run(&plugin(), &readme).await.0.unwrap_err();
    assert_eq!(error.code, "unsupported_target");
    assert!(error.message.contains("Cargo.lock"), "{}", error.message);
}

#[tokio::test]
async fn a_malformed_lockfile_fails_the_task_without_findings() {
    let directory = tempfile::tempdir().unwrap();
    std::fs::copy(
        testdata("rust/Cargo.lock"),
        directory.path().join("Cargo.lock"),
    )
    .unwrap();
    let broken = directory.path().join("ui/package-lock.json");
    std::fs::create_dir_all(broken.parent().unwrap()).unwrap();
    std::fs::write(&broken, "{\"lockfileVersion\": 3, \"packages\": ").unwrap();
    let (result, findings) = run(&plugin(), &directory.path().display().to_string()).await;
    let error = result.unwrap_err();
    assert_eq!(
        (error.code.as_str(), error.retryable),
        ("invalid_lockfile", false)
    );
    assert!(
        error.message.contains(&broken.display().to_string()),
        "{}",
        error.message
    );
    assert!(
        findings.is_empty(),
        "the good lockfile's findings are not sent either"
    );
}

#[tokio::test]
async fn a_malformed_advisory_fails_the_task_naming_it() {
    let database = tempfile::tempdir().unwrap();
    let bad = database.path().join("RUSTSEC-2099-0099.json");
    std::fs::write(&bad, "{\"id\": \"RUSTSEC-2099-0099\", \"affected\": 7}").unwrap();
    let plugin = DependencyAudit::new(Some(database.path().to_owned()));
    let (result, findings) = run(&plugin, &testdata("rust/Cargo.lock").display().to_string()).await;
    let error = result.unwrap_err();
    assert_eq!(
        (error.code.as_str(), error.retryable),
        ("invalid_advisory", false)
    );
    assert!(
        error.message.contains(&bad.display().to_string()),
        "{}",
        error.message
    );
    assert!(
        error.message.contains("PALISADE_OSV_DIR"),
        "{}",
        error.message
    );
    assert!(findings.is_empty());
}

#[test]
fn findings_stop_at_the_limit_with_a_finding_saying_so() {
    let database = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    // One package with more advisories than the limit allows findings.
    let mut lock = String::from("version = 3\n");
    lock.push_str(
        "[[package]]\nname = \"demo\"\nversion = \"1.0.0\"\nsource = \"registry+https://github.com/rust-lang/crates.io-index\"\n",
    );
    std::fs::write(project.path().join("Cargo.lock"), lock).unwrap();
    for index in 0..=FINDINGS_MAX {
        let advisory = serde_json::json!({
            "id": format!("RUSTSEC-2099-{index:05}"),
            "affected": [{"package": {"ecosystem": "crates.io", "name": "demo"}, "versions": ["1.0.0"]}],
        });
        std::fs::write(
            database.path().join(format!("{index}.json")),
            advisory.to_string(),
        )
        .unwrap();
    }
    let database = osv::Database::new(database.path().to_owned());
    let target = format!("file://{}", project.path().display());
    let report = audit(
        project.path(),
        &target,
        &database,
        &CancellationToken::new(),
    )
    .unwrap();
    assert!(report.truncated);
    assert_eq!(report.findings.len(), FINDINGS_MAX + 1);
    let last = report.findings.last().unwrap();
    assert_eq!(
        (
            last.rule_id.as_str(),
            last.severity.as_str(),
            last.resource.as_str()
        ),
        (TRUNCATED_RULE_ID, "info", target.as_str())
    );
    let evaluations = report.evaluations(&target);
    assert_eq!(
        evaluations.len(),
        FINDINGS_MAX + 1,
        "one per advisory, then the target"
    );
    assert_eq!(
        evaluations.last().unwrap(),
        &v1::Evaluation::fail(TRUNCATED_RULE_ID, &target, "")
    );
    assert!(report.summary().ends_with("stopped at a limit"));
}

#[test]
fn text_fields_are_cut_and_lose_nul_characters() {
    assert_eq!(text("a\0b", 10), "ab");
    assert_eq!(text("abcdef", 3), "abc");
    assert_eq!(text("ab  cd", 3), "ab");
}

#[test]
fn the_database_is_indexed_once_and_again_only_when_a_file_changes() {
    let directory = tempfile::tempdir().unwrap();
    let write = |file: &str, id: &str, package: &str, withdrawn: bool| {
        let mut advisory = serde_json::json!({
            "id": id,
            "affected": [{"package": {"ecosystem": "crates.io", "name": package}, "versions": ["1.0.0"]}],
        });
        if withdrawn {
            advisory["withdrawn"] = "2024-01-01T00:00:00Z".into();
        }
        std::fs::write(directory.path().join(file), advisory.to_string()).unwrap();
    };
    write("a.json", "RUSTSEC-2099-0001", "demo", false);
    write("b.json", "RUSTSEC-2099-0002", "demo", false);
    write("c.json", "RUSTSEC-2099-0003", "other", false);
    let database = osv::Database::new(directory.path().to_owned());
    let demo = BTreeSet::from([(lockfile::Ecosystem::CratesIo, "demo".to_owned())]);
    let cancel = CancellationToken::new();
    let ids = |advisories: Vec<osv::Advisory>| -> Vec<String> {
        advisories.into_iter().map(|advisory| advisory.id).collect()
    };

    assert_eq!(
        ids(database.load(&demo, &cancel).unwrap()),
        ["RUSTSEC-2099-0001", "RUSTSEC-2099-0002"]
    );
    assert_eq!(
        database.files_parsed(),
        3 + 2,
        "indexed, then the two naming demo read"
    );
    database.load(&demo, &cancel).unwrap();
    assert_eq!(
        database.files_parsed(),
        5 + 2,
        "unchanged: only the two read again"
    );

    // A new file, and one withdrawn in place, are seen by the next task.
    write("d.json", "RUSTSEC-2099-0004", "demo", false);
    write("a.json", "RUSTSEC-2099-0001", "demo", true);
    assert_eq!(
        ids(database.load(&demo, &cancel).unwrap()),
        ["RUSTSEC-2099-0002", "RUSTSEC-2099-0004"]
    );
    assert_eq!(database.files_parsed(), 7 + 4 + 2);
}
