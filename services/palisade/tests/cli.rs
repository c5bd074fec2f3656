//! The `palisade` command as scripts and pipelines run it, as a child process against a test
//! system (`tests::TestSystem`, every service in-process on real PostgreSQL and NATS): standard
//! output holds the answer and nothing else (parsed as JSON with `--output json`), logs go to
//! standard error at `warn` unless `-v`, exit statuses are those `palisade::exit` documents,
//! and `scan submit --wait` follows a scan to its end.

#![allow(
    clippy::too_many_lines,
    reason = "a test reads as one scenario; the 70-line limit is for production functions"
)]

use palisade::exit::Status;
use tests::TestSystem;
use tests::empty_database::EmptyDatabase;
use uuid::Uuid;

/// The `palisade` binary, built by cargo with this test.
const PALISADE: &str = env!("CARGO_BIN_EXE_palisade");

/// What a run of the command left.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|error| panic!("stdout is not one JSON document ({error}): {self:?}"))
    }

    #[track_caller]
    fn assert_status(&self, status: Status) {
        assert_eq!(self.code, i32::from(status.code()), "{self:?}");
    }
}

/// Runs `palisade args…` as the operator against `system`'s database and NATS, with the
/// logging defaults a user has (no RUST_LOG).
async fn palisade(system: &TestSystem, args: &[&str]) -> Run {
    palisade_on(system, system.database_url(), args).await
}

async fn palisade_on(system: &TestSystem, database_url: &str, args: &[&str]) -> Run {
    palisade_with(system, database_url, &[], args).await
}

/// [`palisade_on`] with more environment variables.
async fn palisade_with(
    system: &TestSystem,
    database_url: &str,
    env: &[(&str, &std::ffi::OsStr)],
    args: &[&str],
) -> Run {
    let output = tokio::process::Command::new(PALISADE)
        .args(args)
        .envs(system.nats.child_env(&messages::Identity::Operator).await)
        .envs(env.iter().copied())
        .env("DATABASE_URL", database_url)
        .env("PALISADE_SUBJECT_PREFIX", system.subjects.prefix())
        .env_remove("RUST_LOG")
        .env_remove("PALISADE_LOG_FORMAT")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .kill_on_drop(true)
        .output()
        .await
        .expect("palisade runs");
    Run {
        code: output.status.code().expect("exited, not killed"),
        stdout: String::from_utf8(output.stdout).expect("UTF-8 stdout"),
        stderr: String::from_utf8(output.stderr).expect("UTF-8 stderr"),
    }
}

/// Log lines at any level, as the text format writes them (coloured or not).
fn has_log_lines(text: &str) -> bool {
    ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"]
        .iter()
        .any(|level| text.contains(level))
}

#[tokio::test]
async fn one_shot_commands_print_only_their_answer_and_log_to_stderr_when_asked() {
    let system = TestSystem::spawn().await;
    let organization_id = system.organization().await;
    system.reference_worker(organization_id, 2).await;
    let org = organization_id.to_string();

    let added = palisade(&system, &["org", "add", "--name", "scripted"]).await;
    added.assert_status(Status::Ok);
    let id: Uuid = added
        .stdout
        .trim_end()
        .parse()
        .expect("stdout is the id alone");
    assert_eq!(added.stdout, format!("{id}\n"));
    assert!(added.stderr.is_empty(), "nothing logged at warn: {added:?}");

    // Submitting connects to NATS (whose client logs its connection at info) and PostgreSQL.
    let target = "synthetic://scripted?findings=1";
    let submit = [
        "scan",
        "submit",
        "--org",
        org.as_str(),
        "--target",
        target,
        "--plugins",
        "synthetic",
    ];
    let submitted = palisade(&system, &[&submit[..], &["--output", "json"]].concat()).await;
    submitted.assert_status(Status::Ok);
    let answer = submitted.json();
    let scan_id = answer["scan_id"].as_str().expect("a scan id").to_owned();
    assert_eq!(answer["deduplicated"], false);
    // The scan's trace, for the tracing UI (the multi-process trace test finds it there).
    let trace_id = answer["trace_id"].as_str().expect("a trace id");
    assert!(
        trace_id.len() == 32 && trace_id.bytes().all(|byte| byte.is_ascii_hexdigit()),
        "{answer}"
    );
    assert!(!has_log_lines(&submitted.stderr), "{submitted:?}");

    // -v: the answer alone on stdout still, info lines on stderr.
    let verbose_submit = [
        "-v",
        "scan",
        "submit",
        "--org",
        org.as_str(),
        "--target",
        "synthetic://verbose",
        "--plugins",
        "synthetic",
        "--output",
        "json",
    ];
    let verbose = palisade(&system, &verbose_submit).await;
    verbose.assert_status(Status::Ok);
    assert!(verbose.json()["scan_id"].is_string());
    assert!(
        verbose.stderr.contains("INFO"),
        "-v logs at info: {verbose:?}"
    );
    assert!(!has_log_lines(&verbose.stdout));
    assert!(
        !verbose.stderr.contains('\u{1b}'),
        "no colours where stderr is not a terminal: {verbose:?}"
    );

    system.wait_scan_state(&scan_id, "completed").await;
    let shown = palisade(
        &system,
        &["scan", "show", scan_id.as_str(), "--output", "json"],
    )
    .await;
    shown.assert_status(Status::Ok);
    let scan = shown.json();
    assert_eq!(
        (scan["id"].as_str(), scan["state"].as_str()),
        (Some(scan_id.as_str()), Some("completed"))
    );
    assert_eq!(scan["jobs"][0]["plugin"], "synthetic");
    assert_eq!(scan["findings"].as_array().map(Vec::len), Some(1));
    assert!(shown.stderr.is_empty(), "{shown:?}");

    // The gate: its one finding is synthetic's first, of severity info, open. Below the
    // default threshold (high) the gate passes, exit 0; at info it does not, exit 5.
    let gate = palisade(
        &system,
        &["scan", "gate", scan_id.as_str(), "--output", "json"],
    )
    .await;
    gate.assert_status(Status::Ok);
    assert_eq!(gate.json()["gate_passed"], true, "{gate:?}");
    let strict = palisade(
        &system,
        &[
            "scan",
            "gate",
            scan_id.as_str(),
            "--threshold",
            "info",
            "--output",
            "json",
        ],
    )
    .await;
    strict.assert_status(Status::NotPassed);
    assert_eq!(strict.json()["gate_passed"], false, "{strict:?}");

    // Coverage: synthetic declares synthetic-0..4 on the target and evaluates each (its one
    // finding's rule fails, the others pass), so the required coverage is complete.
    assert_eq!(scan["coverage"]["summary"]["complete"], true, "{shown:?}");
    assert_eq!(scan["coverage"]["summary"]["status"], "fail", "{shown:?}");
    assert_eq!(
        gate.json()["coverage"]["required_incomplete"],
        0,
        "{gate:?}"
    );
    // A second scan of the target: the diff names the finding still present, and the target
    // shows both scans and the finding seen in two.
    let again = palisade(&system, &[&submit[..], &["--output", "json"]].concat()).await;
    again.assert_status(Status::Ok);
    let later = again.json()["scan_id"]
        .as_str()
        .expect("a scan id")
        .to_owned();
    system.wait_scan_state(&later, "completed").await;
    let diff = palisade(
        &system,
        &[
            "scan",
            "diff",
            scan_id.as_str(),
            later.as_str(),
            "--output",
            "json",
        ],
    )
    .await;
    diff.assert_status(Status::Ok);
    assert_eq!(
        diff.json()["still_present"].as_array().map(Vec::len),
        Some(1),
        "{diff:?}"
    );
    let backwards = palisade(&system, &["scan", "diff", later.as_str(), scan_id.as_str()]).await;
    backwards.assert_status(Status::Refused);
    let shown_target = palisade(&system, &["target", "show", target, "--output", "json"]).await;
    shown_target.assert_status(Status::Ok);
    let history = &shown_target.json()[0];
    assert_eq!(
        history["scans"].as_array().map(Vec::len),
        Some(2),
        "{shown_target:?}"
    );
    assert_eq!(history["latest_completed"], later.as_str());
    assert_eq!(history["findings"][0]["scans"], 2, "{shown_target:?}");
    let unknown = palisade(&system, &["target", "show", "synthetic://nowhere"]).await;
    unknown.assert_status(Status::NotFound);

    let check = palisade(&system, &["migrate", "--check", "--output", "json"]).await;
    check.assert_status(Status::Ok);
    assert_eq!(check.json()["status"], "up_to_date");
    assert!(check.stderr.is_empty(), "{check:?}");
    system.finish().await;
}

