//! `sbom`: a software bill of materials of the registry packages a project's lockfiles pin, as
//! a CycloneDX 1.5 JSON document uploaded as an artifact of the task (the upload path of
//! `docs/protocol/worker.md`, "Artifacts"). The target is what `dependency_audit` takes: a
//! lockfile (`Cargo.lock`, `package-lock.json`, `npm-shrinkwrap.json`) or a directory searched
//! for them, read by the same code. It reports no findings: one `sbom` asset names the
//! artifact, and the summary counts what it lists.
//!
//! Its one rule, `sbom-generated` ([`RULES`]), is evaluated on the target once the document is
//! uploaded: PASS (its evidence the artifact and the counts), or NOT_APPLICABLE
//! (`no_lockfiles`) when the target holds no lockfile to list.
//!
//! Each package is one component: `type` `library`, its name and version, and its package URL
//! (`pkg:cargo/<name>@<version>`, `pkg:npm/<name>@<version>` with a scope's `@` written `%40`),
//! which is also its `bom-ref`. Components are listed once each, in package-URL order, so two
//! runs over the same lockfiles list the same components.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use worker::{BoxFuture, Plugin, PluginError, ResultSink, Rule, TaskInput, v1};

use crate::dependency_audit::{self, lockfile::Ecosystem, lockfile::Package};

/// The artifact's file name.
pub const ARTIFACT_NAME: &str = "sbom.cdx.json";
/// CycloneDX's registered media type for its JSON form.
pub const CONTENT_TYPE: &str = "application/vnd.cyclonedx+json";
/// The asset kind that names the artifact.
pub const ASSET_KIND: &str = "sbom";

/// The rule that says the bill of materials was made.
pub const GENERATED_RULE_ID: &str = "sbom-generated";
/// What it declares: the SBOM of the target.
pub const RULES: [Rule; 1] = [Rule {
    id: GENERATED_RULE_ID,
    applies_to: &[messages::TARGET_RESOURCE_KIND],
}];

pub struct Sbom;

impl Plugin for Sbom {
    fn name(&self) -> &'static str {
        "sbom"
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
            let (document, n_lockfiles, n_components) =
                crate::target::run_blocking("sbom", &cancel, move |cancel| {
                    let lockfiles = dependency_audit::read_lockfiles(&root, cancel)?;
                    let packages = lockfiles.iter().flat_map(|lockfile| &lockfile.packages);
                    let (document, n_components) = document(&target, packages);
                    Ok((document, lockfiles.len(), n_components))
                })
                .await?;
            let uploaded = sink.artifact(ARTIFACT_NAME, CONTENT_TYPE, document).await?;
            sink.asset(v1::Asset {
                kind: ASSET_KIND.into(),
                value: format!("{ARTIFACT_NAME} {} sha256:{}", uploaded.id, uploaded.sha256),
            })
            .await?;
            let evaluation = if n_lockfiles == 0 {
                v1::Evaluation::not_applicable(GENERATED_RULE_ID, &task.target, "no_lockfiles")
            } else {
                v1::Evaluation::pass(GENERATED_RULE_ID, &task.target).with_evidence(format!(
                    "{n_components} packages of {n_lockfiles} lockfiles listed in artifact {}",
                    uploaded.id
                ))
            };
            sink.evaluation(evaluation).await?;
            Ok(format!(
                "CycloneDX SBOM of {n_components} packages in {n_lockfiles} lockfiles: artifact {} ({} bytes)",
                uploaded.id, uploaded.size_bytes
            ))
        })
    }
}

/// The package URL of `package` (purl-spec: `pkg:<type>/<namespace>/<name>@<version>`).
pub fn purl(package: &Package) -> String {
    match package.ecosystem {
        Ecosystem::CratesIo => format!("pkg:cargo/{}@{}", package.name, package.version),
        // A scoped package's namespace is its scope, whose '@' the purl encodes.
        Ecosystem::Npm => format!(
            "pkg:npm/{}@{}",
            package.name.replacen('@', "%40", 1),
            package.version
        ),
    }
}

