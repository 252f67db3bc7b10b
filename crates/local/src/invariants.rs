//! The invariant checker: reads every order of a run back (state, steps, history) and
//! checks the invariants of docs/architecture.md ("Invariants") against the store's history and the
//! remote simulator's ledger; used by `orderly demo`, `orderly bench` and the
//! end-to-end tests. [`Report`] is what it found.

use orderly_cli::outln;
use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use orderly_core::history::HistoryKind;
use orderly_core::store::OrderView;
use orderly_core::{OrderId, ProcessState, StepStatus};
use orderly_remote_sim::{Effect, double_effects};

use crate::system::System;

/// What a run found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Orders submitted.
    pub submitted: usize,
    /// Orders per final state (or still open, if the run timed out).
    pub by_state: HashMap<ProcessState, usize>,
    /// Orders the supervisor sent back to Pending after a timeout.
    pub recoveries: usize,
    /// Orders given up by the supervisor (too many timeouts).
    pub gave_up: usize,
    /// Step requests sent beyond one per step (re-runs after timeouts).
    pub step_retries: usize,
    /// Steps compensated.
    pub compensated: usize,
    /// From the first submit to the last order done.
    pub elapsed: Duration,
    /// Submit-to-Processed latencies, sorted.
    pub latencies: Vec<Duration>,
    /// Invariant violations; empty when all held.
    pub violations: Vec<String>,
    /// Where a Processed order's time went: per hop of its record (from the post to
    /// its first entry, then from each entry to the next, named by their kinds), the
    /// times of every such hop, sorted; hops in the order they first came.
    pub hops: Vec<(Hop, Vec<Duration>)>,
}

impl Report {
    /// Orders in `state`.
    pub fn count(&self, state: ProcessState) -> usize {
        self.by_state.get(&state).copied().unwrap_or(0)
    }

    /// Orders done (Processed, Error or Cancelled) per second.
    pub fn throughput(&self) -> f64 {
        let done = self.count(ProcessState::Processed)
            + self.count(ProcessState::Error)
            + self.count(ProcessState::Cancelled);
        done as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The `p`-th percentile (0 to 100) of submit-to-Processed latency.
    pub fn percentile(&self, p: f64) -> Duration {
        percentile(&self.latencies, p)
    }

    /// Prints the summary.
    pub fn print(&self) {
        outln!("orders submitted     {}", self.submitted);
        for s in ProcessState::ALL {
            let n = self.count(s);
            if n > 0
                || matches!(
                    s,
                    ProcessState::Processed | ProcessState::Error | ProcessState::Cancelled
                )
            {
                outln!("  {:<18} {n}", s.as_str());
            }
        }
        outln!(
            "timeouts recovered   {} (given up: {})",
            self.recoveries,
            self.gave_up
        );
        outln!("step re-runs         {}", self.step_retries);
        outln!("steps compensated    {}", self.compensated);
        outln!(
            "throughput           {:.0} orders/s ({} in {:.2} s)",
            self.throughput(),
            self.submitted,
            self.elapsed.as_secs_f64()
        );
        outln!(
            "submit -> Processed  p50 {:.1} ms, p95 {:.1} ms, p99 {:.1} ms",
            ms(self.percentile(50.0)),
            ms(self.percentile(95.0)),
            ms(self.percentile(99.0))
        );
        if self.violations.is_empty() {
            outln!("invariants           all hold");
        } else {
            outln!("invariants           {} VIOLATED:", self.violations.len());
            for v in self.violations.iter().take(20) {
                outln!("  - {v}");
            }
        }
    }
}

impl Report {
    /// Where the time of a Processed order went, hop by hop ([`Self::hops`]): each
    /// hop's p50, p99 and how many there were per order. Hops inside one transaction
    /// (two entries of the same instant, every time) are left out.
    pub fn hop_times(&self) -> Vec<HopTime> {
        let orders = self.latencies.len().max(1);
        self.hops
            .iter()
            .filter(|(_, times)| times.last().is_some_and(|t| !t.is_zero()))
            .map(|((from, to), times)| HopTime {
                hop: format!(
                    "{} -> {}",
                    from.map_or("posted", HistoryKind::as_str),
                    to.as_str()
                ),
                p50: percentile(times, 50.0),
                p99: percentile(times, 99.0),
                per_order: times.len() as f64 / orders as f64,
            })
            .collect()
    }

