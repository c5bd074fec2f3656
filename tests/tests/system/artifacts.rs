//! Artifacts (issue 12, item 4): upload sessions fenced on the live lease, chunks on the
//! worker's own upload subject, size and sha256 verified at commit before the file is stored,
//! sessions expired and their leftovers removed by the reaper (a committed session's chunks
//! too, when ingestion stopped before purging them), downloads verified, and the
//! `sbom` plugin's CycloneDX document through the whole path.

use bus::artifacts::ArtifactStore as _;
use messages::{ErrorCode, v1};
use tests::{DEPENDENCY_AUDIT_DATA, LeasedScan, TestSystem};
use uuid::Uuid;

fn lease_ref(lease: &v1::Lease) -> v1::LeaseRef {
    lease.lease.clone().expect("lease ref")
}

fn code(reply: &v1::ArtifactReply) -> Option<ErrorCode> {
    reply.error.as_ref().and_then(v1::Error::error_code)
}

async fn status(system: &TestSystem, upload_id: Uuid) -> store::artifacts::Upload {
    store::artifacts::get(&system.pool, upload_id)
        .await
        .expect("read")
        .expect("a session")
}

/// Opens an upload session of a file named `name` under `scan`'s lease: its id and the
/// answer, which must be no refusal.
async fn open_upload(scan: &LeasedScan, name: &str) -> (Uuid, v1::ArtifactReply) {
    let upload_id = Uuid::new_v4();
    let reply = scan
        .worker
        .prepare_upload(&lease_ref(&scan.lease), upload_id, name)
        .await;
    assert!(reply.error.is_none(), "{reply:?}");
    (upload_id, reply)
}

/// Commits `upload_id` naming `data`'s own size and sha256, and `chunks`.
async fn commit_file(
    scan: &LeasedScan,
    upload_id: Uuid,
    data: &[u8],
    chunks: u32,
) -> v1::ArtifactReply {
    scan.worker
        .commit_upload(
            &lease_ref(&scan.lease),
            upload_id,
            data.len() as u64,
            &messages::sha256_hex(data),
            chunks,
        )
        .await
}

/// How many distinct chunks the uploads stream holds for the session.
async fn chunks_sent(system: &TestSystem, worker_id: Uuid, upload_id: Uuid) -> u32 {
    system
        .bus
        .index_upload(&worker_id.to_string(), &upload_id.to_string(), u64::MAX)
        .await
        .unwrap()
        .unwrap()
        .chunks()
}

/// Moves the session's expiry into the past, as if its time had passed.
async fn expire(system: &TestSystem, upload_id: Uuid) {
    sqlx::query(
        "UPDATE worker_artifact_uploads SET expires_at = now() - interval '1 second' WHERE id = $1",
    )
    .bind(upload_id)
    .execute(&system.pool)
    .await
    .unwrap();
}

/// A file of `len` bytes that is not all the same byte.
fn file(len: usize) -> Vec<u8> {
    (0..len).map(|at| (at * 31 % 251) as u8).collect()
}

