//! The `orderly` command's library: the whole system in one process (`orderly up`,
//! `orderly demo`, the end-to-end tests), the invariant checker of a run's end state,
//! and sample orders. The binary in `main.rs` only parses and dispatches.

pub mod dashboard;
pub mod demo;
pub mod invariants;
pub mod measure;
pub mod out;
pub mod sample;
pub mod system;
