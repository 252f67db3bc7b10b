//! The state-store ports: one small trait per role that uses the store.
//!
//! Every operation is atomic: the state row, the step records and the history entry it
//! writes commit together or not at all, and so do the messages it causes (`sends`):
//! they are enqueued in the same transaction, so a state change is never committed
//! without the messages it implies, nor a message sent for a change that did not happen. Every write by a scheduler is fenced by
//! `(order, owner, epoch)`: a deposed owner gets [`Error::Fenced`] and changes nothing.
//!
//! [`Error::Fenced`]: crate::Error::Fenced

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::error::Result;
use crate::id::{Actor, InstanceId, OrderId};
use crate::state::{Fence, ProcessState, StateRow};
use crate::step::StepRecord;
use crate::transport::{Envelope, ReceivedMessage};

mod intake;
mod records;
mod recovery;
mod scheduling;

pub use intake::*;
pub use records::*;
pub use recovery::*;
pub use scheduling::*;

/// Longest reply-queue name accepted.
pub const MAX_REPLY_TO_LEN: usize = 260;
pub use crate::validation::{MAX_TEXT_LEN, bounded_text};
pub use crate::workflow::{StoredWorkflow, WorkflowCount};
/// Most orders one claim, sweep or page may return.
pub const MAX_BATCH: u32 = 10_000;

/// Accepting orders (the submitter).
#[async_trait]
pub trait IntakeStore: Send + Sync {
    /// Inserts the order details, its Pending state row and its first history entry
    /// (naming `actor`, e.g. the submitter instance) in one transaction. The same order
    /// again is a `Duplicate` no-op; the same id with other details is
    /// [`crate::Error::OrderIdConflict`].
    /// `sends` are enqueued with it (and not for a duplicate).
    async fn submit(
        &self,
        order: &NewOrder,
        actor: &Actor,
        sends: &[Envelope],
    ) -> Result<SubmitOutcome>;

    /// [`IntakeStore::submit`] for a batch, in one transaction: each order gets its
    /// own outcome (an invalid order or an id conflict fails alone); a failure to
    /// enqueue the messages fails the whole batch and commits nothing.
    async fn submit_many(
        &self,
        batch: &[Submission],
        actor: &Actor,
    ) -> Result<Vec<Result<SubmitOutcome>>>;

    /// Receives up to `max` messages from `queue` (waiting up to `wait` for the first)
    /// and, in the same transaction, records the submission `plan` gives for each, as
    /// [`IntakeStore::submit_many`] under `actor`, ending the message of each order
    /// accepted or found a duplicate. `None` from a store whose database does not hold
    /// that queue (the default, and a store on the outbox): the caller receives and
    /// submits separately.
    async fn take_and_submit(
        &self,
        queue: &crate::transport::QueueName,
        max: u32,
        wait: Duration,
        actor: &Actor,
        plan: &(dyn for<'c> Fn(&'c ReceivedMessage) -> Option<Submission> + Send + Sync),
    ) -> Result<Option<Taken<SubmitOutcome>>> {
        let _ = (queue, max, wait, actor, plan);
        Ok(None)
    }

    /// [`IntakeStore::submit_many`] where `messages[i]` carried `batch[i]`: a store
    /// whose database also holds the queue they came from deletes, in the same
    /// transaction, the message of each order that was `Accepted` or a `Duplicate`
    /// (still held by this delivery); the others, and all of them on a store that holds
    /// no queue (the default), are the caller's to settle.
    async fn submit_consuming(
        &self,
        batch: &[Submission],
        actor: &Actor,
        messages: &[ReceivedMessage],
    ) -> Result<Consumed<Result<SubmitOutcome>>> {
        check_consuming(batch.len(), messages)?;
        Ok(Consumed::none(self.submit_many(batch, actor).await?))
    }
}

