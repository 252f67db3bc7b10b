//! The state-store conformance suite. Every case takes a [`Ctx`]: a manual clock the
//! store under test reads, and a factory of independent handles on one fresh database
//! (each handle its own connections, like another process). [`store_conformance!`]
//! stamps every case out as a test for one dialect.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use orderly_core::history::HistoryKind;
use orderly_core::step::{StepStatus, idempotency_key};
use orderly_core::store::{
    ClaimRequest, ClaimedOrder, Completion, OrderFilter, RecoveryOutcome, RecoveryPolicy,
    StateStore, StepUpdate, SubmitOutcome,
};
use orderly_core::{
    Actor, Clock, Epoch, Error, Fence, InstanceId, ManualClock, OrderId, ProcessState, StateRow,
};

use crate::builders;

mod leadership;
mod operations;
mod services;
mod workflow;

pub use leadership::*;
pub use operations::*;
pub use services::*;
pub use workflow::*;

/// Opens handles on one database under test.
#[async_trait]
pub trait StoreFactory: Send + Sync {
    /// A new independent handle on the same database, reading the context's clock.
    async fn open(&self) -> Arc<dyn StateStore>;
    /// Removes the database (called when a case passed; a failed one is kept to inspect).
    async fn cleanup(&self) {}
}

/// What a conformance case gets.
pub struct Ctx {
    /// The clock every handle reads.
    pub clock: ManualClock,
    /// Opens handles.
    pub factory: Box<dyn StoreFactory>,
}

impl Ctx {
    /// A new handle on the database.
    pub async fn store(&self) -> Arc<dyn StateStore> {
        self.factory.open().await
    }
}

/// Stamps out every conformance case as a `#[tokio::test]`; `$fixture` is an async fn
/// returning a fresh [`Ctx`].
#[macro_export]
macro_rules! store_conformance {
    ($fixture:path) => {
        $crate::store_conformance!(@cases $fixture;
            submit_creates_a_pending_unlocked_row_with_its_first_history_event,
            duplicate_submit_changes_nothing_and_says_so,
            same_id_with_other_details_is_a_conflict_and_changes_nothing,
            invalid_requests_are_refused_naming_the_field,
            claim_takes_due_orders_oldest_first_and_raises_the_epoch,
            eight_concurrent_claimers_claim_each_of_1000_orders_exactly_once,
            stale_owner_cannot_complete_fail_extend_release_or_record_a_step,
            owner_past_its_deadline_is_refused_and_the_row_untouched,
            complete_many_completes_what_it_owns_and_refuses_the_rest,
            record_step_advances_the_workflow_with_a_stable_idempotency_key,
            extend_moves_the_deadline_forward_never_back,
            release_hands_an_order_back_without_counting_a_failure,
            find_expired_lists_only_overdue_processing_orders_most_overdue_first,
            three_concurrent_recoverers_count_each_expiry_once_and_stop_at_the_threshold,
            recovered_order_is_not_claimable_before_its_next_attempt_time,
            illegal_transitions_are_refused_with_a_typed_error,
            resubmit_sends_an_error_order_round_again_with_a_fresh_failure_budget,
            cancel_fences_out_the_owner_and_records_who_and_why,
            list_filters_by_state_and_error_text_and_pages_without_gaps,
            count_by_state_counts_every_state,
            finished_since_counts_orders_that_finished_in_the_window,
            record_steps_applies_each_write_or_refuses_it_alone,
            resume_owned_takes_back_live_orders_under_a_new_epoch,
            a_compensating_order_ends_cancelled_only_through_its_owner,
            request_cancel_undoes_started_work_and_cancels_untouched_orders_at_once,
            a_cancel_past_a_step_that_cannot_be_undone_is_refused_naming_it,
            every_error_raises_one_alert_which_is_published_once,
            submit_many_records_a_batch_and_judges_each_order_alone,
            a_waiting_claimer_is_woken_by_a_submit_and_a_release,
            owned_lists_what_an_owner_holds_and_release_hands_it_back,
            a_retry_after_compensation_is_a_fresh_run_under_the_next_generation,
            giving_up_undoes_the_steps_done_first,
            recording_the_last_step_completes_the_order_in_the_same_write,
            a_claim_and_its_first_step_commit_together,
            claims_take_only_loaded_workflows_and_pin_new_orders,
            orders_move_only_to_a_stored_compatible_version_and_say_so,
            every_new_term_has_a_larger_epoch,
            a_deposed_leaders_writes_are_refused_and_change_nothing,
            the_sql_lease_has_one_holder_until_it_expires_on_the_store_clock,
            a_released_sql_lease_is_taken_at_once,
            eight_racing_acquirers_get_one_sql_lease,
            an_outage_begins_once_however_many_agents_report_it,
            a_parked_order_waits_uncounted_until_its_service_is_back,
            parking_for_a_service_that_is_up_releases_the_order_at_once,
            one_of_many_racing_schedulers_lets_the_probe_through,
            each_outage_is_announced_once_by_the_leader,
            activity_counts_each_minute_by_outcome_with_latencies,
            a_condition_is_raised_and_resolved_once_per_episode,
            the_oldest_pending_order_leaves_out_orders_waiting_for_a_service,
            presence_lists_the_instances_seen_recently,
            orders_are_found_by_customer_and_by_id_prefix,
        );
    };
    (@cases $fixture:path; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let ctx = $fixture().await;
                $crate::store::$case(&ctx).await;
                ctx.factory.cleanup().await;
            }
        )*
    };
}

pub(crate) const MINUTE: Duration = Duration::from_secs(60);

pub(crate) fn owner(name: &str) -> InstanceId {
    InstanceId::parse(format!("scheduler-{name}")).expect("valid instance id")
}

