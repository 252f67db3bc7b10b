//! The two ports an elector drives: the [`Lease`] that says who may lead, and the
//! [`LeadershipStore`] that numbers each term and fences a leader's writes.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::error::Result;
use crate::id::InstanceId;
use crate::state::Epoch;

/// The proof of leadership a leader's writes carry: the store refuses a write whose
/// term is no longer the current one ([`crate::Error::Deposed`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LeaderFence {
    /// What is led, e.g. `supervisor`.
    pub name: String,
    /// The leader.
    pub holder: InstanceId,
    /// Its term.
    pub epoch: Epoch,
}

impl fmt::Display for LeaderFence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} term {} held by {}",
            self.name, self.epoch, self.holder
        )
    }
}

/// The current term of a leadership, as the store holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Term {
    /// The term's fence (name, holder, epoch).
    pub fence: LeaderFence,
    /// The SQL lease's expiry on the database's clock; `None` for a term whose lease
    /// lives elsewhere (a blob), fenced by epoch alone.
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// When the term began.
    pub started_at: DateTime<Utc>,
    /// When its lease was last renewed (SQL lease) or the term began.
    pub renewed_at: DateTime<Utc>,
}

/// The state store's side of leadership: terms and their epochs, and the lease row of
/// the SQL elector. Every supervisor write checks its fence against the current term.
#[async_trait]
pub trait LeadershipStore: Send + Sync {
    /// Begins a new term of `name` for `holder` whose lease lives elsewhere (a blob):
    /// the epoch becomes one more than any before. Any lease row the SQL elector held
    /// is ended by it.
    async fn begin_term(&self, name: &str, holder: &InstanceId) -> Result<LeaderFence>;

    /// The SQL elector's acquire: a new term for `holder` if there is no term, or the
    /// current one's SQL lease has expired or was released (on the database's clock).
    /// `None` while another's lease (or a term of another elector) holds.
    async fn acquire_lease(
        &self,
        name: &str,
        holder: &InstanceId,
        lease: Duration,
    ) -> Result<Option<LeaderFence>>;

    /// Extends the SQL lease of `fence`'s term to now + `lease`; `false` if the term is
    /// over or its lease expired (it is then lost, never revived).
    async fn renew_lease(&self, fence: &LeaderFence, lease: Duration) -> Result<bool>;

    /// Ends the SQL lease of `fence`'s term now, so a follower can take over at once;
    /// `false` (and nothing changes) if the term or its lease was already over.
    async fn release_lease(&self, fence: &LeaderFence) -> Result<bool>;

    /// The current term of `name`, if there ever was one.
    async fn term(&self, name: &str) -> Result<Option<Term>>;
}

/// The result of one attempt to acquire a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    /// The lease is ours. A lease kept in the state store begins its term itself and
    /// gives the fence; others leave that to the elector.
    Yes(Option<LeaderFence>),
    /// Someone else holds it.
    HeldByOther,
}

/// Why a lease call did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    /// The lease is not (or no longer) ours.
    #[error("lease lost: {0}")]
    Lost(String),
    /// The lease service could not be reached or failed; the call may be retried.
    #[error("lease service unavailable: {0}")]
    Unavailable(String),
    /// The configuration or the credentials are wrong: retrying will not help.
    #[error("lease misconfigured: {0}")]
    Misconfigured(String),
}

/// One lease, held on behalf of one instance. Implementations keep their own lease id.
#[async_trait]
pub trait Lease: Send + Sync {
    /// What the lease is, for logs (no secrets).
    fn describe(&self) -> String;
    /// Tries once to take the lease.
    async fn try_acquire(&self) -> Result<Acquired, LeaseError>;
    /// Renews the lease this instance holds.
    async fn renew(&self) -> Result<(), LeaseError>;
    /// Gives the lease up.
    async fn release(&self) -> Result<(), LeaseError>;
}