#[tokio::test]
async fn a_verified_upload_is_committed_once_and_downloads_intact() {
    let system = TestSystem::spawn().await;
    let scan = system.leased_scan(&["alpha"]).await;
    let lease = lease_ref(&scan.lease);
    let (upload_id, prepared) = open_upload(&scan, "report.json").await;
    assert_eq!(prepared.status, "prepared");
    assert_eq!(
        prepared.chunk_subject,
        system
            .subjects
            .upload(&scan.worker.id.to_string(), &upload_id.to_string())
    );
    assert!(prepared.expires_in_ms > 0);
    // A lost reply: preparing again answers the same session.
    let again = scan
        .worker
        .prepare_upload(&lease, upload_id, "report.json")
        .await;
    assert_eq!(again.chunk_subject, prepared.chunk_subject);

    let data = file(700 * 1024);
    let chunks = scan
        .worker
        .send_chunks(&prepared.chunk_subject, upload_id, &data, 256 * 1024)
        .await;
    assert_eq!(chunks, 3);
    // A chunk resent after its PubAck was lost (a new message id): kept once.
    scan.worker
        .send_chunks(
            &prepared.chunk_subject,
            upload_id,
            &data[..256 * 1024],
            256 * 1024,
        )
        .await;
    let sha256 = messages::sha256_hex(&data);
    let committed = commit_file(&scan, upload_id, &data, chunks).await;
    assert!(committed.error.is_none(), "{committed:?}");
    assert_eq!(
        (
            committed.status.as_str(),
            committed.size_bytes,
            committed.sha256.as_str()
        ),
        ("committed", data.len() as u64, sha256.as_str())
    );
    // A resent commit answers the same.
    let resent = commit_file(&scan, upload_id, &data, chunks).await;
    assert_eq!(resent, committed);

    let session = status(&system, upload_id).await;
    assert_eq!(session.status, "committed");
    assert_eq!(session.chunks, Some(3));
    assert!(
        session.removed_at.is_some(),
        "ingestion purged the chunks and recorded it"
    );
    let scan_id: Uuid = scan.scan_id.parse().unwrap();
    let listed = palisade::commands::list_artifacts(&system.pool, scan_id)
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].original_name, "report.json");
    let store = system.bus.artifacts().await.unwrap();
    let (_, bytes) = palisade::commands::get_artifact(&system.pool, &store, upload_id)
        .await
        .unwrap();
    assert_eq!(bytes.as_ref(), data.as_slice());
    // The chunks were purged once committed.
    assert_eq!(chunks_sent(&system, scan.worker.id, upload_id).await, 0);

    // A stored object that no longer matches its record is refused on download.
    store
        .put(&session.object_key, bytes::Bytes::from_static(b"tampered"))
        .await
        .unwrap();
    let error = palisade::commands::get_artifact(&system.pool, &store, upload_id)
        .await
        .unwrap_err();
    assert!(error.to_string().contains("does not match"), "{error:#}");
    system.finish().await;
}

#[tokio::test]
async fn a_wrong_digest_size_or_chunk_count_is_refused_at_commit_and_fails_the_session() {
    let system = TestSystem::spawn().await;
    let scan = system.leased_scan(&["alpha"]).await;
    let lease = lease_ref(&scan.lease);
    let data = file(10_000);
    let sha256 = messages::sha256_hex(&data);
    let store = system.bus.artifacts().await.unwrap();
    let cases: [(&str, u64, String, u32); 3] = [
        (
            "digest",
            data.len() as u64,
            messages::sha256_hex(b"other"),
            3,
        ),
        ("size", data.len() as u64 - 1, sha256.clone(), 3),
        ("chunks", data.len() as u64, sha256.clone(), 4),
    ];
    for (what, size, digest, chunks) in cases {
        let (upload_id, prepared) = open_upload(&scan, "f").await;
        let sent = scan
            .worker
            .send_chunks(&prepared.chunk_subject, upload_id, &data, 4_000)
            .await;
        assert_eq!(sent, 3);
        let reply = scan
            .worker
            .commit_upload(&lease, upload_id, size, &digest, chunks)
            .await;
        assert_eq!(
            code(&reply),
            Some(ErrorCode::ChecksumMismatch),
            "{what}: {reply:?}"
        );
        let session = status(&system, upload_id).await;
        assert_eq!(session.status, "failed", "{what}");
        assert!(!session.error.is_empty(), "{what}");
        assert!(
            store.get(&session.object_key).await.unwrap().is_none(),
            "{what}"
        );
        // Committing again, even with the right claims, does not revive it.
        let again = commit_file(&scan, upload_id, &data, 3).await;
        assert_eq!(code(&again), Some(ErrorCode::NotFound), "{what}: {again:?}");
    }
    // A size over the limit is refused before anything is read.
    let too_large = scan
        .worker
        .commit_upload(
            &lease,
            Uuid::new_v4(),
            runtime::ArtifactLimits::BYTES_MAX_DEFAULT + 1,
            &sha256,
            1,
        )
        .await;
    assert_eq!(code(&too_large), Some(ErrorCode::TooLarge));
    let scan_id: Uuid = scan.scan_id.parse().unwrap();
    assert!(
        palisade::commands::list_artifacts(&system.pool, scan_id)
            .await
            .unwrap()
            .is_empty()
    );
    // The reaper removes what the failed sessions left.
    let outcome = system.reaper().run_once().await.unwrap();
    assert_eq!(outcome.uploads_removed, 3, "{outcome:?}");
    system.finish().await;
}

