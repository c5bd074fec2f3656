//! Ingestion's consumer of the results stream: each fetched batch of result batches,
//! completions and failures parsed, decided in one transaction (`store::ingest`), answered on
//! each worker's ack subject after the commit, and handed back to the bus as decisions.

use std::collections::HashMap;
use std::time::Duration;

use bus::{BatchHandler, Bus, Decision, Delivery};
use messages::{ErrorCode, WorkerVerb, v1};
use outbox::Relay;
use prost::Message as _;
use runtime::BatchLimits;
use store::ingest::IngestOutcome;
use store::{PgPool, RetryPolicy, StoreError};
use tracing::Instrument as _;

use crate::CONSUMER_NAME;
use crate::parse::{self, AckAddress, WorkerMessage};

/// What ingestion decided about one message.
#[derive(Debug)]
enum Verdict {
    Accepted,
    Duplicate,
    Refused(v1::Error),
    /// Something failed that retrying may fix, the error with its causes; `unavailable` when
    /// nothing is wrong with the message (`StoreError::is_unavailable`), so the bus holds it
    /// rather than spend its deliveries.
    Failed {
        reason: String,
        unavailable: bool,
    },
}

/// A fetched batch parsed: every message's ack address, the verdicts of the messages refused
/// already, and the valid messages with their index in the batch.
struct ParsedBatch {
    addresses: Vec<AckAddress>,
    /// `None` for a valid message, until it is decided.
    verdicts: Vec<Option<Verdict>>,
    valid: Vec<(usize, WorkerMessage)>,
}

/// The results stream's handler: what deciding a fetched batch needs.
pub(crate) struct Ingestion {
    pub(crate) pool: PgPool,
    pub(crate) bus: Bus,
    pub(crate) relay: Relay,
    pub(crate) limits: BatchLimits,
    pub(crate) retry: RetryPolicy,
    pub(crate) lease_ttl: Duration,
    pub(crate) progress_events: store::ProgressEvents,
}

fn verb_of(subject: &str) -> Option<WorkerVerb> {
    match subject.rsplit('.').next()? {
        "result" => Some(WorkerVerb::Result),
        "complete" => Some(WorkerVerb::Complete),
        "fail" => Some(WorkerVerb::Fail),
        _ => None,
    }
}

impl Ingestion {
    /// Parses every message of the batch, refusing what is malformed without SQL.
    fn parse_batch(&self, batch: &[Delivery]) -> ParsedBatch {
        let subjects = self.bus.subjects();
        let mut parsed_batch = ParsedBatch {
            addresses: Vec::with_capacity(batch.len()),
            verdicts: Vec::with_capacity(batch.len()),
            valid: Vec::new(),
        };
        for (index, delivery) in batch.iter().enumerate() {
            let (address, parsed) = parse::parse(
                verb_of(delivery.subject()),
                subjects.worker_id_of(delivery.subject()),
                delivery.payload(),
                &self.limits,
            );
            parsed_batch.addresses.push(address);
            match parsed {
                Ok(message) => {
                    parsed_batch.verdicts.push(None);
                    parsed_batch.valid.push((index, message));
                }
                Err(error) => parsed_batch.verdicts.push(Some(Verdict::Refused(error))),
            }
        }
        parsed_batch
    }

    /// Decides the valid messages and writes their verdicts; a transaction that failed is
    /// every valid message's verdict. Returns the committed decision's events, to hand off,
    /// and the leases handed on with completions, by message index.
    async fn decide_into(
        &self,
        valid: &[(usize, WorkerMessage)],
        spans: &[&tracing::Span],
        verdicts: &mut [Option<Verdict>],
    ) -> Option<(store::Staged, HashMap<usize, Vec<v1::Lease>>)> {
        match self.decide(valid, spans).await {
            Ok((decided, leases, staged)) => {
                for ((index, _), verdict) in valid.iter().zip(decided) {
                    verdicts[*index] = Some(verdict);
                }
                Some((staged, leases))
            }
            Err(error) => {
                // Logged once per message, by the bus, with the redelivery it causes.
                let reason = format!("ingestion transaction failed: {}", telemetry::chain(&error));
                for (index, _) in valid {
                    verdicts[*index] = Some(Verdict::Failed {
                        reason: reason.clone(),
                        unavailable: error.is_unavailable(),
                    });
                }
                None
            }
        }
    }

