//! Conformance cases for accepting orders: a submit, a repeat, a conflict, and
//! requests outside the contract.

use super::{Ctx, MINUTE, claim_req, leader, owner};
use crate::builders;
use orderly_core::history::HistoryKind;
use orderly_core::store::{RecoveryPolicy, SubmitOutcome};
use orderly_core::{Clock, Epoch, Error, ProcessState};
use std::time::Duration;

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