#[tokio::test]
async fn a_worker_without_a_live_lease_cannot_open_or_commit_a_session() {
    let system = TestSystem::spawn().await;
    let scan = system.leased_scan(&["alpha"]).await;
    let lease = lease_ref(&scan.lease);

    let mut forged = lease.clone();
    forged.lease_token = "not-the-token".into();
    let reply = scan
        .worker
        .prepare_upload(&forged, Uuid::new_v4(), "f")
        .await;
    assert_eq!(code(&reply), Some(ErrorCode::LeaseLost), "{reply:?}");

    // Prepared while live; the lease then expires and the task is leased again.
    let (upload_id, prepared) = open_upload(&scan, "f").await;
    let data = file(1_000);
    let chunks = scan
        .worker
        .send_chunks(&prepared.chunk_subject, upload_id, &data, 1_000)
        .await;
    system.expire_and_recover(&scan.lease).await;
    let stale = scan
        .worker
        .prepare_upload(&lease, Uuid::new_v4(), "g")
        .await;
    assert_eq!(code(&stale), Some(ErrorCode::LeaseLost), "{stale:?}");
    let commit = commit_file(&scan, upload_id, &data, chunks).await;
    assert_eq!(code(&commit), Some(ErrorCode::LeaseLost), "{commit:?}");
    let count: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM worker_artifact_uploads WHERE status = 'committed'",
    )
    .fetch_one(&system.pool)
    .await
    .unwrap();
    assert_eq!(count, 0);
    system.finish().await;
}

#[tokio::test]
async fn an_expired_session_is_expired_by_the_reaper_and_what_it_left_is_removed() {
    let system = TestSystem::spawn().await;
    let scan = system.leased_scan(&["alpha"]).await;
    let (upload_id, prepared) = open_upload(&scan, "f").await;
    let data = file(5_000);
    scan.worker
        .send_chunks(&prepared.chunk_subject, upload_id, &data, 2_000)
        .await;
    // As if ingestion had stored the file and then lost the lease before the commit: an
    // object under the session's key.
    let session = status(&system, upload_id).await;
    let store = system.bus.artifacts().await.unwrap();
    store
        .put(&session.object_key, bytes::Bytes::from(data.clone()))
        .await
        .unwrap();
    expire(&system, upload_id).await;

    let outcome = system.reaper().run_once().await.unwrap();
    assert_eq!(
        (outcome.uploads_expired, outcome.uploads_removed),
        (1, 1),
        "{outcome:?}"
    );
    let session = status(&system, upload_id).await;
    assert_eq!(session.status, "expired");
    assert!(session.removed_at.is_some());
    assert!(store.get(&session.object_key).await.unwrap().is_none());
    assert_eq!(
        chunks_sent(&system, scan.worker.id, upload_id).await,
        0,
        "the chunks are purged"
    );
    // Nothing left to do at the next sweep; a commit of the expired session is refused.
    let outcome = system.reaper().run_once().await.unwrap();
    assert_eq!((outcome.uploads_expired, outcome.uploads_removed), (0, 0));
    let commit = commit_file(&scan, upload_id, &data, 3).await;
    assert_eq!(code(&commit), Some(ErrorCode::NotFound), "{commit:?}");
    system.finish().await;
}

