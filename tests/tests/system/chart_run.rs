//! The chart, run (issue 45, item 4): rendered with production-like values (per-service NATS
//! credentials from the Secret `palisade nats init` fills, the reference worker enrolling with a
//! token, TLS to NATS, the default replicas), and every rendered workload run the way the kubelet would,
//! as local processes: each pod in a network namespace of its own on a private bridge (so every
//! pod listens on the port it renders), its containers under chroot in a copy of the image's root
//! filesystem (`image.rs`) as the pod's user, the Secrets and ConfigMaps it mounts written at
//! their mount paths (keys, modes, `fsGroup`), its env resolved as rendered (`value`,
//! `secretKeyRef`, `configMapKeyRef`, `fieldRef`, `envFrom`, `$(VAR)`), and the Services' names
//! in its `/etc/hosts`. Against a PostgreSQL and an operator-mode NATS of the test's own: the
//! migration hook Job first, then every workload, each ready by its own readiness probe; a
//! scan submitted with a client's credentials completes; the chart's test hook passes; a
//! rendered upgrade (a setting changed, a replica more) replaces the pods one at a time while
//! scans keep completing, none lost. The kubelet here refuses what a cluster would only show
//! late: an env var no binary reads, a probe path that does not answer, a Secret key a mount
//! lacks (each shown broken on purpose). NATS requires TLS, with a test authority whose
//! certificate the chart's TLS Secret carries, as production's does.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde_json::{Value, json};
use tests::netns::{Host, Network};
use tests::servers::{NatsServer, PostgresServer};

/// The namespace the release is installed in.
const NAMESPACE: &str = "palisade";
/// The organization the worker's token and the client serve.
const ORGANIZATION: &str = "01900000-0000-7000-8000-00000000c4a7";

/// A Secret's or ConfigMap's keys.
type Data = BTreeMap<String, Vec<u8>>;

/// What the kubelet and the API server would hold: the Secrets the operator created, the
/// ConfigMaps the chart rendered, the Services' pod addresses.
struct Kubelet {
    network: Network,
    /// The image's root filesystem, copied (hard links) for each pod.
    image: PathBuf,
    scratch: tempfile::TempDir,
    secrets: BTreeMap<String, Data>,
    config_maps: BTreeMap<String, Data>,
    /// Service name → the address of a ready pod behind it.
    services: BTreeMap<String, std::net::Ipv4Addr>,
    /// Every env var name some binary of the image reads (its bytes hold the name).
    binary_bytes: Vec<Vec<u8>>,
}

/// A running pod: its namespace, its root, its containers' processes.
struct Pod {
    name: String,
    host: Host,
    /// Each container's process and its log (standard error).
    children: Vec<(tokio::process::Child, PathBuf)>,
}

impl Pod {
    /// SIGTERM to every container, then waits for each to exit.
    async fn stop(mut self) {
        for (child, _) in &self.children {
            tests::servers::signal(child, "TERM");
        }
        for (child, _) in &mut self.children {
            let _ = tokio::time::timeout(tests::WAIT_MAX * 3, child.wait()).await;
        }
    }
}

fn kind(manifest: &Value) -> &str {
    manifest["kind"].as_str().unwrap_or_default()
}

fn name(manifest: &Value) -> &str {
    manifest["metadata"]["name"].as_str().unwrap_or_default()
}

/// The pod template's spec of a workload, or a Pod's own.
fn pod_spec(manifest: &Value) -> &Value {
    if kind(manifest) == "Pod" {
        &manifest["spec"]
    } else {
        &manifest["spec"]["template"]["spec"]
    }
}

/// The pod template's labels of a workload, or a Pod's own.
fn pod_labels(manifest: &Value) -> BTreeMap<String, String> {
    let metadata = if kind(manifest) == "Pod" {
        &manifest["metadata"]
    } else {
        &manifest["spec"]["template"]["metadata"]
    };
    metadata["labels"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(key, value)| (key.clone(), value.as_str().unwrap_or_default().to_owned()))
        .collect()
}

/// `$(VAR)` in `text`, from `env` (the kubelet's expansion; unknown references stay).
fn expand(text: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = text.to_owned();
    for (name, value) in env {
        out = out.replace(&format!("$({name})"), value);
    }
    out
}