/// Owning and advancing orders (the scheduler). Every write is fenced.
#[async_trait]
pub trait SchedulerStore: Send + Sync {
    /// Claims up to `limit` Pending, unlocked orders whose next attempt is due, oldest
    /// first: each becomes Processing, locked by the caller until now + timeout, with
    /// its epoch raised by one. No order is ever given to two claimers.
    async fn claim(&self, request: &ClaimRequest) -> Result<Vec<ClaimedOrder>>;

    /// Waits until orders may have become claimable (submitted, released, sent back to
    /// Pending) since `*seen`, a count it keeps up to date (start at 0), or until
    /// `within` passes: a claimer that found nothing waits here instead of polling. A
    /// store that cannot tell waits `within`.
    async fn wait_claimable(&self, seen: &mut u64, within: Duration) {
        let _ = seen;
        tokio::time::sleep(within).await;
    }

    /// [`SchedulerStore::claim`], and in the same transaction the write `plan` gives
    /// for each order claimed (its first step started and its request enqueued), so a
    /// claim and its first request commit together or not at all. Returns each order
    /// and whether its planned write was applied (`false`: `plan` gave none, e.g. an
    /// order to be undone, left to the caller).
    async fn claim_and_start(
        &self,
        request: &ClaimRequest,
        plan: &(dyn for<'c> Fn(&'c ClaimedOrder) -> Option<StepWrite> + Send + Sync),
    ) -> Result<Vec<(ClaimedOrder, bool)>>;

    /// Records a step's progress (and moves `current_step` past it on success), with
    /// the messages it causes (the step request, the next one, a status notification).
    async fn record_step(
        &self,
        fence: &Fence,
        step: &StepUpdate,
        sends: &[Envelope],
    ) -> Result<StepRecord>;

    /// Pushes the deadline to now + `by` (a heartbeat). Returns the new deadline.
    async fn extend(&self, fence: &Fence, by: Duration) -> Result<DateTime<Utc>>;

    /// Marks orders Processed and unlocks them, in one transaction, each with its
    /// messages. Fences that no longer hold are refused one by one (their messages are
    /// not sent); the others complete.
    async fn complete_many(&self, completions: &[Completion]) -> Result<BatchOutcome>;

    /// Marks one order Processed and unlocks it, sending `sends`.
    async fn complete(&self, fence: &Fence, sends: &[Envelope]) -> Result<()> {
        let completion = Completion {
            fence: fence.clone(),
            sends: sends.to_vec(),
        };
        let mut outcome = self
            .complete_many(std::slice::from_ref(&completion))
            .await?;
        match outcome.refused.pop() {
            Some((_, error)) => Err(error),
            None => Ok(()),
        }
    }

    /// The owner finished undoing an order (every step that could be undone is): it
    /// ends in Error with `error`, unless an operator's retry waits for the undoing
    /// (the order had stopped half undone when it was retried): then the retry's fresh
    /// run starts, Pending from the first step, and its generation is returned.
    async fn finish_undone(&self, fence: &Fence, error: &str) -> Result<Option<i32>>;

    /// Gives up on an order: Error, with the reason kept as its last error, sending
    /// `sends` (the failure notification, the operator alert).
    async fn fail(&self, fence: &Fence, error: &str, sends: &[Envelope]) -> Result<()>;

    /// Hands an order back unfinished (Pending, unlocked, not counted as a failure),
    /// e.g. when the scheduler shuts down.
    async fn release(&self, fence: &Fence, reason: &str) -> Result<()>;

    /// Parks orders whose next request is for a service that is down, in one
    /// transaction: each, if its fence (and step) still hold, goes Pending, unlocked,
    /// marked as waiting for the service and not counted as a failure, held until the
    /// service is back ([`crate::service::Parked::Held`]), or claimable at once if the
    /// store finds the service up again ([`crate::service::Parked::Released`]). The
    /// result says, park by park, what happened or why it was refused.
    async fn park_many(
        &self,
        parks: &[crate::service::Park],
    ) -> Result<Vec<Result<crate::service::Parked>>>;

    /// Applies a batch of step writes in one transaction. Each write is fenced (and
    /// step-guarded) on its own: the result says, write by write, whether it was
    /// applied or why it was refused (refused writes change nothing and send nothing).
    async fn record_steps(&self, writes: &[StepWrite]) -> Result<Vec<Result<()>>>;

    /// [`SchedulerStore::record_steps`] where `messages[i]` asked for `writes[i]` (the
    /// agent's reply): a store whose database also holds the queue they came from
    /// deletes, in the same transaction, the message of each write that was applied
    /// or refused for good (a retryable refusal keeps its message); the others, and
    /// all of them on a store that holds no queue (the default), are the caller's to
    /// settle.
    async fn record_steps_consuming(
        &self,
        writes: &[StepWrite],
        messages: &[ReceivedMessage],
    ) -> Result<Consumed<Result<()>>> {
        check_consuming(writes.len(), messages)?;
        Ok(Consumed::none(self.record_steps(writes).await?))
    }

    /// Receives up to `max` messages from `queue` (waiting up to `wait` for the first)
    /// and, in the same transaction, applies the step write `plan` gives for each
    /// (fenced and step-guarded as in [`SchedulerStore::record_steps`]), ending the
    /// message of each write applied or refused for good: a reply is taken, recorded
    /// and its next request sent in one commit. `None` from a store whose database
    /// does not hold that queue (the default, and a store on the outbox): the caller
    /// receives and records separately.
    async fn take_and_record(
        &self,
        queue: &crate::transport::QueueName,
        max: u32,
        wait: Duration,
        plan: &(dyn for<'c> Fn(&'c ReceivedMessage) -> Option<StepWrite> + Send + Sync),
    ) -> Result<Option<Taken>> {
        let _ = (queue, max, wait, plan);
        Ok(None)
    }

    /// Takes back, under a new epoch, the Processing orders still locked by `owner`
    /// whose deadline has not passed: what a scheduler restarting with the same
    /// instance id does, so its earlier incarnation is fenced out.
    async fn resume_owned(&self, owner: &InstanceId) -> Result<Vec<ClaimedOrder>>;

    /// Marks the order as being undone: its completed steps get compensated before it
    /// ends in `finish_as` (Error or Cancelled). Sends `sends` with it.
    async fn begin_compensation(
        &self,
        fence: &Fence,
        finish_as: ProcessState,
        reason: &str,
        sends: &[Envelope],
    ) -> Result<()>;

    /// Ends a cancel-requested order, its steps undone: Cancelled, unlocked.
    async fn finish_cancelled(&self, fence: &Fence, reason: &str, sends: &[Envelope])
    -> Result<()>;

    /// The step records of one order, by position.
    async fn steps(&self, order_id: &OrderId) -> Result<Vec<StepRecord>>;

    /// Counts the live (Pending and Processing) orders by workflow, version and state:
    /// which versions still have orders in flight (an earlier version's schedulers
    /// can be retired once it has none), and which orders wait for a scheduler that
    /// runs their workflow.
    async fn workflows_in_flight(&self) -> Result<Vec<WorkflowCount>>;

    /// Stores the definition of each of `workflows` not stored yet, as first seen now by
    /// `by`; how many it added. A stored version is never changed.
    async fn record_workflows(
        &self,
        workflows: &[std::sync::Arc<crate::workflow::Workflow>],
        by: &str,
    ) -> Result<usize>;

    /// Every stored workflow version (see [`Self::record_workflows`]), oldest first.
    async fn stored_workflows(&self) -> Result<Vec<StoredWorkflow>>;

    /// The key that signs the step requests and replies of this deployment
    /// ([`crate::signing`]): the stored one, or, the first time, `fresh`, stored by
    /// whoever asks first (concurrent first callers all get the one stored).
    async fn message_key(
        &self,
        fresh: crate::signing::MessageKey,
        by: &str,
    ) -> Result<crate::signing::MessageKey>;

    /// How many orders `owner` holds (Processing, locked by it): a scheduler claims no
    /// more while it holds its maximum, so orders do not wait out their deadline in
    /// the agents' queues.
    async fn count_owned(&self, owner: &InstanceId) -> Result<i64>;

    /// The fences of the Processing orders `owner` holds (to hand them back with
    /// [`SchedulerStore::release`] when it stops).
    async fn owned(&self, owner: &InstanceId) -> Result<Vec<Fence>>;
}