#[tokio::test]
async fn a_worker_cannot_publish_chunks_on_another_workers_upload_subject() {
    let system = TestSystem::spawn().await;
    let scan = system.leased_scan(&["alpha"]).await;
    let (upload_id, prepared) = open_upload(&scan, "f").await;
    // Another worker of the same organization publishes into this session's subject: its
    // credentials do not allow it, so no PubAck comes and nothing reaches the stream.
    let intruder = system.manual_worker(scan.organization_id, 1).await;
    let intruder_bus = system.worker_bus(intruder.id).await;
    let chunk = v1::ArtifactChunk {
        upload_id: upload_id.to_string(),
        index: 0,
        data: b"not yours".to_vec(),
    };
    let published = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        intruder_bus.publish_durable(
            prepared.chunk_subject.clone(),
            "intruder:0",
            Default::default(),
            prost::Message::encode_to_vec(&chunk).into(),
        ),
    )
    .await;
    if system.nats.authority.is_some() {
        assert!(
            !matches!(published, Ok(Ok(_))),
            "a PubAck came for another worker's upload subject"
        );
        assert_eq!(chunks_sent(&system, scan.worker.id, upload_id).await, 0);
    }
    system.finish().await;
}

#[tokio::test]
async fn the_sbom_plugin_uploads_a_cyclonedx_document_that_downloads_and_verifies() {
    let system = TestSystem::spawn().await;
    let organization = system.organization().await;
    system.reference_worker(organization, 2).await;
    let lockfile = std::fs::canonicalize(format!("{DEPENDENCY_AUDIT_DATA}/rust/Cargo.lock"))
        .expect("the test lockfile");
    let reply = system
        .submit(&system.request(organization, &lockfile.display().to_string(), &["sbom"]))
        .await;
    assert!(reply.error.is_none(), "{reply:?}");
    system.wait_scan_state(&reply.scan_id, "completed").await;
    let scan_id: Uuid = reply.scan_id.parse().unwrap();
    let artifacts = palisade::commands::list_artifacts(&system.pool, scan_id)
        .await
        .unwrap();
    assert_eq!(artifacts.len(), 1, "{artifacts:?}");
    let artifact = &artifacts[0];
    assert_eq!(
        artifact.original_name,
        reference_worker::sbom::ARTIFACT_NAME
    );
    assert_eq!(artifact.content_type, reference_worker::sbom::CONTENT_TYPE);
    let store = system.bus.artifacts().await.unwrap();
    let (_, bytes) = palisade::commands::get_artifact(&system.pool, &store, artifact.id)
        .await
        .unwrap();
    let document: serde_json::Value = serde_json::from_slice(&bytes).expect("JSON");
    assert_eq!(document["bomFormat"], "CycloneDX");
    let purls: Vec<&str> = document["components"]
        .as_array()
        .expect("components")
        .iter()
        .filter_map(|component| component["purl"].as_str())
        .collect();
    assert!(!purls.is_empty());
    assert!(
        purls.iter().all(|purl| purl.starts_with("pkg:cargo/")),
        "{purls:?}"
    );
    // The asset names the artifact.
    let assets: Vec<String> =
        sqlx::query_scalar("SELECT a.value FROM assets a JOIN scan_assets s ON s.asset_id = a.id WHERE s.scan_id = $1 AND a.kind = 'sbom'")
            .bind(scan_id)
            .fetch_all(&system.pool)
            .await
            .unwrap();
    assert_eq!(assets.len(), 1, "{assets:?}");
    assert!(assets[0].contains(&artifact.id.to_string()), "{assets:?}");
    system.finish().await;
}

