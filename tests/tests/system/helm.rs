//! The Helm chart (`helm/palisade`) checked against the code it deploys: rendered by
//! `helm/ci/chart.py` (Helm's SDK from PyPI's helm-python-sdk, installed by `.ci/run`), with
//! the least a secure install gives (`helm/ci/minimal-values.yaml`: the NATS credentials' and
//! TLS Secrets' names), with the loud opt-outs (`helm/ci/insecure-values.yaml`) and with
//! `helm/ci/all-on-values.yaml`. The bare defaults refuse to render, saying what to provide and
//! how to opt out; a CA always requires TLS. Every environment variable a
//! palisade binary reads is settable; no secret is inline; the probes ask paths a running
//! system serves; the hook Job runs `palisade migrate`; every metric the PrometheusRule and the
//! Grafana dashboard name is one a running system's `/metrics` exports; a value of the wrong
//! type is refused, naming it; the kubectl commands the chart prints are usable as printed.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use tests::{Component, TestSystem, WAIT_MAX};

/// The render of every option on.
const ALL_ON_VALUES: &str = "helm/ci/all-on-values.yaml";
/// The defaults plus the two Secrets a secure install names: NATS credentials and the CA.
const MINIMAL_VALUES: &str = "helm/ci/minimal-values.yaml";
/// The loud opt-outs: no NATS credentials, no TLS required.
const INSECURE_VALUES: &str = "helm/ci/insecure-values.yaml";
/// Variables holding a secret: they come from a Secret, never from a value or the ConfigMap.
const SECRET_VARIABLES: [&str; 2] = ["DATABASE_URL", "PALISADE_NVD_API_KEY"];
/// The Kubernetes kinds of pods' templates the chart renders.
const WORKLOADS: [&str; 3] = ["Deployment", "StatefulSet", "Job"];
/// Variables the binaries read that no pod of the chart sets, and why.
const NOT_IN_THE_CLUSTER: [(&str, &str); 4] = [
    (
        "NATS_SERVER_BIN",
        "the private NATS server of `palisade demo`, `dev` and `bench`, never a deployment's",
    ),
    (
        "PALISADE_NATS_AUTHORITY",
        "the authority's seeds are kept by administrators, never in the cluster (issue 44)",
    ),
    (
        "PALISADE_ENROLLMENT_TOKEN",
        "worker pods read their token from the Secret's file (PALISADE_ENROLLMENT_TOKEN_FILE)",
    ),
    (
        "PALISADE_WORKER_ID",
        "an enrolled worker's id comes from its token; set only without NATS credentials",
    ),
];

#[test]
fn helm_chart_sets_every_variable_the_binaries_read() {
    let read = variables_read_by_the_binaries();
    assert!(
        read.contains("DATABASE_URL") && read.contains("PALISADE_LEASE_TTL_MS"),
        "the source scan found too little: {read:?}"
    );
    let manifests = render(Some(ALL_ON_VALUES), None).expect("the all-on values render");
    let mut settable = BTreeSet::new();
    for manifest in &manifests {
        if kind(manifest) == "ConfigMap" && name(manifest) == "palisade" {
            let data = manifest["data"]
                .as_object()
                .expect("the ConfigMap has data");
            settable.extend(data.keys().cloned());
        }
        for container in containers(manifest) {
            for variable in container["env"].as_array().into_iter().flatten() {
                settable.insert(variable["name"].as_str().expect("an env name").to_owned());
            }
        }
    }
    let missing: Vec<_> = read
        .difference(&settable)
        .filter(|variable| !NOT_IN_THE_CLUSTER.iter().any(|(name, _)| name == variable))
        .collect();
    assert!(
        missing.is_empty(),
        "palisade's binaries read {missing:?}, which no manifest of the chart sets with every \
         option on: add them to values.yaml's `config` and values.schema.json (or to the \
         templates, for a file or a secret), and to helm/ci/all-on-values.yaml"
    );

    // Every setting of the schema's `config` is set by the all-on values, so the render above
    // shows each of them reaching the ConfigMap.
    let schema = read_json(&repository().join("helm/palisade/values.schema.json"));
    let configurable: BTreeSet<String> = schema["properties"]["config"]["properties"]
        .as_object()
        .expect("config's properties")
        .keys()
        .cloned()
        .collect();
    let not_set: Vec<_> = configurable.difference(&settable).collect();
    assert!(
        not_set.is_empty(),
        "helm/ci/all-on-values.yaml leaves {not_set:?} unset: set every option there"
    );
}