/// Finding and recovering timed-out work (the supervisor).
#[async_trait]
pub trait SupervisorStore: Send + Sync {
    /// Processing orders whose deadline has passed, most overdue first.
    async fn find_expired(&self, limit: u32) -> Result<Vec<Expired>>;

    /// What a sweep has to do now, in one read: whether an order is past its deadline,
    /// an alert is not yet published, an outage's start or end is not yet announced.
    /// An idle sweep then costs one statement and writes nothing (the recovery's
    /// transaction, which begins with the leader's fenced write, is not begun). This
    /// default says everything is due.
    async fn sweep_due(&self) -> Result<SweepDue> {
        Ok(SweepDue::ALL)
    }

    /// Recovers up to `limit` expired orders: failure count + 1 and back to Pending
    /// after a back-off, or Error at the threshold. An expiry is counted once however
    /// many supervisors race on it. Refused ([`crate::Error::Deposed`]) unless
    /// `leader`'s term is the current one.
    async fn recover_expired(
        &self,
        leader: &crate::leader::LeaderFence,
        policy: &RecoveryPolicy,
        limit: u32,
    ) -> Result<Vec<RecoveryOutcome>>;

    /// Alerts not yet published to the alerts queue, oldest first.
    async fn unpublished_alerts(&self, limit: u32) -> Result<Vec<Alert>>;