fn claim_req(who: &InstanceId, limit: u32, timeout: Duration) -> ClaimRequest {
    ClaimRequest {
        workflows: Default::default(),
        owner: who.clone(),
        limit,
        timeout,
    }
}

pub(crate) async fn submit_n(store: &dyn StateStore, n: u64) -> Vec<OrderId> {
    let mut ids = Vec::new();
    for i in 0..n {
        let order = builders::order(i);
        assert_eq!(
            store
                .submit(&order, &builders::submitter(), &[])
                .await
                .expect("submit"),
            SubmitOutcome::Accepted
        );
        ids.push(order.order_id);
    }
    ids
}

pub(crate) async fn row(store: &dyn StateStore, id: &OrderId) -> StateRow {
    store.get(id).await.expect("get").state
}

pub(crate) async fn claim_one(
    store: &dyn StateStore,
    who: &InstanceId,
    timeout: Duration,
) -> ClaimedOrder {
    let mut claimed = store
        .claim(&claim_req(who, 1, timeout))
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 1, "expected one claimable order");
    claimed.remove(0)
}

pub(crate) fn policy(max_failures: i32, base_secs: u64) -> RecoveryPolicy {
    RecoveryPolicy {
        max_failures,
        backoff_base: Duration::from_secs(base_secs),
        backoff_max: Duration::from_secs(base_secs * 100),
        max_undo_failures: 0,
    }
}

pub(crate) fn supervisor(n: usize) -> InstanceId {
    InstanceId::parse(format!("supervisor-{n}")).expect("valid instance id")
}

/// Makes `supervisor(n)` the leader: a new term of the `supervisor` leadership.
pub(crate) async fn leader(store: &dyn StateStore, n: usize) -> orderly_core::leader::LeaderFence {
    store
        .begin_term(SUPERVISOR, &supervisor(n))
        .await
        .expect("begin a term")
}

/// The leadership the supervisors elect.
pub(crate) const SUPERVISOR: &str = "supervisor";

/// Submit stores order, state row and the first history entry together.
pub async fn submit_creates_a_pending_unlocked_row_with_its_first_history_event(ctx: &Ctx) {
    let store = ctx.store().await;
    let mut order = builders::order(1);
    order.reply_to = Some("client-42-replies".into());
    assert_eq!(
        store
            .submit(&order, &builders::submitter(), &[])
            .await
            .unwrap(),
        SubmitOutcome::Accepted
    );
    let view = store.get(&order.order_id).await.unwrap();
    let s = &view.state;
    assert_eq!(s.process_state, ProcessState::Pending);
    assert_eq!(s.locked_by, None);
    assert_eq!(s.complete_by, None);
    assert_eq!(s.failure_count, 0);
    assert_eq!(s.lock_epoch, Epoch(0));
    assert_eq!(s.reply_to.as_deref(), Some("client-42-replies"));
    assert_eq!(s.created_at, ctx.clock.now());
    assert_eq!(view.details, order.details);
    assert_eq!(view.history.len(), 1);
    assert_eq!(view.history[0].kind, HistoryKind::Submitted);
    assert_eq!(view.history[0].actor, builders::submitter());
    assert_eq!(view.history[0].from_state, None);
    assert_eq!(view.history[0].to_state, ProcessState::Pending);
}

/// A redelivered order message is absorbed.
pub async fn duplicate_submit_changes_nothing_and_says_so(ctx: &Ctx) {
    let store = ctx.store().await;
    let order = builders::order(7);
    assert_eq!(
        store
            .submit(&order, &builders::submitter(), &[])
            .await
            .unwrap(),
        SubmitOutcome::Accepted
    );
    let before = store.get(&order.order_id).await.unwrap();
    ctx.clock.advance(MINUTE);
    assert_eq!(
        store
            .submit(&order, &builders::submitter(), &[])
            .await
            .unwrap(),
        SubmitOutcome::Duplicate
    );
    let after = store.get(&order.order_id).await.unwrap();
    assert_eq!(after.state, before.state);
    assert_eq!(after.history, before.history);
}

/// The same id with other details is a client error, not a silent overwrite.
pub async fn same_id_with_other_details_is_a_conflict_and_changes_nothing(ctx: &Ctx) {
    let store = ctx.store().await;
    let first = builders::order_with_id("SO-1", 1);
    store
        .submit(&first, &builders::submitter(), &[])
        .await
        .unwrap();
    let other = builders::order_with_id("SO-1", 2);
    assert_ne!(first.details, other.details);
    assert!(
        matches!(store.submit(&other, &builders::submitter(), &[]).await, Err(Error::OrderIdConflict(id)) if id.as_str() == "SO-1")
    );
    assert_eq!(
        store.get(&first.order_id).await.unwrap().details,
        first.details
    );
}

/// Requests outside the contract are refused before touching the store.
pub async fn invalid_requests_are_refused_naming_the_field(ctx: &Ctx) {
    let store = ctx.store().await;
    let mut order = builders::order(1);
    order.reply_to = Some(String::new());
    assert!(
        matches!(store.submit(&order, &builders::submitter(), &[]).await, Err(Error::Invalid(e)) if e.field == "reply_to")
    );
    let who = owner("a");
    assert!(
        matches!(store.claim(&claim_req(&who, 0, MINUTE)).await, Err(Error::Invalid(e)) if e.field == "limit")
    );
    assert!(matches!(
        store.claim(&claim_req(&who, 1, Duration::ZERO)).await,
        Err(Error::Invalid(e)) if e.field == "timeout"
    ));
    let bad = RecoveryPolicy {
        max_failures: 0,
        ..RecoveryPolicy::default()
    };
    assert!(matches!(
        store.recover_expired(&leader(&*store, 1).await, &bad, 10).await,
        Err(Error::Invalid(e)) if e.field == "max_failures"
    ));
    assert_eq!(
        store
            .count_by_state()
            .await
            .unwrap()
            .iter()
            .map(|(_, n)| n)
            .sum::<i64>(),
        0
    );
}

