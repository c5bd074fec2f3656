//! The repositories: one module per thing an operator or a service reads and changes outside
//! the decisions (organizations, workers and clients; findings, evidence, coverage and history;
//! CVEs and enrichment; artifacts; schedules; dead letters; bus identities; the audit of
//! changes; what `/metrics` reads). A function that takes the pool opens and commits its own
//! transaction; one that takes a connection runs in its caller's.

pub mod admin;
pub mod artifacts;
pub mod audit;
pub mod bus_identities;
pub mod coverage;
pub mod cves;
pub mod dead_letters;
pub mod enrichment;
pub mod enrollment;
pub mod evidence;
pub mod findings;
pub mod history;
pub mod observability;
pub mod rate_limits;
pub mod schedules;