    /// Publishes these alerts: marks them and enqueues `sends` (the alert messages and
    /// the clients' `failed` notices) in the same transaction, so nothing is published
    /// unless `leader`'s term is still the current one ([`crate::Error::Deposed`]
    /// otherwise, and nothing is sent). Returns the ones this call marked (not already
    /// marked by another publisher), so each is logged once.
    async fn mark_alerts_published(
        &self,
        leader: &crate::leader::LeaderFence,
        alert_ids: &[i64],
        sends: &[Envelope],
    ) -> Result<Vec<i64>>;

    /// Removes what `retention` lets go, in short transactions of at most
    /// `retention.batch` orders (or rows) each, so the hot path never waits long behind
    /// it: orders finished (Processed or Cancelled) longer than `retention.keep` ago
    /// (on the store's clock) with their steps, history and alerts; queue dead letters
    /// and outbox rows sent or dead-lettered longer ago than that; and expired
    /// duplicate-detection rows. Orders in Error and live orders are never touched.
    /// With `dry_run`, counts what would go and removes nothing.
    async fn prune(&self, retention: &Retention, dry_run: bool) -> Result<Pruned>;

    /// Reclaims, in the tables whose rows turn over fastest (queue messages, order
    /// state and steps, the outbox), the row versions that updates and deletes left
    /// behind, where the database keeps them until a vacuum (PostgreSQL) and at least
    /// [`TIDY_MIN_DEAD`] rows (and a tenth of the live ones) have piled up in a table.
    /// Every scan in order reads past them (the queue's take, the claim, the sweep),
    /// so their cost grows with the work done since the last vacuum, and the
    /// database's own autovacuum looks once a minute at best. A table another vacuum is
    /// working on is skipped. Returns the tables vacuumed (none where the database
    /// reclaims as it goes, SQLite) and the row versions it counted.
    async fn tidy(&self) -> Result<Tidied>;

