//! What every decision and repository stands on: the error ([`error`]), reaching the database
//! and its schema ([`database`], [`schema`], [`online_indexes`]), the statements ([`sql`]),
//! the states they bind ([`states`]), the lease fence ([`fence`]), the events a transaction
//! stages ([`outbox`]), the retry policy ([`retry`]) and the tending of the hot tables
//! ([`upkeep`]). Nothing here decides about a scan.

pub mod database;
pub mod error;
pub(crate) mod fence;
pub mod online_indexes;
pub mod outbox;
pub mod retry;
pub mod schema;
pub(crate) mod sql;
pub mod states;
pub mod upkeep;
