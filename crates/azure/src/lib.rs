//! orderly's Azure adapters: the Azure Service Bus implementation of the transport
//! port, on the `azservicebus` AMQP client (see docs/architecture.md, "The Service Bus client", for why this crate and the
//! client defects designed around here), and the Azure Blob lease behind the
//! supervisors' leader election, on `azure_storage_blob` 1.x; and Entra ID tokens as
//! PostgreSQL's password (through `orderly_core`'s password port).
//!
//! This crate must not depend on the SQL store; the store reaches Service Bus through
//! its transactional outbox and a relay that publishes with this transport.

pub mod blob_lease;
pub mod postgres_token;
pub mod servicebus;

pub use blob_lease::{
    BlobAuth, BlobConfigError, BlobLease, BlobLocation, EntraIdentity, EntraSource,
    entra_credential, entra_credential_for,
};
pub use postgres_token::{EntraPassword, POSTGRES_SCOPE};
pub use servicebus::{
    PEEK_COUNT_CAP, Provisioned, QueueAdmin, STANDARD_MAX_BATCH_BYTES, ServiceBusAuth,
    ServiceBusSettings, ServiceBusTransport,
};
