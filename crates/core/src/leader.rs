//! Leader election: "run this task while I lead; cancel it the moment I might not".
//!
//! An [`Elector`] drives one [`Lease`] (a blob lease, or a lease row in the state
//! store): followers try to acquire it every `retry` (plus jitter); the winner takes a
//! new term in the state store (a strictly larger epoch, [`LeadershipStore::begin_term`])
//! before its leader task runs, and every write that task makes carries the term's
//! [`LeaderFence`], so a deposed leader's writes are refused by the store, not merely
//! unlikely.
//!
//! While it leads, a renewer renews the lease every `renew_interval` (`renew_retry`
//! after a failure), and only while the leader task beats its [`Heartbeat`]. The task's
//! [`CancellationToken`] is cancelled when
//! - the renew deadline passes: `renew_deadline` after the *send time* of the last
//!   successful renewal, on the monotonic clock, and shorter than the lease, so the
//!   leader stops before the lease can expire anywhere;
//! - the lease is reported lost, or the task's heartbeat stops (a wedged leader);
//! - the process shuts down (the lease is then released, so a follower leads at once).
//!
//! If the task has not ended `stop_grace` after its cancellation, the elector calls its
//! `on_stuck` hook, by default exiting the process. Time is tokio's, so tests drive the
//! whole state machine with a paused clock.

mod elector;
mod ports;
mod store_lease;
mod timing;

/// The leadership the supervisors elect (the name of its term and lease).
pub const SUPERVISORS: &str = "supervisor";

pub use elector::*;
pub use ports::*;
pub use store_lease::*;
pub use timing::*;

#[cfg(test)]
mod tests;
