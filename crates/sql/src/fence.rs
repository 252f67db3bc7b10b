//! Explaining a refused write. Fenced writes are conditional updates; when one matches
//! no row, the current row says why, and the caller gets a typed error.

use chrono::{DateTime, Utc};
use orderly_core::{Error, Fence, ProcessState, StateRow};

/// Why a write fenced by `fence`, meant to move the order to `target`, was refused,
/// given the row as it is now (`None`: no such order) and the store's `now`.
pub(crate) fn refusal(
    fence: &Fence,
    row: Option<StateRow>,
    now: DateTime<Utc>,
    target: ProcessState,
) -> Error {
    let Some(row) = row else {
        return Error::OrderNotFound(fence.order_id.clone());
    };
    if row.locked_by.as_ref() != Some(&fence.owner) || row.lock_epoch != fence.epoch {
        return Error::Fenced {
            order_id: row.order_id,
            caller: fence.owner.clone(),
            caller_epoch: fence.epoch,
            holder: row.locked_by,
            row_epoch: row.lock_epoch,
            state: row.process_state,
        };
    }
    if row.process_state != ProcessState::Processing {
        return Error::IllegalTransition {
            order_id: row.order_id,
            from: row.process_state,
            to: target,
        };
    }
    match row.complete_by {
        Some(complete_by) if complete_by <= now => Error::DeadlinePassed {
            order_id: row.order_id,
            complete_by,
        },
        // The row holds for the caller now: it changed between the write and this read,
        // which only a concurrent writer can do. The caller may retry.
        _ => Error::Unavailable(
            format!(
                "write to order {} raced with another writer; retry",
                row.order_id
            )
            .into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use orderly_core::{Epoch, InstanceId, OrderId};

    use super::*;

    fn row(
        owner: Option<&InstanceId>,
        epoch: i64,
        state: ProcessState,
        complete_by: Option<DateTime<Utc>>,
    ) -> StateRow {
        let t = Utc::now();
        StateRow {
            order_id: OrderId::parse("o-1").unwrap(),
            locked_by: owner.cloned(),
            complete_by,
            process_state: state,
            failure_count: 0,
            lock_epoch: Epoch(epoch),
            current_step: 0,
            next_attempt_at: t,
            last_error: None,
            reply_to: None,
            finish_as: None,
            generation: 0,
            workflow: None,
            workflow_version: None,
            waiting_on: None,
            created_at: t,
            updated_at: t,
        }
    }

    #[test]
    fn another_owner_or_a_newer_epoch_is_fenced() {
        let me = InstanceId::parse("a").unwrap();
        let other = InstanceId::parse("b").unwrap();
        let fence = Fence {
            order_id: OrderId::parse("o-1").unwrap(),
            owner: me.clone(),
            epoch: Epoch(3),
        };
        let later = Some(Utc::now() + chrono::Duration::minutes(1));
        let now = Utc::now();
        assert!(matches!(
            refusal(
                &fence,
                Some(row(Some(&other), 4, ProcessState::Processing, later)),
                now,
                ProcessState::Processed
            ),
            Error::Fenced {
                row_epoch: Epoch(4),
                ..
            }
        ));
        assert!(matches!(
            refusal(
                &fence,
                Some(row(Some(&me), 4, ProcessState::Processing, later)),
                now,
                ProcessState::Processed
            ),
            Error::Fenced { .. }
        ));
        assert!(matches!(
            refusal(
                &fence,
                Some(row(None, 3, ProcessState::Pending, None)),
                now,
                ProcessState::Processed
            ),
            Error::Fenced { holder: None, .. }
        ));
    }

    #[test]
    fn the_right_owner_past_its_deadline_is_told_so() {
        let me = InstanceId::parse("a").unwrap();
        let fence = Fence {
            order_id: OrderId::parse("o-1").unwrap(),
            owner: me.clone(),
            epoch: Epoch(3),
        };
        let past = Utc::now() - chrono::Duration::seconds(1);
        assert!(matches!(
            refusal(
                &fence,
                Some(row(Some(&me), 3, ProcessState::Processing, Some(past))),
                Utc::now(),
                ProcessState::Processed
            ),
            Error::DeadlinePassed { .. }
        ));
        assert!(matches!(
            refusal(&fence, None, Utc::now(), ProcessState::Processed),
            Error::OrderNotFound(_)
        ));
    }
}