impl Kubelet {
    /// A container's environment as the kubelet resolves it, or what it cannot resolve.
    fn env(
        &self,
        container: &Value,
        pod: &str,
        host: &Host,
        labels: &BTreeMap<String, String>,
    ) -> Result<BTreeMap<String, String>, String> {
        let mut env = BTreeMap::new();
        for from in container["envFrom"].as_array().into_iter().flatten() {
            let (source, object) = if let Some(name) = from["configMapRef"]["name"].as_str() {
                (&self.config_maps, name)
            } else {
                (
                    &self.secrets,
                    from["secretRef"]["name"].as_str().unwrap_or_default(),
                )
            };
            let data = source
                .get(object)
                .ok_or(format!("envFrom names {object}, which does not exist"))?;
            for (key, value) in data {
                env.insert(key.clone(), String::from_utf8_lossy(value).into_owned());
            }
        }
        for variable in container["env"].as_array().into_iter().flatten() {
            let name = variable["name"].as_str().unwrap_or_default().to_owned();
            let from = &variable["valueFrom"];
            let value = if let Some(value) = variable["value"].as_str() {
                expand(value, &env)
            } else if from["secretKeyRef"].is_object() {
                self.key(&self.secrets, &from["secretKeyRef"], "Secret")?
            } else if from["configMapKeyRef"].is_object() {
                self.key(&self.config_maps, &from["configMapKeyRef"], "ConfigMap")?
            } else if let Some(path) = from["fieldRef"]["fieldPath"].as_str() {
                field(path, pod, host, labels)?
            } else {
                return Err(format!(
                    "{name}: a source this kubelet does not know: {from}"
                ));
            };
            env.insert(name, value);
        }
        Ok(env)
    }

    fn key(
        &self,
        objects: &BTreeMap<String, Data>,
        reference: &Value,
        what: &str,
    ) -> Result<String, String> {
        let object = reference["name"].as_str().unwrap_or_default();
        let key = reference["key"].as_str().unwrap_or_default();
        objects
            .get(object)
            .and_then(|data| data.get(key))
            .map(|value| String::from_utf8_lossy(value).into_owned())
            .ok_or(format!(
                "{what} {object} has no key {key}, which the pod reads"
            ))
    }

    /// Every variable `env` sets that no binary of the image reads, but those only other
    /// variables refer to (`$(POD_INDEX)`).
    fn unread(&self, container: &Value, env: &BTreeMap<String, String>) -> Vec<String> {
        let referred: String = container["env"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|variable| variable["value"].as_str())
            .collect();
        env.keys()
            .filter(|name| !referred.contains(&format!("$({name})")))
            .filter(|name| {
                !self.binary_bytes.iter().any(|bytes| {
                    bytes
                        .windows(name.len())
                        .any(|window| window == name.as_bytes())
                })
            })
            .cloned()
            .collect()
    }