#[tokio::test]
async fn exit_statuses_say_what_happened() {
    let system = TestSystem::spawn().await;
    let organization_id = system.organization().await;

    let usage = palisade(&system, &["scan", "show", "not-a-uuid"]).await;
    usage.assert_status(Status::Usage);

    let unknown = Uuid::now_v7().to_string();
    for args in [
        &["scan", "show", unknown.as_str()][..],
        &["scan", "show", unknown.as_str(), "--output", "json"],
        &["scan", "gate", unknown.as_str()],
        &["scan", "cancel", unknown.as_str()],
        &["finding", "show", unknown.as_str()],
        &["worker", "enable", "--worker", unknown.as_str()],
        &["client", "revoke", "--id", "nobody"],
    ] {
        let run = palisade(&system, args).await;
        run.assert_status(Status::NotFound);
        assert!(run.stdout.is_empty(), "no answer on stdout: {run:?}");
        assert!(run.stderr.contains("no "), "says what is missing: {run:?}");
    }

    // Admission refuses a profile naming a plugin twice.
    let org = organization_id.to_string();
    let refused = palisade(
        &system,
        &[
            "scan",
            "submit",
            "--org",
            org.as_str(),
            "--target",
            "synthetic://twice",
            "--plugins",
            "synthetic,synthetic",
        ],
    )
    .await;
    refused.assert_status(Status::Refused);
    assert!(
        refused.stdout.is_empty() && refused.stderr.contains("refused"),
        "{refused:?}"
    );
    system.finish().await;
}

/// Runs `args` twice: as text (the default), which is not JSON and holds each of `wanted`;
/// and with `--output json`, which is `json` byte for byte, the JSON the command has always
/// printed.
async fn text_and_json(system: &TestSystem, args: &[&str], wanted: &[&str], json: &str) -> Run {
    let text = palisade(system, args).await;
    text.assert_status(Status::Ok);
    assert!(
        serde_json::from_str::<serde_json::Value>(&text.stdout).is_err(),
        "text by default: {text:?}"
    );
    for wanted in wanted {
        assert!(text.stdout.contains(wanted), "{wanted}: {text:?}");
    }
    let as_json = palisade(system, &[args, &["--output", "json"]].concat()).await;
    as_json.assert_status(Status::Ok);
    assert_eq!(as_json.stdout, format!("{json}\n"), "{args:?}");
    text
}

/// `value` as a command printed it with `--output json` before issue 48 item 13 (indented).
fn pretty(value: &impl serde::Serialize) -> String {
    serde_json::to_string_pretty(value).unwrap()
}

/// `palisade scan list --org <organization>`'s rows, read as the command reads them.
async fn scan_list(pool: &store::PgPool, organization: Uuid) -> Vec<store::admin::ScanView> {
    let filter = store::admin::ScanFilter {
        organization_id: Some(organization),
        target: None,
        state: None,
        plugin: None,
        admitted_from: None,
        admitted_before: None,
        client_id: None,
        after: None,
        limit: 50,
    };
    store::admin::scans(pool, &filter).await.unwrap().unwrap()
}

/// `palisade target show <locator>`'s answer, read as the command reads it.
async fn target_history(
    pool: &store::PgPool,
    locator: &str,
) -> Vec<store::coverage::TargetHistory> {
    let mut conn = pool.acquire().await.unwrap();
    store::coverage::target_history(&mut conn, None, locator, 10)
        .await
        .unwrap()
}

