//! Test support for orderly: builders for orders, and conformance suites that every
//! implementation of a port must pass. The same suite runs against every dialect, so
//! "both dialects behave the same" is checked, not hoped.
//!
//! Depends on `orderly-core` only; adapters depend on this crate in their tests.

// A conformance suite is test code: a failed unwrap is a failed test, with its message.
#![allow(clippy::unwrap_used)]

pub mod azurite;
pub mod builders;
pub mod elector;
pub mod entra;
#[cfg(feature = "otel")]
pub mod otlp;
pub mod partition;
pub mod private_postgres;
pub mod servicebus_standin;
pub mod store;
pub mod tls;
pub mod transport;
