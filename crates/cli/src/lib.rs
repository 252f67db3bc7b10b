//! The `orderly` command's library: the whole system in one process (`orderly up`,
//! `orderly demo`, the end-to-end tests), the invariant checker of a run's end state,
//! and sample orders. The binary in `main.rs` only parses and dispatches.

pub mod backend;
pub mod dashboard;
pub mod demo;
pub mod election;
pub mod intake;
pub mod invariants;
pub mod ops;
pub mod sample;
pub mod system;
