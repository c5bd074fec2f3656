//! `palisade dead-letter` (issue 27, item 3): the messages a consumer gave up on after its last
//! delivery, listed and read with why they died, and resolved by an operator: replayed through
//! the ordinary path, or discarded. Each resolution records who and why, once.
//!
//! A replay publishes the stored message again, unchanged, on the subject it arrived on, with
//! the `Nats-Msg-Id` `replay:<dead letter id>` (a replay repeated within JetStream's
//! de-duplication window is stored once), waits for the stream's acknowledgement, and only then
//! marks the dead letter replayed. The consumer decides it as any message: a scan request is
//! admitted by its idempotency key, so replaying one twice (or one whose first delivery was in
//! fact decided) admits one scan. Only scan requests are replayed: a worker's message is decided
//! against the lease it names, which has ended by the time an operator looks (the reaper
//! retried or failed its task), so a replay could only be refused `lease_lost`.

use bus::Bus;
use store::PgPool;
use store::dead_letters::{self, DeadLetterRow, ListFilter};
use store::states::DeadLetterResolution;
use uuid::Uuid;

use crate::cli_support::{ChangeArgs, Json, Output, field, instant};
use crate::exit;

/// `palisade dead-letter …`; each answers as text, or as JSON with `--output json`.
#[derive(Debug, clap::Subcommand)]
pub enum DeadLetterCommand {
    /// The open dead letters, newest first (`--all`: resolved ones too), without payloads.
    List {
        /// Only this consumer's (`admission` or `ingestion`).
        #[arg(long)]
        consumer: Option<String>,
        #[arg(long)]
        all: bool,
        /// The next page: the last id of the previous one.
        #[arg(long)]
        after: Option<Uuid>,
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(i64).range(1..=1000))]
        limit: i64,
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// One dead letter: why it died, its deliveries, its payload (hex, and decoded when it is a
    /// scan request).
    Show {
        id: Uuid,
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Publishes a dead scan request again on its subject, decided by admission as any
    /// request (its idempotency key admits it once), then marks it replayed.
    Replay(ChangeArgs),
    /// Closes a dead letter without deciding it.
    Discard(ChangeArgs),
}

/// Runs one `palisade dead-letter` command.
pub async fn run(
    common: &runtime::CommonSettings,
    command: DeadLetterCommand,
) -> anyhow::Result<()> {
    let pool = store::connect(&common.database).await?;
    let actor = crate::commands::actor;
    let (answer, output, text) = match command {
        DeadLetterCommand::List {
            consumer,
            all,
            after,
            limit,
            output,
        } => {
            let filter = ListFilter {
                consumer: consumer.as_deref(),
                all,
                after,
                limit,
            };
            let listed = list(&pool, &filter).await?;
            return print_list(output, &listed, limit);
        }
        DeadLetterCommand::Show { id, output } => {
            let (letter, payload) = read(&pool, id).await?;
            let text = shown_text(&letter, &payload);
            (shown(&letter, &payload)?, output, text)
        }
        DeadLetterCommand::Replay(args) => {
            let bus = crate::commands::operator_bus(common).await?;
            let answer = replay(&pool, &bus, args.id, &actor(args.by), args.reason.trim()).await?;
            let text = format!(
                "dead letter {} replayed on {} (stream sequence {}{})",
                args.id,
                answer["subject"].as_str().unwrap_or_default(),
                answer["stream_sequence"],
                if answer["duplicate"] == true {
                    ", a duplicate of an earlier replay"
                } else {
                    ""
                }
            );
            (answer, args.output, text)
        }
        DeadLetterCommand::Discard(args) => {
            let answer = discard(&pool, args.id, &actor(args.by), args.reason.trim()).await?;
            (
                answer,
                args.output,
                format!("dead letter {} discarded", args.id),
            )
        }
    };
    crate::cli_support::print(output, Json::Pretty, &answer, |_| text)
}

/// `palisade dead-letter list` as text or JSON.
fn print_list(output: Output, listed: &[Listed], limit: i64) -> anyhow::Result<()> {
    crate::cli_support::print_page(
        output,
        listed,
        limit,
        &format!(
            "{:<36} {:<10} {:>9} {:<20} {:<10} {:>8} reason",
            "id", "consumer", "delivered", "died", "resolution", "bytes"
        ),
        |listed| {
            let letter = &listed.letter;
            format!(
                "{:<36} {:<10} {:>9} {:<20} {:<10} {:>8} {}",
                letter.id,
                letter.consumer,
                letter.delivered,
                instant(&letter.created_at),
                letter.resolution.as_deref().unwrap_or("open"),
                listed.payload_bytes,
                letter.reason
            )
        },
        |listed| listed.letter.id.to_string(),
    )
}

/// `palisade dead-letter show` as text: the record, then the payload decoded, or in hex.
fn shown_text(letter: &DeadLetterRow, payload: &[u8]) -> String {
    let resolution = match (&letter.resolution, letter.resolved_at) {
        (Some(resolution), Some(at)) => format!(
            "{resolution} at {} by {}: {}",
            instant(&at),
            letter.resolved_by,
            letter.resolution_note
        ),
        _ => "open".to_owned(),
    };
    let payload_text = match decode(&letter.consumer, payload) {
        Some(decoded) => format!("{} bytes, {decoded}", payload.len()),
        None => format!("{} bytes, hex {}", payload.len(), hex::encode(payload)),
    };
    [
        field("dead letter", letter.id),
        field("consumer", &letter.consumer),
        field("subject", &letter.subject),
        field(
            "delivered",
            format!(
                "{} times (stream sequence {})",
                letter.delivered, letter.stream_sequence
            ),
        ),
        field("died", instant(&letter.created_at)),
        field("reason", &letter.reason),
        field("resolution", resolution),
        field("payload", payload_text),
    ]
    .join("\n")
}