    /// Writes the pod's volumes at its containers' mount paths in `root`; a claim of the
    /// StatefulSet's is a directory of the pod's root, which the pod's restarts keep.
    fn mount(&self, manifest: &Value, root: &Path) -> Result<(), String> {
        let spec = pod_spec(manifest);
        let group = spec["securityContext"]["fsGroup"].as_u64().unwrap_or(0) as u32;
        let volumes: BTreeMap<&str, &Value> = spec["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|volume| (volume["name"].as_str().unwrap_or_default(), volume))
            .collect();
        let claims: Vec<&str> = manifest["spec"]["volumeClaimTemplates"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|claim| claim["metadata"]["name"].as_str())
            .collect();
        let containers = spec["initContainers"]
            .as_array()
            .into_iter()
            .flatten()
            .chain(spec["containers"].as_array().into_iter().flatten());
        for container in containers {
            for mount in container["volumeMounts"].as_array().into_iter().flatten() {
                let volume_name = mount["name"].as_str().unwrap_or_default();
                let path = mount["mountPath"].as_str().unwrap_or_default();
                let at = root.join(path.trim_start_matches('/'));
                std::fs::create_dir_all(&at).unwrap();
                if claims.contains(&volume_name) {
                    own(&at, group, 0o2775);
                    continue;
                }
                let volume = volumes.get(volume_name).ok_or(format!(
                    "a mount of {volume_name}, which is no volume of the pod"
                ))?;
                self.fill(volume, &at, group)?;
            }
        }
        Ok(())
    }

    /// One volume's files in `at`.
    fn fill(&self, volume: &Value, at: &Path, group: u32) -> Result<(), String> {
        let (objects, source, what) = if volume["secret"].is_object() {
            (&self.secrets, &volume["secret"], "Secret")
        } else if volume["configMap"].is_object() {
            (&self.config_maps, &volume["configMap"], "ConfigMap")
        } else {
            // emptyDir: writable by the pod's group.
            own(at, group, 0o2777);
            return Ok(());
        };
        let object = source["secretName"]
            .as_str()
            .or(source["name"].as_str())
            .unwrap_or_default();
        let data = objects.get(object).ok_or(format!(
            "{what} {object}, which the pod mounts, does not exist"
        ))?;
        let mode = source["defaultMode"].as_u64().unwrap_or(0o644) as u32;
        let items: Vec<(String, String)> = match source["items"].as_array() {
            Some(items) => items
                .iter()
                .map(|item| {
                    (
                        item["key"].as_str().unwrap_or_default().to_owned(),
                        item["path"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect(),
            None => data.keys().map(|key| (key.clone(), key.clone())).collect(),
        };
        for (key, path) in items {
            let bytes = data.get(&key).ok_or(format!(
                "{what} {object} has no key {key}, which the pod mounts"
            ))?;
            let file = at.join(path);
            std::fs::write(&file, bytes).unwrap();
            own(&file, group, mode);
        }
        Ok(())
    }

    /// The pod's root: the image's files (hard links), `/etc/hosts` naming the Services. A
    /// pod of the same name (a StatefulSet's, restarted) gets its root back.
    fn root(&self, pod: &str) -> PathBuf {
        let root = self.scratch.path().join("pods").join(pod);
        if !root.exists() {
            std::fs::create_dir_all(root.parent().unwrap()).unwrap();
            let copied = std::process::Command::new("cp")
                .args(["-al"])
                .arg(&self.image)
                .arg(&root)
                .status()
                .unwrap();
            assert!(copied.success(), "the image copied for {pod}");
        }
        let mut hosts = String::from("127.0.0.1 localhost\n");
        for (service, address) in &self.services {
            hosts.push_str(&format!("{address} {service} {service}.{NAMESPACE}.svc\n"));
        }
        std::fs::write(root.join("etc/hosts"), hosts).unwrap();
        root
    }

    /// Where a container of `pod` logs.
    fn log(&self, pod: &str, container: &Value) -> PathBuf {
        let logs = self.scratch.path().join("logs");
        std::fs::create_dir_all(&logs).unwrap();
        logs.join(format!(
            "{pod}-{}.log",
            container["name"].as_str().unwrap_or("container")
        ))
    }

    /// Starts one pod of `manifest` (a Job's runs to its end first): init containers in order,
    /// then every container; each under chroot in the pod's root, in its own network namespace.
    async fn start(
        &mut self,
        manifest: &Value,
        pod: &str,
        labels: BTreeMap<String, String>,
    ) -> Result<Pod, String> {
        let host = self.network.host(pod);
        let root = self.root(pod);
        self.mount(manifest, &root)?;
        let spec = pod_spec(manifest);
        let user = format!(
            "{}:{}",
            spec["securityContext"]["runAsUser"].as_u64().unwrap_or(0),
            spec["securityContext"]["runAsGroup"].as_u64().unwrap_or(0)
        );
        let group = spec["securityContext"]["fsGroup"].as_u64().unwrap_or(0);
        for init in spec["initContainers"].as_array().into_iter().flatten() {
            let env = self.env(init, pod, &host, &labels)?;
            let log = self.log(pod, init);
            let status = logged(command(&host, &root, &user, group, init, &env), &log)
                .status()
                .await
                .unwrap();
            if !status.success() {
                return Err(format!(
                    "{pod}: init container {} failed: {status}: {}",
                    tail(&log),
                    init["name"]
                ));
            }
        }
        let mut children = Vec::new();
        for container in spec["containers"].as_array().into_iter().flatten() {
            let env = self.env(container, pod, &host, &labels)?;
            let unread = self.unread(container, &env);
            if !unread.is_empty() {
                return Err(format!(
                    "{pod}: container {} is given {unread:?}, which no binary of the image reads",
                    container["name"]
                ));
            }
            let log = self.log(pod, container);
            let child = logged(command(&host, &root, &user, group, container, &env), &log)
                .spawn()
                .unwrap();
            children.push((child, log));
        }
        Ok(Pod {
            name: pod.to_owned(),
            host,
            children,
        })
    }
}

/// `fieldRef`'s paths the chart uses.
fn field(
    path: &str,
    pod: &str,
    host: &Host,
    labels: &BTreeMap<String, String>,
) -> Result<String, String> {
    if let Some(label) = path
        .strip_prefix("metadata.labels['")
        .and_then(|rest| rest.strip_suffix("']"))
    {
        return labels
            .get(label)
            .cloned()
            .ok_or(format!("fieldRef {path}: the pod has no such label"));
    }
    Ok(match path {
        "metadata.name" => pod.to_owned(),
        "metadata.namespace" => NAMESPACE.to_owned(),
        "status.podIP" => host.address.to_string(),
        other => return Err(format!("fieldRef {other}: not a path this kubelet knows")),
    })
}

fn own(path: &Path, group: u32, mode: u32) {
    use std::os::unix::fs::PermissionsExt as _;
    std::os::unix::fs::chown(path, Some(0), Some(group)).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The container's process: `ip netns exec <pod> chroot --userspec … <root> command args…`.
fn command(
    host: &Host,
    root: &Path,
    user: &str,
    group: u64,
    container: &Value,
    env: &BTreeMap<String, String>,
) -> tokio::process::Command {
    let mut argv: Vec<String> = container["command"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(container["args"].as_array().into_iter().flatten())
        .filter_map(Value::as_str)
        .map(|arg| expand(arg, env))
        .collect();
    assert!(
        !argv.is_empty(),
        "a container without a command: the image's CMD is palisade"
    );
    let mut args = vec![
        format!("--userspec={user}"),
        format!("--groups={group}"),
        root.display().to_string(),
    ];
    args.append(&mut argv);
    let (program, args) = host.wrap(&crate::image::system_program("chroot"), &args);
    let mut command = tokio::process::Command::new(crate::image::system_program(&program));
    command
        .args(args)
        .env_clear()
        .env("PATH", "/usr/local/bin")
        .envs(env)
        .stdout(Stdio::null())
        .kill_on_drop(true);
    command
}

/// The container's standard error goes to `log`, named in a failure.
fn logged(mut command: tokio::process::Command, log: &Path) -> tokio::process::Command {
    command.stderr(std::fs::File::create(log).unwrap());
    command
}

/// The last lines of a container's log.
fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join("\n")
}

/// Waits until every container of `pod` with a readiness probe answers it (an HTTP GET of its
/// path on its port, at the pod's address) with a success, and its liveness probe too.
async fn ready(manifest: &Value, pod: &mut Pod) -> Result<(), String> {
    for container in pod_spec(manifest)["containers"]
        .as_array()
        .into_iter()
        .flatten()
    {
        for probe in ["readinessProbe", "livenessProbe"] {
            let get = &container[probe]["httpGet"];
            let Some(path) = get["path"].as_str() else {
                continue;
            };
            let port = match &get["port"] {
                Value::Number(port) => port.as_u64().unwrap_or_default(),
                Value::String(named) => container["ports"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|port| port["name"].as_str() == Some(named))
                    .and_then(|port| port["containerPort"].as_u64())
                    .ok_or(format!(
                        "{}: {probe} names port {named}, which the container does not declare",
                        pod.name
                    ))?,
                other => return Err(format!("{probe}: port {other}")),
            };
            let url = format!("http://{}:{port}{path}", pod.host.address);
            let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
            loop {
                match reqwest::get(&url).await {
                    Ok(answer) if answer.status().is_success() => break,
                    Ok(answer) if answer.status() == reqwest::StatusCode::NOT_FOUND => {
                        return Err(format!("{}: {probe} {url} does not exist (404)", pod.name));
                    }
                    _ => {}
                }
                for (child, log) in &mut pod.children {
                    if let Ok(Some(status)) = child.try_wait() {
                        return Err(format!(
                            "{}: a container exited before it was ready: {status}: {}",
                            pod.name,
                            tail(log)
                        ));
                    }
                }
                if tokio::time::Instant::now() > deadline {
                    return Err(format!("{}: {probe} {url} never succeeded", pod.name));
                }
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            }
        }
    }
    Ok(())
}

/// Waits for every container of a run-to-completion pod (a Job's, a test hook's) to exit 0.
async fn completed(mut pod: Pod) -> Result<(), String> {
    for (child, log) in &mut pod.children {
        let status = tokio::time::timeout(std::time::Duration::from_secs(120), child.wait())
            .await
            .map_err(|_| format!("{} did not end: {}", pod.name, tail(log)))?
            .unwrap();
        if !status.success() {
            return Err(format!(
                "{}: a container failed: {status}: {}",
                pod.name,
                tail(log)
            ));
        }
    }
    Ok(())
}

/// `palisade args…` on the administrator's machine, with `env`; its standard output.
async fn palisade(env: &[(&str, String)], args: &[&str]) -> String {
    let output = palisade_output(env, args).await;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "palisade {args:?}: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// `palisade args…` on the administrator's machine, with `env`, as it ended.
async fn palisade_output(env: &[(&str, String)], args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(crate::image::binaries_dir().join("palisade"))
        .args(args)
        .env_remove("RUST_LOG")
        .envs(env.iter().map(|(name, value)| (*name, value.as_str())))
        .output()
        .await
        .expect("palisade runs")
}

/// The chart rendered with these cluster's production-like values, and `more` over them.
fn render(nats_url: &str, more: &Value) -> Vec<Value> {
    let mut values = json!({
        "nats": {
            "credentials": {"existingSecret": "palisade-nats-credentials"},
            "tls": {"existingSecret": "palisade-nats-tls"}
        },
        "config": {"NATS_URL": nats_url},
        "worker": {"enabled": true, "enrollment": {"existingSecret": "palisade-worker-enrollment"}}
    });
    merge(&mut values, more);
    crate::helm::render(None, Some(&values.to_string())).expect("the chart renders")
}

fn merge(into: &mut Value, from: &Value) {
    match (into, from) {
        (Value::Object(into), Value::Object(from)) => {
            for (key, value) in from {
                merge(into.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
        (into, from) => *into = from.clone(),
    }
}

fn find<'a>(manifests: &'a [Value], wanted: &str, named: &str) -> &'a Value {
    manifests
        .iter()
        .find(|manifest| kind(manifest) == wanted && name(manifest) == named)
        .unwrap_or_else(|| panic!("no {wanted} {named} rendered"))
}

/// The Deployments and the StatefulSet, in the order rendered.
fn workloads(manifests: &[Value]) -> Vec<&Value> {
    manifests
        .iter()
        .filter(|manifest| matches!(kind(manifest), "Deployment" | "StatefulSet"))
        .collect()
}

fn replicas(manifest: &Value) -> u64 {
    manifest["spec"]["replicas"].as_u64().unwrap_or(1)
}

impl Kubelet {
    /// Replica `index` of `manifest` (generation `generation` of a Deployment's pods), started
    /// and ready; the Service of its name now reaches it.
    async fn replica(
        &mut self,
        manifest: &Value,
        generation: u32,
        index: u64,
    ) -> Result<Pod, String> {
        let workload = name(manifest).to_owned();
        let mut labels = pod_labels(manifest);
        let pod = if kind(manifest) == "StatefulSet" {
            labels.insert("apps.kubernetes.io/pod-index".into(), index.to_string());
            format!("{workload}-{index}")
        } else {
            format!("{workload}-g{generation}-{index}")
        };
        labels.insert("statefulset.kubernetes.io/pod-name".into(), pod.clone());
        let mut started = self.start(manifest, &pod, labels).await?;
        ready(manifest, &mut started).await?;
        self.services.insert(workload, started.host.address);
        Ok(started)
    }

    /// Every replica of every workload, one workload after the other.
    async fn install(&mut self, manifests: &[Value]) -> BTreeMap<String, Vec<Pod>> {
        let mut pods = BTreeMap::new();
        for manifest in workloads(manifests) {
            let mut started = Vec::new();
            for index in 0..replicas(manifest) {
                started.push(
                    self.replica(manifest, 1, index)
                        .await
                        .expect("a pod of the chart is ready"),
                );
            }
            pods.insert(name(manifest).to_owned(), started);
        }
        pods
    }

    /// A Helm upgrade's rollout: each Deployment's pods replaced one at a time (a new one
    /// ready, then an old one stopped: maxUnavailable 0), the StatefulSet's in reverse order
    /// (one stopped, then started again on its claim).
    async fn roll(&mut self, manifests: &[Value], pods: &mut BTreeMap<String, Vec<Pod>>) {
        for manifest in workloads(manifests) {
            let workload = name(manifest).to_owned();
            let mut old = pods.remove(&workload).unwrap_or_default();
            let mut new = Vec::new();
            if kind(manifest) == "StatefulSet" {
                while let Some(pod) = old.pop() {
                    let index = old.len() as u64;
                    pod.stop().await;
                    new.insert(
                        0,
                        self.replica(manifest, 2, index)
                            .await
                            .expect("the restarted pod is ready"),
                    );
                }
            } else {
                for index in 0..replicas(manifest) {
                    new.push(
                        self.replica(manifest, 2, index)
                            .await
                            .expect("the new pod is ready"),
                    );
                    if !old.is_empty() {
                        old.remove(0).stop().await;
                    }
                }
                for pod in old {
                    pod.stop().await;
                }
            }
            pods.insert(workload, new);
        }
    }
}

/// Scans submitted one after the other with a client's credentials, each followed to its end,
/// until `stop` (one, without): how many completed, and what else happened.
async fn submit_until(
    admin: Vec<(&'static str, String)>,
    target: String,
    stop: Option<tokio_util::sync::CancellationToken>,
) -> (usize, Vec<String>) {
    let mut completed = 0;
    let mut other = Vec::new();
    loop {
        let output = palisade_output(
            &admin,
            &[
                "scan",
                "submit",
                "--org",
                ORGANIZATION,
                "--client",
                "chart-client",
                "--target",
                &target,
                "--plugins",
                "tcp_connect,http_headers",
                "--wait",
                "--timeout-secs",
                "120",
            ],
        )
        .await;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        if output.status.success() && stdout.contains("completed") {
            completed += 1;
        } else {
            other.push(format!(
                "{stdout}{}",
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        if stop
            .as_ref()
            .is_none_or(tokio_util::sync::CancellationToken::is_cancelled)
        {
            return (completed, other);
        }
    }
}

/// A web application on the suite's network for the worker's plugins to scan.
/// The scans' target, served from a thread and a runtime of its own: the test's runtime
/// (two threads) also runs the kubelet, whose blocking steps (`cp -al` of a pod's root, `ip`)
/// could otherwise leave a GET unanswered past the plugin's 3 s timeout on a loaded machine.
async fn web_app(address: std::net::Ipv4Addr) -> String {
    let listener = std::net::TcpListener::bind((address, 0)).expect("binds on the bridge");
    listener.set_nonblocking(true).unwrap();
    let bound = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime for the target")
            .block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let app = axum::Router::new().fallback(|| async { "hello from the chart run\n" });
                axum::serve(listener, app).await
            })
    });
    format!("http://{bound}/")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_runs_as_rendered_and_rolls_an_upgrade_without_losing_a_scan() {
    let mut network = Network::create()
        .unwrap_or_else(|why| panic!("the chart run needs network namespaces: {why}"));
    let (pg_address, nats_address, app_address) = (
        network.server_address(),
        network.server_address(),
        network.server_address(),
    );
    let scratch = tempfile::tempdir().unwrap();
    let postgres = PostgresServer::start_at(Some(pg_address)).await;
    // The authority, as docs/deploy.md's step 3 has the administrator write it.
    let authority = scratch.path().join("authority");
    let dir = authority.display().to_string();
    palisade(
        &[],
        &[
            "nats",
            "init",
            "--dir",
            &dir,
            "--resolver-dir",
            &format!("{dir}/jwt"),
        ],
    )
    .await;
    // Its configuration as the servers include it (inline: `include` takes relative paths),
    // and TLS required of every client, with a certificate naming the server's address.
    let certificates = tests::tls::TestCertificates::generate_for(scratch.path(), &[nats_address]);
    let nats = NatsServer::start_with_config_at(
        &format!(
            "{}\ntls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n}}\n",
            std::fs::read_to_string(authority.join("nats-server-auth.conf")).unwrap(),
            certificates.server_cert.display(),
            certificates.server_key.display()
        ),
        Some(nats_address),
    )
    .await;
    let nats_url = nats.url().replace("nats://", "tls://");
    let ca = certificates.ca.display().to_string();
    let database_url = postgres.url("palisade");
    let admin: Vec<(&'static str, String)> = vec![
        ("DATABASE_URL", database_url.clone()),
        ("NATS_URL", nats_url.clone()),
        ("NATS_CREDS", format!("{dir}/operator.creds")),
        ("PALISADE_NATS_AUTHORITY", dir.clone()),
        ("NATS_TLS_CA", ca.clone()),
        ("NATS_TLS_REQUIRED", "true".to_owned()),
    ];

    let image = scratch.path().join("image");
    crate::image::assemble(&image).await;
    let binary_bytes = crate::image::BINARIES
        .iter()
        .map(|binary| std::fs::read(image.join("usr/local/bin").join(binary)).unwrap())
        .collect();
    let mut credentials = Data::new();
    for file in [
        "admission.creds",
        "dispatch.creds",
        "ingestion.creds",
        "enrichment.creds",
        "reaper.creds",
        "enrollment.nk",
    ] {
        credentials.insert(
            file.to_owned(),
            std::fs::read(authority.join(file)).unwrap(),
        );
    }
    let mut kubelet = Kubelet {
        network,
        image,
        scratch,
        secrets: BTreeMap::from([
            (
                "palisade-database".to_owned(),
                Data::from([("DATABASE_URL".to_owned(), database_url.clone().into_bytes())]),
            ),
            ("palisade-nats-credentials".to_owned(), credentials),
            (
                "palisade-nats-tls".to_owned(),
                Data::from([(
                    "ca.crt".to_owned(),
                    std::fs::read(&certificates.ca).unwrap(),
                )]),
            ),
        ]),
        config_maps: BTreeMap::new(),
        services: BTreeMap::new(),
        binary_bytes,
    };
    let manifests = render(&nats_url, &json!({}));
    for manifest in manifests
        .iter()
        .filter(|manifest| kind(manifest) == "ConfigMap")
    {
        let data = manifest["data"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(key, value)| {
                (
                    key.clone(),
                    value.as_str().unwrap_or_default().as_bytes().to_vec(),
                )
            })
            .collect();
        kubelet.config_maps.insert(name(manifest).to_owned(), data);
    }

    // The pre-install hook: the migrations, before anything else.
    let job = find(&manifests, "Job", "palisade-migrate");
    let migrate = kubelet
        .start(job, "palisade-migrate-1", pod_labels(job))
        .await
        .expect("the Job starts");
    completed(migrate)
        .await
        .expect("the migration Job succeeds");

    // The administrator: an organization, the worker's token (the Secret the StatefulSet
    // mounts), a client.
    palisade(
        &admin,
        &["org", "add", "--name", "chart", "--id", ORGANIZATION],
    )
    .await;
    let token = palisade(
        &admin,
        &[
            "worker",
            "token",
            "create",
            "--org",
            ORGANIZATION,
            "--capabilities",
            "tcp_connect,http_headers",
            "--expires",
            "1h",
        ],
    )
    .await;
    kubelet.secrets.insert(
        "palisade-worker-enrollment".into(),
        Data::from([("token-0".to_owned(), token.trim().as_bytes().to_vec())]),
    );
    let client_creds = kubelet
        .scratch
        .path()
        .join("client.creds")
        .display()
        .to_string();
    palisade(
        &admin,
        &[
            "client",
            "add",
            "--id",
            "chart-client",
            "--org",
            ORGANIZATION,
            "--creds",
            &client_creds,
        ],
    )
    .await;
    let client: Vec<(&'static str, String)> = vec![
        ("DATABASE_URL", database_url.clone()),
        ("NATS_URL", nats_url.clone()),
        ("NATS_CREDS", client_creds),
        ("NATS_TLS_CA", ca.clone()),
        ("NATS_TLS_REQUIRED", "true".to_owned()),
    ];

    let mut pods = kubelet.install(&manifests).await;
    let target = web_app(app_address).await;
    let (scan, failures) = submit_until(client.clone(), target.clone(), None).await;
    assert_eq!(
        (scan, failures.as_slice()),
        (1, &[][..]),
        "the first scan; the worker's log: {}; dispatch's: {}",
        tail(
            &kubelet
                .scratch
                .path()
                .join("logs/palisade-worker-0-worker.log")
        ),
        tail(
            &kubelet
                .scratch
                .path()
                .join("logs/palisade-dispatch-g1-0-dispatch.log")
        )
    );

    // helm test: the chart's test hook passes.
    let hook = find(&manifests, "Pod", "palisade-test");
    let test_pod = kubelet
        .start(hook, "palisade-test", pod_labels(hook))
        .await
        .expect("the test hook starts");
    completed(test_pod)
        .await
        .expect("the chart's test hook passes");

    // helm upgrade: a setting changed and a replica more, rolled out while scans go on.
    let upgraded = render(
        &nats_url,
        &json!({"config": {"RUST_LOG": "info,palisade=debug"}, "services": {"enrichment": {"replicas": 2}}}),
    );
    let stop = tokio_util::sync::CancellationToken::new();
    let load = tokio::spawn(submit_until(
        client.clone(),
        target.clone(),
        Some(stop.clone()),
    ));
    kubelet.roll(&upgraded, &mut pods).await;
    stop.cancel();
    let (completed_scans, other) = load.await.unwrap();
    assert!(
        other.is_empty(),
        "scans that did not complete during the upgrade: {other:?}"
    );
    assert!(completed_scans >= 1, "no scan completed during the upgrade");
    assert_eq!(pods["palisade-enrichment"].len(), 2, "the replica more");

    // What the kubelet refuses, broken on purpose.
    broken_on_purpose(&mut kubelet, &upgraded).await;
    for (_, replicas) in pods {
        for pod in replicas {
            pod.stop().await;
        }
    }
}

/// An env var no binary reads, a probe path that does not answer, a Secret key a mount lacks:
/// each refused with what is wrong.
async fn broken_on_purpose(kubelet: &mut Kubelet, manifests: &[Value]) {
    let admission = find(manifests, "Deployment", "palisade-admission");

    let mut unread = admission.clone();
    unread["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "PALISADE_NOT_A_SETTING", "value": "1"}));
    let refused = kubelet
        .replica(&unread, 9, 0)
        .await
        .err()
        .expect("an unread variable is refused");
    assert!(refused.contains("PALISADE_NOT_A_SETTING"), "{refused}");

    let mut probe = admission.clone();
    probe["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["path"] =
        json!("/ready");
    let refused = kubelet
        .replica(&probe, 9, 1)
        .await
        .err()
        .expect("a probe path that does not exist is refused");
    assert!(
        refused.contains("/ready") && refused.contains("404"),
        "{refused}"
    );

    let mut key = admission.clone();
    for volume in key["spec"]["template"]["spec"]["volumes"]
        .as_array_mut()
        .unwrap()
    {
        if volume["secret"]["secretName"] == json!("palisade-nats-credentials") {
            volume["secret"]["items"][0]["key"] = json!("admision.creds");
        }
    }
    let refused = kubelet
        .replica(&key, 9, 2)
        .await
        .err()
        .expect("a Secret key the mount lacks is refused");
    assert!(refused.contains("has no key admision.creds"), "{refused}");
}
