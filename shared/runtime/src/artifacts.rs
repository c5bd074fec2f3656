//! What an artifact may be ([`ArtifactLimits`]) and where committed artifacts are kept
//! (`PALISADE_ARTIFACT_STORE`): the JetStream Object Store
//! bucket `<PREFIX>_ARTIFACTS` (`nats`, the default), or an S3-compatible bucket (`s3`), both
//! behind [`bus::artifacts::ArtifactStore`]. Ingestion writes it, the reaper removes from it,
//! `palisade artifact get` reads it: all three must be given the same settings. Workers never
//! see it, whichever it is: they upload over the bus either way.

use bus::artifacts::{ArtifactStore, ObjectStoreArtifacts};
use bus::{Bus, BusError};
use bytes::Bytes;
use futures::{Stream, StreamExt as _};
use object_store::ObjectStore as _;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::buffered::BufWriter;
use object_store::path::Path;

use crate::env::{self, SettingsError};

/// What an artifact may be and how long its upload session stays open (ingestion).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArtifactLimits {
    /// `PALISADE_ARTIFACT_BYTES_MAX`: the largest file a worker may commit. Ingestion streams
    /// a file being committed into the store: it never holds the whole of it.
    pub bytes_max: u64,
    /// `PALISADE_UPLOAD_TTL_MS`: a session not committed within this long expires, and the
    /// reaper removes what was sent.
    pub upload_ttl: std::time::Duration,
}

impl ArtifactLimits {
    pub const BYTES_MAX_DEFAULT: u64 = bus::artifacts::ARTIFACT_BYTES_MAX_DEFAULT;
    pub const UPLOAD_TTL_MS_DEFAULT: u64 = 15 * 60 * 1000;

    pub fn from_env() -> Result<Self, SettingsError> {
        let bytes_max = env::parse_in(
            "PALISADE_ARTIFACT_BYTES_MAX",
            Self::BYTES_MAX_DEFAULT,
            1..=1024 * 1024 * 1024,
        )?;
        let ttl_ms = env::parse_in(
            "PALISADE_UPLOAD_TTL_MS",
            Self::UPLOAD_TTL_MS_DEFAULT,
            1_000..=24 * 3600 * 1000,
        )?;
        Ok(Self {
            bytes_max,
            upload_ttl: std::time::Duration::from_millis(ttl_ms),
        })
    }
}

impl Default for ArtifactLimits {
    fn default() -> Self {
        Self {
            bytes_max: Self::BYTES_MAX_DEFAULT,
            upload_ttl: std::time::Duration::from_millis(Self::UPLOAD_TTL_MS_DEFAULT),
        }
    }
}

/// Which store keeps artifacts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ArtifactStoreSettings {
    /// The JetStream Object Store bucket `<PREFIX>_ARTIFACTS` on palisade's own NATS.
    #[default]
    Nats,
    /// An S3-compatible bucket.
    S3(S3Settings),
}

/// An S3-compatible bucket. Credentials and everything else the AWS SDKs read (`AWS_*`:
/// access key, secret, session token, web identity, region) come from the environment as
/// AWS's own tools read them; the `PALISADE_S3_*` settings override them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Settings {
    /// `PALISADE_S3_BUCKET` (required).
    pub bucket: String,
    /// `PALISADE_S3_PREFIX`: keys are `<prefix>/<upload id>` (empty: the upload id alone).
    pub prefix: String,
    /// `PALISADE_S3_ENDPOINT`: an S3-compatible server's URL (MinIO, Ceph, …); `http://` is
    /// allowed only here, for a server on a trusted network.
    pub endpoint: Option<String>,
    /// `PALISADE_S3_REGION` (default `us-east-1`, what most S3-compatible servers accept).
    pub region: String,
    /// `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY`, both or neither; neither: the rest of
    /// the AWS environment (a web identity token, the instance's role) says who palisade is.
    pub access_key: Option<S3AccessKey>,
}

/// A static S3 access key. `Debug` never shows the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct S3AccessKey {
    pub id: String,
    pub secret: String,
}

impl std::fmt::Debug for S3AccessKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3AccessKey")
            .field("id", &self.id)
            .field("secret", &"<redacted>")
            .finish()
    }
}

impl ArtifactStoreSettings {
    /// `PALISADE_ARTIFACT_STORE` (`nats` or `s3`) and, for `s3`, the `PALISADE_S3_*` settings.
    pub fn from_env() -> Result<Self, SettingsError> {
        Self::from_lookup(env::optional_string)
    }