/// Every command that prints an answer prints it one way (issue 48, item 13): text by default,
/// and with `--output json` the JSON it has always printed, byte for byte (a struct's fields in
/// their order, a `serde_json::Value`'s keys in alphabetical order; indented, or on one line
/// where the command always printed one line).
#[tokio::test]
async fn reads_and_changes_print_text_or_the_json_they_always_printed() {
    let system = TestSystem::spawn().await;
    let organization_id = system.organization().await;
    system.reference_worker(organization_id, 2).await;
    let org = organization_id.to_string();
    let target = "synthetic://printed?findings=1";
    let submitted = palisade(
        &system,
        &[
            "scan",
            "submit",
            "--org",
            &org,
            "--target",
            target,
            "--plugins",
            "synthetic",
        ],
    )
    .await;
    submitted.assert_status(Status::Ok);
    let scan_id = submitted.stdout.split(' ').next().unwrap().to_owned();
    let scan: Uuid = scan_id.parse().expect("text: the scan id first");
    system.wait_scan_state(&scan_id, "completed").await;
    let pool = &system.pool;

    let detail = palisade::scans::show(pool, scan).await.unwrap();
    let page = palisade::commands::list_findings(pool, scan, &Default::default(), "", 100)
        .await
        .unwrap();
    let finding_id = page.findings[0].id.to_string();
    for (args, wanted, json) in [
        (
            vec!["scan", "show", scan_id.as_str()],
            vec![
                format!("scan        {scan_id}"),
                "state       completed".to_owned(),
                "1 findings".to_owned(),
                "coverage    fail".to_owned(),
            ],
            pretty(&detail),
        ),
        (
            vec!["scan", "list", "--org", org.as_str()],
            vec![format!("{scan_id} completed")],
            pretty(&scan_list(pool, organization_id).await),
        ),
        (
            vec!["scan", "gate", scan_id.as_str()],
            vec![format!("scan {scan_id}: completed (complete)")],
            pretty(
                &palisade::commands::scan_gate(pool, scan, store::states::Severity::High)
                    .await
                    .unwrap(),
            ),
        ),
        (
            vec!["target", "show", target],
            vec![
                format!("target      {target}"),
                format!("{scan_id} completed"),
            ],
            pretty(&target_history(pool, target).await),
        ),
        (
            vec!["finding", "list", "--scan", scan_id.as_str()],
            vec![format!("scan {scan_id} (completed), collection revision 0")],
            pretty(&page),
        ),
        (
            vec!["finding", "show", finding_id.as_str()],
            vec![format!("{finding_id} [info]")],
            pretty(
                &palisade::commands::show_finding(pool, finding_id.parse().unwrap())
                    .await
                    .unwrap(),
            ),
        ),
        (
            vec!["queue"],
            vec!["organization".to_owned()],
            pretty(&store::observability::backlog(pool).await.unwrap()),
        ),
    ] {
        let wanted: Vec<&str> = wanted.iter().map(String::as_str).collect();
        text_and_json(&system, &args, &wanted, &json).await;
    }

    // Answers built as JSON: keys in alphabetical order, on one line or indented as always.
    let enrich = palisade(&system, &["scan", "enrich", &scan_id, "--output", "json"]).await;
    enrich.assert_status(Status::Ok);
    let answer = enrich.json();
    assert_eq!(enrich.stdout, format!("{answer}\n"), "one line");
    let keys: Vec<&String> = answer.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["job_id", "message", "outcome", "scan_id", "status"]);
    let enrich = palisade(&system, &["scan", "enrich", &scan_id]).await;
    enrich.assert_status(Status::Ok);
    assert!(
        enrich
            .stdout
            .starts_with(&format!("scan {scan_id}: enrichment job ")),
        "{enrich:?}"
    );
    let cancelled = serde_json::json!({
        "outcome": "already_terminal", "scan_id": scan_id, "state": "completed"
    });
    text_and_json(
        &system,
        &["scan", "cancel", &scan_id],
        &[&format!("scan {scan_id}: completed (already_terminal)")],
        &format!("{cancelled:#}"),
    )
    .await;

    // A finding's change: a sentence, or the outcome on one line.
    let set = |revision: &'static str, status: &'static str| {
        vec![
            "finding",
            "set",
            finding_id.as_str(),
            "--status",
            status,
            "--revision",
            revision,
            "--reason",
            "a test",
            "--actor",
            "tester",
        ]
    };
    let text = palisade(&system, &set("1", "accepted_risk")).await;
    text.assert_status(Status::Ok);
    assert_eq!(
        text.stdout,
        format!("finding {finding_id} is accepted_risk: revision 2, collection revision 1\n")
    );
    let json = palisade(
        &system,
        &[&set("2", "open")[..], &["--output", "json"]].concat(),
    )
    .await;
    json.assert_status(Status::Ok);
    assert_eq!(
        json.stdout,
        "{\"collection_revision\":2,\"outcome\":\"changed\",\"revision\":3}\n"
    );
    let deleted = palisade(
        &system,
        &[
            "finding",
            "delete",
            &finding_id,
            "--revision",
            "3",
            "--actor",
            "tester",
            "--output",
            "json",
        ],
    )
    .await;
    deleted.assert_status(Status::Ok);
    assert_eq!(
        deleted.stdout,
        "{\"collection_revision\":3,\"outcome\":\"changed\",\"revision\":null}\n"
    );
    system.finish().await;
}

/// `palisade cve import` and `cve status` (issue 48, item 13): text by default; with
/// `--output json`, the summary on one line and the status indented, as they always printed.
#[tokio::test]
async fn cve_import_and_status_print_text_or_json() {
    let system = TestSystem::spawn().await;
    let now = chrono::Utc::now();
    let cves: Vec<serde_json::Value> = (0..3)
        .map(|n| tests::nvd::ServedCve::numbered(&format!("CVE-2026-{}", 2000 + n), n, now).json)
        .collect();
    let folder = tempfile::tempdir().unwrap();
    let feed = serde_json::json!({
        "resultsPerPage": 3, "startIndex": 0, "totalResults": 3,
        "format": "NVD_CVE", "version": "2.0", "timestamp": "2026-12-01T00:00:00.000",
        "vulnerabilities": cves,
    });
    std::fs::write(folder.path().join("nvdcve-2.0-2026.json"), feed.to_string()).unwrap();
    let path = folder.path().to_str().unwrap();

    let imported = palisade(&system, &["cve", "import", path]).await;
    imported.assert_status(Status::Ok);
    assert_eq!(
        imported.stdout,
        "1 file(s) imported: 3 CVE records, 3 written, 0 quarantined\n"
    );
    assert!(imported.stderr.starts_with("[1/1] "), "{imported:?}");
    let again = palisade(&system, &["cve", "import", path, "--output", "json"]).await;
    again.assert_status(Status::Ok);
    assert_eq!(
        again.stdout,
        "{\"files\":1,\"quarantined\":0,\"records\":3,\"written\":0}\n"
    );

    let status = store::cves::status(&system.pool, 20).await.unwrap();
    text_and_json(
        &system,
        &["cve", "status"],
        &["known       3", "imported    3", "quarantined 0"],
        &serde_json::to_string_pretty(&status).unwrap(),
    )
    .await;
    system.finish().await;
}