    /// Decides the valid messages in one transaction (`store::ingest`: set-wise, with a fixed
    /// number of statements), which also leases their scans' next plugins to the completions
    /// that asked (`lease_next`). When a set-wise statement fails for a reason retrying cannot
    /// fix, the batch is decided again one message per savepoint, so the message at fault is
    /// refused alone and its neighbours go through.
    async fn decide(
        &self,
        messages: &[(usize, WorkerMessage)],
        spans: &[&tracing::Span],
    ) -> Result<(Vec<Verdict>, HashMap<usize, Vec<v1::Lease>>, store::Staged), StoreError> {
        // One transaction decides messages of many tasks and scans: its span is a root of
        // its own, linked to every message's `process` span (parenting would lie).
        let transaction_span = tracing::info_span!(
            parent: None,
            "ingest",
            otel.name = "ingestion transaction",
            otel.kind = "internal",
            palisade.service = "ingestion",
            messaging.batch.message_count = messages.len(),
        );
        for (index, message) in messages {
            bus::trace::link_to(&transaction_span, spans[*index]);
            spans[*index].record(
                "palisade.task_id",
                tracing::field::display(message.claim().task_id),
            );
        }
        // A completion carrying its last batch is two decisions: the batch, then itself.
        let parts: Vec<Vec<store::ingest::Message<'_>>> = messages
            .iter()
            .map(|(_, message)| message.to_store(self.retry))
            .collect();
        let decisions: Vec<store::ingest::Message<'_>> = parts.iter().flatten().cloned().collect();
        let subjects = self.bus.subjects();
        let script = store::ingest::Ingest {
            subjects,
            messages: &decisions,
            lease_ttl: self.lease_ttl,
        };
        let (decisions, staged) = store::decide_batch(&self.pool, self.progress_events, &script)
            .instrument(transaction_span)
            .await?;
        for (index, message) in messages {
            if let Some(scan_id) = decisions.scans.get(&message.claim().task_id) {
                spans[*index].record("palisade.scan_id", tracing::field::display(scan_id));
            }
        }
        let leases = handed_on(messages, spans, &decisions.leases);
        let mut outcomes = decisions.outcomes.into_iter();
        let verdicts = parts
            .iter()
            .map(|part| {
                let mut verdicts: Vec<Verdict> = outcomes
                    .by_ref()
                    .take(part.len())
                    .map(|outcome| match outcome {
                        Ok(IngestOutcome::Accepted) => Verdict::Accepted,
                        Ok(IngestOutcome::Duplicate) => Verdict::Duplicate,
                        Ok(IngestOutcome::Refused(error)) => Verdict::Refused(error),
                        // Logged once, by the bus, with the redelivery it causes.
                        Err(error) => Verdict::Failed {
                            reason: telemetry::chain(&error).to_string(),
                            unavailable: error.is_unavailable(),
                        },
                    })
                    .collect();
                // The completion answers for its batch, unless deciding the batch failed: then
                // the whole message is decided again.
                let own = verdicts.pop().expect("every message has its own decision");
                match verdicts.pop() {
                    Some(failed @ Verdict::Failed { .. }) => failed,
                    _ => own,
                }
            })
            .collect();
        Ok((verdicts, leases, staged))
    }

