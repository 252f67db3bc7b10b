//! End-to-end tests of the four roles: in one process over a real store (SQLite and
//! PostgreSQL), and as separate processes of the real binaries killed with SIGKILL.
//! Every test asserts the invariants of docs/architecture.md ("Invariants"), not just that it ended.

#![allow(clippy::unwrap_used)]

mod bench;
mod console;
mod deploy;
mod fixtures;
mod hostile;
mod hostile_text;
mod leader;
mod lifecycle;
mod newcomer;
mod ops;
#[cfg(feature = "otel")]
mod otel;
mod outage;
mod passwordless;
mod probe;
mod processes;
#[path = "../support/procs.rs"]
mod procs;
mod query_fuzz;
mod retention;
mod roles;
mod servicebus;
mod tls;
mod undo;
mod workflows;