    pub fn from_lookup(
        lookup: impl Fn(&'static str) -> Option<String>,
    ) -> Result<Self, SettingsError> {
        match lookup("PALISADE_ARTIFACT_STORE").as_deref() {
            None | Some("nats") => Ok(Self::Nats),
            Some("s3") => {
                let bucket = lookup("PALISADE_S3_BUCKET").ok_or(SettingsError::Missing {
                    name: "PALISADE_S3_BUCKET",
                    hint: "PALISADE_ARTIFACT_STORE=s3 needs the bucket's name",
                })?;
                let endpoint = lookup("PALISADE_S3_ENDPOINT");
                if let Some(endpoint) = &endpoint
                    && !(endpoint.starts_with("https://") || endpoint.starts_with("http://"))
                {
                    return Err(SettingsError::Invalid {
                        name: "PALISADE_S3_ENDPOINT",
                        value: endpoint.clone(),
                        reason: "give the server's URL, https://host[:port]".into(),
                    });
                }
                Ok(Self::S3(S3Settings {
                    bucket,
                    prefix: lookup("PALISADE_S3_PREFIX")
                        .unwrap_or_default()
                        .trim_matches('/')
                        .to_owned(),
                    endpoint,
                    region: lookup("PALISADE_S3_REGION").unwrap_or_else(|| "us-east-1".into()),
                    access_key: match (lookup("AWS_ACCESS_KEY_ID"), lookup("AWS_SECRET_ACCESS_KEY"))
                    {
                        (Some(id), Some(secret)) => Some(S3AccessKey { id, secret }),
                        (None, None) => None,
                        _ => {
                            return Err(SettingsError::Missing {
                                name: "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY",
                                hint: "give both, or neither (then the AWS environment's role is used)",
                            });
                        }
                    },
                }))
            }
            Some(other) => Err(SettingsError::Invalid {
                name: "PALISADE_ARTIFACT_STORE",
                value: other.to_owned(),
                reason: "use nats (the JetStream Object Store, the default) or s3".into(),
            }),
        }
    }
}

/// The store the settings name.
#[derive(Debug, Clone)]
pub enum Artifacts {
    /// Boxed: the object store's handle is large beside the S3 client's.
    Nats(Box<ObjectStoreArtifacts>),
    S3(S3Artifacts),
}

impl Artifacts {
    /// Opens the store `settings` names (the NATS bucket through `bus`).
    pub async fn open(bus: &Bus, settings: &ArtifactStoreSettings) -> Result<Self, BusError> {
        Ok(match settings {
            ArtifactStoreSettings::Nats => Self::Nats(Box::new(bus.artifacts().await?)),
            ArtifactStoreSettings::S3(s3) => Self::S3(S3Artifacts::new(s3)?),
        })
    }
}

impl ArtifactStore for Artifacts {
    async fn put_stream<P>(&self, key: &str, pieces: &mut P) -> Result<(), BusError>
    where
        P: Stream<Item = Result<Bytes, BusError>> + Unpin + Send,
    {
        match self {
            Self::Nats(store) => store.put_stream(key, pieces).await,
            Self::S3(store) => store.put_stream(key, pieces).await,
        }
    }

    async fn get(&self, key: &str) -> Result<Option<Bytes>, BusError> {
        match self {
            Self::Nats(store) => store.get(key).await,
            Self::S3(store) => store.get(key).await,
        }
    }

    async fn delete(&self, key: &str) -> Result<(), BusError> {
        match self {
            Self::Nats(store) => store.delete(key).await,
            Self::S3(store) => store.delete(key).await,
        }
    }
}

/// The size of a part of an S3 multipart upload, and the most of a file put in one request:
/// S3's smallest part (5 MiB; only the last part may be smaller).
pub const S3_PART_BYTES: usize = 5 * 1024 * 1024;

/// Parts of one S3 multipart upload uploading at once while the next part fills.
pub const S3_PARTS_IN_FLIGHT_MAX: usize = 2;

/// An S3-compatible bucket (`object_store`'s S3 client).
#[derive(Debug, Clone)]
pub struct S3Artifacts {
    store: std::sync::Arc<AmazonS3>,
    bucket: String,
    prefix: String,
}

impl S3Artifacts {
    pub fn new(settings: &S3Settings) -> Result<Self, BusError> {
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(&settings.bucket)
            .with_region(&settings.region);
        if let Some(key) = &settings.access_key {
            builder = builder
                .with_access_key_id(&key.id)
                .with_secret_access_key(&key.secret);
        }
        if let Some(endpoint) = &settings.endpoint {
            builder = builder
                .with_endpoint(endpoint)
                .with_allow_http(endpoint.starts_with("http://"))
                // S3-compatible servers address buckets by path, not by host name.
                .with_virtual_hosted_style_request(false);
        }
        let store = builder.build().map_err(|error| BusError::Artifacts {
            message: format!(
                "cannot use S3 bucket {:?}: {error}; check PALISADE_S3_* and the AWS_* credentials",
                settings.bucket
            ),
        })?;
        Ok(Self {
            store: std::sync::Arc::new(store),
            bucket: settings.bucket.clone(),
            prefix: settings.prefix.clone(),
        })
    }