    async fn answer(&self, address: &AckAddress, verdict: &Verdict, leases: Vec<v1::Lease>) {
        let Some(worker_id) = &address.worker_id else {
            return;
        };
        let error = match verdict {
            Verdict::Refused(error) => Some(error.clone()),
            Verdict::Accepted | Verdict::Duplicate => None,
            Verdict::Failed { .. } => return,
        };
        let ack = v1::IngestAck {
            kind: address.kind.to_owned(),
            task_id: address.task_id.clone(),
            attempt_id: address.attempt_id.clone(),
            idempotency_key: address.idempotency_key.clone(),
            sequence_number: address.sequence_number,
            error,
            duplicate: matches!(verdict, Verdict::Duplicate),
            leases,
        };
        let subject = self.bus.subjects().worker(worker_id, WorkerVerb::Ack);
        if let Err(error) = self
            .bus
            .publish_core(subject, ack.encode_to_vec().into())
            .await
        {
            // The worker resends after its ack timeout and gets the same answer again.
            tracing::debug!(error = %telemetry::chain(&error), "ingest ack not sent");
        }
    }
}

impl BatchHandler for Ingestion {
    async fn handle(&self, batch: &[Delivery]) -> Vec<Decision> {
        let ParsedBatch {
            addresses,
            mut verdicts,
            mut valid,
        } = self.parse_batch(batch);
        valid.sort_by_key(|(_, message)| message.sort_key());
        let spans: Vec<&tracing::Span> = batch.iter().map(Delivery::span).collect();
        let mut leases = match self.decide_into(&valid, &spans, &mut verdicts).await {
            Some((staged, leases)) => {
                self.relay.hand_off(staged);
                leases
            }
            None => HashMap::new(),
        };
        let mut decisions = Vec::with_capacity(batch.len());
        for (index, (address, verdict)) in addresses.iter().zip(verdicts).enumerate() {
            let verdict = verdict.expect("every message decided");
            // The acknowledgement and the log line belong to the message's trace.
            let span = batch[index].span();
            self.answer(address, &verdict, leases.remove(&index).unwrap_or_default())
                .instrument(span.clone())
                .await;
            decisions.push(decision_of(span, address, verdict));
        }
        decisions
    }

    async fn dead_letter(&self, delivery: &Delivery, reason: &str) -> Result<(), String> {
        runtime::record_dead_letter(&self.pool, CONSUMER_NAME, delivery, reason).await
    }
}

/// The wire leases handed on with each completion (by message index), each opened in the
/// completion's own span: the cause of the grant.
fn handed_on(
    messages: &[(usize, WorkerMessage)],
    spans: &[&tracing::Span],
    granted: &HashMap<uuid::Uuid, Vec<store::lease::GrantedLease>>,
) -> HashMap<usize, Vec<v1::Lease>> {
    messages
        .iter()
        .filter_map(|(index, message)| {
            let WorkerMessage::Complete { claim, .. } = message else {
                return None;
            };
            let leases = granted.get(&claim.attempt_id)?;
            let wire = spans[*index].in_scope(|| {
                leases
                    .iter()
                    .map(|lease| runtime::traced_lease(lease, "ingestion"))
                    .collect()
            });
            Some((*index, wire))
        })
        .collect()
}

/// What the bus does with a message given its verdict; a refusal is logged (but the routine
/// `lease_lost`), recorded on the message's span and counted.
fn decision_of(span: &tracing::Span, address: &AckAddress, verdict: Verdict) -> Decision {
    match verdict {
        Verdict::Accepted | Verdict::Duplicate => Decision::Ack,
        Verdict::Refused(error) => {
            span.in_scope(|| {
                if error.error_code() != Some(ErrorCode::LeaseLost) {
                    tracing::info!(code = %error.code, kind = address.kind, task_id = %address.task_id, "worker message refused");
                }
            });
            telemetry::record_error(span, &error.code, &error.message);
            bus::metrics::record_refusal(CONSUMER_NAME, &error.code);
            Decision::Reject { reason: error.code }
        }
        Verdict::Failed {
            reason,
            unavailable: true,
        } => Decision::Hold { reason },
        Verdict::Failed { reason, .. } => Decision::Retry { reason },
    }
}