    /// Counts the Processed and Cancelled orders per minute of their finish, up to the
    /// start of the minute [`TALLY_GRACE`] ago, so that counting the orders by state
    /// ([`OperatorStore::count_by_state`]) reads the tallies and only the orders
    /// finished since, not every finished order (the leader's housekeeping, once a
    /// minute). Each call counts again the last [`TALLY_RECOUNT`] already tallied, and
    /// a first call over a large store goes in transactions of [`TALLY_STRIDE`] of
    /// finishes. Removing tallied orders (retention) takes them off their tallies in the
    /// same transaction, whoever removes them. Without calls the counts stay exact, and
    /// only grow slower with the store. A finish whose transaction commits later than
    /// [`TALLY_GRACE`] and [`TALLY_RECOUNT`] after it began stays out of the counts
    /// until retention removes its minute (orderly's transactions last milliseconds).
    async fn tally_finished(&self) -> Result<Tallied>;
}

/// What a sweep has to do ([`SupervisorStore::sweep_due`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SweepDue {
    /// A Processing order's deadline has passed.
    pub expired: bool,
    /// An alert (an order in Error) is not yet published.
    pub alerts: bool,
    /// A service's outage start or end is not yet announced.
    pub outages: bool,
}

impl SweepDue {
    /// Everything may be due.
    pub const ALL: Self = Self {
        expired: true,
        alerts: true,
        outages: true,
    };
}

/// Looking at and repairing orders (operators).
#[async_trait]
pub trait OperatorStore: Send + Sync {
    /// Lists orders matching `filter`, oldest first, one page at a time.
    async fn list(&self, filter: &OrderFilter) -> Result<Page>;

    /// One order with its details, steps and history.
    async fn get(&self, order_id: &OrderId) -> Result<OrderView>;

    /// Whether the store answers: one statement that reads no table (readiness probes).
    async fn ping(&self) -> Result<()>;

    /// The store's own time: the database server's clock where deadlines are set on
    /// it (PostgreSQL), the host's for an embedded database; a role measures how far
    /// its host's clock is off with it.
    async fn store_now(&self) -> Result<DateTime<Utc>>;

    /// Counts orders by state, exactly, in one snapshot: the live ones and those in
    /// Error through their states' indexes, the Processed and Cancelled ones from the
    /// leader's tallies ([`SupervisorStore::tally_finished`]) and the rows finished
    /// since the last tally.
    async fn count_by_state(&self) -> Result<Vec<(ProcessState, i64)>>;

    /// The activity of every minute from the one `since` falls in, oldest first
    /// (minutes without any are left out): finished orders by outcome with their
    /// latencies, recoveries, dead letters.
    async fn activity(&self, since: DateTime<Utc>) -> Result<Vec<crate::activity::MinuteActivity>>;

    /// How many orders finished (reached Processed, Error or Cancelled, and are still
    /// there) at or after `since`, by final state: the throughput an operator sees.
    /// Every final state is listed, zero or not.
    async fn finished_since(&self, since: DateTime<Utc>) -> Result<Vec<(ProcessState, i64)>>;

    /// Moves up to `limit` orders in `states` (Pending or Error; an order in
    /// Processing finishes on the version it runs) pinned to `from` to version `to`
    /// of the same workflow, each with a `VersionMoved` history entry, and returns
    /// them. Both versions must be stored, and compatible
    /// ([`crate::workflow::Workflow::compatible_with`]): anything else is refused
    /// before any order moves. Call again until fewer than `limit` come back.
    async fn move_version(
        &self,
        from: &crate::workflow::WorkflowRef,
        to: &crate::workflow::WorkflowRef,
        states: &[ProcessState],
        actor: &Actor,
        reason: &str,
        limit: u32,
    ) -> Result<Vec<OrderId>>;

    /// Sends an Error order round again: Pending, failure count reset, due at once.
    /// Steps already done stay done.
    async fn resubmit(
        &self,
        order_id: &OrderId,
        actor: &Actor,
        reason: &str,
        sends: &[Envelope],
    ) -> Result<StateRow>;

