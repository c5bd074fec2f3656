//! Cutting a plugin's stream of results into result batches within the session's limits, and
//! encoding each batch as the `ResultBatch` that goes on the wire. Pure: no I/O, no clock.

use messages::{limits, v1};
use prost::Message as _;

use crate::plugin::ResultItem;

/// Field tags of `BatchPayload`: each repeated entry costs its tag, its length and its bytes.
const FINDINGS_TAG: u32 = 1;
const ASSETS_TAG: u32 = 2;
const EVALUATIONS_TAG: u32 = 3;

/// A result that cannot fit in any batch, even alone.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("one result encodes to {bytes} bytes, over the batch limit of {bytes_max}")]
pub(crate) struct ItemTooLarge {
    pub bytes: usize,
    pub bytes_max: usize,
}

/// Collects results into the current batch and hands over a full one when the next result
/// does not fit.
#[derive(Debug)]
pub(crate) struct Batcher {
    findings_max: usize,
    bytes_max: usize,
    current: v1::BatchPayload,
    current_bytes: usize,
}

impl Batcher {
    pub fn new(findings_max: usize, bytes_max: usize) -> Self {
        assert!(
            findings_max > 0 && bytes_max > 0,
            "batch limits must be positive"
        );
        Self {
            findings_max,
            bytes_max,
            current: v1::BatchPayload::default(),
            current_bytes: 0,
        }
    }

    /// Adds `item`. Returns the batch that was full before it, if `item` did not fit there
    /// (the item starts the next batch).
    pub fn push(&mut self, item: ResultItem) -> Result<Option<v1::BatchPayload>, ItemTooLarge> {
        let item = match item {
            ResultItem::Finding(finding) => ResultItem::Finding(clamp_finding(finding)),
            ResultItem::Evaluation(evaluation) => {
                ResultItem::Evaluation(clamp_evaluation(evaluation))
            }
            asset @ ResultItem::Asset(_) => asset,
        };
        let bytes = match &item {
            ResultItem::Finding(finding) => {
                prost::encoding::message::encoded_len(FINDINGS_TAG, finding)
            }
            ResultItem::Asset(asset) => prost::encoding::message::encoded_len(ASSETS_TAG, asset),
            ResultItem::Evaluation(evaluation) => {
                prost::encoding::message::encoded_len(EVALUATIONS_TAG, evaluation)
            }
        };
        if bytes > self.bytes_max {
            return Err(ItemTooLarge {
                bytes,
                bytes_max: self.bytes_max,
            });
        }
        // Findings and evaluations share the session's findings limit (reference 6.7).
        let counted = !matches!(item, ResultItem::Asset(_));
        let fits = self.current_bytes + bytes <= self.bytes_max
            && (!counted
                || self.current.findings.len() + self.current.evaluations.len()
                    < self.findings_max);
        let full = if fits { None } else { self.take() };
        match item {
            ResultItem::Finding(finding) => self.current.findings.push(finding),
            ResultItem::Asset(asset) => self.current.assets.push(asset),
            ResultItem::Evaluation(evaluation) => self.current.evaluations.push(evaluation),
        }
        self.current_bytes += bytes;
        debug_assert_eq!(self.current_bytes, self.current.encoded_len());
        Ok(full)
    }

    /// The current batch, if it holds anything; the batcher starts a new one.
    pub fn take(&mut self) -> Option<v1::BatchPayload> {
        if self.is_empty() {
            return None;
        }
        self.current_bytes = 0;
        Some(std::mem::take(&mut self.current))
    }

    pub fn is_empty(&self) -> bool {
        self.current.findings.is_empty()
            && self.current.assets.is_empty()
            && self.current.evaluations.is_empty()
    }
}

/// Cuts text fields to the protocol's per-field limit, so that one verbose finding does not
/// get its whole batch refused as `too_large`.
pub(crate) fn clamp_finding(mut finding: v1::Finding) -> v1::Finding {
    for field in [
        &mut finding.resource,
        &mut finding.title,
        &mut finding.description,
        &mut finding.evidence,
    ] {
        limits::truncate_at_char_boundary(field, limits::FINDING_FIELD_BYTES_MAX);
    }
    finding
}

/// Cuts an evaluation's evidence to the protocol's per-field limit, as [`clamp_finding`]
/// does a finding's text.
pub(crate) fn clamp_evaluation(mut evaluation: v1::Evaluation) -> v1::Evaluation {
    limits::truncate_at_char_boundary(&mut evaluation.evidence, limits::FINDING_FIELD_BYTES_MAX);
    evaluation
}

/// `{attempt_id}:{sequence_number}`: unique per task, the same for every resend.
pub(crate) fn idempotency_key(attempt_id: &str, sequence_number: u32) -> String {
    format!("{attempt_id}:{sequence_number}")
}

/// The `Nats-Msg-Id` of send number `send` (0 for the first) of a message whose first send
/// used `first_msg_id`. Resends need a fresh id: JetStream would drop a repeated one as a
/// duplicate, and ingestion would never answer it.
pub(crate) fn msg_id(first_msg_id: &str, send: u32) -> String {
    if send == 0 {
        first_msg_id.to_owned()
    } else {
        format!("{first_msg_id}:r{send}")
    }
}

