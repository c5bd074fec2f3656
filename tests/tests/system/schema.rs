//! The code and the schema agree: every state enum matches its table's CHECK constraint, and
//! docs/ARCHITECTURE.md names every workspace crate.

use std::collections::BTreeSet;

use store::states::{
    AdminAction, AttemptStatus, DeadLetterResolution, EnrichmentJobState, EvaluationStatus,
    FindingChange, FindingStatus, QuarantineAction, ResultBatchStatus, ScanJobState, ScanState,
    ScheduleFireOutcome, ScheduleOverlap, Severity, TaskState, UploadStatus,
};
use tests::TestSystem;

fn quoted_values(definition: &str) -> BTreeSet<String> {
    definition
        .split('\'')
        .enumerate()
        .filter(|(index, _)| index % 2 == 1)
        .map(|(_, value)| value.to_owned())
        .collect()
}

#[tokio::test]
async fn state_enums_match_the_check_constraints() {
    let system = TestSystem::spawn().await;
    let cases: [(&str, &[&str]); 16] = [
        (ScanState::CHECK_CONSTRAINT, ScanState::NAMES),
        (ScanJobState::CHECK_CONSTRAINT, ScanJobState::NAMES),
        (TaskState::CHECK_CONSTRAINT, TaskState::NAMES),
        (AttemptStatus::CHECK_CONSTRAINT, AttemptStatus::NAMES),
        (
            EnrichmentJobState::CHECK_CONSTRAINT,
            EnrichmentJobState::NAMES,
        ),
        (
            ResultBatchStatus::CHECK_CONSTRAINT,
            ResultBatchStatus::NAMES,
        ),
        (UploadStatus::CHECK_CONSTRAINT, UploadStatus::NAMES),
        (FindingStatus::CHECK_CONSTRAINT, FindingStatus::NAMES),
        (Severity::CHECK_CONSTRAINT, Severity::NAMES),
        (FindingChange::CHECK_CONSTRAINT, FindingChange::NAMES),
        (EvaluationStatus::CHECK_CONSTRAINT, EvaluationStatus::NAMES),
        (QuarantineAction::CHECK_CONSTRAINT, QuarantineAction::NAMES),
        (
            DeadLetterResolution::CHECK_CONSTRAINT,
            DeadLetterResolution::NAMES,
        ),
        (ScheduleOverlap::CHECK_CONSTRAINT, ScheduleOverlap::NAMES),
        (
            ScheduleFireOutcome::CHECK_CONSTRAINT,
            ScheduleFireOutcome::NAMES,
        ),
        (AdminAction::CHECK_CONSTRAINT, AdminAction::NAMES),
    ];
    for (constraint, expected) in cases {
        let (table, name) = constraint.split_once('.').unwrap();
        let definition = store::testing::check_constraint(&system.pool, table, name)
            .await
            .unwrap();
        let expected: BTreeSet<String> = expected.iter().map(|name| (*name).to_owned()).collect();
        assert_eq!(
            quoted_values(&definition),
            expected,
            "{constraint}: {definition}"
        );
    }
    system.finish().await;
}

#[test]
fn architecture_document_names_every_workspace_crate() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let architecture = std::fs::read_to_string(root.join("docs/ARCHITECTURE.md")).unwrap();
    for folder in ["services", "shared"] {
        for entry in std::fs::read_dir(root.join(folder)).unwrap() {
            let path = entry.unwrap().path();
            if path.join("Cargo.toml").exists() {
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                assert!(
                    architecture.contains(&format!("`{folder}/{name}`")),
                    "docs/ARCHITECTURE.md has no section for {folder}/{name}"
                );
            }
        }
    }
}