/// The CycloneDX 1.5 JSON document listing `packages` once each, and how many it lists.
pub fn document<'p>(target: &str, packages: impl Iterator<Item = &'p Package>) -> (Bytes, usize) {
    let components: BTreeMap<String, &Package> =
        packages.map(|package| (purl(package), package)).collect();
    let count = components.len();
    let components: Vec<serde_json::Value> = components
        .into_iter()
        .map(|(purl, package)| {
            json!({
                "type": "library",
                "bom-ref": purl,
                "name": package.name,
                "version": package.version,
                "purl": purl,
            })
        })
        .collect();
    let document = json!({
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "serialNumber": format!("urn:uuid:{}", uuid::Uuid::new_v4()),
        "version": 1,
        "metadata": {
            "tools": {
                "components": [{
                    "type": "application",
                    "name": "palisade-worker",
                    "version": env!("CARGO_PKG_VERSION"),
                }]
            },
            "component": {
                "type": "application",
                "bom-ref": "target",
                "name": target,
            }
        },
        "components": components,
    });
    let bytes = serde_json::to_vec_pretty(&document).expect("a JSON value always serializes");
    (bytes.into(), count)
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::{Arc, Mutex};

    use worker::{ArtifactUploader, ResultItem, UploadedArtifact};

    use super::*;

    /// Keeps what is uploaded, in memory.
    #[derive(Default)]
    struct Kept(Mutex<Vec<(String, Bytes)>>);

    impl ArtifactUploader for Kept {
        fn upload<'a>(
            &'a self,
            name: &'a str,
            _content_type: &'a str,
            bytes: Bytes,
        ) -> BoxFuture<'a, Result<UploadedArtifact, PluginError>> {
            Box::pin(async move {
                let size_bytes = bytes.len() as u64;
                self.0.lock().unwrap().push((name.to_owned(), bytes));
                Ok(UploadedArtifact {
                    id: uuid::Uuid::nil(),
                    size_bytes,
                    sha256: "00".repeat(32),
                })
            })
        }
    }

    async fn run(target: &str) -> (Result<String, PluginError>, Vec<ResultItem>) {
        let kept = Arc::new(Kept::default());
        let (sink, mut receiver) = ResultSink::channel(16);
        let task = TaskInput::for_target("sbom", target);
        let result = Sbom
            .run(
                task.clone(),
                sink.with_artifacts(kept.clone()),
                CancellationToken::new(),
            )
            .await;
        let mut items = vec![];
        while let Ok(item) = receiver.try_recv() {
            items.push(item);
        }
        if result.is_ok() {
            assert_eq!(kept.0.lock().unwrap()[0].0, ARTIFACT_NAME);
            crate::coverage::testing::assert_covered(&RULES, &task, &items);
        }
        (result, items)
    }

    #[tokio::test]
    async fn a_project_s_sbom_passes_on_the_target_and_an_empty_one_does_not_apply() {
        let project = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/dependency_audit/rust");
        let target = project.display().to_string();
        let (result, items) = run(&target).await;
        assert!(result.unwrap().starts_with("CycloneDX SBOM of"));
        assert_eq!(
            crate::coverage::testing::statuses(&items),
            [(
                (GENERATED_RULE_ID.to_owned(), target),
                ("pass".to_owned(), String::new())
            )]
            .into()
        );
        let empty = tempfile::tempdir().unwrap();
        let target = empty.path().display().to_string();
        let (result, items) = run(&target).await;
        assert!(result.unwrap().starts_with("CycloneDX SBOM of 0 packages"));
        assert_eq!(
            crate::coverage::testing::statuses(&items),
            [(
                (GENERATED_RULE_ID.to_owned(), target),
                ("not_applicable".to_owned(), "no_lockfiles".to_owned())
            )]
            .into()
        );
    }

    fn package(ecosystem: Ecosystem, name: &str, version: &str) -> Package {
        Package {
            ecosystem,
            name: name.into(),
            version: version.into(),
        }
    }

    #[test]
    fn components_are_package_urls_once_each_in_order() {
        let packages = [
            package(Ecosystem::Npm, "@babel/core", "7.0.0"),
            package(Ecosystem::CratesIo, "serde", "1.0.1"),
            package(Ecosystem::CratesIo, "serde", "1.0.1"),
            package(Ecosystem::CratesIo, "anyhow", "1.0.0"),
        ];
        let (bytes, count) = document("/src", packages.iter());
        assert_eq!(count, 3);
        let document: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(document["bomFormat"], "CycloneDX");
        assert_eq!(document["specVersion"], "1.5");
        assert!(
            document["serialNumber"]
                .as_str()
                .unwrap()
                .starts_with("urn:uuid:")
        );
        let purls: Vec<&str> = document["components"]
            .as_array()
            .unwrap()
            .iter()
            .map(|component| component["purl"].as_str().unwrap())
            .collect();
        assert_eq!(
            purls,
            [
                "pkg:cargo/anyhow@1.0.0",
                "pkg:cargo/serde@1.0.1",
                "pkg:npm/%40babel/core@7.0.0"
            ]
        );
        assert_eq!(
            document["components"][0]["bom-ref"],
            "pkg:cargo/anyhow@1.0.0"
        );
        assert_eq!(document["metadata"]["component"]["name"], "/src");
    }
}