#[tokio::test]
async fn an_s3_compatible_store_keeps_verified_artifacts_and_loses_expired_ones() {
    let s3 = tests::servers::S3Server::start("palisade-artifacts").await;
    let settings = s3.settings();
    let system = TestSystem::spawn_with(|system| {
        system.ingestion.common.artifact_store = settings.clone();
        system.reaper.common.artifact_store = settings.clone();
        system.common.artifact_store = settings.clone();
    })
    .await;
    let store = runtime::artifacts::Artifacts::open(&system.bus, &settings)
        .await
        .unwrap();
    assert!(matches!(store, runtime::artifacts::Artifacts::S3(_)));
    let scan = system.leased_scan(&["alpha"]).await;

    // Committed: in the bucket, downloaded intact, and nothing in the NATS bucket.
    let (upload_id, prepared) = open_upload(&scan, "a.json").await;
    let data = file(300 * 1024);
    let chunks = scan
        .worker
        .send_chunks(&prepared.chunk_subject, upload_id, &data, 256 * 1024)
        .await;
    let committed = commit_file(&scan, upload_id, &data, chunks).await;
    assert!(committed.error.is_none(), "{committed:?}");
    let (_, bytes) = palisade::commands::get_artifact(&system.pool, &store, upload_id)
        .await
        .unwrap();
    assert_eq!(bytes.as_ref(), data.as_slice());
    let key = status(&system, upload_id).await.object_key;
    let nats = system.bus.artifacts().await.unwrap();
    assert!(nats.get(&key).await.unwrap().is_none());

    // Larger than a part: streamed as a multipart upload, in parts of 5 MiB.
    let (large_id, prepared) = open_upload(&scan, "large.json").await;
    let large = file(2 * runtime::artifacts::S3_PART_BYTES + 300 * 1024);
    let chunks = scan
        .worker
        .send_chunks(&prepared.chunk_subject, large_id, &large, 256 * 1024)
        .await;
    let committed = commit_file(&scan, large_id, &large, chunks).await;
    assert!(committed.error.is_none(), "{committed:?}");
    let (_, bytes) = palisade::commands::get_artifact(&system.pool, &store, large_id)
        .await
        .unwrap();
    assert!(
        bytes.as_ref() == large.as_slice(),
        "the parts make the file"
    );

    // Expired after an object was stored: the reaper removes it from the bucket.
    let (stale_id, _) = open_upload(&scan, "b.json").await;
    let stale_key = status(&system, stale_id).await.object_key;
    store
        .put(&stale_key, bytes::Bytes::from_static(b"left behind"))
        .await
        .unwrap();
    expire(&system, stale_id).await;
    let outcome = system.reaper().run_once().await.unwrap();
    assert_eq!(
        (outcome.uploads_expired, outcome.uploads_removed),
        (1, 1),
        "{outcome:?}"
    );
    assert!(store.get(&stale_key).await.unwrap().is_none());
    assert!(
        store.get(&key).await.unwrap().is_some(),
        "the committed one stays"
    );
    system.finish().await;
}

#[tokio::test]
async fn chunks_a_crash_left_after_a_commit_are_purged_by_the_reaper_and_the_artifact_kept() {
    let system = TestSystem::spawn().await;
    let scan = system.leased_scan(&["alpha"]).await;
    let lease = lease_ref(&scan.lease);
    let (upload_id, prepared) = open_upload(&scan, "report.json").await;
    let data = file(40_000);
    let chunks = scan
        .worker
        .send_chunks(&prepared.chunk_subject, upload_id, &data, 16_000)
        .await;
    assert_eq!(chunks, 3);
    // Ingestion's commit up to its purge, then a crash: the session committed and its object
    // stored, its chunks still on the uploads stream.
    let claim = store::LeaseClaim::from_wire(scan.worker.id, Some(&lease)).unwrap();
    let sha256 = messages::sha256_hex(&data);
    let verified = store::artifacts::Verified {
        size_bytes: data.len() as u64,
        sha256: &sha256,
        chunks,
    };
    store::artifacts::mark_uploaded(&system.pool, &claim, upload_id, &verified)
        .await
        .unwrap()
        .unwrap();
    let key = status(&system, upload_id).await.object_key;
    let store = system.bus.artifacts().await.unwrap();
    store
        .put(&key, bytes::Bytes::from(data.clone()))
        .await
        .unwrap();
    store::artifacts::commit(&system.pool, &claim, upload_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(chunks_sent(&system, scan.worker.id, upload_id).await, 3);

    // Past the grace ingestion has to purge them itself, the reaper does.
    sqlx::query(
        "UPDATE worker_artifact_uploads SET committed_at = now() - interval '10 minutes' WHERE id = $1",
    )
    .bind(upload_id)
    .execute(&system.pool)
    .await
    .unwrap();
    let outcome = system.reaper().run_once().await.unwrap();
    assert_eq!(outcome.uploads_removed, 1, "{outcome:?}");
    assert_eq!(
        chunks_sent(&system, scan.worker.id, upload_id).await,
        0,
        "the committed session's chunks are purged"
    );
    let session = status(&system, upload_id).await;
    assert_eq!(session.status, "committed");
    assert!(session.removed_at.is_some());
    // The object is the artifact: kept, and it downloads intact.
    let (_, bytes) = palisade::commands::get_artifact(&system.pool, &store, upload_id)
        .await
        .unwrap();
    assert_eq!(bytes.as_ref(), data.as_slice());
    let outcome = system.reaper().run_once().await.unwrap();
    assert_eq!(outcome.uploads_removed, 0, "{outcome:?}");
    system.finish().await;
}

/// The test-service binary (one service as a process of its own), built by cargo with this test.
const SERVICE: &str = env!("CARGO_BIN_EXE_test-service");

/// A `/proc/<pid>/status` field in bytes (`VmRSS`, `VmHWM`: the resident set and its peak).
fn resident_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("a live process");
    let kilobytes: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|value| value.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"));
    kilobytes * 1024
}

