//! Limits every party checks, with why each is what it is. Defaults that operators tune
//! (lease TTL, batch sizes) are settings in the services; these are the hard edges of the
//! protocol itself.

/// The `max_control_line` every NATS server palisade authenticates against must allow, in
/// bytes. A user JWT lists every subject its identity may use, and the client sends it in its
/// `CONNECT` line: ingestion's is 5 KB with a 32-character prefix, over the server's default
/// of 4,096, which refuses the connection ("maximum control line exceeded").
pub const NATS_MAX_CONTROL_LINE: usize = 16_384;

/// A request's target string, in bytes: long URLs fit, a pasted document does not.
pub const TARGET_BYTES_MAX: usize = 512;
/// A scan request as encoded, unknown fields included: the largest valid request (a 512-byte
/// target, 16 plugin names and two identifiers of 128 bytes) is under 3,000 bytes, so this
/// refuses only padding. A new field that could push a valid request past it raises it.
pub const SCAN_REQUEST_BYTES_MAX: usize = 4_096;
/// Client ids, idempotency keys and plugin names, in bytes.
pub const IDENTIFIER_BYTES_MAX: usize = 128;
/// Plugins in one profile: a scan is a short pipeline, not a program.
pub const PROFILE_PLUGINS_MAX: usize = 16;
/// Priority must lie in this symmetric range (others are refused) so ordering stays meaningful.
pub const PRIORITY_ABS_MAX: i32 = 1_000;
/// A task's execution deadline, in seconds (one week).
pub const EXECUTION_DEADLINE_SECONDS_MAX: u32 = 7 * 24 * 3600;
/// Leases one acquire can return.
pub const ACQUIRE_TASKS_MAX: u32 = 256;
/// Longest acquire long-poll, in milliseconds; below NATS request timeouts clients use.
pub const ACQUIRE_WAIT_MS_MAX: u32 = 30_000;
/// A worker's declared capacity.
pub const WORKER_CAPACITY_MAX: u32 = 1_024;
/// Capabilities a worker may declare.
pub const WORKER_CAPABILITIES_MAX: usize = 256;
/// Rules a worker's hello may declare, over all its plugins (`HelloRequest.rules`).
pub const WORKER_RULES_MAX: usize = 4_096;
/// Resource kinds one declared rule may apply to.
pub const RULE_KINDS_MAX: usize = 16;
/// Longest resource kind (an asset's kind, or `target`), in bytes.
pub const RESOURCE_KIND_BYTES_MAX: usize = 64;
/// Highest sequence number of a result batch: bounds the completion check.
pub const BATCH_SEQUENCE_MAX: u32 = 100_000;
/// Largest result batch payload ingestion may be set to take (`PALISADE_BATCH_BYTES_MAX`), in
/// bytes: the results stream's largest message is this with its envelope.
pub const BATCH_BYTES_LIMIT: usize = 1024 * 1024;
/// Any single finding text field (title, description, evidence, resource), in bytes.
pub const FINDING_FIELD_BYTES_MAX: usize = 64 * 1024;
/// Leases one renew request may name (`lease` and `more_leases` together): a worker holds at
/// most its capacity of leases, so one message always renews them all, and the request
/// (about 150 bytes a lease) and its reply stay far below NATS's default 1 MiB payload.
pub const RENEW_LEASES_MAX: usize = WORKER_CAPACITY_MAX as usize;
/// Events one `events` reply holds when the request says 0: a scan makes about five tenant
/// events, so a client following a dozen scans catches up in one round.
pub const EVENTS_PER_REPLY_DEFAULT: u32 = 64;
/// Events one `events` reply may hold (`max_events` above is refused): each is one read of the
/// stream, so a reply stays a bounded piece of work.
pub const EVENTS_PER_REPLY_MAX: u32 = 256;
/// Payload bytes of the events in one reply: the reply stays far below NATS's default 1 MiB
/// `max_payload` (a tenant event is well under 8 KiB); the first event is always returned, the
/// others only while they fit, and the cursor says where the next request resumes.
pub const EVENTS_REPLY_BYTES_MAX: usize = 512 * 1024;
/// Longest `events` long-poll, in milliseconds (a longer `wait_ms` is shortened to it); below
/// the NATS request timeouts clients use with it, like [`ACQUIRE_WAIT_MS_MAX`].
pub const EVENTS_WAIT_MS_MAX: u32 = 30_000;

/// Organizations an enrollment token may carry (and an enrollment ask for).
pub const ENROLLMENT_ORGANIZATIONS_MAX: usize = 256;

/// Longest enrollment token secret accepted, in bytes (palisade's are 43).
pub const ENROLLMENT_SECRET_BYTES_MAX: usize = 128;

/// Cuts `text` to at most `bytes_max` bytes, at a character boundary (a field cut to its
/// limit rather than refused: the SDK's finding text, an evaluation's evidence on the bus).
pub fn truncate_at_char_boundary(text: &mut String, bytes_max: usize) {
    if text.len() <= bytes_max {
        return;
    }
    let mut end = bytes_max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
}