    /// Prints [`Self::hop_times`].
    pub fn print_hops(&self) {
        let hops = self.hop_times();
        if hops.is_empty() {
            return;
        }
        outln!(
            "time per hop         p50 / p99 ms, Processed orders (hops within one transaction left out)"
        );
        for h in hops {
            outln!(
                "  {:<34} {:>7.1} / {:>7.1}{}",
                h.hop,
                ms(h.p50),
                ms(h.p99),
                if (h.per_order - 1.0).abs() < 0.005 {
                    String::new()
                } else {
                    format!("  ({:.2} per order)", h.per_order)
                }
            );
        }
    }
}

/// One hop of [`Report::hop_times`].
#[derive(Debug, Clone, PartialEq)]
pub struct HopTime {
    /// From which entry of the record to which (`posted` for the post).
    pub hop: String,
    /// Its median.
    pub p50: Duration,
    /// Its 99th percentile.
    pub p99: Duration,
    /// How many per Processed order.
    pub per_order: f64,
}

/// The `p`-th percentile (0 to 100) of `sorted`.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// A hop of an order's record: from the entry of the first kind (`None`: its post) to
/// the next, of the second.
pub type Hop = (Option<HistoryKind>, HistoryKind);

/// Adds the hops of one Processed order's `history`, posted at `sent`, to `hops`.
fn add_hops(
    hops: &mut Vec<(Hop, Vec<Duration>)>,
    sent: DateTime<Utc>,
    history: &[orderly_core::history::HistoryEvent],
) {
    let mut add = |hop: Hop, took: chrono::TimeDelta| {
        let took = took.to_std().unwrap_or_default();
        match hops.iter_mut().find(|(h, _)| *h == hop) {
            Some((_, times)) => times.push(took),
            None => hops.push((hop, vec![took])),
        }
    };
    let Some(first) = history.first() else {
        return;
    };
    add((None, first.kind), first.at - sent);
    for pair in history.windows(2) {
        add((Some(pair[0].kind), pair[1].kind), pair[1].at - pair[0].at);
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Reads every order back and checks the invariants; fills the report.
pub async fn report(
    system: &System,
    sent_at: &HashMap<OrderId, DateTime<Utc>>,
    workflows: &orderly_core::workflow::Workflows,
    check: bool,
) -> anyhow::Result<Report> {
    let effects = system.sim.as_ref().map(|s| s.effects());
    report_on(
        system.backend.store.as_ref(),
        effects,
        sent_at,
        workflows,
        check,
    )
    .await
}

/// [`report`] for a system running elsewhere: its store, and the simulator's ledger
/// if there is one. Each order is checked against the workflow version it is pinned
/// to, looked up in `workflows`.
pub async fn report_on(
    store: &dyn orderly_core::store::StateStore,
    effects: Option<Vec<Effect>>,
    sent_at: &HashMap<OrderId, DateTime<Utc>>,
    workflows: &orderly_core::workflow::Workflows,
    check: bool,
) -> anyhow::Result<Report> {
    let has_ledger = effects.is_some();
    let effects = effects.unwrap_or_default();
    let mut r = Report {
        submitted: sent_at.len(),
        ..Report::default()
    };
    let first_sent = sent_at.values().min().copied().unwrap_or_else(Utc::now);
    let mut last_done = first_sent;
    let mut effects_by_order: HashMap<&str, Vec<&Effect>> = HashMap::new();
    for e in &effects {
        effects_by_order
            .entry(e.order_id.as_str())
            .or_default()
            .push(e);
    }
    let alerts = store.alerts(false, orderly_core::store::MAX_BATCH).await?;
    let alerted: HashMap<&str, usize> = alerts.iter().fold(HashMap::new(), |mut m, a| {
        *m.entry(a.order_id.as_str()).or_default() += 1;
        m
    });
    for (id, sent) in sent_at {
        let view = match store.get(id).await {
            Ok(v) => v,
            Err(orderly_core::Error::OrderNotFound(_)) => {
                r.violations
                    .push(format!("order {id} was posted but never recorded (lost)"));
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        *r.by_state.entry(view.state.process_state).or_default() += 1;
        let count = |k: HistoryKind| view.history.iter().filter(|e| e.kind == k).count();
        r.recoveries += count(HistoryKind::Recovered);
        r.gave_up += count(HistoryKind::GaveUp);
        r.compensated += count(HistoryKind::StepCompensated);
        r.step_retries += view
            .steps
            .iter()
            .map(|s| usize::try_from(s.attempts - 1).unwrap_or(0))
            .sum::<usize>();
        if let Some(done) = view.history.iter().rev().find(|e| {
            matches!(
                e.kind,
                HistoryKind::Completed
                    | HistoryKind::Failed
                    | HistoryKind::GaveUp
                    | HistoryKind::Cancelled
            )
        }) {
            last_done = last_done.max(done.at);
            if done.kind == HistoryKind::Completed {
                r.latencies
                    .push((done.at - *sent).to_std().unwrap_or_default());
                add_hops(&mut r.hops, *sent, &view.history);
            }
        }
        if check {
            let pinned = view.state.workflow_version.as_ref().map(|version| {
                orderly_core::workflow::WorkflowRef {
                    name: view.state.workflow.clone().unwrap_or_default(),
                    version: version.clone(),
                }
            });
            let Some(workflow) = workflows.get(pinned.as_ref()) else {
                r.violations.push(format!(
                    "order {id} is pinned to workflow {}, which none of the workflows checked against is",
                    view.state.workflow_label()
                ));
                continue;
            };
            let order_effects = has_ledger.then(|| {
                effects_by_order
                    .get(id.as_str())
                    .map(Vec::as_slice)
                    .unwrap_or(&[])
            });
            check_order(
                &view,
                workflow,
                order_effects,
                alerted.get(id.as_str()).copied(),
                &mut r.violations,
            );
        }
    }
    if check && has_ledger {
        for (order, action, n) in double_effects(&effects) {
            r.violations
                .push(format!("order {order}: {action} took effect {n} times"));
        }
    }
    r.latencies.sort();
    for (_, times) in &mut r.hops {
        times.sort();
    }
    r.elapsed = (last_done - first_sent).to_std().unwrap_or_default();
    Ok(r)
}

/// The invariants one order's record must satisfy.
fn check_order(
    view: &OrderView,
    workflow: &orderly_core::workflow::Workflow,
    effects: Option<&[&Effect]>,
    alerts: Option<usize>,
    violations: &mut Vec<String>,
) {
    let id = &view.state.order_id;
    let state = view.state.process_state;
    // 1. Nothing lost or stuck.
    if !matches!(
        state,
        ProcessState::Processed | ProcessState::Error | ProcessState::Cancelled
    ) {
        violations.push(format!("order {id} is still {state}"));
    }
    // 2. Ownership terms only grow.
    let epochs: Vec<i64> = view
        .history
        .iter()
        .filter(|e| matches!(e.kind, HistoryKind::Claimed | HistoryKind::Resumed))
        .map(|e| e.epoch.0)
        .collect();
    if epochs.windows(2).any(|w| w[1] <= w[0]) {
        violations.push(format!("order {id}: claim epochs do not grow: {epochs:?}"));
    }
    // 5. FailureCount counts each timeout or failure exactly once (since the last
    // operator move back to Pending, a retry or a cancel that undoes steps, which gives
    // the order a fresh failure budget).
    let since_retry = view
        .history
        .iter()
        .rposition(|e| {
            matches!(
                e.kind,
                HistoryKind::Resubmitted
                    | HistoryKind::RetriedAfresh
                    | HistoryKind::CancelRequested
            )
        })
        .map_or(0, |i| i + 1);
    let failures = view.history[since_retry..]
        .iter()
        .filter(|e| {
            matches!(
                e.kind,
                HistoryKind::Recovered | HistoryKind::GaveUp | HistoryKind::Failed
            )
        })
        .count();
    if usize::try_from(view.state.failure_count).unwrap_or(0) != failures {
        violations.push(format!(
            "order {id}: failure_count {} but {failures} timeouts/failures in its history",
            view.state.failure_count
        ));
    }
    // 3. A Processed order did every step exactly once (in its last run: a fresh run
    // after an operator's retry redoes every step), and each is in effect once.
    let run = view
        .history
        .iter()
        .rposition(|e| e.kind == HistoryKind::RetriedAfresh)
        .map_or(0, |i| i + 1);
    if state == ProcessState::Processed {
        for (i, def) in workflow.steps.iter().enumerate() {
            let succeeded = view.history[run..]
                .iter()
                .filter(|e| e.kind == HistoryKind::StepSucceeded && e.step == Some(i as i32))
                .count();
            if succeeded != 1 {
                violations.push(format!(
                    "order {id}: step {} recorded done {succeeded} times",
                    def.name
                ));
            }
            if !view
                .steps
                .iter()
                .any(|s| s.index == i as i32 && s.status == StepStatus::Succeeded)
            {
                violations.push(format!(
                    "order {id}: Processed but step {} is not done",
                    def.name
                ));
            }
            if let Some(effects) = effects {
                // In effect: applied and not undone (a run before an operator's retry
                // may have been undone; its redo is the one in effect).
                let applied = effects
                    .iter()
                    .filter(|e| e.action == def.name && e.kind == "do")
                    .filter(|e| {
                        !effects
                            .iter()
                            .any(|u| u.compensates.as_deref() == Some(e.key.as_str()))
                    })
                    .count();
                if applied != 1 {
                    violations.push(format!(
                        "order {id}: {} is in effect {applied} times",
                        def.name
                    ));
                }
            }
        }
    }
    // 9. It ran the workflow version it is pinned to: every step it recorded is that
    // version's step at that index, and every action applied for it is one of its.
    for s in &view.steps {
        if workflow.step(s.index).is_none_or(|d| d.name != s.name) {
            violations.push(format!(
                "order {id}: step {} recorded at index {} is not that step of its workflow {}",
                s.name,
                s.index,
                view.state.workflow_label()
            ));
        }
    }
    if let Some(effects) = effects {
        for e in effects.iter() {
            let known = workflow.steps.iter().any(|d| {
                d.name == e.action || d.compensation.as_deref() == Some(e.action.as_str())
            });
            if !known {
                violations.push(format!(
                    "order {id}: {} took effect but is no action of its workflow {}",
                    e.action,
                    view.state.workflow_label()
                ));
            }
        }
    }
    // Every compensated step's undo took effect.
    for s in view
        .steps
        .iter()
        .filter(|s| s.status == StepStatus::Compensated)
    {
        let undo = workflow.step(s.index).and_then(|d| d.compensation.clone());
        if let Some(undo) = undo
            && let Some(effects) = effects
            && !effects.iter().any(|e| e.action == undo)
        {
            violations.push(format!(
                "order {id}: step {} marked compensated but {undo} never took effect",
                s.name
            ));
        }
    }
    // 8. An Error or Cancelled order whose steps were undone has each step that took
    // effect undone exactly once, and none that can never be undone took effect,
    // unless it says it needs repair by hand (a compensation that failed for good,
    // undoing that never finished, or refused past the point of no return).
    let undoes = match state {
        // Cancelled by a scheduler once it had undone the steps, not by an operator at
        // once (without compensation, or with nothing to undo).
        ProcessState::Cancelled => view
            .history
            .iter()
            .rev()
            .find(|e| e.to_state == ProcessState::Cancelled)
            .is_some_and(|e| !e.actor.is_operator()),
        ProcessState::Error => workflow.compensate_on_error,
        _ => false,
    };
    let by_hand = view
        .state
        .last_error
        .as_deref()
        .is_some_and(|e| e.contains("by hand") || e.contains("manual repair"));
    if undoes
        && !by_hand
        && let Some(effects) = effects
    {
        for e in effects.iter().filter(|e| e.kind == "do") {
            let Some(def) = workflow.steps.iter().find(|d| d.name == e.action) else {
                continue; // reported above
            };
            let undone = effects
                .iter()
                .filter(|u| u.compensates.as_deref() == Some(e.key.as_str()))
                .count();
            if def.compensation.is_some() && undone != 1 {
                violations.push(format!(
                    "order {id} ended {state} but {} ({}) was undone {undone} times",
                    e.action, e.key
                ));
            }
            if def.cannot_be_undone() {
                violations.push(format!(
                    "order {id} ended {state} but {} ({}) took effect, cannot be undone, \
                     and the order does not say it needs repair by hand",
                    e.action, e.key
                ));
            }
        }
    }
    // 7. Every Error raised an alert.
    if state == ProcessState::Error && alerts.unwrap_or(0) == 0 {
        violations.push(format!("order {id} is in Error without an alert"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orderly_core::history::HistoryEvent;
    use orderly_core::{Actor, Epoch};

    fn event(order: &str, kind: HistoryKind, at_ms: i64, step: Option<i32>) -> HistoryEvent {
        HistoryEvent {
            seq: at_ms,
            order_id: OrderId::parse(order).unwrap(),
            at: DateTime::<Utc>::UNIX_EPOCH + chrono::Duration::milliseconds(at_ms),
            actor: Actor::from_stored("test".to_owned()),
            kind,
            from_state: None,
            to_state: ProcessState::Processing,
            epoch: Epoch(1),
            step,
            reason: None,
        }
    }

    /// Each hop of a Processed order's record is timed from one entry to the next, the
    /// first from its post; the steps' hops are pooled, and the hops that happen inside
    /// one transaction (same instant) are left out of what is shown.
    #[test]
    fn the_time_of_an_order_is_split_by_the_hops_of_its_record() {
        let mut r = Report::default();
        for (order, slow) in [("A-1", 0), ("A-2", 10)] {
            let history = [
                event(order, HistoryKind::Submitted, 2, None),
                event(order, HistoryKind::Claimed, 5 + slow, None),
                event(order, HistoryKind::StepStarted, 5 + slow, Some(0)),
                event(order, HistoryKind::StepSucceeded, 9 + slow, Some(0)),
                event(order, HistoryKind::StepStarted, 9 + slow, Some(1)),
                event(order, HistoryKind::StepSucceeded, 15 + slow, Some(1)),
                event(order, HistoryKind::Completed, 15 + slow, None),
            ];
            add_hops(&mut r.hops, DateTime::<Utc>::UNIX_EPOCH, &history);
            r.latencies.push(Duration::from_millis(15 + slow as u64));
        }
        for (_, times) in &mut r.hops {
            times.sort();
        }
        let ms = Duration::from_millis;
        let shown: Vec<(String, Duration, Duration, f64)> = r
            .hop_times()
            .into_iter()
            .map(|h| (h.hop, h.p50, h.p99, h.per_order))
            .collect();
        assert_eq!(
            shown,
            vec![
                ("posted -> Submitted".to_owned(), ms(2), ms(2), 1.0),
                ("Submitted -> Claimed".to_owned(), ms(13), ms(13), 1.0),
                ("StepStarted -> StepSucceeded".to_owned(), ms(6), ms(6), 2.0),
            ]
        );
    }
}
