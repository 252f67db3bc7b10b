//! The `orderly` command's library: the operators' dashboard, sample orders, and the
//! output helpers its commands (and the local runner, `orderly-local`) print with. The
//! binary in `main.rs` parses and `commands.rs` dispatches.

pub mod dashboard;
pub mod out;
pub mod sample;
pub mod shapes;
