//! The Azure Blob lease behind the supervisors' election, with `azure_storage_blob` 1.x.
//!
//! A dedicated blob (created with its container if missing, used for nothing else)
//! carries the lease. Every instance proposes its own lease id, so a second acquire by
//! another instance fails with 409 `LeaseAlreadyPresent` ("follower"). Lease calls get
//! a tight retry budget (one quick retry inside the call timeout) instead of the SDK's
//! default, which can spend about 80 s on a failing call; the elector wraps each call in
//! its own timeout as well, so a renewal can never outlive the lease.
//!
//! Authentication ([`BlobAuth`]): a storage connection string with an account key
//! (including `UseDevelopmentStorage=true` for Azurite), for which requests are signed
//! with SharedKey by a per-try policy of ours (the 1.x crate has no SharedKey support),
//! re-signed on every retry; a SAS URL; or an Entra ID token credential.

mod lease;
mod location;
mod shared_key;

pub use lease::*;
pub use location::*;

#[cfg(test)]
mod tests;
