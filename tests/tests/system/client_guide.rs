//! The client guide's Python (`docs/protocol/client.md`), run against a running system so it
//! cannot drift from what palisade does. Every ```` ```python ```` block of the guide is read
//! when the test runs, in order, into one module (`guide.py`); the schema is compiled for it as
//! the protocol reference says (`grpc_tools.protoc`); `client_guide.py` drives it as a client
//! would, on a client's own credentials, while the test plays the worker.
//!
//! The Python packages (nats-py, nkeys, protobuf, grpcio-tools, pinned) are installed outside
//! the clone by `.ci/run`, like moto: `PALISADE_PYTHON_CLIENT_DIR`, else
//! `~/.cache/palisade-tools/python-client`. Without them the test fails saying how to install
//! them.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use messages::{EventKind, v1};
use prost::Message as _;
use serde_json::Value;
use tests::{Component, TestSystem, WAIT_MAX};
use tokio::process::{Child, Command};
use uuid::Uuid;

/// What `.ci/run` installs, for the message of a test that finds them missing.
const PYTHON_PACKAGES: &str = "nats-py==2.16.0 nkeys==0.2.1 protobuf==7.36.2 grpcio-tools==1.85.1";
/// The guide whose Python runs.
const GUIDE: &str = "docs/protocol/client.md";
/// The driver: what a client does with the guide's functions.
const DRIVER: &str = include_str!("client_guide.py");
/// The one plugin of both scans, offered only by the test's manual worker.
const PLUGIN: &str = "guide_check";
const CLIENT_ID: &str = "guide-client";
const TARGET_A: &str = "http://a.guide.test/";
const TARGET_B: &str = "http://b.guide.test/";

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Where `.ci/run` installs the Python packages; fails, saying how to install them, where they
/// are not installed.
fn python_packages() -> PathBuf {
    let dir = std::env::var_os("PALISADE_PYTHON_CLIENT_DIR").map_or_else(
        || {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/palisade-tools/python-client")
        },
        PathBuf::from,
    );
    for module in ["nats", "nkeys", "google/protobuf", "grpc_tools"] {
        assert!(
            dir.join(module).is_dir(),
            "no {module} at {} (the client guide's Python needs nats-py, nkeys, protobuf and \
             grpcio-tools): install them with `python3 -m pip install --target {} {PYTHON_PACKAGES}` \
             (.ci/run does), or set PALISADE_PYTHON_CLIENT_DIR",
            dir.display(),
            dir.display()
        );
    }
    dir
}

/// The body of every ```` ```python ```` block of `markdown`, in order (fenced with backticks
/// or tildes, the opening fence's indentation removed from its lines).
fn python_blocks(markdown: &str) -> Vec<String> {
    struct Open {
        fence: char,
        length: usize,
        indent: usize,
        python: Option<String>,
    }
    let mut blocks = Vec::new();
    let mut open: Option<Open> = None;
    for line in markdown.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        match &mut open {
            None => {
                let Some(fence) = trimmed.chars().next().filter(|c| *c == '`' || *c == '~') else {
                    continue;
                };
                let length = trimmed.chars().take_while(|c| *c == fence).count();
                if length < 3 {
                    continue;
                }
                let info = trimmed[length..].split_whitespace().next();
                open = Some(Open {
                    fence,
                    length,
                    indent,
                    python: (info == Some("python")).then(String::new),
                });
            }
            Some(block) => {
                let closing = trimmed.trim_end();
                if closing.len() >= block.length && closing.chars().all(|c| c == block.fence) {
                    blocks.extend(open.take().and_then(|block| block.python));
                    continue;
                }
                if let Some(python) = &mut block.python {
                    let strip = line.len() - line.trim_start().len();
                    python.push_str(&line[strip.min(block.indent)..]);
                    python.push('\n');
                }
            }
        }
    }
    assert!(open.is_none(), "{GUIDE}: a code block is not closed");
    blocks
}

/// The guide's Python running as a client: its files and its process.
struct Guide {
    dir: tempfile::TempDir,
    child: Child,
}

/// What the guide's Python wrote so far, for a failure's message.
fn output(dir: &Path) -> String {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
    format!(
        "--- stdout\n{}--- stderr\n{}--- guide.py (from {GUIDE})\n{}",
        read("stdout"),
        read("stderr"),
        read("guide.py")
    )
}

