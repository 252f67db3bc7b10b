//! orderly's Azure adapters. Today: the Azure Service Bus implementation of the
//! transport port, on the `azservicebus` AMQP client (see DESIGN.md §9 for why this
//! crate and the client defects designed around here).
//!
//! This crate must not depend on the SQL store; the store reaches Service Bus through
//! its transactional outbox and a relay that publishes with this transport.

pub mod servicebus;

pub use servicebus::{Provisioned, QueueAdmin, ServiceBusSettings, ServiceBusTransport};
