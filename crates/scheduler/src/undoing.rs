//! The replies that are not forward successes: a step that failed for good (which
//! undoes the completed steps, refuses to when one cannot be undone, or fails the order
//! at once), and the outcomes of compensations (the next undo, or the finish).

use orderly_core::messages::{StepKind, StepOutcome, StepReply};
use orderly_core::workflow::Workflow;
use orderly_core::{ProcessState, StepStatus};
use tracing::warn;

use crate::moves::single;
use crate::{Next, Pass, Scheduler, plan};

impl Scheduler {
    /// Applies a reply other than a forward success: a permanent failure, or a
    /// compensation's outcome.
    pub(crate) async fn apply_other(
        &self,
        flow: &Workflow,
        reply: &StepReply,
        pass: &mut Pass,
    ) -> orderly_core::Result<()> {
        match (&reply.kind, &reply.outcome) {
            (StepKind::Do, StepOutcome::Failed { error }) => {
                self.step_failed(flow, reply, error, pass).await
            }
            (StepKind::Compensate, StepOutcome::Succeeded { detail }) => {
                self.step_undone(flow, reply, detail, pass).await
            }
            (StepKind::Compensate, StepOutcome::Failed { error }) => {
                self.undo_failed(reply, error, pass).await
            }
            // Applied in the batch, before these.
            (StepKind::Do, StepOutcome::Succeeded { .. }) | (_, StepOutcome::Deferred { .. }) => {
                Ok(())
            }
        }
    }

    /// A step failed for good: recorded Failed, then, where the workflow compensates on
    /// error, its completed steps are undone in reverse (or, if one of them can never
    /// be undone, none is); otherwise the order fails at once.
    async fn step_failed(
        &self,
        flow: &Workflow,
        reply: &StepReply,
        error: &str,
        pass: &mut Pass,
    ) -> orderly_core::Result<()> {
        warn!(error = %error, "step failed permanently");
        let fence = &reply.fence;
        let failed = plan::outcome_write(flow, reply, StepStatus::Failed, error);
        single(self.store.record_steps(&[failed]).await?)?;
        pass.applied += 1;
        let steps = self.store.steps(&fence.order_id).await?;
        let undoable = steps.iter().any(|s| {
            matches!(s.status, StepStatus::Succeeded | StepStatus::Started)
                && flow.step(s.index).is_some_and(|d| d.compensation.is_some())
        });
        let why = format!("step {} failed: {error}", reply.step);
        let fixed = plan::past_return(flow, &steps);
        let next = if flow.compensate_on_error && !fixed.is_empty() {
            // Undoing would leave the order half undone: nothing is.
            Self::refuse_undoing(fence, Some(ProcessState::Error), &steps, &fixed)
        } else if flow.compensate_on_error && undoable {
            self.store
                .begin_compensation(fence, ProcessState::Error, &why, &[])
                .await?;
            let mut context = reply.context.clone();
            context.finish_as = Some(ProcessState::Error);
            self.plan_compensation(flow, fence, reply.complete_by, &context, &steps, None)
        } else {
            Next::Fail(fence.clone(), why)
        };
        self.execute(vec![next], pass).await
    }

    /// A compensation succeeded: the next one is sent, or the order finishes as it is
    /// marked to. A repeat of one already recorded is dropped.
    async fn step_undone(
        &self,
        flow: &Workflow,
        reply: &StepReply,
        detail: &str,
        pass: &mut Pass,
    ) -> orderly_core::Result<()> {
        let fence = &reply.fence;
        let steps = self.store.steps(&fence.order_id).await?;
        let already = steps
            .iter()
            .any(|s| s.index == reply.step_index && s.status == StepStatus::Compensated);
        if already {
            pass.dropped += 1;
            return Ok(());
        }
        pass.applied += 1;
        let next = self.plan_compensation(
            flow,
            fence,
            reply.complete_by,
            &reply.context,
            &steps,
            Some((reply.step_index, detail)),
        );
        self.execute(vec![next], pass).await
    }

    /// A compensation failed for good: the order ends in Error, naming the steps still
    /// to undo by hand.
    async fn undo_failed(
        &self,
        reply: &StepReply,
        error: &str,
        pass: &mut Pass,
    ) -> orderly_core::Result<()> {
        pass.applied += 1;
        let steps = self.store.steps(&reply.fence.order_id).await?;
        let left: Vec<String> = steps
            .iter()
            .filter(|s| matches!(s.status, StepStatus::Started | StepStatus::Succeeded))
            .map(|s| s.name.clone())
            .collect();
        let error = format!(
            "compensation {} of step {} failed: {error}; still to undo by hand: {}",
            reply.action,
            reply.step,
            left.join(", ")
        );
        self.execute(vec![Next::Fail(reply.fence.clone(), error)], pass)
            .await
    }
}
