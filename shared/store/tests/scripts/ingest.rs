//! `ingest::Ingest`: a mixed batch of results, completions and failures decided alike
//! set-wise, one by one and by `decide_batch`; a result the schema refuses refused alone by the
//! fallback.

use messages::v1;
use prost::Message as _;
use store::ingest::{
    BatchParams, CompleteParams, Decisions, FailParams, Ingest, IngestOutcome, Message,
};
use store::{LeaseClaim, RetryPolicy};

use crate::support::{Database, Form, commit, difference, rehearse};

const PLUGIN: &str = "synthetic";

/// `count` one-plugin scans of a new organization, each leased once by one worker.
async fn leased(database: &Database, count: usize) -> Vec<LeaseClaim> {
    let organization = database.organization(None).await;
    let worker = database
        .worker(organization, count as i32 + 1, &[PLUGIN])
        .await;
    let requests: Vec<crate::support::Request> = (0..count)
        .map(|index| {
            crate::support::Request::new(
                organization,
                &format!("http://target-{index}.test"),
                &[PLUGIN],
            )
        })
        .collect();
    database.admitted(&requests).await;
    database.leases(worker, count).await
}

/// A batch payload of `findings` findings, the failed evaluation of each, a passed one, and
/// one asset.
fn payload(findings: usize) -> v1::BatchPayload {
    v1::BatchPayload {
        findings: (0..findings)
            .map(|index| v1::Finding {
                rule_id: format!("rule-{index}"),
                resource: "http://example.test/".into(),
                severity: "low".into(),
                title: format!("finding {index}"),
                ..Default::default()
            })
            .collect(),
        assets: vec![v1::Asset {
            kind: "http_service".into(),
            value: "http://example.test:80".into(),
        }],
        evaluations: (0..findings)
            .map(|index| v1::Evaluation::fail(&format!("rule-{index}"), "http://example.test/", ""))
            .chain([v1::Evaluation::pass("rule-ok", "http://example.test/")])
            .collect(),
    }
}

/// A result batch as ingestion's parsing leaves it, owning what the params borrow.
struct Batch {
    claim: LeaseClaim,
    sequence_number: i32,
    key: String,
    checksum: String,
    payload: v1::BatchPayload,
}

impl Batch {
    fn new(claim: &LeaseClaim, sequence_number: i32, payload: v1::BatchPayload) -> Self {
        Self {
            key: format!("{}:{sequence_number}", claim.attempt_id),
            checksum: messages::sha256_hex(&payload.encode_to_vec()),
            claim: claim.clone(),
            sequence_number,
            payload,
        }
    }

    fn message(&self) -> Message<'_> {
        Message::Result(BatchParams {
            claim: &self.claim,
            sequence_number: self.sequence_number,
            idempotency_key: &self.key,
            payload_sha256: &self.checksum,
            findings: &self.payload.findings,
            assets: &self.payload.assets,
            evaluations: &self.payload.evaluations,
        })
    }
}

fn completion(claim: &LeaseClaim, batch_count: i32) -> Message<'_> {
    Message::Complete(CompleteParams {
        claim,
        batch_count,
        summary: "done",
        lease_next: false,
    })
}