#[tokio::test]
async fn a_commit_holds_a_few_chunks_of_the_file_in_memory_never_the_whole_file() {
    const FILE_BYTES: usize = 128 * 1024 * 1024;
    const WARM_UP_BYTES: usize = 8 * 1024 * 1024;
    const CHUNK_BYTES: usize = bus::artifacts::CHUNK_BYTES_MAX as usize;
    let system = TestSystem::spawn().await;
    // Ingestion as a process of its own, whose peak resident set the kernel measures.
    system.stop(tests::Component::Ingestion).await;
    let http_port = tests::servers::free_port();
    let mut ingestion = tokio::process::Command::new(SERVICE)
        .arg("ingestion")
        .env("DATABASE_URL", &system.settings.common.database.url)
        .envs(
            system
                .nats
                .child_env(&messages::Identity::Service(messages::Service::Ingestion))
                .await,
        )
        .env("PALISADE_SUBJECT_PREFIX", system.subjects.prefix())
        .env("PALISADE_HTTP_ADDR", format!("127.0.0.1:{http_port}"))
        .env("PALISADE_ARTIFACT_BYTES_MAX", FILE_BYTES.to_string())
        .kill_on_drop(true)
        .spawn()
        .expect("test-service ingestion starts");
    let pid = ingestion.id().expect("running");
    let readyz = format!("http://127.0.0.1:{http_port}/readyz");
    system
        .wait_for("the ingestion process to be ready", || async {
            let answer = reqwest::get(&readyz).await.ok()?;
            answer.status().is_success().then_some(())
        })
        .await;
    let scan = system.leased_scan(&["alpha"]).await;
    let send = async |data: &[u8]| {
        let (upload_id, prepared) = open_upload(&scan, "large.bin").await;
        let chunks = scan
            .worker
            .send_chunks(&prepared.chunk_subject, upload_id, data, CHUNK_BYTES)
            .await;
        (upload_id, chunks)
    };
    // The first commit of a process grows its resident set by some 30 MiB whatever the file's
    // size (measured: as much for a file of 10 MiB as for one of 40; the allocator and the
    // NATS client warming up). So a small commit first, and a file large enough that holding
    // it (twice, as commits once did) is told from what is left without doubt: this commit
    // grew it by 2 to 8 MiB.
    let warm_up = file(WARM_UP_BYTES);
    let (upload_id, chunks) = send(&warm_up).await;
    let committed = commit_file(&scan, upload_id, &warm_up, chunks).await;
    assert!(committed.error.is_none(), "{committed:?}");
    let data = file(FILE_BYTES);
    let (upload_id, chunks) = send(&data).await;
    assert_eq!(chunks as usize, FILE_BYTES / CHUNK_BYTES);

    // The peak resident set from now on (writing 5 to clear_refs resets it to the current one).
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("the peak is reset");
    let resident = resident_bytes(pid, "VmRSS");
    let committed = commit_file(&scan, upload_id, &data, chunks).await;
    assert!(committed.error.is_none(), "{committed:?}");
    let grown = resident_bytes(pid, "VmHWM").saturating_sub(resident);
    eprintln!(
        "the commit of a {} MiB file grew ingestion's peak resident set by {:.1} MiB",
        FILE_BYTES >> 20,
        grown as f64 / (1024.0 * 1024.0)
    );
    assert!(
        grown < (FILE_BYTES / 4) as u64,
        "the commit grew ingestion's resident set by {grown} bytes for a file of {FILE_BYTES}"
    );
    let store = system.bus.artifacts().await.unwrap();
    let (_, bytes) = palisade::commands::get_artifact(&system.pool, &store, upload_id)
        .await
        .unwrap();
    assert!(bytes.as_ref() == data.as_slice(), "the object is the file");
    ingestion.kill().await.expect("killed");
    system.finish().await;
}

