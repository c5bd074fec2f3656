//! palisade's system tests: one binary, every service in-process on real PostgreSQL and NATS,
//! a database and subject prefix per test. See `tests/src/lib.rs` for the harness.

mod admission;
mod admit;
mod artifacts;
mod bad_input;
mod cluster;
mod control;
mod cost;
mod cve;
mod decide;
mod disclosure;
mod end_to_end;
mod enrichment;
mod events;
mod findings;
mod flat;
mod health;
mod helm;
mod ingestion;
mod leader;
mod metrics;
mod migrations;
mod otlp;
mod outage;
mod outbox;
mod processes;
mod recovery;
mod redaction;
mod redelivery;
mod renew;
mod rows;
mod schema;
mod scripts;
mod security;
mod tls;
mod tracing;
