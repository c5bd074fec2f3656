//! Redaction before anything is stored (issue 12, item 3): every text of the redaction corpus
//! (`shared/store/testdata/redaction_corpus.tsv`) goes through the real ingestion path in
//! every field a worker fills (a finding's resource, discriminator, title, description and
//! evidence, an asset's value, a completion summary, a failure message, an artifact's name),
//! and no secret is then found in any table of PostgreSQL, in any event, or in any log line at `debug`; the
//! look-alikes arrive unchanged.

use messages::{WorkerVerb, v1};
use prost::Message as _;
use tests::TestSystem;
use uuid::Uuid;

use super::disclosure::capture_logs;

/// Every row of every table, as text.
async fn database_text(system: &TestSystem) -> String {
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT tablename::text FROM pg_tables WHERE schemaname = current_schema()",
    )
    .fetch_all(&system.pool)
    .await
    .unwrap();
    let mut text = String::new();
    for table in tables {
        let rows: Option<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT string_agg(to_jsonb(t)::text, E'\\n') FROM \"{table}\" t"
        )))
        .fetch_one(&system.pool)
        .await
        .unwrap();
        text.push_str(&rows.unwrap_or_default());
        text.push('\n');
    }
    text
}

/// Every event written, published or not, its payload as (lossy) text: protobuf keeps strings
/// as UTF-8.
async fn events_text(system: &TestSystem) -> String {
    tests::written_events(system)
        .await
        .iter()
        .map(|event| String::from_utf8_lossy(&event.payload).into_owned())
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_corpus_secret_reaches_postgresql_the_events_or_the_logs() {
    let (logs, _telemetry) = capture_logs("debug", None);
    let system = TestSystem::spawn().await;
    let (secrets, keep) = store::evidence::redaction_corpus();
    let texts: Vec<&str> = secrets
        .iter()
        .map(|(_, text)| text.as_str())
        .chain(keep.iter().map(String::as_str))
        .collect();

    // A scan whose one task reports every text in every finding field and as an asset, and
    // completes with all of them as its summary.
    let scan = system.leased_scan(&["alpha"]).await;
    let payload = v1::BatchPayload {
        findings: texts
            .iter()
            .enumerate()
            .map(|(index, text)| v1::Finding {
                rule_id: format!("rule-{index}"),
                resource: (*text).into(),
                discriminator: (*text).into(),
                severity: "low".into(),
                title: (*text).into(),
                description: (*text).into(),
                evidence: (*text).into(),
                ..Default::default()
            })
            .collect(),
        assets: texts
            .iter()
            .map(|text| v1::Asset {
                kind: "http_service".into(),
                value: (*text).into(),
            })
            .collect(),
        evaluations: texts
            .iter()
            .enumerate()
            .map(|(index, text)| {
                v1::Evaluation::error(&format!("rule-{index}"), text, "timeout")
                    .with_evidence(*text)
            })
            .collect(),
    };
    let batch = scan.worker.batch(&scan.lease, 0, &payload);
    let ack = scan.worker.send_batch(&batch).await;
    assert!(ack.error.is_none(), "{ack:?}");
    // Every text as an artifact's name: stored redacted, or refused (not a file name).
    let lease = scan.lease.lease.clone().unwrap();
    for text in &texts {
        let reply = scan
            .worker
            .prepare_upload(&lease, Uuid::new_v4(), text)
            .await;
        if let Some(error) = &reply.error {
            assert_eq!(error.code, "invalid_field", "{text:?}: {error:?}");
        }
    }
    let mut completion = scan.worker.completion(&scan.lease, 1);
    completion.summary = texts.join("\n");
    scan.worker
        .publish_raw(WorkerVerb::Complete, completion.encode_to_vec())
        .await;
    let ack = scan.worker.next_ack().await;
    assert!(ack.error.is_none(), "{ack:?}");
    system.wait_scan_state(&scan.scan_id, "completed").await;

    // A second scan's task fails for good with all of them as its message.
    let reply = system
        .submit(&system.request(scan.organization_id, "http://other.test", &["alpha"]))
        .await;
    assert!(reply.error.is_none(), "{reply:?}");
    let lease = scan.worker.acquire_one().await;
    let mut failure = scan.worker.failure(&lease, "plugin_failed", false);
    failure.error.as_mut().unwrap().message = texts.join("\n");
    scan.worker
        .publish_raw(WorkerVerb::Fail, failure.encode_to_vec())
        .await;
    let ack = scan.worker.next_ack().await;
    assert!(ack.error.is_none(), "{ack:?}");
    system.wait_scan_state(&reply.scan_id, "failed").await;
    system.wait_outbox_drained().await;

    let database = database_text(&system).await;
    let events = events_text(&system).await;
    let logged = logs.text();
    assert!(database.contains("[REDACTED]") && events.contains("[REDACTED]"));
    for (secret, _) in &secrets {
        assert!(
            !database.contains(secret.as_str()),
            "{secret:?} is in PostgreSQL"
        );
        assert!(
            !events.contains(secret.as_str()),
            "{secret:?} is in an event"
        );
        assert!(!logged.contains(secret.as_str()), "{secret:?} was logged");
    }

    // The look-alikes arrived as they were sent.
    let scan_id: Uuid = scan.scan_id.parse().unwrap();
    let titles: Vec<String> = sqlx::query_scalar("SELECT title FROM findings WHERE scan_id = $1")
        .bind(scan_id)
        .fetch_all(&system.pool)
        .await
        .unwrap();
    for text in &keep {
        assert!(titles.contains(text), "{text:?} did not survive");
    }
    system.finish().await;
}