fn answers(decisions: &Decisions) -> Vec<String> {
    decisions
        .outcomes
        .iter()
        .map(|outcome| match outcome {
            Ok(IngestOutcome::Accepted) => "accepted".into(),
            Ok(IngestOutcome::Duplicate) => "duplicate".into(),
            Ok(IngestOutcome::Refused(error)) => error.code.clone(),
            Err(_) => "error".into(),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_batch_is_decided_alike_in_either_form_and_by_decide_batch() {
    let database = Database::create().await;
    let claims = leased(&database, 6).await;
    // Accepted earlier: batch 0 of task 1, for this batch to replay and conflict with.
    let earlier = Batch::new(&claims[1], 0, payload(1));
    let accepted = commit(
        &database,
        &Ingest {
            subjects: &database.subjects,
            messages: &[earlier.message()],
            lease_ttl: std::time::Duration::from_secs(300),
        },
    )
    .await;
    assert_eq!(answers(&accepted.outcomes), ["accepted"]);

    let good = Batch::new(&claims[0], 0, payload(3));
    let replay = Batch::new(&claims[1], 0, payload(1));
    let mut other_checksum = Batch::new(&claims[1], 0, payload(2));
    other_checksum.key = earlier.key.clone();
    let mut sequence_taken = Batch::new(&claims[1], 0, payload(2));
    sequence_taken.key = "another-key".into();
    let mut forged = claims[2].clone();
    forged.lease_token = "not-the-token".into();
    let fenced_out = Batch::new(&forged, 0, payload(1));
    let only_first = Batch::new(&claims[3], 0, payload(1));
    let twice = Batch::new(&claims[4], 0, payload(1));
    let failure = FailParams {
        claim: &claims[5],
        error_code: "plugin_error",
        error_message: "it broke",
        retryable: false,
        retry: RetryPolicy::default(),
    };
    let messages = [
        good.message(),                 // accepted
        completion(&claims[0], 1),      // accepted: completes its scan
        replay.message(),               // a replay
        other_checksum.message(),       // the same key, another checksum
        sequence_taken.message(),       // the sequence number under another key
        fenced_out.message(),           // a wrong token
        completion(&forged, 0),         // a wrong token
        only_first.message(),           // accepted
        completion(&claims[3], 2),      // batch 1 missing
        twice.message(),                // accepted
        twice.message(),                // a replay in the batch
        completion(&claims[4], 1),      // accepted
        completion(&claims[4], 1),      // the completion again
        twice.message(),                // a replay after the completion
        Message::Fail(failure.clone()), // accepted: fails its scan
        completion(&claims[5], 0),      // after the failure
        completion(&claims[0], 1),      // the first completion again
        Message::Fail(failure),         // the failure again
    ];
    let expected = [
        "accepted",
        "accepted",
        "duplicate",
        "batch_conflict",
        "batch_conflict",
        "lease_lost",
        "lease_lost",
        "accepted",
        "batch_missing",
        "accepted",
        "duplicate",
        "accepted",
        "duplicate",
        "duplicate",
        "accepted",
        "lease_lost",
        "duplicate",
        "duplicate",
    ];
    let script = Ingest {
        subjects: &database.subjects,
        messages: &messages,
        lease_ttl: std::time::Duration::from_secs(300),
    };
    let before = database.tally().await;

    let set_wise = rehearse(&database, &script, Form::SetWise)
        .await
        .expect("decided set-wise");
    assert_eq!(answers(&set_wise.outcomes), expected);
    // Findings of the accepted batches only (3 + 1 + 1); two scans completed, one failed.
    let written = difference(&before, &set_wise.tally);
    for (what, rows) in [
        ("findings", 5),
        ("worker_result_batches", 3),
        ("scans completed", 2),
        ("scans failed", 1),
    ] {
        assert_eq!(written.get(what), Some(&rows), "{what}: {written:?}");
    }

    let one_by_one = rehearse(&database, &script, Form::OneByOne)
        .await
        .expect("decided one by one");
    assert_eq!(answers(&one_by_one.outcomes), expected);
    assert_eq!(one_by_one.tally, set_wise.tally, "the same rows written");
    assert_eq!(one_by_one.events, set_wise.events);
    assert_eq!(one_by_one.outcomes.scans, set_wise.outcomes.scans);

    let committed = commit(&database, &script).await;
    assert_eq!(answers(&committed.outcomes), expected);
    assert_eq!(committed.tally, set_wise.tally);
    assert_eq!(committed.events, set_wise.events);
    assert_eq!(committed.outcomes.scans, set_wise.outcomes.scans);
    database.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_the_schema_refuses_is_refused_alone_and_its_neighbours_accepted() {
    let database = Database::create().await;
    let claims = leased(&database, 3).await;
    let mut refused = payload(1);
    // Past the schema's limit on an asset kind: ingestion's parsing refuses it on the wire;
    // here it reaches the store.
    refused.assets[0].kind = "k".repeat(65);
    let batches = [
        Batch::new(&claims[0], 0, payload(1)),
        Batch::new(&claims[1], 0, refused),
        Batch::new(&claims[2], 0, payload(1)),
    ];
    let messages: Vec<Message<'_>> = batches.iter().map(Batch::message).collect();
    let script = Ingest {
        subjects: &database.subjects,
        messages: &messages,
        lease_ttl: std::time::Duration::from_secs(300),
    };
    let before = database.tally().await;

    let error = rehearse(&database, &script, Form::SetWise)
        .await
        .expect_err("the set-wise asset statement is refused");
    assert!(!error.is_transient(), "{error}");
    let one_by_one = rehearse(&database, &script, Form::OneByOne)
        .await
        .expect("decided one by one");
    let expected = ["accepted", "error", "accepted"];
    assert_eq!(answers(&one_by_one.outcomes), expected);

    // decide_batch falls back to the one-by-one form by itself.
    let committed = commit(&database, &script).await;
    assert_eq!(answers(&committed.outcomes), expected);
    assert_eq!(committed.tally, one_by_one.tally);
    let written = difference(&before, &committed.tally);
    assert_eq!(
        written.get("worker_result_batches"),
        Some(&2),
        "{written:?}"
    );
    assert_eq!(written.get("findings"), Some(&2), "{written:?}");
    database.drop().await;
}
