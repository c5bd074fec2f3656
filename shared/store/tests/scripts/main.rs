//! The decision scripts (`store::Script`: `admit::Admit`, `ingest::Ingest`,
//! `fire::FireDue`) against PostgreSQL, in the store's own tests: for each, its two forms
//! decide the same batch alike (outcomes, rows and events), `store::decide_batch` commits what
//! the set-wise form decided, and where a message can be one the schema refuses, the fallback
//! refuses it alone while its neighbours go through. Each test has a database of its own
//! (`DATABASE_URL`'s server, else postgres://postgres@127.0.0.1:5432).

#![allow(
    clippy::too_many_lines,
    reason = "a test reads as one scenario; the 70-line limit is for production functions"
)]

mod admit;
mod ingest;
mod schedules;
mod support;
mod upkeep;