#[tokio::test]
async fn scan_submit_wait_follows_the_scan_to_its_end_and_exits_by_its_outcome() {
    let system = TestSystem::spawn().await;
    let organization_id = system.organization().await;
    system.reference_worker(organization_id, 2).await;
    let org = organization_id.to_string();
    let submit = |target: &'static str| {
        [
            "scan",
            "submit",
            "--org",
            org.as_str(),
            "--target",
            target,
            "--plugins",
            "synthetic",
            "--wait",
            "--output",
            "json",
        ]
        .map(str::to_owned)
    };

    let args = submit("synthetic://waited?findings=2&duration_ms=300");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let completed = palisade(&system, &args).await;
    completed.assert_status(Status::Ok);
    let scan = completed.json();
    assert_eq!(scan["state"], "completed", "{completed:?}");
    assert_eq!(scan["findings"].as_array().map(Vec::len), Some(2));
    // Progress on stderr as the scan moved: the last line says its plugin completed.
    let progress: Vec<&str> = completed.stderr.lines().collect();
    assert!(
        progress
            .last()
            .is_some_and(|line| line.contains("completed: 1/1 plugins completed")),
        "{completed:?}"
    );
    assert!(progress.len() >= 2, "a line per change: {completed:?}");

    let args = submit("synthetic://doomed?fail=1&retryable=false");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let failed = palisade(&system, &args).await;
    failed.assert_status(Status::NotPassed);
    assert_eq!(
        failed.json()["state"],
        "failed",
        "the answer still on stdout: {failed:?}"
    );
    assert!(failed.stderr.contains("ended failed"), "{failed:?}");
    system.finish().await;
}

/// `palisade migrate` with `NATS_URL` set provisions the streams too, so a server that cannot
/// hold them is named at the migration (exit 4, the numbers and the setting), not by services
/// that do not start (issue 44, item 4).
#[tokio::test]
async fn migrate_names_a_nats_server_that_cannot_hold_the_streams() {
    let system = TestSystem::spawn().await;
    // A JetStream store of 1 GiB in all, under the four streams' set 1 GiB each.
    let small = tests::servers::NatsServer::start_with_config(
        "jetstream {\n  max_file_store: 1073741824\n}\n",
    )
    .await;
    let url = small.url();
    let empty = EmptyDatabase::create().await;
    let set = [
        ("NATS_URL", std::ffi::OsStr::new(&url)),
        (
            "PALISADE_STREAM_BYTES_MAX",
            std::ffi::OsStr::new("1073741824"),
        ),
    ];
    // Left to its default, the setting is fitted to the server.
    let fitted = palisade_with(&system, &empty.url, &set[..1], &["migrate"]).await;
    fitted.assert_status(Status::Ok);
    assert!(
        fitted.stdout.contains("NATS streams: provisioned"),
        "{fitted:?}"
    );
    // Set, it is that or a refusal naming it (another installation's streams, on the same
    // server, beside the first's).
    let mut set = set.to_vec();
    set.push(("PALISADE_SUBJECT_PREFIX", std::ffi::OsStr::new("another")));
    let refused = palisade_with(&system, &empty.url, &set, &["migrate"]).await;
    refused.assert_status(Status::Refused);
    for named in [
        "PALISADE_STREAM_BYTES_MAX",
        "max_file_store",
        "the database is migrated",
    ] {
        assert!(refused.stderr.contains(named), "{named}: {refused:?}");
    }
    empty.drop().await;
    system.finish().await;
}

#[tokio::test]
async fn migrate_check_says_whether_migrations_are_pending_and_changes_nothing() {
    let system = TestSystem::spawn().await;
    let expected = store::expected_migration_version();
    let all = store::MIGRATOR.iter().count();

    // A database that does not exist yet: everything pending, and it is not created.
    let missing = EmptyDatabase::missing().await;
    let check = palisade_on(
        &system,
        &missing,
        &["migrate", "--check", "--output", "json"],
    )
    .await;
    check.assert_status(Status::Pending);
    let answer = check.json();
    assert_eq!(answer["status"], "pending");
    assert_eq!(answer["build_version"], expected);
    assert_eq!(answer["migrations"].as_array().map(Vec::len), Some(all));
    assert!(check.stderr.contains("run `palisade migrate`"), "{check:?}");
    assert!(!store::database_exists(&missing).await.unwrap());

    // An empty one: the same, in text, one line per migration after the summary.
    let empty = EmptyDatabase::create().await;
    let check = palisade_on(&system, &empty.url, &["migrate", "--check"]).await;
    check.assert_status(Status::Pending);
    assert_eq!(check.stdout.lines().count(), 1 + all, "{check:?}");
    assert!(
        check
            .stdout
            .lines()
            .last()
            .unwrap()
            .starts_with(&expected.to_string())
    );

    // Migrated: up to date.
    let migrated = palisade_on(&system, &empty.url, &["migrate", "--output", "json"]).await;
    migrated.assert_status(Status::Ok);
    assert_eq!(migrated.json()["status"], "migrated");
    assert_eq!(migrated.json()["streams"], "provisioned", "NATS_URL is set");
    assert_eq!(
        migrated.json()["migrations"].as_array().map(Vec::len),
        Some(all)
    );
    let check = palisade_on(&system, &empty.url, &["migrate", "--check"]).await;
    check.assert_status(Status::Ok);
    assert_eq!(
        check.stdout,
        format!("up to date: the database is at migration {expected}, as this build\n")
    );

    // A newer build migrated it: refused, naming both versions.
    let pool = empty.pool().await;
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
         VALUES (99991231000001, 'from a newer build', true, '\\x00', 1)",
    )
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;
    for args in [&["migrate", "--check"][..], &["migrate"]] {
        let refused = palisade_on(&system, &empty.url, args).await;
        refused.assert_status(Status::Refused);
        assert!(refused.stdout.is_empty(), "{refused:?}");
        assert!(
            refused.stderr.contains("at migration 99991231000001")
                && refused
                    .stderr
                    .contains(&format!("its newest is {expected}")),
            "{refused:?}"
        );
    }
    empty.drop().await;
    system.finish().await;
}