/// A claim locks due Pending orders for the caller until now + timeout.
pub async fn claim_takes_due_orders_oldest_first_and_raises_the_epoch(ctx: &Ctx) {
    let store = ctx.store().await;
    let mut ids = Vec::new();
    for i in 0..3 {
        let mut order = builders::order(i);
        order.reply_to = Some(format!("replies-{i}"));
        store
            .submit(&order, &builders::submitter(), &[])
            .await
            .unwrap();
        ids.push(order.order_id);
        ctx.clock.advance(Duration::from_secs(1));
    }
    let who = owner("a");
    let claimed = store.claim(&claim_req(&who, 2, MINUTE)).await.unwrap();
    let got: HashSet<_> = claimed.iter().map(|c| c.fence.order_id.clone()).collect();
    assert_eq!(
        got,
        ids[..2].iter().cloned().collect::<HashSet<_>>(),
        "the two oldest"
    );
    for c in &claimed {
        assert_eq!(c.fence.owner, who);
        assert_eq!(c.fence.epoch, Epoch(1));
        assert_eq!(
            c.complete_by,
            ctx.clock.now() + chrono::Duration::seconds(60)
        );
        assert_eq!(c.failure_count, 0);
        assert_eq!(c.current_step, 0);
        let i: usize = ids.iter().position(|id| *id == c.fence.order_id).unwrap();
        assert_eq!(c.details, builders::details(i as u64));
        assert_eq!(c.reply_to.as_deref(), Some(format!("replies-{i}").as_str()));
        let r = row(&*store, &c.fence.order_id).await;
        assert_eq!(r.process_state, ProcessState::Processing);
        assert_eq!(r.locked_by.as_ref(), Some(&who));
        assert_eq!(r.complete_by, Some(c.complete_by));
    }
    let rest = store
        .claim(&claim_req(&owner("b"), 10, MINUTE))
        .await
        .unwrap();
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].fence.order_id, ids[2]);
    assert!(
        store
            .claim(&claim_req(&owner("c"), 10, MINUTE))
            .await
            .unwrap()
            .is_empty()
    );
}

/// Claims are exclusive under real concurrency: 8 independent handles race.
pub async fn eight_concurrent_claimers_claim_each_of_1000_orders_exactly_once(ctx: &Ctx) {
    let store = ctx.store().await;
    // Submit from 4 handles at once to keep set-up short.
    let mut submitters = Vec::new();
    for s in 0..4u64 {
        let handle = ctx.store().await;
        submitters.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in 0..250 {
                let order = builders::order(s * 1000 + i);
                handle
                    .submit(&order, &builders::submitter(), &[])
                    .await
                    .unwrap();
                ids.push(order.order_id);
            }
            ids
        }));
    }
    let mut submitted = HashSet::new();
    for s in submitters {
        submitted.extend(s.await.unwrap());
    }
    assert_eq!(submitted.len(), 1000);

    let mut claimers = Vec::new();
    for c in 0..8 {
        let handle = ctx.store().await;
        let who = owner(&format!("c{c}"));
        claimers.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let batch = handle.claim(&claim_req(&who, 7, MINUTE)).await.unwrap();
                if batch.is_empty() {
                    break;
                }
                mine.extend(batch.into_iter().map(|c| c.fence));
            }
            mine
        }));
    }
    let mut by_order: HashMap<OrderId, Vec<Fence>> = HashMap::new();
    for c in claimers {
        for fence in c.await.unwrap() {
            by_order
                .entry(fence.order_id.clone())
                .or_default()
                .push(fence);
        }
    }
    assert_eq!(by_order.len(), 1000, "every order claimed");
    let twice: Vec<_> = by_order.iter().filter(|(_, f)| f.len() > 1).collect();
    assert!(
        twice.is_empty(),
        "{} orders claimed more than once, e.g. {:?}",
        twice.len(),
        twice.iter().take(2).collect::<Vec<_>>()
    );
    assert_eq!(by_order.keys().cloned().collect::<HashSet<_>>(), submitted);
    // The store agrees with what each claimer believes, and history shows one claim each.
    for (id, fences) in by_order.iter().take(50) {
        let view = store.get(id).await.unwrap();
        assert_eq!(view.state.locked_by.as_ref(), Some(&fences[0].owner));
        assert_eq!(view.state.lock_epoch, Epoch(1));
        assert_eq!(view.history_count(HistoryKind::Claimed), 1);
    }
    let counts: HashMap<_, _> = store.count_by_state().await.unwrap().into_iter().collect();
    assert_eq!(counts[&ProcessState::Processing], 1000);
    assert_eq!(counts[&ProcessState::Pending], 0);
}

/// Fencing: a deposed owner's writes are refused with a typed error and change nothing.
pub async fn stale_owner_cannot_complete_fail_extend_release_or_record_a_step(ctx: &Ctx) {
    let store = ctx.store().await;
    let id = submit_n(&*store, 1).await.remove(0);
    let (a, b) = (owner("a"), owner("b"));
    let first = claim_one(&*store, &a, MINUTE).await;
    ctx.clock.advance(MINUTE + Duration::from_secs(1));
    let recovered = store
        .recover_expired(&leader(&*store, 1).await, &policy(5, 1), 10)
        .await
        .unwrap();
    assert_eq!(recovered.len(), 1);
    ctx.clock.advance(Duration::from_secs(1));
    let second = claim_one(&*store, &b, MINUTE).await;
    assert_eq!(second.fence.epoch, Epoch(2));

    // Another owner holds the order now.
    every_write_is_fenced(&*store, &first.fence, &b, Epoch(2)).await;

    // The same instance with an older epoch is just as stale.
    store.release(&second.fence, "handing back").await.unwrap();
    let third = claim_one(&*store, &b, MINUTE).await;
    assert_eq!(third.fence.epoch, Epoch(3));
    every_write_is_fenced(&*store, &second.fence, &b, Epoch(3)).await;

    // Another instance naming the current epoch is refused too: the owner is part of
    // the fence, not only the epoch.
    let forged = Fence {
        owner: a.clone(),
        ..third.fence.clone()
    };
    every_write_is_fenced(&*store, &forged, &b, Epoch(3)).await;
    store.complete(&third.fence, &[]).await.unwrap();
    assert_eq!(
        row(&*store, &id).await.process_state,
        ProcessState::Processed
    );
}