/// The front door and the map stay short (issue 28): the README at most 150 lines,
/// docs/ARCHITECTURE.md at most 3,500 words with no paragraph or bullet over 150, and every
/// module of every crate named in it (the detail lives in the modules' `//!` docs).
#[test]
fn the_readme_and_the_architecture_map_stay_short_and_name_every_module() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    assert!(
        readme.lines().count() <= 150,
        "README.md is {} lines",
        readme.lines().count()
    );
    let architecture = std::fs::read_to_string(root.join("docs/ARCHITECTURE.md")).unwrap();
    let words = architecture.split_whitespace().count();
    assert!(words <= 3_500, "docs/ARCHITECTURE.md is {words} words");
    let mut in_code = false;
    for block in architecture.split("\n\n") {
        if block.trim_start().starts_with("```") {
            in_code = !block.trim_end().ends_with("```") || block.trim() == "```";
            continue;
        }
        if in_code {
            in_code = !block.contains("```");
            continue;
        }
        for entry in block.split("\n- ") {
            let count = entry.split_whitespace().count();
            assert!(count <= 150, "an entry of {count} words: {entry}");
        }
    }
    // Every module file, in folders too: `src/a/b.rs` is named as `b`, `b::…` or `a::b`.
    fn modules(folder: &std::path::Path, found: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                modules(&path, found);
            } else if path.extension().is_some_and(|extension| extension == "rs") {
                found.push(path);
            }
        }
    }
    let mut missing = Vec::new();
    for group in ["services", "shared"] {
        for krate in std::fs::read_dir(root.join(group)).unwrap() {
            let src = krate.unwrap().path().join("src");
            if !src.is_dir() {
                continue;
            }
            let mut files = Vec::new();
            modules(&src, &mut files);
            for path in files {
                let name = path.file_stem().unwrap().to_string_lossy().into_owned();
                if ["lib", "main", "mod"].contains(&name.as_str())
                    || path.starts_with(src.join("bin"))
                {
                    continue;
                }
                let parent = path
                    .parent()
                    .unwrap()
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                if !architecture.contains(&format!("`{name}`"))
                    && !architecture.contains(&format!("`{name}::"))
                    && !architecture.contains(&format!("`{parent}::{name}"))
                {
                    missing.push(path.display().to_string());
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/ARCHITECTURE.md does not name {missing:?}"
    );
}

/// `docs/configuration.md` names every environment variable the services, the command and the
/// worker read (a string literal `PALISADE_…`, `NATS_…`, `DATABASE_…`, `OTEL_…` or `AWS_…` in
/// their sources), and names none they do not read.
#[test]
fn the_configuration_reference_names_exactly_the_settings_the_code_reads() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let prefixes = ["PALISADE_", "NATS_", "DATABASE_", "OTEL_", "AWS_"];
    // Upper-case words with one of the prefixes, within `quote`s; partial names
    // (`PALISADE_NVD_*`) end with an underscore and are not settings.
    let names = |text: &str, quote: char| -> BTreeSet<String> {
        text.split(quote)
            .skip(1)
            .step_by(2)
            .filter(|word| prefixes.iter().any(|prefix| word.starts_with(prefix)))
            .filter(|word| {
                !word.ends_with('_')
                    && word
                        .bytes()
                        .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
            })
            .map(str::to_owned)
            .collect()
    };
    let mut read = BTreeSet::new();
    let mut folders = vec![];
    for group in ["services", "shared"] {
        for entry in std::fs::read_dir(root.join(group)).unwrap() {
            folders.push(entry.unwrap().path().join("src"));
        }
    }
    while let Some(folder) = folders.pop() {
        let Ok(entries) = std::fs::read_dir(&folder) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                read.extend(names(&std::fs::read_to_string(&path).unwrap(), '"'));
            }
        }
    }
    assert!(
        read.len() > 50,
        "found the settings the code reads: {read:?}"
    );
    let documented = names(
        &std::fs::read_to_string(root.join("docs/configuration.md")).unwrap(),
        '`',
    );
    let undocumented: Vec<_> = read.difference(&documented).collect();
    let unread: Vec<_> = documented.difference(&read).collect();
    assert!(
        undocumented.is_empty() && unread.is_empty(),
        "docs/configuration.md is out of date: read but not documented {undocumented:?}; \
         documented but not read {unread:?}"
    );
}

/// Issue 48, item 12: the settings an operator sets hold no test hook. The fault injection
/// `crash_after_commit` sat in admission's and ingestion's `Settings` (behind the `testing`
/// feature these tests build with); it is now given to the built service by the tests alone.
#[test]
fn the_settings_operators_set_hold_no_test_hook() {
    let common = runtime::CommonSettings::from_env().expect("valid environment");
    let admission = format!(
        "{:?}",
        admission::Settings::from_common(common.clone()).expect("admission settings")
    );
    let ingestion = format!(
        "{:?}",
        ingestion::Settings::from_common(common).expect("ingestion settings")
    );
    for (service, settings) in [("admission", admission), ("ingestion", ingestion)] {
        assert!(
            !settings.contains("crash"),
            "{service}'s settings hold a test hook: {settings}"
        );
    }
}