    fn path(&self, key: &str) -> Path {
        if self.prefix.is_empty() {
            Path::from(key)
        } else {
            Path::from(format!("{}/{key}", self.prefix))
        }
    }

    fn error(&self, action: &str, key: &str, error: impl std::fmt::Display) -> BusError {
        BusError::Artifacts {
            message: format!(
                "{action} of {key:?} in S3 bucket {} failed: {error}",
                self.bucket
            ),
        }
    }
}

impl ArtifactStore for S3Artifacts {
    /// A file of less than [`S3_PART_BYTES`] is one `PutObject` of what was buffered; a larger
    /// one a multipart upload in parts of [`S3_PART_BYTES`], at most
    /// [`S3_PARTS_IN_FLIGHT_MAX`] of them uploading while the next fills: at most three parts
    /// in memory. A failed piece or part aborts the multipart upload (S3 drops its parts).
    async fn put_stream<P>(&self, key: &str, pieces: &mut P) -> Result<(), BusError>
    where
        P: Stream<Item = Result<Bytes, BusError>> + Unpin + Send,
    {
        use tokio::io::AsyncWriteExt as _;
        let store: std::sync::Arc<dyn object_store::ObjectStore> = self.store.clone();
        let mut writer = BufWriter::with_capacity(store, self.path(key), S3_PART_BYTES)
            .with_max_concurrency(S3_PARTS_IN_FLIGHT_MAX);
        let mut written = Ok(());
        while let Some(piece) = pieces.next().await {
            written = match piece {
                Ok(piece) => writer
                    .put(piece)
                    .await
                    .map_err(|error| self.error("put", key, error)),
                Err(error) => Err(error),
            };
            if written.is_err() {
                break;
            }
        }
        if let Err(error) = written {
            if let Err(abort) = writer.abort().await {
                tracing::warn!(key, error = %abort, "multipart upload not aborted; its parts stay in the bucket until it is (an AbortIncompleteMultipartUpload lifecycle rule does it)");
            }
            return Err(error);
        }
        writer
            .shutdown()
            .await
            .map_err(|error| self.error("put", key, error))
    }

    async fn get(&self, key: &str) -> Result<Option<Bytes>, BusError> {
        match self.store.get(&self.path(key)).await {
            Ok(result) => result
                .bytes()
                .await
                .map(Some)
                .map_err(|error| self.error("read", key, error)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(error) => Err(self.error("get", key, error)),
        }
    }

    async fn delete(&self, key: &str) -> Result<(), BusError> {
        match self.store.delete(&self.path(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(error) => Err(self.error("delete", key, error)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(vars: &[(&str, &str)]) -> Result<ArtifactStoreSettings, SettingsError> {
        ArtifactStoreSettings::from_lookup(|name| {
            vars.iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| (*value).to_owned())
        })
    }

    #[test]
    fn the_store_is_nats_unless_s3_is_named_with_its_bucket() {
        assert_eq!(settings(&[]).unwrap(), ArtifactStoreSettings::Nats);
        assert_eq!(
            settings(&[
                ("PALISADE_ARTIFACT_STORE", "s3"),
                ("PALISADE_S3_BUCKET", "evidence"),
                ("PALISADE_S3_PREFIX", "/palisade/"),
                ("PALISADE_S3_ENDPOINT", "http://minio:9000"),
            ])
            .unwrap(),
            ArtifactStoreSettings::S3(S3Settings {
                bucket: "evidence".into(),
                prefix: "palisade".into(),
                endpoint: Some("http://minio:9000".into()),
                region: "us-east-1".into(),
                access_key: None,
            })
        );
        let missing = settings(&[("PALISADE_ARTIFACT_STORE", "s3")]).unwrap_err();
        assert!(
            missing.to_string().contains("PALISADE_S3_BUCKET"),
            "{missing}"
        );
        let unknown = settings(&[("PALISADE_ARTIFACT_STORE", "gcs")]).unwrap_err();
        assert!(unknown.to_string().contains("nats"), "{unknown}");
        let endpoint = settings(&[
            ("PALISADE_ARTIFACT_STORE", "s3"),
            ("PALISADE_S3_BUCKET", "b"),
            ("PALISADE_S3_ENDPOINT", "minio:9000"),
        ])
        .unwrap_err();
        assert!(
            endpoint.to_string().contains("PALISADE_S3_ENDPOINT"),
            "{endpoint}"
        );
        let half = settings(&[
            ("PALISADE_ARTIFACT_STORE", "s3"),
            ("PALISADE_S3_BUCKET", "b"),
            ("AWS_ACCESS_KEY_ID", "AKIA"),
        ])
        .unwrap_err();
        assert!(half.to_string().contains("AWS_SECRET_ACCESS_KEY"), "{half}");
        let key = S3AccessKey {
            id: "AKIA".into(),
            secret: "very-secret".into(),
        };
        assert!(!format!("{key:?}").contains("very-secret"));
    }
}