/// `worker add --creds` and `client add --creds` into a file that exists, readable by everyone:
/// the new credentials replace it, readable by their owner only (issue 23, point 5).
#[cfg(unix)]
#[tokio::test]
async fn credentials_written_over_a_readable_file_are_readable_by_their_owner_only() {
    use std::os::unix::fs::PermissionsExt as _;
    let system = TestSystem::spawn().await;
    let authority = system
        .nats
        .authority
        .as_ref()
        .expect("the test system's NATS authenticates");
    let dir = std::env::temp_dir().join(format!("palisade-cli-creds-{}", Uuid::new_v4()));
    let authority_dir = dir.join("authority");
    authority.write(&authority_dir).unwrap();
    let org = system.organization().await.to_string();
    let worker = Uuid::new_v4().to_string();

    for (name, args) in [
        (
            "worker.creds",
            vec!["worker", "add", "--name", "w", "--id", worker.as_str()],
        ),
        (
            "client.creds",
            vec!["client", "add", "--id", "cli-client", "--org", org.as_str()],
        ),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, "an older file, readable by everyone").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let path_arg = path.to_str().unwrap();
        let args: Vec<&str> = args.into_iter().chain(["--creds", path_arg]).collect();
        let run = palisade_with(
            &system,
            system.database_url(),
            &[("PALISADE_NATS_AUTHORITY", authority_dir.as_os_str())],
            &args,
        )
        .await;
        run.assert_status(Status::Ok);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{name}: mode {mode:o}");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.starts_with("-----BEGIN NATS USER JWT-----") && text.contains("USER NKEY SEED"),
            "{name} holds the new credentials: {text}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
    system.finish().await;
}

#[tokio::test]
async fn schedule_commands_create_read_pause_and_refuse_what_cannot_fire() {
    let system = TestSystem::spawn().await;
    let org = system.organization().await.to_string();
    let add = |name: &'static str, when: &'static [&'static str]| {
        let mut args = vec![
            "schedule",
            "add",
            "--org",
            org.as_str(),
            "--name",
            name,
            "--target",
            "https://nightly.example",
            "--plugins",
            "tcp_connect",
        ];
        args.extend_from_slice(when);
        args
    };
    let created = palisade(
        &system,
        &add(
            "nightly",
            &[
                "--cron",
                "0 3 * * *",
                "--time-zone",
                "Europe/Berlin",
                "--jitter",
                "5m",
                "--output",
                "json",
            ],
        ),
    )
    .await;
    created.assert_status(Status::Ok);
    let schedule = created.json();
    let id = schedule["id"].as_str().unwrap().to_owned();
    assert_eq!(schedule["time_zone"], "Europe/Berlin");
    assert_eq!(schedule["jitter_seconds"], 300);
    assert_eq!(schedule["overlap"], "skip");
    assert!(
        schedule["next_slot"]
            .as_str()
            .unwrap()
            .ends_with("T02:00:00Z"),
        "{schedule}"
    );

    // What could never fire is refused with what to fix, and nothing is written.
    for (args, says) in [
        (add("nightly", &["--every", "1h"]), "name_taken"),
        (add("bad-cron", &["--cron", "0 3 * *"]), "five fields"),
        (
            add(
                "bad-zone",
                &["--cron", "0 3 * * *", "--time-zone", "Mars/Olympus"],
            ),
            "IANA",
        ),
        (add("too-often", &["--every", "10s"]), "minimum"),
    ] {
        let run = palisade(&system, &args).await;
        run.assert_status(Status::Refused);
        assert!(run.stderr.contains(says), "{says}: {run:?}");
    }
    let listed = palisade(
        &system,
        &[
            "schedule",
            "list",
            "--org",
            org.as_str(),
            "--output",
            "json",
        ],
    )
    .await;
    assert_eq!(listed.json().as_array().unwrap().len(), 1);

    let paused = palisade(
        &system,
        &[
            "schedule", "pause", &id, "--reason", "freeze", "--by", "alice", "--output", "json",
        ],
    )
    .await;
    paused.assert_status(Status::Ok);
    assert_eq!(paused.json()["paused"], true);
    assert_eq!(paused.json()["updated_by"], "alice");
    let shown = palisade(&system, &["schedule", "show", &id, "--output", "json"])
        .await
        .json();
    assert_eq!(shown["update_reason"], "freeze");
    assert_eq!(shown["fires"], serde_json::json!([]));

    // Text by default (issue 48, item 11): a table, a field a line.
    let listed = palisade(&system, &["schedule", "list", "--org", org.as_str()]).await;
    listed.assert_status(Status::Ok);
    let lines: Vec<&str> = listed.stdout.lines().collect();
    assert!(
        lines[0].starts_with("id ") && lines[0].contains("next slot"),
        "{listed:?}"
    );
    assert_eq!(lines.len(), 2, "a header and one schedule: {listed:?}");
    for wanted in [
        id.as_str(),
        "nightly",
        "paused",
        "cron 0 3 * * * Europe/Berlin",
        "https://nightly.example",
    ] {
        assert!(lines[1].contains(wanted), "{wanted}: {listed:?}");
    }
    let shown = palisade(&system, &["schedule", "show", &id]).await;
    shown.assert_status(Status::Ok);
    for wanted in [
        format!("schedule    {id} (nightly)"),
        "state       paused".to_owned(),
        "by alice: freeze".to_owned(),
        "profile     tcp_connect".to_owned(),
    ] {
        assert!(shown.stdout.contains(&wanted), "{wanted}: {shown:?}");
    }
    let resumed = palisade(&system, &["schedule", "resume", &id, "--reason", "thaw"]).await;
    resumed.assert_status(Status::Ok);
    assert!(resumed.stdout.contains("state       active"), "{resumed:?}");
    let deleted = palisade(&system, &["schedule", "delete", &id]).await;
    deleted.assert_status(Status::Ok);
    assert_eq!(
        deleted.stdout,
        format!("schedule {id} (nightly) deleted; the scans it submitted stay\n")
    );
    palisade(&system, &["schedule", "show", &id])
        .await
        .assert_status(Status::NotFound);
    system.finish().await;
}