/// An artifact store that records the length of every piece a put is given, then stores it
/// in the NATS bucket.
struct PieceRecorder {
    inner: bus::artifacts::ObjectStoreArtifacts,
    pieces: std::sync::Mutex<Vec<usize>>,
}

impl bus::artifacts::ArtifactStore for PieceRecorder {
    async fn put_stream<P>(&self, key: &str, pieces: &mut P) -> Result<(), bus::BusError>
    where
        P: futures::Stream<Item = Result<bytes::Bytes, bus::BusError>> + Unpin + Send,
    {
        use futures::TryStreamExt as _;
        let mut recorded = pieces.inspect_ok(|piece| self.pieces.lock().unwrap().push(piece.len()));
        self.inner.put_stream(key, &mut recorded).await
    }

    async fn get(&self, key: &str) -> Result<Option<bytes::Bytes>, bus::BusError> {
        self.inner.get(key).await
    }

    async fn delete(&self, key: &str) -> Result<(), bus::BusError> {
        self.inner.delete(key).await
    }
}

/// Publishes chunk `index` of `data` (chunks of `chunk_bytes`) as the worker would, on its
/// upload subject.
async fn send_chunk(
    worker_bus: &bus::Bus,
    subject: &str,
    upload_id: Uuid,
    data: &[u8],
    chunk_bytes: usize,
    index: u32,
) {
    let start = index as usize * chunk_bytes;
    let chunk = v1::ArtifactChunk {
        upload_id: upload_id.to_string(),
        index,
        data: data[start..(start + chunk_bytes).min(data.len())].to_vec(),
    };
    worker_bus
        .publish_durable(
            subject.to_owned(),
            &format!("{upload_id}:{index}"),
            Default::default(),
            prost::Message::encode_to_vec(&chunk).into(),
        )
        .await
        .expect("chunk stored");
}

/// Stores a copy of chunk `index` on the session's stored subject under a message id of its
/// own, as a resend after JetStream's duplicate window would be stored.
async fn store_copy(
    system: &TestSystem,
    worker_id: Uuid,
    upload_id: Uuid,
    chunk: v1::ArtifactChunk,
) {
    system
        .bus
        .publish_durable(
            system
                .subjects
                .upload_stored(&worker_id.to_string(), &upload_id.to_string()),
            &format!("late-{upload_id}:{}:{}", chunk.index, Uuid::new_v4()),
            Default::default(),
            prost::Message::encode_to_vec(&chunk).into(),
        )
        .await
        .expect("copy stored");
}