impl Guide {
    /// Writes the guide's Python and the compiled schema into a directory of their own and
    /// starts the driver, as client [`CLIENT_ID`] of `organization` (spelt in capitals: the
    /// guide canonicalises it).
    async fn start(system: &TestSystem, organization: Uuid, packages: &Path) -> Self {
        let dir = tempfile::tempdir().expect("a directory");
        let markdown = std::fs::read_to_string(repository().join(GUIDE)).expect("the client guide");
        let blocks = python_blocks(&markdown);
        assert!(
            blocks.len() >= 2,
            "{GUIDE} has {} python blocks; the test runs its sample of section 4 and section 7's",
            blocks.len()
        );
        std::fs::write(dir.path().join("guide.py"), blocks.join("\n")).expect("guide.py written");
        std::fs::write(dir.path().join("driver.py"), DRIVER).expect("driver.py written");

        // The schema, compiled as the reference says (reference, 3).
        let compiled = Command::new("python3")
            .args(["-m", "grpc_tools.protoc", "-I"])
            .arg(repository().join("shared/messages/proto"))
            .arg("--python_out=.")
            .arg("palisade/v1/palisade.proto")
            .current_dir(dir.path())
            .env("PYTHONPATH", packages)
            .output()
            .await
            .expect("python3 runs grpc_tools.protoc");
        assert!(
            compiled.status.success(),
            "the schema did not compile: {}",
            String::from_utf8_lossy(&compiled.stderr)
        );

        let client = messages::Identity::Client {
            client_id: CLIENT_ID.into(),
            organizations: vec![organization],
        };
        let python_path = std::env::join_paths([dir.path(), packages]).expect("a PYTHONPATH");
        let file = |name: &str| {
            Stdio::from(std::fs::File::create(dir.path().join(name)).expect("an output file"))
        };
        let child = Command::new("python3")
            .arg("driver.py")
            .current_dir(dir.path())
            .env_remove("NATS_CREDS")
            .envs(system.nats.child_env(&client).await)
            .env("PALISADE_SUBJECT_PREFIX", system.subjects.prefix())
            .env("PYTHONPATH", python_path)
            .env("GUIDE_ORG", organization.to_string().to_uppercase())
            .env("GUIDE_CLIENT_ID", CLIENT_ID)
            .env("GUIDE_PLUGIN", PLUGIN)
            .env("GUIDE_TARGET_A", TARGET_A)
            .env("GUIDE_KEY_A", "key-a")
            .env("GUIDE_TARGET_B", TARGET_B)
            .env("GUIDE_KEY_B", "key-b")
            .stdout(file("stdout"))
            .stderr(file("stderr"))
            .kill_on_drop(true)
            .spawn()
            .expect("python3 runs the guide");
        Self { dir, child }
    }

    /// Runs `work` (the test's side) while the guide runs: fails, with what the guide wrote,
    /// when the guide ends first or `work` takes longer than [`WAIT_MAX`].
    async fn during<T>(&mut self, what: &str, work: impl Future<Output = T>) -> T {
        tokio::select! {
            done = tokio::time::timeout(WAIT_MAX, work) => done.unwrap_or_else(|_| {
                panic!("timed out waiting for {what}\n{}", output(self.dir.path()))
            }),
            ended = self.child.wait() => {
                panic!("the guide's Python ended ({ended:?}) before {what}\n{}", output(self.dir.path()))
            }
        }
    }

    /// Waits for the guide to end well and returns what it printed last.
    async fn result(mut self) -> Value {
        let ended = tokio::time::timeout(WAIT_MAX, self.child.wait()).await;
        let report = output(self.dir.path());
        match ended {
            Ok(Ok(status)) if status.success() => {}
            Ok(ended) => panic!("the guide's Python failed ({ended:?})\n{report}"),
            Err(_) => panic!("the guide's Python did not end within {WAIT_MAX:?}\n{report}"),
        }
        let stdout = std::fs::read_to_string(self.dir.path().join("stdout")).expect("stdout");
        let last = stdout.lines().last().unwrap_or_default();
        serde_json::from_str(last)
            .unwrap_or_else(|error| panic!("not the driver's JSON ({error})\n{report}"))
    }
}

/// Whether `enrichment.completed` of `scan_id` is on the events stream.
async fn enrichment_published(system: &TestSystem, scan_id: &str) -> bool {
    tests::published_events(system).await.iter().any(|event| {
        event.kind == Some(EventKind::EnrichmentCompleted)
            && v1::EnrichmentCompleted::decode(event.payload.as_slice())
                .is_ok_and(|completed| completed.scan_id == scan_id)
    })
}