#[tokio::test]
async fn worker_show_and_org_show_say_who_changed_access_and_limits_and_why() {
    let system = TestSystem::spawn().await;
    let organization = system.organization().await;
    let org = organization.to_string();
    let worker = system.registered_worker(organization, 2).await.to_string();

    let set = palisade(
        &system,
        &[
            "org",
            "set",
            &org,
            "--max-running-tasks",
            "3",
            "--reason",
            "noisy tenant",
            "--by",
            "alice",
            "--output",
            "json",
        ],
    )
    .await;
    set.assert_status(Status::Ok);
    // On one line, keys in alphabetical order, as `org set` always printed it.
    assert_eq!(
        set.stdout,
        format!("{{\"id\":\"{org}\",\"max_running_tasks\":{{\"after\":3,\"before\":null}}}}\n")
    );
    palisade(
        &system,
        &[
            "worker", "revoke", "--worker", &worker, "--org", &org, "--reason", "moved", "--by",
            "bob",
        ],
    )
    .await
    .assert_status(Status::Ok);
    palisade(
        &system,
        &[
            "worker", "assign", "--worker", &worker, "--org", &org, "--reason", "back", "--by",
            "carol",
        ],
    )
    .await
    .assert_status(Status::Ok);

    let shown = palisade(&system, &["worker", "show", &worker, "--output", "json"]).await;
    shown.assert_status(Status::Ok);
    // As `worker show` always printed it: the worker's keys and `changes` in alphabetical order.
    let worker_id: Uuid = worker.parse().unwrap();
    let mut before = serde_json::to_value(
        store::audit::worker(&system.pool, worker_id)
            .await
            .unwrap()
            .unwrap(),
    )
    .unwrap();
    before["changes"] = serde_json::to_value(
        store::audit::recent(&system.pool, Some(worker_id), None, &[], 20)
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(shown.stdout, format!("{before:#}\n"));
    let shown = shown.json();
    assert_eq!(shown["organizations"][0]["enabled"], true);
    let changes: Vec<(String, String, String)> = shown["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|change| {
            let text = |key: &str| change[key].as_str().unwrap().to_owned();
            (text("action"), text("actor"), text("reason"))
        })
        .collect();
    assert_eq!(
        changes[..2],
        [
            (
                "assign_worker".to_owned(),
                "carol".to_owned(),
                "back".to_owned()
            ),
            (
                "revoke_assignment".to_owned(),
                "bob".to_owned(),
                "moved".to_owned()
            ),
        ],
        "newest first: {shown}"
    );

    let organization_shown = palisade(&system, &["org", "show", &org, "--output", "json"]).await;
    assert_eq!(
        organization_shown.stdout,
        format!("{:#}\n", organization_shown.json()),
        "indented, keys in alphabetical order, as `org show` always printed it"
    );
    let organization_shown = organization_shown.json();
    assert_eq!(organization_shown["max_running_tasks"], 3);
    let limits = organization_shown["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|change| change["action"] == "set_organization_limits")
        .unwrap_or_else(|| panic!("{organization_shown}"));
    assert_eq!(
        (limits["actor"].as_str(), limits["reason"].as_str()),
        (Some("alice"), Some("noisy tenant"))
    );
    assert_eq!(limits["detail"]["max_running_tasks"]["after"], 3);

    // Text by default: a field a line, then tables.
    let set = palisade(&system, &["org", "set", &org, "--hourly-quota", "9"]).await;
    set.assert_status(Status::Ok);
    assert_eq!(
        set.stdout,
        format!("organization {org}: hourly quota none -> 9\n")
    );
    let text = palisade(&system, &["worker", "show", &worker]).await;
    text.assert_status(Status::Ok);
    for wanted in [
        format!("worker      {worker}"),
        "state       enabled".to_owned(),
        "capacity    2, 0 live leases".to_owned(),
    ] {
        assert!(text.stdout.contains(&wanted), "{wanted}: {text:?}");
    }
    let assignment = text
        .stdout
        .lines()
        .find(|line| line.starts_with(&org))
        .unwrap_or_else(|| panic!("{text:?}"));
    assert!(assignment.contains(" enabled "), "{text:?}");
    let change = text
        .stdout
        .lines()
        .find(|line| line.contains("assign_worker"))
        .unwrap_or_else(|| panic!("{text:?}"));
    assert!(
        change.contains(" carol ") && change.ends_with(" back"),
        "{text:?}"
    );
    let text = palisade(&system, &["org", "show", &org]).await;
    text.assert_status(Status::Ok);
    for wanted in [
        format!("org         {org}"),
        "quota       9 scans an hour".to_owned(),
        "in flight   0 tasks, at most 3".to_owned(),
    ] {
        assert!(text.stdout.contains(&wanted), "{wanted}: {text:?}");
    }
    assert!(
        text.stdout
            .lines()
            .any(|line| line.contains("set_organization_limits") && line.ends_with("noisy tenant")),
        "{text:?}"
    );
    palisade(&system, &["worker", "show", &Uuid::now_v7().to_string()])
        .await
        .assert_status(Status::NotFound);
    system.finish().await;
}

/// `palisade dead-letter` (issue 48, item 11): text by default, as the other commands print;
/// with `--output json`, the JSON it always printed.
#[tokio::test]
async fn dead_letter_commands_print_text_or_json() {
    let system = TestSystem::spawn().await;
    store::dead_letters::record(
        &system.pool,
        &store::dead_letters::DeadLetter {
            consumer: "ingestion",
            subject: "test.result",
            stream_sequence: 7,
            delivered: 10,
            reason: "refused by the test",
            payload: &[1, 2],
        },
    )
    .await
    .unwrap();
    let listed = palisade(&system, &["dead-letter", "list", "--output", "json"]).await;
    listed.assert_status(Status::Ok);
    let listed = listed.json();
    let id = listed[0]["id"].as_str().unwrap().to_owned();
    assert_eq!(listed[0]["payload_bytes"], 2);
    assert_eq!(listed[0]["delivered"], 10);

    let text = palisade(&system, &["dead-letter", "list"]).await;
    text.assert_status(Status::Ok);
    let lines: Vec<&str> = text.stdout.lines().collect();
    assert!(
        lines[0].starts_with("id ") && lines[0].contains("consumer"),
        "{text:?}"
    );
    assert!(lines[1].starts_with(&id), "{text:?}");
    for wanted in ["ingestion", "open", "refused by the test"] {
        assert!(lines[1].contains(wanted), "{wanted}: {text:?}");
    }
    let shown = palisade(&system, &["dead-letter", "show", &id]).await;
    shown.assert_status(Status::Ok);
    for wanted in [
        format!("dead letter {id}"),
        "subject     test.result".to_owned(),
        "reason      refused by the test".to_owned(),
        "resolution  open".to_owned(),
        "payload     2 bytes, hex 0102".to_owned(),
    ] {
        assert!(shown.stdout.contains(&wanted), "{wanted}: {shown:?}");
    }
    let shown = palisade(&system, &["dead-letter", "show", &id, "--output", "json"]).await;
    assert_eq!(shown.json()["payload_hex"], "0102");

    let discarded = palisade(
        &system,
        &[
            "dead-letter",
            "discard",
            &id,
            "--reason",
            "a test",
            "--by",
            "ops",
        ],
    )
    .await;
    discarded.assert_status(Status::Ok);
    assert_eq!(discarded.stdout, format!("dead letter {id} discarded\n"));
    let open = palisade(&system, &["dead-letter", "list"]).await;
    assert_eq!(open.stdout.lines().count(), 1, "the header alone: {open:?}");
    let all = palisade(
        &system,
        &["dead-letter", "list", "--all", "--output", "json"],
    )
    .await;
    assert_eq!(all.json()[0]["resolution"], "discarded");
    system.finish().await;
}

/// `palisade worker list`, `org list` and `client list` (issue 48, item 11): a table by
/// default, the rows as JSON with `--output json`, a page at a time.
#[tokio::test]
async fn worker_org_and_client_lists_print_a_table_or_json_a_page_at_a_time() {
    let system = TestSystem::spawn().await;
    let organization = system.organization().await;
    let org = organization.to_string();
    let worker = system.registered_worker(organization, 3).await.to_string();
    for args in [
        &["org", "set", &org, "--hourly-quota", "7", "--reason", "r"][..],
        &[
            "client", "add", "--id", "billing", "--name", "Billing", "--org", &org,
        ],
        &["client", "add", "--id", "audit", "--org", &org],
        &["client", "revoke", "--id", "audit"],
    ] {
        palisade(&system, args).await.assert_status(Status::Ok);
    }

    let workers = palisade(&system, &["worker", "list"]).await;
    workers.assert_status(Status::Ok);
    let header = workers.stdout.lines().next().unwrap();
    assert!(
        header.starts_with("id ") && header.contains("capacity"),
        "{workers:?}"
    );
    let row = workers
        .stdout
        .lines()
        .find(|line| line.starts_with(&worker))
        .unwrap_or_else(|| panic!("{workers:?}"));
    assert!(row.contains("enabled") && row.ends_with(&org), "{row}");
    let workers = palisade(&system, &["worker", "list", "--output", "json"])
        .await
        .json();
    let listed = workers
        .as_array()
        .unwrap()
        .iter()
        .find(|listed| listed["id"] == worker.as_str())
        .unwrap_or_else(|| panic!("{workers}"));
    assert_eq!(listed["capacity"], 3);
    assert_eq!(listed["organization_ids"], serde_json::json!([org]));

    let organizations = palisade(&system, &["org", "list"]).await;
    organizations.assert_status(Status::Ok);
    let row = organizations
        .stdout
        .lines()
        .find(|line| line.starts_with(&org))
        .unwrap_or_else(|| panic!("{organizations:?}"));
    let columns: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(columns[1..6], ["7", "-", "1", "1", "0"], "{row}");
    let organizations = palisade(&system, &["org", "list", "--output", "json"])
        .await
        .json();
    let listed = organizations
        .as_array()
        .unwrap()
        .iter()
        .find(|listed| listed["id"] == org.as_str())
        .unwrap_or_else(|| panic!("{organizations}"));
    assert_eq!(
        (
            &listed["hourly_scan_quota"],
            &listed["workers"],
            &listed["clients"]
        ),
        (
            &serde_json::json!(7),
            &serde_json::json!(1),
            &serde_json::json!(1)
        ),
        "{organizations}"
    );

    let clients = palisade(&system, &["client", "list", "--limit", "1"]).await;
    clients.assert_status(Status::Ok);
    let lines: Vec<&str> = clients.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "header, audit, more: {clients:?}");
    assert!(
        lines[1].starts_with("audit ") && lines[1].ends_with(&org),
        "{clients:?}"
    );
    assert!(!lines[1].contains(" - "), "audit is revoked: {clients:?}");
    assert_eq!(lines[2], "more: --after audit");
    let clients = palisade(
        &system,
        &["client", "list", "--after", "audit", "--output", "json"],
    )
    .await
    .json();
    assert_eq!(clients.as_array().unwrap().len(), 1, "{clients}");
    assert_eq!(
        (
            &clients[0]["id"],
            &clients[0]["name"],
            &clients[0]["revoked_at"]
        ),
        (
            &serde_json::json!("billing"),
            &serde_json::json!("Billing"),
            &serde_json::Value::Null
        )
    );
    assert_eq!(clients[0]["organization_ids"], serde_json::json!([org]));
    system.finish().await;
}