/// What `list` prints per dead letter.
#[derive(Debug, serde::Serialize)]
pub struct Listed {
    #[serde(flatten)]
    pub letter: DeadLetterRow,
    pub payload_bytes: i64,
}

/// `palisade dead-letter list`.
pub async fn list(pool: &PgPool, filter: &ListFilter<'_>) -> anyhow::Result<Vec<Listed>> {
    Ok(dead_letters::list(pool, filter)
        .await?
        .into_iter()
        .map(|(letter, payload_bytes)| Listed {
            letter,
            payload_bytes,
        })
        .collect())
}

/// `palisade dead-letter show`: the record, its payload in hex and, when it decodes as the
/// message its consumer reads, that message as JSON.
pub async fn show(pool: &PgPool, id: Uuid) -> anyhow::Result<serde_json::Value> {
    let (letter, payload) = read(pool, id).await?;
    shown(&letter, &payload)
}

/// `show`'s answer for a dead letter read.
fn shown(letter: &DeadLetterRow, payload: &[u8]) -> anyhow::Result<serde_json::Value> {
    let decoded = decode(&letter.consumer, payload);
    let mut shown = serde_json::to_value(letter)?;
    shown["payload_hex"] = hex::encode(payload).into();
    shown["payload"] = decoded.unwrap_or(serde_json::Value::Null);
    Ok(shown)
}

/// `palisade dead-letter replay`.
pub async fn replay(
    pool: &PgPool,
    bus: &Bus,
    id: Uuid,
    by: &str,
    note: &str,
) -> anyhow::Result<serde_json::Value> {
    noted(note)?;
    let (letter, payload) = read(pool, id).await?;
    open(&letter)?;
    if letter.consumer != admission::CONSUMER_NAME {
        return Err(exit::refused(format!(
            "not_replayable: dead letter {id} is a worker's message ({}), decided against a lease that has ended by now, so a replay would only be refused lease_lost; the reaper retried or failed its task: discard it (palisade dead-letter discard {id} --reason ...)",
            letter.subject
        )));
    }
    let ack = bus
        .publish_durable(
            letter.subject.clone(),
            &format!("replay:{id}"),
            Default::default(),
            payload.into(),
        )
        .await?;
    let resolved =
        dead_letters::resolve(pool, id, DeadLetterResolution::Replayed, by, note).await?;
    Ok(serde_json::json!({
        "id": id,
        "subject": letter.subject,
        "stream_sequence": ack.sequence,
        "duplicate": ack.duplicate,
        "resolution": DeadLetterResolution::Replayed.as_str(),
        "resolved_now": resolved,
    }))
}

/// `palisade dead-letter discard`.
pub async fn discard(
    pool: &PgPool,
    id: Uuid,
    by: &str,
    note: &str,
) -> anyhow::Result<serde_json::Value> {
    noted(note)?;
    let (letter, _) = read(pool, id).await?;
    open(&letter)?;
    if !dead_letters::resolve(pool, id, DeadLetterResolution::Discarded, by, note).await? {
        // Resolved by another operator since it was read.
        let (letter, _) = read(pool, id).await?;
        open(&letter)?;
    }
    Ok(serde_json::json!({
        "id": id,
        "resolution": DeadLetterResolution::Discarded.as_str(),
    }))
}

async fn read(pool: &PgPool, id: Uuid) -> anyhow::Result<(DeadLetterRow, Vec<u8>)> {
    dead_letters::get(pool, id)
        .await?
        .ok_or_else(|| exit::not_found(format!("not_found: no dead letter {id}")))
}

/// Refuses a resolution without a reason.
fn noted(note: &str) -> anyhow::Result<()> {
    if note.trim().is_empty() {
        return Err(exit::refused(
            "reason_required: say why with a non-blank --reason; it is kept with the dead letter",
        ));
    }
    Ok(())
}

/// Refuses a dead letter resolved already, saying how.
fn open(letter: &DeadLetterRow) -> anyhow::Result<()> {
    match (&letter.resolution, letter.resolved_at) {
        (Some(resolution), Some(at)) => Err(exit::refused(format!(
            "already_resolved: dead letter {} was {resolution} at {at} by {:?} ({:?}); nothing was done",
            letter.id, letter.resolved_by, letter.resolution_note
        ))),
        _ => Ok(()),
    }
}

/// The payload as the message its consumer reads, as JSON; `None` when it does not decode.
fn decode(consumer: &str, payload: &[u8]) -> Option<serde_json::Value> {
    use prost::Message as _;
    if consumer == admission::CONSUMER_NAME {
        let request = messages::v1::ScanRequest::decode(payload).ok()?;
        return Some(serde_json::json!({
            "kind": "ScanRequest",
            "organization_id": request.organization_id,
            "client_id": request.client_id,
            "idempotency_key": request.idempotency_key,
            "target": request.target,
            "plugins": request.plugins,
        }));
    }
    None
}
