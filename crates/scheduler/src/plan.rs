//! Planning an order's next move: the step request to send, the writes that record
//! a reply, the compensation to run next, and how an undone order ends.

use orderly_core::messages::{
    OrderStatus, StatusNotice, StepContext, StepKind, StepReply, StepRequest, json_message,
};
use orderly_core::step::idempotency_key;
use orderly_core::store::{Completion, StepUpdate, StepWrite};
use orderly_core::transport::Envelope;
use orderly_core::workflow::{StepDef, Workflow};
use orderly_core::{Fence, ProcessState, StepRecord, StepStatus};

use crate::{Next, Scheduler};

/// The record of step `index` of `flow` as its undoing moves it to `status`: under the
/// key of the order's run, never irreversible (an undoing takes nothing new into
/// effect).
fn undo_update(
    flow: &Workflow,
    fence: &Fence,
    context: &StepContext,
    index: i32,
    status: StepStatus,
    detail: Option<String>,
) -> StepUpdate {
    let name = flow.step(index).map(|d| d.name.clone()).unwrap_or_default();
    StepUpdate {
        index,
        idempotency_key: idempotency_key(&fence.order_id, context.generation, index, &name),
        name,
        status,
        detail,
        irreversible: false,
    }
}

/// A write of an undoing: `updates` and `sends`, at whatever step the order stands
/// (compensations run backwards), never completing it.
fn undo_write(fence: &Fence, updates: Vec<StepUpdate>, sends: Vec<Envelope>) -> StepWrite {
    StepWrite {
        complete: false,
        fence: fence.clone(),
        expect_step: None,
        updates,
        sends,
    }
}

impl Scheduler {
    pub(crate) fn check_reply(&self, flow: &Workflow, reply: &StepReply) -> Result<(), String> {
        let Some(def) = flow.step(reply.step_index) else {
            return Err(format!(
                "step index {} is outside workflow {:?} ({} steps)",
                reply.step_index,
                flow.name,
                flow.len()
            ));
        };
        let expected_action = match reply.kind {
            StepKind::Do => Some(def.name.as_str()),
            StepKind::Compensate => def.compensation.as_deref(),
        };
        if def.name != reply.step || expected_action != Some(reply.action.as_str()) {
            return Err(format!(
                "step {} is {:?} with action {:?} in workflow {:?}, the reply names step {:?} action {:?}",
                reply.step_index, def.name, expected_action, flow.name, reply.step, reply.action
            ));
        }
        Ok(())
    }