#[tokio::test]
async fn every_migration_can_run_again_over_its_own_result() {
    // A re-run after a partial failure meets objects that already exist: every statement
    // must be idempotent (IF NOT EXISTS), and sqlx's own re-run must be a no-op.
    let system = TestSystem::spawn().await;
    for migration in store::MIGRATOR.iter() {
        sqlx::raw_sql(migration.sql.clone())
            .execute(&system.pool)
            .await
            .unwrap_or_else(|error| {
                panic!(
                    "migration {} is not re-runnable: {error}",
                    migration.description
                )
            });
    }
    store::migrate(&system.pool)
        .await
        .expect("re-running the migrator is a no-op");
    system.finish().await;
}

/// Every statement file under `shared/store/sql/` is planned by PostgreSQL against the
/// migrated schema, so a statement naming a table or column that does not exist, or with a
/// type error, fails here rather than in a service. Its header declares each of its parameters
/// `$1…$n` with the type PostgreSQL's describe gives it (a binder's field takes only values of
/// that type), exactly as many as PostgreSQL finds. The two statements a granted lease is
/// decoded from return the same columns.
#[tokio::test]
async fn every_statement_is_planned_against_the_migrated_schema() {
    use sqlx::Executor as _;
    use sqlx::{Column as _, TypeInfo as _};

    let system = TestSystem::spawn().await;
    let mut conn = system.pool.acquire().await.unwrap();
    assert!(store::STATEMENTS.len() > 80, "found the statement files");
    let mut problems = Vec::new();
    let mut columns = std::collections::BTreeMap::new();
    for statement in store::STATEMENTS {
        let described = match (&mut *conn)
            .describe(sqlx::SqlSafeStr::into_sql_str(statement.text))
            .await
        {
            Ok(described) => described,
            Err(error) => {
                problems.push(format!("{}: {error}", statement.name));
                continue;
            }
        };
        let actual: Vec<String> = match described.parameters() {
            Some(sqlx::Either::Left(types)) => types
                .iter()
                .map(|parameter| parameter.name().to_lowercase())
                .collect(),
            Some(sqlx::Either::Right(count)) => vec![String::new(); count],
            None => Vec::new(),
        };
        if statement.parameters.len() != actual.len() {
            problems.push(format!(
                "{}: PostgreSQL finds {} parameters {actual:?}; its header declares {} \
                 (write one `-- $n name: type — what it is` line for each, in order)",
                statement.name,
                actual.len(),
                statement.parameters.len()
            ));
        }
        for (index, (declared, actual)) in statement.parameters.iter().zip(&actual).enumerate() {
            if declared != actual {
                problems.push(format!(
                    "{}: ${} is declared `{declared}`, PostgreSQL describes it as `{actual}` \
                     (declare the type PostgreSQL names)",
                    statement.name,
                    index + 1
                ));
            }
        }
        let returned: Vec<(String, String)> = described
            .columns()
            .iter()
            .map(|column| {
                (
                    column.name().to_owned(),
                    column.type_info().name().to_owned(),
                )
            })
            .collect();
        columns.insert(statement.name, returned);
    }
    assert!(
        problems.is_empty(),
        "statements the schema refuses or documents wrongly:\n{}",
        problems.join("\n")
    );
    assert_eq!(
        columns["worker_tasks/grant"], columns["worker_task_attempts/replayed_leases"],
        "a granted lease and a replayed one decode into the same `GrantedLease`"
    );
    drop(conn); // `finish` closes the pool, which waits for every connection to come back
    system.finish().await;
}

/// The protocol reference is a contract other languages implement from the text alone: every
/// error code is in its table of codes (7), and every message of the proto in its table of
/// messages (4).
#[test]
fn the_protocol_reference_names_every_error_code_and_message() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let reference = std::fs::read_to_string(root.join("docs/protocol/reference.md")).unwrap();
    let section = |start: &str, end: &str| {
        let from = reference.find(start).expect(start);
        let to = reference[from..].find(end).expect(end) + from;
        reference[from..to].to_owned()
    };
    let codes = section("## 7. Error codes", "## 8. Limits");
    for code in messages::ErrorCode::ALL {
        assert!(
            codes.contains(&format!("| `{}` |", code.as_str())),
            "error code {code} is not in reference 7"
        );
    }
    let messages_table = section("## 4. Messages", "## 5. Events");
    let proto =
        std::fs::read_to_string(root.join("shared/messages/proto/palisade/v1/palisade.proto"))
            .unwrap();
    for line in proto.lines() {
        if let Some(name) = line
            .strip_prefix("message ")
            .and_then(|rest| rest.split_whitespace().next())
        {
            assert!(
                messages_table.contains(&format!("`{name}`")),
                "message {name} is not in reference 4"
            );
        }
    }
}
