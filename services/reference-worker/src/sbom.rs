//! `sbom`: a software bill of materials of the registry packages a project's lockfiles pin, as
//! a CycloneDX 1.5 JSON document uploaded as an artifact of the task (the upload path of
//! `docs/protocol/worker.md`, "Artifacts"). The target is what `dependency_audit` takes: a
//! lockfile (`Cargo.lock`, `package-lock.json`, `npm-shrinkwrap.json`) or a directory searched
//! for them, read by the same code. It reports no findings: one `sbom` asset names the
//! artifact, and the summary counts what it lists.
//!
//! Each package is one component: `type` `library`, its name and version, and its package URL
//! (`pkg:cargo/<name>@<version>`, `pkg:npm/<name>@<version>` with a scope's `@` written `%40`),
//! which is also its `bom-ref`. Components are listed once each, in package-URL order, so two
//! runs over the same lockfiles list the same components.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use worker::{BoxFuture, Plugin, PluginError, ResultSink, TaskInput, v1};

use crate::dependency_audit::{self, lockfile::Ecosystem, lockfile::Package};

/// The artifact's file name.
pub const ARTIFACT_NAME: &str = "sbom.cdx.json";
/// CycloneDX's registered media type for its JSON form.
pub const CONTENT_TYPE: &str = "application/vnd.cyclonedx+json";
/// The asset kind that names the artifact.
pub const ASSET_KIND: &str = "sbom";

pub struct Sbom;

impl Plugin for Sbom {
    fn name(&self) -> &'static str {
        "sbom"
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
    use super::*;

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