#[tokio::test]
async fn a_commit_streams_chunks_sent_out_of_order_and_twice_into_the_store_one_chunk_at_a_time() {
    const CHUNK_BYTES: usize = bus::artifacts::CHUNK_BYTES_MAX as usize;
    let system = TestSystem::spawn().await;
    let scan = system.leased_scan(&["alpha"]).await;
    let lease = lease_ref(&scan.lease);
    let worker_bus = system.worker_bus(scan.worker.id).await;
    let recorder = PieceRecorder {
        inner: system.bus.artifacts().await.unwrap(),
        pieces: Default::default(),
    };
    let ingestion = ingestion::artifacts::Artifacts {
        pool: system.pool.clone(),
        bus: system.bus.clone(),
        store: recorder,
        limits: runtime::ArtifactLimits::default(),
    };
    let artifact_subject = system
        .subjects
        .worker(&scan.worker.id.to_string(), messages::WorkerVerb::Artifact);
    let commit = |upload_id: Uuid, data: &[u8], chunks: u32| {
        prost::Message::encode_to_vec(&v1::ArtifactRequest {
            schema_version: messages::SCHEMA_VERSION,
            worker_id: scan.worker.id.to_string(),
            lease: Some(lease.clone()),
            step: Some(v1::artifact_request::Step::Commit(v1::CommitUpload {
                upload_id: upload_id.to_string(),
                size_bytes: data.len() as u64,
                sha256: messages::sha256_hex(data),
                chunks,
            })),
        })
    };

    // Five chunks, the last a short one, stored in the order 3, 0, 4, 1, 2; chunks 1 and 3
    // stored twice more, as resends after the duplicate window.
    let (upload_id, prepared) = open_upload(&scan, "out-of-order.bin").await;
    let data = file(4 * CHUNK_BYTES + 1_000);
    for index in [3, 0, 4, 1, 2] {
        send_chunk(
            &worker_bus,
            &prepared.chunk_subject,
            upload_id,
            &data,
            CHUNK_BYTES,
            index,
        )
        .await;
    }
    for index in [1_u32, 3] {
        let start = index as usize * CHUNK_BYTES;
        let copy = v1::ArtifactChunk {
            upload_id: upload_id.to_string(),
            index,
            data: data[start..start + CHUNK_BYTES].to_vec(),
        };
        store_copy(&system, scan.worker.id, upload_id, copy).await;
    }
    let reply = ingestion
        .reply(&artifact_subject, &commit(upload_id, &data, 5))
        .await;
    assert!(reply.error.is_none(), "{reply:?}");
    assert_eq!(reply.status, "committed");
    let pieces = ingestion.store.pieces.lock().unwrap().clone();
    assert!(
        pieces.iter().all(|len| *len <= CHUNK_BYTES),
        "the store was given the file in pieces of at most a chunk, not {pieces:?}"
    );
    assert_eq!(
        pieces,
        [CHUNK_BYTES, CHUNK_BYTES, CHUNK_BYTES, CHUNK_BYTES, 1_000],
        "one piece a chunk, each once"
    );
    let (_, bytes) = palisade::commands::get_artifact(&system.pool, &ingestion.store, upload_id)
        .await
        .unwrap();
    assert!(
        bytes.as_ref() == data.as_slice(),
        "the object is the file, in order"
    );
    assert_eq!(chunks_sent(&system, scan.worker.id, upload_id).await, 0);

    // A copy of a chunk with other contents fails the session before anything is stored.
    let (conflicted_id, prepared) = open_upload(&scan, "conflict.bin").await;
    let data = file(2 * CHUNK_BYTES);
    for index in [1, 0] {
        send_chunk(
            &worker_bus,
            &prepared.chunk_subject,
            conflicted_id,
            &data,
            CHUNK_BYTES,
            index,
        )
        .await;
    }
    let other = v1::ArtifactChunk {
        upload_id: conflicted_id.to_string(),
        index: 0,
        data: vec![7; CHUNK_BYTES],
    };
    store_copy(&system, scan.worker.id, conflicted_id, other).await;
    ingestion.store.pieces.lock().unwrap().clear();
    let reply = ingestion
        .reply(&artifact_subject, &commit(conflicted_id, &data, 2))
        .await;
    assert_eq!(code(&reply), Some(ErrorCode::ChecksumMismatch), "{reply:?}");
    let session = status(&system, conflicted_id).await;
    assert_eq!(session.status, "failed");
    assert!(session.error.contains("chunk 0"), "{}", session.error);
    assert!(ingestion.store.pieces.lock().unwrap().is_empty());
    system.finish().await;
}
