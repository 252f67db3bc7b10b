//! The `orderly` command's library: the whole system in one process (`orderly up`,
//! `orderly demo`, the end-to-end tests), the demo's report and invariant checks, and
//! sample orders. The binary in `main.rs` only parses and dispatches.

pub mod backend;
pub mod dashboard;
pub mod demo;
pub mod election;
pub mod intake;
pub mod ops;
pub mod sample;
pub mod system;
