//! Trace context carried in message properties, so that the spans one order causes in
//! the scheduler, the agents and back form one trace across processes.
//!
//! This crate knows no tracing backend. A binary that exports traces installs a
//! [`Propagator`] once at start-up (orderly-runtime does with its `otel` feature: W3C
//! `traceparent` / `tracestate`); without one every function here does nothing, and
//! messages carry no extra properties.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use tracing::Span;

/// Reads and writes a span's trace context in a message's application properties.
pub trait Propagator: Send + Sync + 'static {
    /// Writes the context of `span` into `properties` (nothing if the span is disabled).
    fn inject(&self, span: &Span, properties: &mut BTreeMap<String, String>);
    /// Makes `span` a child of the context `properties` carry, or, when they carry
    /// none (or `None`), the root of a new trace. Call before the span is entered or
    /// has children.
    fn adopt(&self, span: &Span, properties: Option<&BTreeMap<String, String>>);
}

static PROPAGATOR: OnceLock<Box<dyn Propagator>> = OnceLock::new();

/// Installs the process's propagator; `false` if one was installed already (the first
/// stays).
pub fn install(propagator: Box<dyn Propagator>) -> bool {
    PROPAGATOR.set(propagator).is_ok()
}

/// Writes the current span's trace context into `properties`.
pub fn inject_current(properties: &mut BTreeMap<String, String>) {
    if let Some(p) = PROPAGATOR.get() {
        p.inject(&Span::current(), properties);
    }
}

/// Continues the trace a received message carries in `span` (a new trace if it
/// carries none), rather than nesting `span` under the long-lived span of the loop
/// that received it.
pub fn continue_from(span: &Span, properties: &BTreeMap<String, String>) {
    if let Some(p) = PROPAGATOR.get() {
        p.adopt(span, Some(properties));
    }
}

/// Starts a new trace at `span` (work that no message caused, such as a claim).
pub fn start_trace(span: &Span) {
    if let Some(p) = PROPAGATOR.get() {
        p.adopt(span, None);
    }
}