/// Tries every owner write with `stale` and checks each is refused as Fenced (the row
/// held by `holder` at `row_epoch`) and that nothing about the order changed.
async fn every_write_is_fenced(
    store: &dyn StateStore,
    stale: &Fence,
    holder: &InstanceId,
    row_epoch: Epoch,
) {
    let before = store.get(&stale.order_id).await.unwrap();
    let fenced = |what: &str, r: Result<(), Error>| match r {
        Err(Error::Fenced {
            row_epoch: e,
            holder: h,
            ..
        }) => {
            assert_eq!((e, h.as_ref()), (row_epoch, Some(holder)), "{what}");
        }
        other => panic!("{what}: expected Fenced, got {other:?}"),
    };
    fenced("complete", store.complete(stale, &[]).await);
    fenced("fail", store.fail(stale, "late failure", &[]).await);
    fenced("extend", store.extend(stale, MINUTE).await.map(|_| ()));
    fenced("release", store.release(stale, "late release").await);
    let step = StepUpdate {
        index: 0,
        name: "reserve-inventory".into(),
        status: StepStatus::Succeeded,
        detail: None,
        idempotency_key: "late-key".into(),
        irreversible: false,
    };
    fenced(
        "record_step",
        store.record_step(stale, &step, &[]).await.map(|_| ()),
    );
    let outcome = store
        .complete_many(&[Completion::from(stale.clone())])
        .await
        .unwrap();
    assert!(outcome.completed.is_empty());
    let after = store.get(&stale.order_id).await.unwrap();
    assert_eq!(after.state, before.state, "row untouched");
    assert_eq!(after.steps, before.steps);
    assert_eq!(after.history, before.history, "nothing recorded");
}

/// Once CompleteBy passes only the supervisor may act on the order.
pub async fn owner_past_its_deadline_is_refused_and_the_row_untouched(ctx: &Ctx) {
    let store = ctx.store().await;
    let id = submit_n(&*store, 1).await.remove(0);
    let claimed = claim_one(&*store, &owner("a"), MINUTE).await;
    ctx.clock.advance(MINUTE);
    let before = row(&*store, &id).await;
    for result in [
        store.complete(&claimed.fence, &[]).await,
        store.fail(&claimed.fence, "too late", &[]).await,
        store.extend(&claimed.fence, MINUTE).await.map(|_| ()),
    ] {
        match result {
            Err(Error::DeadlinePassed { complete_by, .. }) => {
                assert_eq!(complete_by, claimed.complete_by)
            }
            other => panic!("expected DeadlinePassed, got {other:?}"),
        }
    }
    assert_eq!(row(&*store, &id).await, before);
}

/// Batched completion: one transaction, per-order verdicts.
pub async fn complete_many_completes_what_it_owns_and_refuses_the_rest(ctx: &Ctx) {
    let store = ctx.store().await;
    submit_n(&*store, 5).await;
    let a = owner("a");
    let claimed = store.claim(&claim_req(&a, 5, MINUTE)).await.unwrap();
    assert_eq!(claimed.len(), 5);
    let mut fences: Vec<Fence> = claimed.iter().map(|c| c.fence.clone()).collect();
    // One fence is forged with a wrong epoch; one names an order that does not exist.
    fences[4].epoch = Epoch(99);
    fences.push(Fence {
        order_id: OrderId::parse("no-such-order").unwrap(),
        owner: a.clone(),
        epoch: Epoch(1),
    });
    fences.push(fences[0].clone()); // the same fence twice counts once
    let completions: Vec<Completion> = fences.iter().cloned().map(Completion::from).collect();
    let outcome = store.complete_many(&completions).await.unwrap();
    assert_eq!(outcome.completed.len(), 4);
    assert_eq!(outcome.refused.len(), 2);
    assert!(
        outcome
            .refused
            .iter()
            .any(|(id, e)| *id == fences[4].order_id && matches!(e, Error::Fenced { .. }))
    );
    assert!(
        outcome
            .refused
            .iter()
            .any(|(_, e)| matches!(e, Error::OrderNotFound(_)))
    );
    for id in &outcome.completed {
        let view = store.get(id).await.unwrap();
        assert_eq!(view.state.process_state, ProcessState::Processed);
        assert_eq!(view.state.locked_by, None);
        assert_eq!(view.state.complete_by, None);
        let last = view.history.last().unwrap();
        assert_eq!(
            (last.kind, last.actor.as_str()),
            (HistoryKind::Completed, a.as_str())
        );
    }
    assert_eq!(
        row(&*store, &fences[4].order_id).await.process_state,
        ProcessState::Processing
    );
}