#[test]
fn helm_chart_renders_no_secret_value() {
    for values in [
        Some(MINIMAL_VALUES),
        Some(INSECURE_VALUES),
        Some(ALL_ON_VALUES),
    ] {
        let manifests = render(values, None).expect("the chart renders");
        for manifest in &manifests {
            assert_ne!(
                kind(manifest),
                "Secret",
                "the chart renders a Secret: {manifest}"
            );
            if kind(manifest) == "ConfigMap" {
                for secret in SECRET_VARIABLES {
                    assert!(
                        manifest["data"].get(secret).is_none(),
                        "{secret} in a ConfigMap"
                    );
                }
            }
            for container in containers(manifest) {
                for variable in container["env"].as_array().into_iter().flatten() {
                    let variable_name = variable["name"].as_str().expect("an env name");
                    if SECRET_VARIABLES.contains(&variable_name) {
                        assert!(
                            variable.get("value").is_none()
                                && variable["valueFrom"]["secretKeyRef"]["name"].is_string(),
                            "{variable_name} must come from a Secret: {variable}"
                        );
                    }
                }
            }
            for text in strings(manifest) {
                assert!(
                    !has_password_in_url(&text),
                    "a URL with a password in {} {}: {text}",
                    kind(manifest),
                    name(manifest)
                );
            }
        }
    }
    let refusal = render(
        Some(MINIMAL_VALUES),
        Some(r#"{"config": {"NATS_URL": "nats://palisade:hunter2@nats:4222"}}"#),
    )
    .expect_err("a NATS_URL with a password is refused");
    assert!(refusal.contains("/config/NATS_URL"), "{refusal}");
}

#[test]
fn helm_chart_migrates_in_a_pre_install_and_pre_upgrade_hook() {
    let manifests = render(Some(MINIMAL_VALUES), None).expect("the minimal values render");
    let jobs: Vec<_> = manifests.iter().filter(|m| kind(m) == "Job").collect();
    assert_eq!(jobs.len(), 1, "one Job: the migrations");
    let job = jobs[0];
    let annotations = &job["metadata"]["annotations"];
    let hooks: BTreeSet<&str> = annotations["helm.sh/hook"]
        .as_str()
        .expect("a hook annotation")
        .split(',')
        .collect();
    assert_eq!(hooks, BTreeSet::from(["pre-install", "pre-upgrade"]));
    assert!(annotations["helm.sh/hook-weight"].is_string(), "{job}");
    assert!(
        annotations["helm.sh/hook-delete-policy"].is_string(),
        "{job}"
    );
    let container = &containers(job)[0];
    assert_eq!(
        container["command"],
        serde_json::json!(["palisade", "migrate"])
    );
    // Its pod's ServiceAccount is a hook too, created first: the release's own does not exist
    // yet on install.
    let account = job["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .expect("a service account");
    let hook_account = manifests
        .iter()
        .find(|m| kind(m) == "ServiceAccount" && name(m) == account)
        .expect("the Job's ServiceAccount is rendered");
    let weight = |m: &Value| -> i64 {
        m["metadata"]["annotations"]["helm.sh/hook-weight"]
            .as_str()
            .and_then(|w| w.parse().ok())
            .expect("a hook weight")
    };
    assert!(weight(hook_account) < weight(job), "{hook_account}");
}

#[test]
fn helm_values_schema_refuses_a_wrong_type_naming_it() {
    let refusal = render(
        Some(MINIMAL_VALUES),
        Some(r#"{"services": {"dispatch": {"replicas": "two"}}}"#),
    )
    .expect_err("a string for replicas is refused");
    assert!(
        refusal.contains("/services/dispatch/replicas") && refusal.contains("want integer"),
        "{refusal}"
    );
    let refusal = render(
        Some(MINIMAL_VALUES),
        Some(r#"{"config": {"PALISADE_LEASE_TTL": 30000}}"#),
    )
    .expect_err("an unknown setting is refused");
    assert!(refusal.contains("PALISADE_LEASE_TTL"), "{refusal}");
}

/// Secure by default (docs/deploy.md, "Secure defaults"): without NATS credentials and a CA the
/// chart does not render, and says what to provide and how to opt out; with them every pod
/// gets its own credentials and TLS is required, whatever the URL's scheme; the INSECURE
/// opt-outs render, without them.
#[test]
fn helm_chart_requires_nats_credentials_and_tls_unless_loudly_insecure() {
    let refusal = render(None, None).expect_err("the bare defaults are refused");
    for wanted in [
        "nats.credentials.existingSecret",
        "palisade nats init",
        "nats.insecureNoCredentials=true",
        "nats.tls.existingSecret",
        "ca.crt",
        "nats.insecureNoTls=true",
        "INSECURE",
    ] {
        assert!(
            refusal.contains(wanted),
            "the refusal does not say {wanted}: {refusal}"
        );
    }
    let refusal = render(
        Some(MINIMAL_VALUES),
        Some(r#"{"config": {"NATS_TLS_REQUIRED": false}}"#),
    )
    .expect_err("a CA with TLS not required is refused");
    assert!(
        refusal.contains("config.NATS_TLS_REQUIRED is false"),
        "{refusal}"
    );
    let refusal = render(
        Some(MINIMAL_VALUES),
        Some(r#"{"nats": {"insecureNoTls": true}}"#),
    )
    .expect_err("a CA beside the opt-out from TLS is refused");
    assert!(refusal.contains("nats.insecureNoTls is true"), "{refusal}");

    // A CA and nats:// URLs: TLS is required (the client upgrades, or refuses the server).
    let manifests = render(
        Some(MINIMAL_VALUES),
        Some(r#"{"config": {"NATS_URL": "nats://nats-0.nats:4222,nats://nats-1.nats:4222"}}"#),
    )
    .expect("the minimal values render");
    assert_eq!(settings(&manifests)["NATS_TLS_REQUIRED"], "true");
    for manifest in manifests.iter().filter(|m| kind(m) == "Deployment") {
        let component = name(manifest).trim_start_matches("palisade-");
        let container = &containers(manifest)[0];
        assert_eq!(
            env_value(container, "NATS_CREDS").as_deref(),
            Some(format!("/etc/palisade/nats/{component}.creds").as_str()),
            "{}",
            name(manifest)
        );
        assert!(
            env_value(container, "NATS_TLS_CA").is_some(),
            "{}",
            name(manifest)
        );
    }

    let manifests = render(Some(INSECURE_VALUES), None).expect("the insecure opt-outs render");
    assert!(settings(&manifests).get("NATS_TLS_REQUIRED").is_none());
    for manifest in &manifests {
        for container in containers(manifest) {
            for variable in ["NATS_CREDS", "NATS_TLS_CA"] {
                assert!(
                    env_value(&container, variable).is_none(),
                    "{variable} in {manifest}"
                );
            }
        }
    }
}

/// The kubectl commands the chart prints (issue 48, item 11) name the release's namespace, and
/// where a render has none (`helm lint`, which logs a template's refusal instead of failing)
/// no namespace at all: never `kubectl -n  create secret`, which kubectl refuses.
#[test]
fn helm_chart_kubectl_commands_name_the_namespace_or_none() {
    let refusal = render(None, None).expect_err("the bare defaults are refused");
    assert!(
        refusal.contains("`kubectl -n palisade create secret generic palisade-nats-credentials"),
        "{refusal}"
    );
    for (values, secrets) in [
        (
            None,
            &["palisade-nats-credentials", "palisade-nats-tls"][..],
        ),
        (
            Some(r#"{"worker": {"enabled": true}}"#),
            &["palisade-worker-enrollment"][..],
        ),
    ] {
        let logged = lint_log(values.map(|json| (MINIMAL_VALUES, json)));
        for secret in secrets {
            assert!(
                logged.contains(&format!("`kubectl create secret generic {secret} ")),
                "helm lint's log (no namespace) names no usable command for {secret}: {logged}"
            );
        }
        assert!(!logged.contains("kubectl -n  "), "{logged}");
    }
}

/// What Helm logs linting the chart without a namespace (`helm/ci/chart.py lint-log`), with a
/// values file and values as JSON over it.
fn lint_log(values: Option<(&str, &str)>) -> String {
    let mut command = Command::new("python3");
    command
        .current_dir(repository())
        .arg("helm/ci/chart.py")
        .arg("lint-log");
    if let Some((file, json)) = values {
        command
            .arg("--values")
            .arg(file)
            .arg("--values-json")
            .arg(json);
    }
    let output = command.output().expect("python3 runs helm/ci/chart.py");
    assert!(output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The settings ConfigMap's data.
fn settings(manifests: &[Value]) -> &serde_json::Map<String, Value> {
    manifests
        .iter()
        .find(|m| kind(m) == "ConfigMap" && name(m) == "palisade")
        .and_then(|m| m["data"].as_object())
        .expect("the settings ConfigMap")
}

/// The probes, the ServiceMonitor, the alerts and the dashboard against a running system:
/// every path they ask is served, every metric they name is exported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_chart_probes_and_metrics_match_a_running_system() {
    let manifests = render(Some(ALL_ON_VALUES), None).expect("the all-on values render");
    let system = TestSystem::spawn_with(|settings| {
        settings.http_addr = Some("127.0.0.1:0".parse().expect("address"));
    })
    .await;
    system.start(Component::Reaper);
    system.start(Component::Enrichment);
    let addr = system.health_addr.expect("health endpoints served");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("HTTP client");
    let get = |path: String| {
        let http = http.clone();
        async move {
            let response = http
                .get(format!("http://{addr}{path}"))
                .send()
                .await
                .expect("the health server answers");
            let status = response.status().as_u16();
            (status, response.text().await.expect("a body"))
        }
    };

    // Probes: liveness /healthz, readiness /readyz, on the port PALISADE_HTTP_ADDR names.
    let mut probed = BTreeSet::new();
    for manifest in manifests.iter().filter(|m| kind(m) == "Deployment") {
        for container in containers(manifest) {
            let http_addr = env_value(&container, "PALISADE_HTTP_ADDR");
            for (probe, path_wanted) in
                [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")]
            {
                let Some(probe) = container.get(probe) else {
                    continue;
                };
                let path = probe["httpGet"]["path"].as_str().expect("an HTTP probe");
                assert_eq!(
                    path,
                    path_wanted,
                    "{} {}",
                    name(manifest),
                    container["name"]
                );
                let port = container_port(&container, &probe["httpGet"]["port"]);
                let http_addr = http_addr.clone().expect("PALISADE_HTTP_ADDR is set");
                assert!(
                    http_addr.ends_with(&format!(":{port}")),
                    "{}: the probe asks port {port}, the service listens on {http_addr}",
                    name(manifest)
                );
                probed.insert(path.to_owned());
            }
        }
    }
    assert_eq!(
        probed,
        BTreeSet::from(["/healthz".into(), "/readyz".into()])
    );
    let (status, _) = get("/healthz".into()).await;
    assert_eq!(status, 200, "/healthz");
    system
        .wait_for("/readyz to answer ready", || async move {
            (get("/readyz".into()).await.0 == 200).then_some(())
        })
        .await;

    // The ServiceMonitor scrapes /metrics on the services' http port.
    let monitor = manifests
        .iter()
        .find(|m| kind(m) == "ServiceMonitor")
        .expect("a ServiceMonitor with every option on");
    assert_eq!(monitor["spec"]["endpoints"][0]["path"], "/metrics");
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "http");

    // A scan through every service, so every family has been registered and has series.
    let organization = system.organization().await;
    system.reference_worker(organization, 2).await;
    let reply = system
        .submit(&system.request(organization, "synthetic://helm", &["synthetic"]))
        .await;
    assert!(reply.error.is_none(), "{reply:?}");
    system.wait_scan_state(&reply.scan_id, "completed").await;

    let named_by_rules = metric_names_in(&rule_expressions(&manifests));
    let named_by_dashboard = metric_names_in(&dashboard_expressions(&manifests));
    assert!(named_by_rules.len() > 10, "{named_by_rules:?}");
    assert!(named_by_dashboard.len() > 5, "{named_by_dashboard:?}");
    let named: BTreeSet<String> = named_by_rules.union(&named_by_dashboard).cloned().collect();
    // Every family is registered once its process has started; poll a bounded while for the
    // consumers, which register in their own tasks, then name what is missing.
    let deadline = tokio::time::Instant::now() + WAIT_MAX;
    let missing = loop {
        let (status, text) = get("/metrics".into()).await;
        assert_eq!(status, 200, "/metrics");
        let missing: Vec<String> = named.difference(&exported_names(&text)).cloned().collect();
        if missing.is_empty() || tokio::time::Instant::now() >= deadline {
            break missing;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        missing.is_empty(),
        "the chart's PrometheusRule or Grafana dashboard names {missing:?}, which a running \
         system's /metrics does not export (docs/operations.md lists the metrics)"
    );
}

/// Renders the chart (`helm/ci/chart.py render`) with a values file and values as JSON over
/// it: its manifests, or Helm's refusal.
pub(crate) fn render(
    values: Option<&str>,
    values_json: Option<&str>,
) -> Result<Vec<Value>, String> {
    let mut command = Command::new("python3");
    command
        .current_dir(repository())
        .arg("helm/ci/chart.py")
        .arg("render");
    if let Some(values) = values {
        command.arg("--values").arg(values);
    }
    if let Some(values_json) = values_json {
        command.arg("--values-json").arg(values_json);
    }
    let output = command
        .output()
        .expect("python3 runs (the chart is rendered by helm/ci/chart.py)");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        !stderr.contains("is not installed"),
        "the render test needs the chart tools: {stderr}"
    );
    if !output.status.success() {
        return Err(stderr);
    }
    let rendered: Value = serde_json::from_slice(&output.stdout).expect("chart.py prints JSON");
    Ok(rendered["manifests"]
        .as_array()
        .expect("a list of manifests")
        .iter()
        .map(|manifest| manifest["document"].clone())
        .collect())
}

/// Every variable named in the source of palisade's binaries and the crates they are built
/// from (`services/*/src`, `shared/*/src`): string literals `"DATABASE_URL"`, `"RUST_LOG"`,
/// `"NATS_…"`, `"OTEL_…"`, `"PALISADE_…"`.
fn variables_read_by_the_binaries() -> BTreeSet<String> {
    let mut variables = BTreeSet::new();
    for group in ["services", "shared"] {
        for crate_dir in read_dir(&repository().join(group)) {
            let mut pending = vec![crate_dir.join("src")];
            while let Some(dir) = pending.pop() {
                if !dir.is_dir() {
                    continue;
                }
                for path in read_dir(&dir) {
                    if path.is_dir() {
                        pending.push(path);
                    } else if path.extension().is_some_and(|e| e == "rs") {
                        let text = std::fs::read_to_string(&path).expect("a source file");
                        variables.extend(quoted_variables(&text));
                    }
                }
            }
        }
    }
    variables
}

fn quoted_variables(text: &str) -> Vec<String> {
    text.split('"')
        .skip(1)
        .step_by(2)
        .filter(|literal| {
            !literal.is_empty()
                && literal
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
                && (["PALISADE_", "NATS_", "OTEL_"]
                    .iter()
                    .any(|prefix| literal.starts_with(prefix))
                    || ["DATABASE_URL", "RUST_LOG"].contains(literal))
        })
        .map(str::to_owned)
        .collect()
}

fn read_dir(dir: &Path) -> Vec<PathBuf> {
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|error| panic!("cannot read {}: {error}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    paths.sort();
    paths
}

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate is in the workspace")
        .to_owned()
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("readable")).expect("JSON")
}

fn kind(manifest: &Value) -> &str {
    manifest["kind"].as_str().unwrap_or_default()
}

fn name(manifest: &Value) -> &str {
    manifest["metadata"]["name"].as_str().unwrap_or_default()
}

/// The containers and init containers of a workload's pod template.
fn containers(manifest: &Value) -> Vec<Value> {
    if !WORKLOADS.contains(&kind(manifest)) {
        return Vec::new();
    }
    let pod = &manifest["spec"]["template"]["spec"];
    ["initContainers", "containers"]
        .iter()
        .flat_map(|field| pod[field].as_array().cloned().unwrap_or_default())
        .collect()
}

fn env_value(container: &Value, variable: &str) -> Option<String> {
    container["env"]
        .as_array()?
        .iter()
        .find(|entry| entry["name"] == variable)
        .and_then(|entry| entry["value"].as_str().map(str::to_owned))
}

/// A probe's port: a number, or the name of one of the container's ports.
fn container_port(container: &Value, port: &Value) -> u64 {
    if let Some(number) = port.as_u64() {
        return number;
    }
    let port_name = port.as_str().expect("a port number or name");
    container["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == port_name)
        .and_then(|p| p["containerPort"].as_u64())
        .unwrap_or_else(|| panic!("no container port named {port_name}: {container}"))
}

/// Every string value in a manifest.
fn strings(value: &Value) -> Vec<String> {
    match value {
        Value::String(text) => vec![text.clone()],
        Value::Array(items) => items.iter().flat_map(strings).collect(),
        Value::Object(fields) => fields.values().flat_map(strings).collect(),
        _ => Vec::new(),
    }
}

/// Whether `text` holds a URL with a password (`scheme://user:password@host`).
fn has_password_in_url(text: &str) -> bool {
    text.split("://").skip(1).any(|rest| {
        let authority = rest.split(['/', '?', ',', ' ']).next().unwrap_or_default();
        authority
            .split_once('@')
            .is_some_and(|(user_info, _)| user_info.contains(':'))
    })
}

fn rule_expressions(manifests: &[Value]) -> Vec<String> {
    let rule = manifests
        .iter()
        .find(|m| kind(m) == "PrometheusRule")
        .expect("a PrometheusRule with every option on");
    let mut expressions = Vec::new();
    for group in rule["spec"]["groups"].as_array().expect("rule groups") {
        for rule in group["rules"].as_array().expect("rules") {
            assert!(rule["alert"].is_string(), "an alert without a name: {rule}");
            expressions.push(rule["expr"].as_str().expect("an expression").to_owned());
        }
    }
    expressions
}

fn dashboard_expressions(manifests: &[Value]) -> Vec<String> {
    let config_map = manifests
        .iter()
        .find(|m| kind(m) == "ConfigMap" && m["metadata"]["labels"]["grafana_dashboard"] == "1")
        .expect("a dashboard ConfigMap with Grafana's sidecar label");
    let text = config_map["data"]["palisade.json"]
        .as_str()
        .expect("the dashboard JSON");
    let dashboard: Value = serde_json::from_str(text).expect("the dashboard is valid JSON");
    let mut expressions = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            expressions.push(target["expr"].as_str().expect("an expression").to_owned());
        }
    }
    expressions
}

/// The `palisade_…` metric names in PromQL expressions.
fn metric_names_in(expressions: &[String]) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for expression in expressions {
        for (start, _) in expression.match_indices("palisade_") {
            let name: String = expression[start..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            names.insert(name);
        }
    }
    names
}

/// The names a `/metrics` answer exports: each sample's, and each family's with the suffixes
/// its type gives its samples (`_total`; `_bucket`, `_sum`, `_count`), so a family with no
/// sample yet still counts.
fn exported_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(declaration) = line.strip_prefix("# TYPE ") {
            let mut parts = declaration.split_whitespace();
            let (Some(family), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            names.insert(family.to_owned());
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                _ => &[],
            };
            names.extend(suffixes.iter().map(|suffix| format!("{family}{suffix}")));
        } else if !line.starts_with('#') {
            let sample = line.split(['{', ' ']).next().unwrap_or_default();
            if !sample.is_empty() {
                names.insert(sample.to_owned());
            }
        }
    }
    names
}