    /// The request for step `index`. `uncertain`: it may have been sent before and
    /// taken effect unseen (the order came back after a timeout, or was resumed), so an
    /// agent asks the step's status probe, if it declares one, before calling.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn request(
        &self,
        flow: &Workflow,
        fence: &Fence,
        index: i32,
        kind: StepKind,
        complete_by: chrono::DateTime<chrono::Utc>,
        context: &StepContext,
        uncertain: bool,
    ) -> Option<Envelope> {
        let def = flow.step(index)?;
        let action = match kind {
            StepKind::Do => def.name.clone(),
            StepKind::Compensate => def.compensation.clone()?,
        };
        // A probe asks about the step's own action, not its compensation.
        let probe = def.probe.clone().filter(|_| kind == StepKind::Do);
        let generation = context.generation;
        let request = StepRequest {
            fence: fence.clone(),
            step_index: index,
            step: def.name.clone(),
            idempotency_key: idempotency_key(&fence.order_id, generation, index, &action),
            // The first run's agents derive it, as before generations existed.
            compensates: (kind == StepKind::Compensate && generation > 0)
                .then(|| idempotency_key(&fence.order_id, generation, index, &def.name)),
            action,
            kind,
            complete_by,
            timeout_ms: def.timeout_ms,
            retry: def.retry.clone(),
            reply_to: self.cfg.replies.clone(),
            context: context.clone(),
            uncertain: uncertain && probe.is_some(),
            probe,
        };
        let mut message = json_message(
            request.message_id(),
            &request,
            Some(fence.order_id.as_str()),
        );
        if let Some(key) = &self.key {
            key.sign(&mut message);
        }
        Some(Envelope {
            queue: def.queue.clone(),
            message,
        })
    }

    /// The write that starts step `index` (see [`Self::request`] for `uncertain`).
    pub(crate) fn start_step(
        &self,
        flow: &Workflow,
        fence: &Fence,
        index: i32,
        complete_by: chrono::DateTime<chrono::Utc>,
        context: &StepContext,
        uncertain: bool,
    ) -> StepWrite {
        let name = flow.step(index).map(|d| d.name.clone()).unwrap_or_default();
        StepWrite {
            complete: false,
            fence: fence.clone(),
            expect_step: Some(index),
            updates: vec![StepUpdate {
                index,
                idempotency_key: idempotency_key(&fence.order_id, context.generation, index, &name),
                name,
                status: StepStatus::Started,
                detail: None,
                irreversible: flow.step(index).is_some_and(StepDef::cannot_be_undone),
            }],
            sends: self
                .request(
                    flow,
                    fence,
                    index,
                    StepKind::Do,
                    complete_by,
                    context,
                    uncertain,
                )
                .into_iter()
                .collect(),
        }
    }

    /// The write that records a step done and starts the next one (or completes the
    /// order). When the next step's service is down, the write only records the step,
    /// and the park that follows it is returned too.
    pub(crate) fn step_succeeded(
        &self,
        flow: &Workflow,
        reply: &StepReply,
        detail: &str,
    ) -> (StepWrite, Option<orderly_core::service::Park>) {
        let notice = StatusNotice {
            order_id: reply.fence.order_id.clone(),
            status: OrderStatus::StepDone,
            step: Some(reply.step.clone()),
            detail: None,
        };
        let mut write = outcome_write(flow, reply, StepStatus::Succeeded, detail);
        write.sends = notice
            .envelope(
                reply.context.notify_to.as_deref(),
                &format!("{}.{}", reply.fence.epoch, reply.step_index),
            )
            .into_iter()
            .collect();
        let next = reply.step_index + 1;
        let waits_for = flow
            .step(next)
            .and_then(|def| self.blocked(&def.queue, None));
        if let Some(health) = waits_for {
            // Recorded now; the next step is started by whoever claims the order once
            // its service is back.
            let park = Self::park_for(&reply.fence, Some(next), &health);
            return (write, Some(park));
        }
        if next < flow.len() {
            let start =
                // The next step has never been sent in this ownership.
                self.start_step(
                    flow,
                    &reply.fence,
                    next,
                    reply.complete_by,
                    &reply.context,
                    false,
                );
            write.updates.extend(start.updates);
            write.sends.extend(start.sends);
        } else {
            // The last step: recorded and the order completed in one transaction.
            write.complete = true;
            write
                .sends
                .extend(self.completion(&reply.fence, &reply.context).sends);
        }
        (write, None)
    }

    pub(crate) fn completion(&self, fence: &Fence, context: &StepContext) -> Completion {
        let notice = StatusNotice {
            order_id: fence.order_id.clone(),
            status: OrderStatus::Completed,
            step: None,
            detail: None,
        };
        Completion {
            fence: fence.clone(),
            sends: notice
                .envelope(context.notify_to.as_deref(), &fence.epoch.to_string())
                .into_iter()
                .collect(),
        }
    }

    /// The next move of an order whose steps are being undone: compensate the latest
    /// step that may have taken effect and can be undone, or finish. `just_done` is a
    /// step whose compensation was just confirmed (recorded in the same write).
    ///
    /// Undoing starts only if no step that can never be taken back may have taken
    /// effect ([`past_return`]); else nothing is undone and the order ends in Error for
    /// repair by hand. Once undoing has started no step can newly take effect, so the
    /// check is made when it starts (`just_done` is `None`: the failure, the cancel's
    /// claim, or a claim after the undoing was recovered).
    pub(crate) fn plan_compensation(
        &self,
        flow: &Workflow,
        fence: &Fence,
        complete_by: chrono::DateTime<chrono::Utc>,
        context: &StepContext,
        steps: &[StepRecord],
        just_done: Option<(i32, &str)>,
    ) -> Next {
        if just_done.is_none() {
            let fixed = past_return(flow, steps);
            if !fixed.is_empty() {
                return Self::refuse_undoing(fence, context.finish_as, steps, &fixed);
            }
        }
        let pending = next_to_undo(flow, steps, just_done.map(|(i, _)| i));
        let update =
            |index, status, detail| undo_update(flow, fence, context, index, status, detail);
        let mut updates: Vec<StepUpdate> = just_done
            .map(|(index, detail)| update(index, StepStatus::Compensated, Some(detail.to_owned())))
            .into_iter()
            .collect();
        let write = |updates, sends| undo_write(fence, updates, sends);
        match pending {
            Some(index) => {
                let detail = flow
                    .step(index)
                    .and_then(|d| d.compensation.as_ref())
                    .map(|c| orderly_core::step::compensating_detail(c));
                updates.push(update(index, StepStatus::Started, detail));
                let request = self.request(
                    flow,
                    fence,
                    index,
                    StepKind::Compensate,
                    complete_by,
                    context,
                    false,
                );
                Next::Write(write(updates, request.into_iter().collect()))
            }
            None if !updates.is_empty() => Next::Finish(
                write(updates, Vec::new()),
                context.finish_as,
                context.notify_to.clone(),
            ),
            None => Self::plan_finish(
                fence,
                context.finish_as,
                steps,
                context.notify_to.as_deref(),
            ),
        }
    }

    /// How an order whose steps are undone ends.
    pub(crate) fn plan_finish(
        fence: &Fence,
        finish_as: Option<ProcessState>,
        steps: &[StepRecord],
        notify_to: Option<&str>,
    ) -> Next {
        match finish_as {
            Some(ProcessState::Cancelled) => {
                Next::Cancel(fence.clone(), notify_to.map(str::to_owned))
            }
            _ => {
                let error = failure_text(steps);
                let undone = undone(steps);
                let error = if undone.is_empty() {
                    error
                } else {
                    format!("{error}; undone: {}", undone.join(", "))
                };
                Next::Undone(fence.clone(), error)
            }
        }
    }

    /// How an order ends when undoing it is refused because `fixed`, steps that can
    /// never be taken back, may have taken effect: in Error, what it was asked to end
    /// as and why, for repair by hand. Its steps stay as they are, so a retry carries
    /// on from where it stopped (sending an uncertain step again under its key) and a
    /// cancel without compensation ends it as it stands.
    pub(crate) fn refuse_undoing(
        fence: &Fence,
        finish_as: Option<ProcessState>,
        steps: &[StepRecord],
        fixed: &[&str],
    ) -> Next {
        let asked = match finish_as {
            Some(ProcessState::Cancelled) => "cancel asked for".to_owned(),
            _ => failure_text(steps),
        };
        let undone = undone(steps);
        let undone = if undone.is_empty() {
            "nothing undone".to_owned()
        } else {
            format!("undone: {}", undone.join(", "))
        };
        Next::Fail(
            fence.clone(),
            format!(
                "{asked}, but {} may have taken effect and cannot be undone: {undone}; \
                 needs repair by hand (retry to finish the order, or cancel it without \
                 compensation once it is dealt with)",
                fixed.join(", ")
            ),
        )
    }
}