/// Steps: attempts counted, current_step advanced on success, the key never changes.
pub async fn record_step_advances_the_workflow_with_a_stable_idempotency_key(ctx: &Ctx) {
    let store = ctx.store().await;
    let id = submit_n(&*store, 1).await.remove(0);
    let first = claim_one(&*store, &owner("a"), MINUTE).await;
    let step = |index: i32, name: &str, status: StepStatus, detail: Option<&str>| StepUpdate {
        index,
        name: name.into(),
        status,
        detail: detail.map(str::to_owned),
        idempotency_key: idempotency_key(&id, 0, index, name),
        irreversible: false,
    };
    let s0 = store
        .record_step(
            &first.fence,
            &step(0, "reserve-inventory", StepStatus::Started, None),
            &[],
        )
        .await
        .unwrap();
    assert_eq!((s0.attempts, s0.status), (1, StepStatus::Started));
    store
        .record_step(
            &first.fence,
            &step(
                0,
                "reserve-inventory",
                StepStatus::Succeeded,
                Some("{\"hold\":\"h-1\"}"),
            ),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row(&*store, &id).await.current_step, 1);
    let s1 = store
        .record_step(
            &first.fence,
            &step(1, "charge-payment", StepStatus::Started, None),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        s1.idempotency_key,
        idempotency_key(&id, 0, 1, "charge-payment")
    );
    store.release(&first.fence, "shutting down").await.unwrap();

    // Another scheduler resumes at step 1 with the same key; the attempt is counted.
    let second = claim_one(&*store, &owner("b"), MINUTE).await;
    assert_eq!(second.current_step, 1, "done steps are not redone");
    let again = store
        .record_step(
            &second.fence,
            &step(1, "charge-payment", StepStatus::Started, None),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(again.idempotency_key, s1.idempotency_key);
    assert_eq!(again.attempts, 2);
    assert_eq!(again.epoch, second.fence.epoch);
    store
        .record_step(
            &second.fence,
            &step(
                1,
                "charge-payment",
                StepStatus::Failed,
                Some("card declined"),
            ),
            &[],
        )
        .await
        .unwrap();
    let view = store.get(&id).await.unwrap();
    assert_eq!(view.state.current_step, 1, "a failed step does not advance");
    assert_eq!(view.state.last_error.as_deref(), Some("card declined"));
    assert_eq!(view.steps.len(), 2);
    assert_eq!(view.steps[0].status, StepStatus::Succeeded);
    assert_eq!(view.steps[0].detail.as_deref(), Some("{\"hold\":\"h-1\"}"));
    assert_eq!(view.steps[1].status, StepStatus::Failed);
    let kinds: Vec<_> = view.history.iter().map(|h| h.kind).collect();
    assert_eq!(
        kinds,
        [
            HistoryKind::Submitted,
            HistoryKind::Claimed,
            HistoryKind::StepStarted,
            HistoryKind::StepSucceeded,
            HistoryKind::StepStarted,
            HistoryKind::Released,
            HistoryKind::Claimed,
            HistoryKind::StepStarted,
            HistoryKind::StepFailed,
        ]
    );
    assert!(
        view.history
            .windows(2)
            .all(|w| w[0].seq < w[1].seq && w[0].at <= w[1].at)
    );
}

/// A heartbeat pushes the deadline; it never pulls it in.
pub async fn extend_moves_the_deadline_forward_never_back(ctx: &Ctx) {
    let store = ctx.store().await;
    let id = submit_n(&*store, 1).await.remove(0);
    let claimed = claim_one(&*store, &owner("a"), MINUTE).await;
    ctx.clock.advance(Duration::from_secs(50));
    let extended = store.extend(&claimed.fence, MINUTE).await.unwrap();
    assert_eq!(extended, ctx.clock.now() + chrono::Duration::seconds(60));
    let unchanged = store
        .extend(&claimed.fence, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(unchanged, extended);
    ctx.clock.advance(Duration::from_secs(30));
    assert!(
        store.find_expired(10).await.unwrap().is_empty(),
        "the original deadline has passed, the new one not"
    );
    store.complete(&claimed.fence, &[]).await.unwrap();
    assert_eq!(
        row(&*store, &id).await.process_state,
        ProcessState::Processed
    );
}

/// Release is a clean hand-back: Pending, due at once, FailureCount unchanged.
pub async fn release_hands_an_order_back_without_counting_a_failure(ctx: &Ctx) {
    let store = ctx.store().await;
    let id = submit_n(&*store, 1).await.remove(0);
    let claimed = claim_one(&*store, &owner("a"), MINUTE).await;
    store
        .release(&claimed.fence, "graceful shutdown")
        .await
        .unwrap();
    let r = row(&*store, &id).await;
    assert_eq!(
        (r.process_state, r.failure_count, r.locked_by.clone()),
        (ProcessState::Pending, 0, None)
    );
    let again = claim_one(&*store, &owner("b"), MINUTE).await;
    assert_eq!(again.fence.epoch, Epoch(2));
}

/// The sweep query sees exactly the Processing rows whose deadline is behind.
pub async fn find_expired_lists_only_overdue_processing_orders_most_overdue_first(ctx: &Ctx) {
    let store = ctx.store().await;
    submit_n(&*store, 4).await;
    let a = owner("a");
    let c10 = claim_one(&*store, &a, Duration::from_secs(10)).await;
    let c20 = claim_one(&*store, &a, Duration::from_secs(20)).await;
    let c30 = claim_one(&*store, &a, Duration::from_secs(30)).await;
    ctx.clock.advance(Duration::from_secs(25));
    let expired = store.find_expired(10).await.unwrap();
    let ids: Vec<_> = expired.iter().map(|e| e.order_id.clone()).collect();
    assert_eq!(
        ids,
        [c10.fence.order_id.clone(), c20.fence.order_id.clone()]
    );
    assert_eq!(expired[0].locked_by, a.as_str());
    assert_eq!(expired[0].lock_epoch, c10.fence.epoch);
    assert_eq!(expired[0].complete_by, c10.complete_by);
    assert_eq!(store.find_expired(1).await.unwrap().len(), 1);
    assert!(!ids.contains(&c30.fence.order_id));
}

/// Invariant 5: several supervisors, each expiry counted exactly once, Error at the
/// threshold and never beyond.
pub async fn three_concurrent_recoverers_count_each_expiry_once_and_stop_at_the_threshold(
    ctx: &Ctx,
) {
    let store = ctx.store().await;
    let ids: HashSet<OrderId> = submit_n(&*store, 40).await.into_iter().collect();
    let handles = [ctx.store().await, ctx.store().await, ctx.store().await];
    let max = 3;
    for round in 1..=max {
        let claimed = store
            .claim(&claim_req(&owner("a"), 100, MINUTE))
            .await
            .unwrap();
        assert_eq!(
            claimed.len(),
            40,
            "round {round}: every order claimable again"
        );
        ctx.clock.advance(MINUTE + Duration::from_secs(1));
        // Overlapping sweeps of one leader (a slow sweep and the next tick's): the
        // store still counts each expiry once.
        let term = leader(&*store, 0).await;
        let mut tasks = Vec::new();
        for handle in &handles {
            let (handle, term) = (handle.clone(), term.clone());
            tasks.push(tokio::spawn(async move {
                let mut all = Vec::new();
                loop {
                    let batch = handle
                        .recover_expired(&term, &policy(max, 1), 7)
                        .await
                        .unwrap();
                    if batch.is_empty() {
                        break all;
                    }
                    all.extend(batch);
                }
            }));
        }
        let mut seen: HashMap<OrderId, RecoveryOutcome> = HashMap::new();
        for t in tasks {
            for r in t.await.unwrap() {
                let dup = seen.insert(r.order_id().clone(), r);
                assert!(
                    dup.is_none(),
                    "round {round}: one expiry recovered twice: {dup:?}"
                );
            }
        }
        assert_eq!(seen.keys().cloned().collect::<HashSet<_>>(), ids);
        for id in &ids {
            let r = row(&*store, id).await;
            assert_eq!(
                r.failure_count, round,
                "round {round}: counted exactly once"
            );
            let expected = if round < max {
                ProcessState::Pending
            } else {
                ProcessState::Error
            };
            assert_eq!(r.process_state, expected);
            assert_eq!(r.locked_by, None);
            match &seen[id] {
                RecoveryOutcome::Retried { failure_count, .. } => {
                    assert!(round < max && *failure_count == round)
                }
                RecoveryOutcome::GaveUp { failure_count, .. } => {
                    assert!(round == max && *failure_count == max)
                }
                RecoveryOutcome::Undoing { .. } => panic!("no step was started: nothing to undo"),
                RecoveryOutcome::Waiting { .. } => panic!("no service is down: nothing waits"),
            }
        }
        ctx.clock.advance(Duration::from_secs(300));
    }
    // Beyond the threshold nothing moves: Error orders are neither claimable nor recovered.
    assert!(
        store
            .claim(&claim_req(&owner("a"), 100, MINUTE))
            .await
            .unwrap()
            .is_empty()
    );
    ctx.clock.advance(Duration::from_secs(3600));
    assert!(
        store
            .recover_expired(&leader(&*store, 0).await, &policy(max, 1), 100)
            .await
            .unwrap()
            .is_empty()
    );
    let sample = ids.iter().next().unwrap();
    let view = store.get(sample).await.unwrap();
    assert_eq!(view.state.failure_count, max);
    assert!(
        view.state
            .last_error
            .as_deref()
            .unwrap()
            .contains("deadline passed")
    );
    let kinds: Vec<_> = view
        .history
        .iter()
        .map(|h| h.kind)
        .filter(|k| *k != HistoryKind::Claimed)
        .collect();
    assert_eq!(
        kinds,
        [
            HistoryKind::Submitted,
            HistoryKind::Recovered,
            HistoryKind::Recovered,
            HistoryKind::GaveUp
        ]
    );
}

/// Back-off: a recovered order waits base * 2^(failures - 1) before it can be claimed.
pub async fn recovered_order_is_not_claimable_before_its_next_attempt_time(ctx: &Ctx) {
    let store = ctx.store().await;
    let id = submit_n(&*store, 1).await.remove(0);
    let a = owner("a");
    let p = policy(5, 10);
    let mut expected_wait = 10;
    for failures in 1..=2 {
        claim_one(&*store, &a, MINUTE).await;
        ctx.clock.advance(MINUTE + Duration::from_secs(1));
        let recovered = store
            .recover_expired(&leader(&*store, 1).await, &p, 10)
            .await
            .unwrap();
        let now = ctx.clock.now();
        match &recovered[..] {
            [
                RecoveryOutcome::Retried {
                    failure_count,
                    next_attempt_at,
                    ..
                },
            ] => {
                assert_eq!(*failure_count, failures);
                assert_eq!(
                    *next_attempt_at,
                    now + chrono::Duration::seconds(expected_wait)
                );
            }
            other => panic!("expected one retry, got {other:?}"),
        }
        assert_eq!(
            row(&*store, &id).await.next_attempt_at,
            now + chrono::Duration::seconds(expected_wait)
        );
        assert!(
            store
                .claim(&claim_req(&a, 10, MINUTE))
                .await
                .unwrap()
                .is_empty(),
            "not due yet"
        );
        ctx.clock
            .advance(Duration::from_secs(expected_wait as u64 - 1));
        assert!(
            store
                .claim(&claim_req(&a, 10, MINUTE))
                .await
                .unwrap()
                .is_empty(),
            "one second early"
        );
        ctx.clock.advance(Duration::from_secs(1));
        let due = store.claim(&claim_req(&a, 10, MINUTE)).await.unwrap();
        assert_eq!(due.len(), 1, "due exactly at its next attempt time");
        store.release(&due[0].fence, "test").await.unwrap();
        expected_wait *= 2;
    }
}

/// The state machine is enforced by the store, with typed errors.
pub async fn illegal_transitions_are_refused_with_a_typed_error(ctx: &Ctx) {
    let store = ctx.store().await;
    let ids = submit_n(&*store, 2).await;
    let alice = Actor::operator("alice");
    let illegal = |r: Result<StateRow, Error>, from: ProcessState, to: ProcessState| match r {
        Err(Error::IllegalTransition { from: f, to: t, .. }) => assert_eq!((f, t), (from, to)),
        other => panic!("expected IllegalTransition {from} -> {to}, got {other:?}"),
    };
    illegal(
        store.resubmit(&ids[0], &alice, "why not", &[]).await,
        ProcessState::Pending,
        ProcessState::Pending,
    );
    let claimed = claim_one(&*store, &owner("a"), MINUTE).await;
    store.complete(&claimed.fence, &[]).await.unwrap();
    let done = &claimed.fence.order_id;
    let before = store.get(done).await.unwrap();
    illegal(
        store.resubmit(done, &alice, "again", &[]).await,
        ProcessState::Processed,
        ProcessState::Pending,
    );
    illegal(
        store.cancel(done, &alice, "oops", &[]).await,
        ProcessState::Processed,
        ProcessState::Cancelled,
    );
    assert!(matches!(
        store.complete(&claimed.fence, &[]).await,
        Err(Error::Fenced {
            state: ProcessState::Processed,
            ..
        })
    ));
    let after = store.get(done).await.unwrap();
    assert_eq!(
        (after.state, after.history.len()),
        (before.state, before.history.len())
    );

    let other = ids.iter().find(|id| *id != done).unwrap();
    store
        .cancel(other, &alice, "customer asked", &[])
        .await
        .unwrap();
    illegal(
        store.resubmit(other, &alice, "undo", &[]).await,
        ProcessState::Cancelled,
        ProcessState::Pending,
    );
    illegal(
        store.cancel(other, &alice, "twice", &[]).await,
        ProcessState::Cancelled,
        ProcessState::Cancelled,
    );
    let missing = OrderId::parse("missing").unwrap();
    assert!(matches!(
        store.get(&missing).await,
        Err(Error::OrderNotFound(_))
    ));
    assert!(matches!(
        store.cancel(&missing, &alice, "x", &[]).await,
        Err(Error::OrderNotFound(_))
    ));
}

/// Operators retry an Error order: Pending, due now, a fresh failure budget, history kept.
pub async fn resubmit_sends_an_error_order_round_again_with_a_fresh_failure_budget(ctx: &Ctx) {
    let store = ctx.store().await;
    let id = submit_n(&*store, 1).await.remove(0);
    let claimed = claim_one(&*store, &owner("a"), MINUTE).await;
    ctx.clock.advance(MINUTE + Duration::from_secs(1));
    store
        .recover_expired(&leader(&*store, 1).await, &policy(5, 1), 10)
        .await
        .unwrap();
    ctx.clock.advance(Duration::from_secs(5));
    let again = claim_one(&*store, &owner("a"), MINUTE).await;
    assert_eq!(again.failure_count, 1);
    store
        .fail(
            &again.fence,
            "payment service: card permanently declined",
            &[],
        )
        .await
        .unwrap();
    let failed = row(&*store, &id).await;
    assert_eq!(failed.process_state, ProcessState::Error);
    assert_eq!(
        failed.failure_count, 2,
        "one timeout, then one permanent failure"
    );
    assert_eq!(
        failed.last_error.as_deref(),
        Some("payment service: card permanently declined")
    );
    assert!(matches!(
        store.complete(&claimed.fence, &[]).await,
        Err(Error::Fenced { .. })
    ));

    let resubmitted = store
        .resubmit(&id, &Actor::operator("bob"), "card replaced", &[])
        .await
        .unwrap();
    assert_eq!(resubmitted.process_state, ProcessState::Pending);
    assert_eq!(resubmitted.failure_count, 0);
    assert_eq!(resubmitted.next_attempt_at, ctx.clock.now());
    let third = claim_one(&*store, &owner("b"), MINUTE).await;
    assert_eq!(third.fence.epoch, Epoch(3));
    let last = store.get(&id).await.unwrap().history;
    let r = last
        .iter()
        .find(|h| h.kind == HistoryKind::Resubmitted)
        .unwrap();
    assert_eq!(
        (r.actor.as_str(), r.reason.as_deref()),
        ("operator:bob", Some("card replaced"))
    );
    assert_eq!(
        (r.from_state, r.to_state),
        (Some(ProcessState::Error), ProcessState::Pending)
    );
}

/// Cancelling a Processing order takes it from its owner at once.
pub async fn cancel_fences_out_the_owner_and_records_who_and_why(ctx: &Ctx) {
    let store = ctx.store().await;
    let id = submit_n(&*store, 1).await.remove(0);
    let claimed = claim_one(&*store, &owner("a"), MINUTE).await;
    let cancelled = store
        .cancel(&id, &Actor::operator("carol"), "fraud suspected", &[])
        .await
        .unwrap();
    assert_eq!(cancelled.process_state, ProcessState::Cancelled);
    assert_eq!((cancelled.locked_by, cancelled.complete_by), (None, None));
    assert!(matches!(
        store.complete(&claimed.fence, &[]).await,
        Err(Error::Fenced { holder: None, .. })
    ));
    ctx.clock.advance(MINUTE * 2);
    assert!(
        store
            .recover_expired(&leader(&*store, 1).await, &policy(5, 1), 10)
            .await
            .unwrap()
            .is_empty()
    );
    let view = store.get(&id).await.unwrap();
    let last = view.history.last().unwrap();
    assert_eq!(last.kind, HistoryKind::Cancelled);
    assert_eq!(
        (last.actor.as_str(), last.reason.as_deref()),
        ("operator:carol", Some("fraud suspected"))
    );
    assert_eq!(last.from_state, Some(ProcessState::Processing));
}

/// Triage lists: filters combine, pages follow each other with no gap and no repeat.
pub async fn list_filters_by_state_and_error_text_and_pages_without_gaps(ctx: &Ctx) {
    let store = ctx.store().await;
    let start = ctx.clock.now();
    let mut all = Vec::new();
    for i in 0..25u64 {
        let order = builders::order(i);
        store
            .submit(&order, &builders::submitter(), &[])
            .await
            .unwrap();
        all.push(order.order_id);
        if i % 4 == 0 {
            ctx.clock.advance(Duration::from_secs(1)); // several orders share a created_at
        }
    }
    let a = owner("a");
    let mut declined = HashSet::new();
    for n in 0..6 {
        let c = claim_one(&*store, &a, MINUTE).await;
        let error = if n % 2 == 0 {
            "Payment DECLINED by issuer"
        } else {
            "out of stock: 100%_sure"
        };
        store.fail(&c.fence, error, &[]).await.unwrap();
        if n % 2 == 0 {
            declined.insert(c.fence.order_id);
        }
    }
    let errors = store
        .list(&OrderFilter {
            state: Some(ProcessState::Error),
            error_contains: Some("declined".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        errors
            .orders
            .iter()
            .map(|o| o.order_id.clone())
            .collect::<HashSet<_>>(),
        declined
    );
    assert!(errors.next.is_none());
    let literal = store
        .list(&OrderFilter {
            error_contains: Some("100%_s".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(literal.orders.len(), 3, "% and _ are matched literally");
    let wildcard = store
        .list(&OrderFilter {
            error_contains: Some("1_0".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(wildcard.orders.is_empty());

    let mut paged = Vec::new();
    let mut filter = OrderFilter {
        limit: 10,
        ..Default::default()
    };
    let mut pages = 0;
    loop {
        let page = store.list(&filter).await.unwrap();
        pages += 1;
        paged.extend(page.orders.iter().map(|o| o.order_id.clone()));
        match page.next {
            Some(cursor) => filter.after = Some(cursor),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(paged.len(), 25);
    assert_eq!(
        paged.iter().collect::<HashSet<_>>(),
        all.iter().collect::<HashSet<_>>()
    );
    let pending = store
        .list(&OrderFilter {
            state: Some(ProcessState::Pending),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(pending.orders.len(), 19);
    assert!(
        pending
            .orders
            .windows(2)
            .all(|w| (w[0].created_at, &w[0].order_id) < (w[1].created_at, &w[1].order_id))
    );
    // One order was created at `start`, four a second later, four more the next second.
    let early = store
        .list(&OrderFilter {
            created_before: Some(start + chrono::Duration::seconds(2)),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(early.orders.len(), 5);
}

/// Throughput: orders that reached a final state at or after a time, by state.
pub async fn finished_since_counts_orders_that_finished_in_the_window(ctx: &Ctx) {
    let store = ctx.store().await;
    submit_n(&*store, 6).await;
    let a = owner("a");
    let early = claim_one(&*store, &a, MINUTE).await;
    store.complete(&early.fence, &[]).await.unwrap();
    ctx.clock.advance(MINUTE);
    let since = ctx.clock.now();
    for _ in 0..2 {
        let c = claim_one(&*store, &a, MINUTE).await;
        store.complete(&c.fence, &[]).await.unwrap();
    }
    let c = claim_one(&*store, &a, MINUTE).await;
    store.fail(&c.fence, "boom", &[]).await.unwrap();
    claim_one(&*store, &a, MINUTE).await;
    let finished = async |since| -> HashMap<ProcessState, i64> {
        store
            .finished_since(since)
            .await
            .unwrap()
            .into_iter()
            .collect()
    };
    let counts = finished(since).await;
    assert_eq!(counts.len(), 3, "every final state is listed, zero or not");
    assert_eq!(
        counts[&ProcessState::Processed],
        2,
        "the one before the window is not counted"
    );
    assert_eq!(counts[&ProcessState::Error], 1);
    assert_eq!(counts[&ProcessState::Cancelled], 0);
    let all = finished(since - chrono::Duration::minutes(2)).await;
    assert_eq!(all[&ProcessState::Processed], 3);
    // An Error order sent round again is no longer finished.
    store
        .resubmit(&c.fence.order_id, &Actor::operator("dan"), "retry", &[])
        .await
        .unwrap();
    assert_eq!(finished(since).await[&ProcessState::Error], 0);
    assert!(
        finished(ctx.clock.now() + chrono::Duration::seconds(1))
            .await
            .values()
            .all(|n| *n == 0)
    );
}

/// The overview counts.
pub async fn count_by_state_counts_every_state(ctx: &Ctx) {
    let store = ctx.store().await;
    let ids = submit_n(&*store, 6).await;
    let a = owner("a");
    let c1 = claim_one(&*store, &a, MINUTE).await;
    store.complete(&c1.fence, &[]).await.unwrap();
    let c2 = claim_one(&*store, &a, MINUTE).await;
    store.fail(&c2.fence, "boom", &[]).await.unwrap();
    let pending = ids
        .iter()
        .find(|id| **id != c1.fence.order_id && **id != c2.fence.order_id)
        .unwrap();
    store
        .cancel(pending, &Actor::operator("dan"), "duplicate order", &[])
        .await
        .unwrap();
    claim_one(&*store, &a, MINUTE).await;
    let counts: HashMap<_, _> = store.count_by_state().await.unwrap().into_iter().collect();
    assert_eq!(counts.len(), 5, "every state is listed, zero or not");
    assert_eq!(counts[&ProcessState::Processed], 1);
    assert_eq!(counts[&ProcessState::Error], 1);
    assert_eq!(counts[&ProcessState::Processing], 1);
    assert_eq!(counts[&ProcessState::Cancelled], 1);
    assert_eq!(counts[&ProcessState::Pending], 2);
}