/// `palisade worker token create|list|revoke` (issue 44): each token alone on its own line of
/// standard output, the rest on standard error; without the authority, an error naming it.
#[tokio::test]
async fn worker_token_commands_print_one_token_per_line_and_name_what_is_missing() {
    let system = TestSystem::spawn().await;
    let authority = system
        .nats
        .authority
        .as_ref()
        .expect("the test system's NATS authenticates");
    let dir = tempfile::tempdir().unwrap();
    authority.write(dir.path()).unwrap();
    let org = system.organization().await.to_string();
    let with_authority = [("PALISADE_NATS_AUTHORITY", dir.path().as_os_str())];
    let create = |extra: &'static [&'static str]| {
        let mut args = vec![
            "worker",
            "token",
            "create",
            "--org",
            org.as_str(),
            "--capabilities",
            "tcp_connect,http_headers",
        ];
        args.extend_from_slice(extra);
        args
    };

    let run = palisade_with(
        &system,
        system.database_url(),
        &with_authority,
        &create(&["--count", "2"]),
    )
    .await;
    run.assert_status(Status::Ok);
    let tokens: Vec<identity::enrollment::EnrollmentToken> = run
        .stdout
        .lines()
        .map(|line| identity::enrollment::EnrollmentToken::decode(line).expect("a token"))
        .collect();
    assert_eq!(tokens.len(), 2, "{run:?}");
    assert_ne!(tokens[0].worker_id, tokens[1].worker_id);
    assert_eq!(tokens[0].capabilities, ["tcp_connect", "http_headers"]);
    assert!(run.stderr.contains("usable once until"), "{run:?}");

    let listed = palisade(&system, &["worker", "token", "list", "--output", "json"]).await;
    listed.assert_status(Status::Ok);
    assert_eq!(listed.json().as_array().unwrap().len(), 2, "{listed:?}");
    assert!(
        !listed.stdout.contains(&tokens[0].secret),
        "a listed token shows its secret"
    );
    // As `token list` always printed it: each token's fields in their order.
    let before = store::enrollment::list_tokens(&system.pool, false, 100)
        .await
        .unwrap();
    assert_eq!(
        listed.stdout,
        format!("{}\n", serde_json::to_string_pretty(&before).unwrap())
    );
    // Text by default: a table, a token a line.
    let text = palisade(&system, &["worker", "token", "list"]).await;
    text.assert_status(Status::Ok);
    let lines: Vec<&str> = text.stdout.lines().collect();
    assert!(
        lines[0].starts_with("id ") && lines[0].contains("expires"),
        "{text:?}"
    );
    assert_eq!(lines.len(), 3, "a header and two tokens: {text:?}");
    for token in &tokens {
        let line = lines
            .iter()
            .find(|line| line.starts_with(&token.token_id.to_string()))
            .unwrap_or_else(|| panic!("{text:?}"));
        assert!(
            line.contains(&token.worker_id.to_string())
                && line.contains(" usable ")
                && line.contains("tcp_connect,http_headers")
                && line.ends_with(&org),
            "{line}"
        );
        assert!(!line.contains(&token.secret), "{line}");
    }
    let token_id = tokens[0].token_id.to_string();
    palisade(
        &system,
        &["worker", "token", "revoke", "--token", &token_id],
    )
    .await
    .assert_status(Status::Ok);
    palisade(
        &system,
        &["worker", "token", "revoke", "--token", &token_id],
    )
    .await
    .assert_status(Status::NotFound);
    let listed = palisade(&system, &["worker", "token", "list", "--output", "json"]).await;
    assert_eq!(listed.json().as_array().unwrap().len(), 1, "{listed:?}");

    // No authority: nothing issued, and the error says what to set.
    let without = palisade(&system, &create(&[])).await;
    without.assert_status(Status::Error);
    assert!(without.stdout.is_empty(), "{without:?}");
    assert!(
        without.stderr.contains("PALISADE_NATS_AUTHORITY"),
        "{without:?}"
    );
    // An organization that does not exist: nothing issued.
    let unknown = uuid::Uuid::new_v4().to_string();
    let run = palisade_with(
        &system,
        system.database_url(),
        &with_authority,
        &[
            "worker",
            "token",
            "create",
            "--org",
            &unknown,
            "--capabilities",
            "tcp_connect",
        ],
    )
    .await;
    run.assert_status(Status::NotFound);
    assert!(run.stderr.contains(&unknown), "{run:?}");
    system.finish().await;
}