    /// Cancels an order the way a user expects: if any of its steps may have taken
    /// effect, it goes back to Pending marked to be undone (a scheduler compensates
    /// the steps in reverse order, then ends it Cancelled); otherwise it is Cancelled
    /// at once. A scheduler still working on it is fenced out from this moment. An
    /// order past the point of no return (a step that can never be undone may have
    /// taken effect) is not undone: the scheduler that claims it ends it in Error for
    /// repair by hand, saying why.
    async fn request_cancel(
        &self,
        order_id: &OrderId,
        actor: &Actor,
        reason: &str,
        sends: &[Envelope],
    ) -> Result<StateRow>;

    /// The Error orders grouped by cause (workflow, step, the error with ids and
    /// numbers stripped), largest first, read from the store's index of causes; the
    /// causes of orders that entered Error (or changed) since the last call are computed
    /// and kept first.
    async fn error_causes(&self) -> Result<Vec<crate::triage::ErrorCause>>;

    /// The Error orders of `cause` now, oldest first, up to `limit`.
    async fn error_cause_orders(
        &self,
        cause: &crate::triage::CauseKey,
        limit: u32,
    ) -> Result<Vec<StateRow>>;

    /// The ids of the oldest Error orders of each of `causes` now (up to `limit` each),
    /// in the order of `causes`: read from the index of causes alone, over one
    /// connection.
    async fn error_cause_ids(
        &self,
        causes: &[crate::triage::CauseKey],
        limit: u32,
    ) -> Result<Vec<Vec<OrderId>>>;

    /// The steps of each of `orders`, by position (an order without any is left out).
    async fn steps_of_many(
        &self,
        orders: &[OrderId],
    ) -> Result<std::collections::HashMap<OrderId, Vec<StepRecord>>>;

    /// Alerts, newest first; with `open_only`, those not yet acknowledged.
    async fn alerts(&self, open_only: bool, limit: u32) -> Result<Vec<Alert>>;

    /// Acknowledges an alert ("an operator has seen it"); acknowledging again keeps the
    /// first acknowledgement. `None` if there is no such alert.
    async fn acknowledge_alert(&self, alert_id: i64, by: &Actor) -> Result<Option<Alert>>;

    /// Cancels a Pending, Processing or Error order at once, without compensation. A
    /// scheduler still working on it is fenced out from this moment.
    async fn cancel(
        &self,
        order_id: &OrderId,
        actor: &Actor,
        reason: &str,
        sends: &[Envelope],
    ) -> Result<StateRow>;
}

/// The whole state store.
pub trait StateStore:
    IntakeStore
    + SchedulerStore
    + SupervisorStore
    + OperatorStore
    + crate::leader::LeadershipStore
    + crate::service::ServiceStore
    + crate::conditions::ConditionStore
{
}

impl<T> StateStore for T where
    T: IntakeStore
        + SchedulerStore
        + SupervisorStore
        + OperatorStore
        + crate::leader::LeadershipStore
        + crate::service::ServiceStore
        + crate::conditions::ConditionStore
{
}

/// Orders moved per transaction by [`move_version_all`].
pub const MOVE_BATCH: u32 = 500;

/// Moves every order [`OperatorStore::move_version`] would, batch after batch (each
/// its own transaction, so a run cut short is taken up by running it again), telling
/// `progress` the count so far after each full batch; returns how many moved.
pub async fn move_version_all(
    store: &dyn OperatorStore,
    from: &crate::workflow::WorkflowRef,
    to: &crate::workflow::WorkflowRef,
    states: &[ProcessState],
    actor: &Actor,
    reason: &str,
    progress: &mut (dyn FnMut(usize) + Send),
) -> Result<usize> {
    let mut moved = 0;
    loop {
        let batch = store
            .move_version(from, to, states, actor, reason, MOVE_BATCH)
            .await?;
        moved += batch.len();
        if batch.len() < MOVE_BATCH as usize {
            return Ok(moved);
        }
        progress(moved);
    }
}