/// The `ResultBatch` for `payload`.
pub(crate) fn batch_message(
    worker_id: &str,
    lease: &v1::LeaseRef,
    sequence_number: u32,
    payload: &v1::BatchPayload,
) -> v1::ResultBatch {
    let payload = payload.encode_to_vec();
    v1::ResultBatch {
        schema_version: messages::SCHEMA_VERSION,
        worker_id: worker_id.to_owned(),
        lease: Some(lease.clone()),
        sequence_number,
        idempotency_key: idempotency_key(&lease.attempt_id, sequence_number),
        payload_sha256: messages::sha256_hex(&payload),
        payload,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finding(index: usize, evidence_bytes: usize) -> ResultItem {
        ResultItem::Finding(v1::Finding {
            rule_id: format!("rule-{index}"),
            resource: "host:80".into(),
            severity: "info".into(),
            evidence: "x".repeat(evidence_bytes),
            ..Default::default()
        })
    }

    fn asset(value: &str) -> ResultItem {
        ResultItem::Asset(v1::Asset {
            kind: "tcp_service".into(),
            value: value.into(),
        })
    }

    #[test]
    fn cuts_by_finding_count() {
        let mut batcher = Batcher::new(2, 1 << 20);
        let mut batches = vec![];
        for index in 0..5 {
            batches.extend(batcher.push(finding(index, 10)).unwrap());
        }
        batches.extend(batcher.take());
        let sizes: Vec<_> = batches.iter().map(|batch| batch.findings.len()).collect();
        assert_eq!(sizes, [2, 2, 1]);
        assert!(batcher.take().is_none());
    }

    #[test]
    fn assets_do_not_count_as_findings() {
        let mut batcher = Batcher::new(1, 1 << 20);
        assert!(batcher.push(finding(0, 1)).unwrap().is_none());
        assert!(batcher.push(asset("a:1")).unwrap().is_none());
        assert!(batcher.push(asset("a:2")).unwrap().is_none());
        let full = batcher.push(finding(1, 1)).unwrap().unwrap();
        assert_eq!((full.findings.len(), full.assets.len()), (1, 2));
    }

    #[test]
    fn evaluations_count_with_findings() {
        let mut batcher = Batcher::new(3, 1 << 20);
        assert!(batcher.push(finding(0, 1)).unwrap().is_none());
        for index in 0..2 {
            let evaluation = v1::Evaluation::pass(&format!("rule-{index}"), "host:80");
            assert!(
                batcher
                    .push(ResultItem::Evaluation(evaluation))
                    .unwrap()
                    .is_none()
            );
        }
        let evaluation = v1::Evaluation::error("rule-9", "host:80", "timeout");
        let full = batcher
            .push(ResultItem::Evaluation(evaluation))
            .unwrap()
            .expect("the fourth counted result starts a new batch");
        assert_eq!((full.findings.len(), full.evaluations.len()), (1, 2));
        assert_eq!(batcher.take().unwrap().evaluations.len(), 1);
    }

    #[test]
    fn cuts_by_encoded_bytes_and_never_exceeds_them() {
        let bytes_max = 1_000;
        let mut batcher = Batcher::new(1_000, bytes_max);
        let mut batches = vec![];
        for index in 0..50 {
            batches.extend(batcher.push(finding(index, 100)).unwrap());
            batches.extend(batcher.push(asset("host:443")).unwrap());
        }
        batches.extend(batcher.take());
        assert!(batches.len() > 1);
        for batch in &batches {
            assert!(batch.encoded_len() <= bytes_max, "{}", batch.encoded_len());
        }
        let findings: usize = batches.iter().map(|batch| batch.findings.len()).sum();
        assert_eq!(findings, 50);
    }

    #[test]
    fn refuses_a_result_larger_than_a_batch() {
        let mut batcher = Batcher::new(10, 100);
        assert!(batcher.push(finding(0, 200)).is_err());
        assert!(batcher.is_empty());
    }

    #[test]
    fn clamps_long_fields_at_a_char_boundary() {
        let finding = v1::Finding {
            evidence: "é".repeat(limits::FINDING_FIELD_BYTES_MAX),
            ..Default::default()
        };
        let clamped = clamp_finding(finding);
        assert!(clamped.evidence.len() <= limits::FINDING_FIELD_BYTES_MAX);
        assert!(clamped.evidence.len() >= limits::FINDING_FIELD_BYTES_MAX - 1);
    }

    #[test]
    fn keys_and_message_ids() {
        assert_eq!(idempotency_key("a1", 7), "a1:7");
        assert_eq!(msg_id("a1:7", 0), "a1:7");
        assert_eq!(msg_id("a1:7", 2), "a1:7:r2");
        assert_eq!(msg_id("complete:a1", 1), "complete:a1:r1");
    }

    #[test]
    fn encoded_batches_carry_their_checksum() {
        let lease = v1::LeaseRef {
            task_id: "t".into(),
            attempt_id: "a".into(),
            attempt_number: 2,
            lease_token: "secret".into(),
        };
        let payload = v1::BatchPayload {
            findings: vec![],
            assets: vec![v1::Asset {
                kind: "file".into(),
                value: "/etc".into(),
            }],
            ..Default::default()
        };
        let batch = batch_message("w", &lease, 3, &payload);
        assert_eq!(batch.idempotency_key, "a:3");
        assert_eq!(batch.sequence_number, 3);
        assert_eq!(batch.payload_sha256, messages::sha256_hex(&batch.payload));
        assert_eq!(
            v1::BatchPayload::decode(&batch.payload[..]).unwrap(),
            payload
        );
        assert_eq!(batch.lease, Some(lease));
    }
}