/// The steps that may have taken effect (started or done) and can never be taken
/// back ([`orderly_core::workflow::StepDef::cannot_be_undone`]): while one stands, an
/// order cannot be undone, only finished or repaired by hand.
pub(crate) fn past_return<'a>(flow: &Workflow, steps: &'a [StepRecord]) -> Vec<&'a str> {
    steps
        .iter()
        .filter(|s| matches!(s.status, StepStatus::Started | StepStatus::Succeeded))
        .filter(|s| flow.step(s.index).is_some_and(|d| d.cannot_be_undone()))
        .map(|s| s.name.as_str())
        .collect()
}

/// Why an order being undone for Error is: its latest failed step, or the supervisor
/// giving up on it.
fn failure_text(steps: &[StepRecord]) -> String {
    steps
        .iter()
        .filter(|s| s.status == StepStatus::Failed)
        .max_by_key(|s| s.index)
        .map(|s| {
            format!(
                "step {} failed: {}",
                s.name,
                s.detail.as_deref().unwrap_or("no detail")
            )
        })
        // No step failed: the supervisor gave up on it (too many timeouts).
        .unwrap_or_else(|| {
            "gave up: the order timed out too often (its history has each timeout)".to_owned()
        })
}

/// The steps already undone.
fn undone(steps: &[StepRecord]) -> Vec<&str> {
    steps
        .iter()
        .filter(|s| s.status == StepStatus::Compensated)
        .map(|s| s.name.as_str())
        .collect()
}

/// The write that records a reply's step with `status` and `detail`, under the
/// reply's fence and only while the order is at that step; it sends nothing.
pub(crate) fn outcome_write(
    flow: &Workflow,
    reply: &StepReply,
    status: StepStatus,
    detail: &str,
) -> StepWrite {
    StepWrite {
        complete: false,
        fence: reply.fence.clone(),
        expect_step: Some(reply.step_index),
        updates: vec![StepUpdate {
            index: reply.step_index,
            name: reply.step.clone(),
            status,
            detail: Some(detail.to_owned()),
            idempotency_key: reply_key(reply),
            irreversible: flow
                .step(reply.step_index)
                .is_some_and(StepDef::cannot_be_undone),
        }],
        sends: Vec::new(),
    }
}

/// The key a reply's step was recorded under (its `do` action in the reply's run).
pub(crate) fn reply_key(reply: &StepReply) -> String {
    idempotency_key(
        &reply.fence.order_id,
        reply.context.generation,
        reply.step_index,
        &reply.step,
    )
}

/// The next step to undo: the last one that may have taken effect and has a
/// compensation, other than `just_undone`.
fn next_to_undo(flow: &Workflow, steps: &[StepRecord], just_undone: Option<i32>) -> Option<i32> {
    steps
        .iter()
        .filter(|s| Some(s.index) != just_undone)
        .filter(|s| matches!(s.status, StepStatus::Started | StepStatus::Succeeded))
        .filter(|s| flow.step(s.index).is_some_and(|d| d.compensation.is_some()))
        .map(|s| s.index)
        .max()
}
