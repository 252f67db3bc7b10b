//! The local runner's library: the whole system in one process (`orderly-local up`,
//! `demo`, `bench`, the end-to-end tests), the demo's driver, the bench's meter and the
//! invariant checker of a run's end state. The binary in `main.rs` parses and
//! dispatches.

pub mod demo;
pub mod fleet;
pub mod invariants;
pub mod limits;
pub mod measure;
pub mod system;
pub mod wire;
