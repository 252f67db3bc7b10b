//! The state-store conformance suite. Every case takes a [`Ctx`]: a manual clock the
//! store under test reads, and a factory of independent handles on one fresh database
//! (each handle its own connections, like another process). [`store_conformance!`]
//! stamps every case out as a test for one dialect.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use orderly_core::store::{ClaimRequest, ClaimedOrder, RecoveryPolicy, StateStore, SubmitOutcome};
use orderly_core::{InstanceId, ManualClock, OrderId, StateRow};

use crate::builders;

mod leadership;
mod operations;
mod services;
mod workflow;

pub use leadership::*;
pub use operations::*;
pub use services::*;
pub use workflow::*;

mod claims;
mod intake;
mod operator;
mod recovery;

pub use claims::*;
pub use intake::*;
pub use operator::*;
pub use recovery::*;

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
            sweep_due_tells_what_a_sweep_would_find,
            three_concurrent_recoverers_count_each_expiry_once_and_stop_at_the_threshold,
            recovered_order_is_not_claimable_before_its_next_attempt_time,
            illegal_transitions_are_refused_with_a_typed_error,
            resubmit_sends_an_error_order_round_again_with_a_fresh_failure_budget,
            cancel_fences_out_the_owner_and_records_who_and_why,
            list_filters_by_state_and_error_text_and_pages_without_gaps,
            error_causes_group_error_orders_and_follow_them_as_they_change,
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
            the_message_key_is_created_once_and_shared,
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