/// `palisade dev` as a newcomer runs it (issue 45, item 2): it serves a local web application
/// and prints a command that completes a scan against it; its health endpoint is on loopback;
/// enrichment reads the local CVE table unless PALISADE_CVE_SOURCE says otherwise, and dev says
/// so (issue 48, item 11); its logs, written to a file, carry no colour codes.
#[tokio::test]
async fn palisade_devs_suggested_command_completes_a_scan() {
    let nats = tests::servers::NatsServer::start().await;
    let database = EmptyDatabase::create().await;
    let prefix = format!("dev{}", &Uuid::now_v7().simple().to_string()[20..]);
    // Its standard output and error both to a file, as a user's `palisade dev > dev.log 2>&1`.
    let logs = tempfile::NamedTempFile::new().unwrap();
    let env = [
        ("NATS_URL", nats.url()),
        ("DATABASE_URL", database.url.clone()),
        ("PALISADE_SUBJECT_PREFIX", prefix),
    ];
    let mut dev = tokio::process::Command::new(PALISADE)
        .args(["dev", "--workers", "1"])
        .envs(env.iter().cloned())
        .env_remove("PALISADE_HTTP_ADDR")
        .env_remove("PALISADE_CVE_SOURCE")
        .env_remove("NO_COLOR")
        .env_remove("RUST_LOG")
        .stdout(logs.reopen().unwrap())
        .stderr(logs.reopen().unwrap())
        .kill_on_drop(true)
        .spawn()
        .expect("palisade dev runs");
    let written = || std::fs::read_to_string(logs.path()).unwrap_or_default();
    let deadline = tokio::time::Instant::now() + tests::WAIT_MAX;
    let suggested = loop {
        let text = written();
        if let Some(line) = text.lines().find(|line| line.starts_with("try: palisade ")) {
            break line["try: palisade ".len()..].to_owned();
        }
        assert!(
            dev.try_wait().unwrap().is_none() && tokio::time::Instant::now() < deadline,
            "palisade dev ended or printed no suggestion: {text}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert!(
        written()
            .lines()
            .any(|line| line.starts_with("health: http://127.0.0.1:9090/")),
        "health on loopback: {}",
        written()
    );
    // Offline by default: enrichment reads the local CVE table, and dev says so once.
    assert_eq!(
        written()
            .matches("enrichment reads the local CVE table")
            .count(),
        1,
        "{}",
        written()
    );

    let run = tokio::process::Command::new(PALISADE)
        .args(suggested.split_whitespace())
        .envs(env.iter().cloned())
        .env_remove("RUST_LOG")
        .output()
        .await
        .expect("the suggested command runs");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{suggested}: {stdout}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(stdout.contains("completed"), "{stdout}");

    tests::servers::signal(&dev, "TERM");
    let ended = tokio::time::timeout(tests::WAIT_MAX, dev.wait())
        .await
        .expect("palisade dev stops on SIGTERM")
        .unwrap();
    assert!(ended.success(), "{ended}");
    let written = written();
    assert!(written.contains(" INFO "), "palisade dev logs: {written}");
    assert!(
        !written.contains('\u{1b}'),
        "colour codes in a log file: {written}"
    );
    database.drop().await;
}