/// The guide's Python, as a client: two scans submitted at once on the durable path, each
/// followed to its `scan.completed` by the guide's events loop, the second of them across the
/// first's `scan.completed` and `enrichment.completed` (published after the second's cursor,
/// before its outcome: the test holds its lease until then); the first submitted again (a
/// duplicate PubAck, so the guide asks over request/reply and gets the scan back); the guide's
/// fingerprint equal to admission's; a finding of the first marked a false positive, and the
/// same change again refused `revision_conflict`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_guides_python_submits_follows_and_decides_against_a_running_system() {
    let packages = python_packages();
    let system = TestSystem::spawn().await;
    system.start(Component::Enrichment);
    let organization = system.organization().await;
    let worker = system.manual_worker(organization, 2).await;
    let hello = worker.hello(&[PLUGIN]).await;
    assert!(hello.error.is_none(), "{hello:?}");
    let mut guide = Guide::start(&system, organization, &packages).await;

    // Both scans leased: each was submitted, so each loop's cursor was taken before anything
    // below happened.
    let leases = guide
        .during("both scans to be leased", async {
            let mut leases = Vec::new();
            while leases.len() < 2 {
                let reply = worker
                    .acquire(Uuid::new_v4(), 2 - leases.len() as u32, 1_000)
                    .await;
                assert!(reply.error.is_none(), "{reply:?}");
                leases.extend(reply.leases);
            }
            leases
        })
        .await;
    let lease = |target: &str| {
        leases
            .iter()
            .find(|lease| lease.target == target)
            .unwrap_or_else(|| panic!("no lease of {target}: {leases:?}"))
    };
    let (lease_a, lease_b) = (lease(TARGET_A), lease(TARGET_B));

    // Scan a completes with a finding that names a CVE, so its enrichment job runs and ends
    // with `enrichment.completed`, while scan b still runs.
    let mut payload = tests::findings_payload(2);
    payload.findings[0].cve_ids = vec!["CVE-2099-0001".into()];
    let ack = worker.send_batch(&worker.batch(lease_a, 0, &payload)).await;
    assert!(ack.error.is_none(), "{ack:?}");
    let ack = worker.complete(lease_a, 1).await;
    assert!(ack.error.is_none(), "{ack:?}");
    guide
        .during(
            "scan a's enrichment.completed to be published",
            system.wait_for("scan a's enrichment.completed", || async {
                enrichment_published(&system, &lease_a.scan_id)
                    .await
                    .then_some(())
            }),
        )
        .await;
    let ack = worker
        .send_batch(&worker.batch(lease_b, 0, &tests::findings_payload(1)))
        .await;
    assert!(ack.error.is_none(), "{ack:?}");
    let ack = worker.complete(lease_b, 1).await;
    assert!(ack.error.is_none(), "{ack:?}");

    let result = guide.result().await;
    let outcome = |name: &str| &result[name];
    assert_eq!(outcome("a")["name"], "scan.completed", "{result:#}");
    assert_eq!(
        outcome("a")["scan_id"],
        lease_a.scan_id.as_str(),
        "{result:#}"
    );
    assert_eq!(outcome("a")["finding_count"], 2, "{result:#}");
    assert_ne!(outcome("a")["enrichment_job_id"], "", "{result:#}");
    assert_eq!(outcome("b")["name"], "scan.completed", "{result:#}");
    assert_eq!(
        outcome("b")["scan_id"],
        lease_b.scan_id.as_str(),
        "{result:#}"
    );
    // Scan b's loop read scan a's enrichment.completed (and passed it over) before its outcome.
    let seen_by_b: Vec<&str> = result["seen"]["b"]
        .as_array()
        .expect("the names b's loop read")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let enrichment = seen_by_b
        .iter()
        .position(|name| *name == "enrichment.completed");
    let outcome_b = seen_by_b.iter().rposition(|name| *name == "scan.completed");
    assert!(
        matches!((enrichment, outcome_b), (Some(e), Some(o)) if e < o),
        "b's loop did not read an enrichment event before its outcome: {seen_by_b:?}"
    );

    // The replay: dropped by JetStream's de-duplication, answered over request/reply.
    let replay = outcome("replay");
    assert_eq!(replay["name"], "reply", "{result:#}");
    assert_eq!(replay["scan_id"], lease_a.scan_id.as_str(), "{result:#}");
    assert_eq!(replay["deduplicated"], true, "{result:#}");
    assert_eq!(replay["state"], "completed", "{result:#}");
    assert_eq!(replay["error"], Value::Null, "{result:#}");

    // The guide's fingerprint is admission's (its Nats-Msg-Id names the request).
    let request_a = v1::ScanRequest {
        schema_version: 1,
        organization_id: organization.to_string(),
        target: TARGET_A.into(),
        plugins: vec![PLUGIN.into()],
        client_id: CLIENT_ID.into(),
        idempotency_key: "key-a".into(),
        ..Default::default()
    };
    assert_eq!(
        result["fingerprint"],
        messages::scan_request_fingerprint(&request_a),
        "{result:#}"
    );

    // The disposition: set once on the revision read, then refused on that same revision.
    assert_eq!(
        result["findings"].as_array().map(Vec::len),
        Some(2),
        "{result:#}"
    );
    let finding = &result["findings"][0];
    assert_eq!(result["first"]["error"], Value::Null, "{result:#}");
    assert_eq!(
        result["first"]["revision"],
        finding["revision"].as_u64().expect("a revision") + 1,
        "{result:#}"
    );
    assert_eq!(result["again"]["error"], "revision_conflict", "{result:#}");
    let (status, reviewed_by): (String, String) =
        sqlx::query_as("SELECT status, reviewed_by FROM findings WHERE id = $1::uuid")
            .bind(finding["id"].as_str().expect("a finding id"))
            .fetch_one(&system.pool)
            .await
            .expect("the finding");
    assert_eq!(
        (status.as_str(), reviewed_by.as_str()),
        ("false_positive", "guide-client:alice")
    );
    system.finish().await;
}

#[test]
fn python_blocks_are_the_python_fences_in_order() {
    let markdown = "text\n\
                    ```python\nimport a\n```\n\
                    ```sh\n```python\n```\n\
                    - item\n\n  ~~~~python\n  def f():\n      return 1\n  ~~~~\n\
                    ```\nprint('not python')\n```\n";
    assert_eq!(
        python_blocks(markdown),
        ["import a\n", "def f():\n    return 1\n"]
    );
}
