//! One order: its state and what it waits for, Retry (saying what a retry will do) and
//! Cancel, a visual timeline of its steps and attempts, the steps, the full history,
//! and the details.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use maud::{Markup, html};
use orderly_core::history::{HistoryEvent, HistoryKind};
use orderly_core::store::OrderView;
use orderly_core::{OrderId, ProcessState};

use super::Dash;
use super::auth::{cookie, operator};
use super::html::{action_fields, badge, failed, notice, page, url};

pub(super) async fn order(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let Ok(order_id) = OrderId::parse(id) else {
        return (
            StatusCode::BAD_REQUEST,
            page("Bad order id", "/orders", html! {}),
        )
            .into_response();
    };
    let view = match dash.backend.store.get(&order_id).await {
        Ok(v) => v,
        Err(orderly_core::Error::OrderNotFound(_)) => {
            return (
                StatusCode::NOT_FOUND,
                page(
                    "No such order",
                    "/orders",
                    notice(
                        false,
                        "No order has this id (finished orders are removed after the retention period).",
                    ),
                ),
            )
                .into_response();
        }
        Err(e) => return failed(e),
    };
    let s = &view.state;
    let csrf = cookie(&headers, "orderly_csrf").unwrap_or("");
    let operator = operator(&headers);
    let waiting = if s.waiting_on.is_some() {
        let services = dash
            .backend
            .store
            .services()
            .await
            .unwrap_or_default()
            .into_iter()
            .map(|h| (h.service.clone(), h))
            .collect();
        s.waiting_note(&services)
    } else {
        None
    };
    let form = |action: &str, label: &str, reason: &str, class: &str| {
        html! {
            form.inline method="post" action={"/orders/" (url(s.order_id.as_str())) "/" (action)} {
                (action_fields(csrf, &operator))
                input name="reason" value=(reason) size="24" aria-label="reason";
                " "
                button id=(action) class=(class) { (label) }
            }
            " "
        }
    };
    // Say what a retry will do: continue, or run afresh because steps were undone.
    let retry = (s.process_state == ProcessState::Error).then(|| {
        let plan = orderly_core::RetryPlan::for_order(s.generation, s.current_step, &view.steps);
        let label = match &plan {
            orderly_core::RetryPlan::Continue { .. } => "Retry from the failed step",
            orderly_core::RetryPlan::FreshRun { .. } => "Retry as a fresh run from the first step",
            orderly_core::RetryPlan::UndoFirst { .. } => {
                "Finish undoing, then retry as a fresh run"
            }
        };
        (plan.describe(), label)
    });
    let body = html! {
        div.card {
            p {
                "State " b #state class=(s.process_state.as_str()) { (s.process_state.as_str()) } " "
                (badge(s.process_state))
                @if let Some(f) = s.finish_as { " (undoing its steps, then " (f) ")" }
                " \u{b7} step " (s.current_step)
                " \u{b7} failures " (s.failure_count)
                " \u{b7} epoch " (s.lock_epoch)
                " \u{b7} held by " (s.locked_by.as_ref().map_or("nobody", |l| l.as_str()))
                " \u{b7} workflow " b #workflow { (s.workflow_label()) }
            }
            @if let Some(note) = &waiting { p { b #waiting .warn { (note) } } }
            @if let Some(e) = &s.error_note() { p { "Last error: " b #last-error .bad { (e) } } }
            @if let Some((plan, label)) = &retry {
                p #retry-plan .muted { "A retry " (plan) "." }
                (form("retry", label, "retried from the dashboard", ""))
            }
            @if s.process_state.can_become(ProcessState::Cancelled) {
                (form("cancel", "Cancel (undo its steps)", "cancelled from the dashboard", "danger"))
            }
        }
        div class="card chart" { h2 { "Timeline" } (timeline_svg(&view)) }
        div.card {
            h2 { "Steps" }
            div.scroll { table #steps {
                tr { th { "#" } th { "step" } th { "status" } th { "attempts" } th { "key" } th { "detail" } }
                @for st in &view.steps {
                    tr {
                        td { (st.index) }
                        td { (st.name) }
                        td { (st.status.as_str()) }
                        td { (st.attempts) }
                        td class="mono muted" { (st.idempotency_key) }
                        td { (st.detail.as_deref().unwrap_or("")) }
                    }
                }
            } }
        }
        div.card {
            h2 { "History" }
            div.scroll { table #timeline {
                tr { th { "when" } th { "what" } th { "from" } th { "to" } th { "who" } th { "epoch" } th { "why" } }
                @for h in &view.history {
                    tr {
                        td.mono { (h.at.format("%Y-%m-%d %H:%M:%S%.3f")) }
                        td { (h.kind.as_str()) }
                        td { (h.from_state.map_or("", |f| f.as_str())) }
                        td { (badge(h.to_state)) }
                        td { (h.actor.as_str()) }
                        td { (h.epoch) }
                        td { (h.reason.as_deref().unwrap_or("")) }
                    }
                }
            } }
        }
        div.card {
            h2 { "Details" }
            pre.mono { (serde_json::to_string_pretty(&view.details).unwrap_or_default()) }
        }
    };
    page(&format!("Order {}", s.order_id), "/orders", body).into_response()
}

/// The colour of what a history entry says about a step.
fn step_colour(kind: HistoryKind) -> Option<&'static str> {
    Some(match kind {
        HistoryKind::StepStarted => "#2563eb",
        HistoryKind::StepSucceeded => "#15803d",
        HistoryKind::StepFailed => "#b91c1c",
        HistoryKind::StepCompensated => "#6b7280",
        _ => return None,
    })
}

/// The order's life drawn on one time axis: a lane per step with a bar from each time
/// it was sent (an attempt) to its answer, and a lane for the order itself with a mark
/// at each change of state (claims, recoveries, waits, operator actions).
fn timeline_svg(view: &OrderView) -> Markup {
    let events: &[HistoryEvent] = &view.history;
    let (Some(first), Some(last)) = (events.first(), events.last()) else {
        return html! {};
    };
    let start = first.at;
    let end = if matches!(
        view.state.process_state,
        ProcessState::Pending | ProcessState::Processing
    ) {
        Utc::now().max(last.at)
    } else {
        last.at
    };
    let span = (end - start).num_microseconds().unwrap_or(1).max(1) as f64;
    // A lane per step that appears in the history or the step records (a fresh run
    // drops the old records; the history keeps their attempts).
    let mut indices: Vec<i32> = events
        .iter()
        .filter(|e| step_colour(e.kind).is_some())
        .filter_map(|e| e.step)
        .chain(view.steps.iter().map(|s| s.index))
        .collect();
    indices.sort_unstable();
    indices.dedup();
    let lanes: Vec<String> = indices
        .iter()
        .map(|i| {
            view.steps
                .iter()
                .find(|s| s.index == *i)
                .map_or_else(|| format!("{i} step {i}"), |s| format!("{i} {}", s.name))
        })
        .collect();
    let (w, left, lane_h) = (1000.0, 130.0, 22.0);
    let h = lane_h * (lanes.len() + 1) as f64 + 18.0;
    let x = |t: DateTime<Utc>| {
        left + ((t - start).num_microseconds().unwrap_or(0) as f64 / span) * (w - left - 6.0)
    };
    let lane_of = |step: Option<i32>| step.and_then(|s| indices.iter().position(|i| *i == s));
    let lane_y = |lane: usize| lane_h * (lane + 1) as f64 + 4.0;
    // Each step's attempts: from a start to the next entry about that step.
    let mut open: Vec<Option<DateTime<Utc>>> = vec![None; lanes.len().max(1)];
    let mut marks = Vec::with_capacity(events.len());
    for e in events {
        if let Some(colour) = step_colour(e.kind)
            && let Some(lane) = lane_of(e.step)
        {
            let y = lane_y(lane);
            let at = e.at.format("%H:%M:%S%.3f");
            marks.push(if e.kind == HistoryKind::StepStarted {
                open[lane] = Some(e.at);
                html! {
                    circle.attempt cx=(f1(x(e.at))) cy=(f1(y + 6.0)) r="3" fill=(colour) {
                        title { (lanes[lane]) " sent at " (at) }
                    }
                }
            } else {
                let from = open[lane].take().unwrap_or(e.at);
                html! {
                    rect class={"step-" (e.kind.as_str())} x=(f1(x(from))) y=(f1(y))
                        width=(f1((x(e.at) - x(from)).max(2.0))) height="12" rx="2" fill=(colour) {
                        title { (lanes[lane]) ": " (e.kind.as_str()) " at " (at) " (" ((e.at - from).num_milliseconds()) " ms)" }
                    }
                }
            });
        } else if e.from_state != Some(e.to_state) || e.kind == HistoryKind::WaitEnded {
            let colour = match e.to_state {
                ProcessState::Processed => "#15803d",
                ProcessState::Error => "#b91c1c",
                ProcessState::Cancelled => "#6b7280",
                ProcessState::Processing => "#d97706",
                ProcessState::Pending => "#2563eb",
            };
            marks.push(html! {
                rect class={"mark " (e.kind.as_str())} x=(f1(x(e.at) - 1.5)) y="4" width="3" height="14" fill=(colour) {
                    title {
                        (e.kind.as_str()) " at " (e.at.format("%H:%M:%S%.3f")) ": "
                        (e.from_state.map_or("-", |f| f.as_str())) " -> " (e.to_state.as_str())
                        @if let Some(r) = &e.reason { " (" (r) ")" }
                    }
                }
            });
        }
    }
    html! {
        svg #order-timeline viewBox={"0 0 " (w) " " (h)} role="img" aria-label="the order's timeline" {
            text x="0" y="15" font-size="11" fill="#374151" { "order" }
            @for (i, name) in lanes.iter().enumerate() {
                @let y = lane_h * (i + 1) as f64 + 15.0;
                text x="0" y=(y) font-size="11" fill="#374151" { (truncate(name, 16)) }
                line x1=(left) y1=(y - 4.0) x2=(w) y2=(y - 4.0) stroke="#eef0f3" {}
            }
            @for mark in &marks { (mark) }
            // Still waiting for an answer: an open bar to now.
            @for (lane, since) in open.iter().enumerate() {
                @if let Some(from) = since {
                    @if lane < lanes.len() {
                        rect.step-open x=(f1(x(*from))) y=(f1(lane_y(lane)))
                            width=(f1((x(end) - x(*from)).max(2.0))) height="12" rx="2" fill="#93c5fd" {
                            title { (lanes[lane]) ": no answer yet" }
                        }
                    }
                }
            }
            text x=(left) y=(h - 2.0) font-size="10" fill="#6b7280" { (start.format("%H:%M:%S%.3f")) }
            text x=(w) y=(h - 2.0) font-size="10" text-anchor="end" fill="#6b7280" { "+" (format!("{:.3}", span / 1e6)) " s" }
        }
    }
}

/// A coordinate, to a tenth.
fn f1(v: f64) -> String {
    format!("{v:.1}")
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        let mut t: String = s.chars().take(n - 1).collect();
        t.push('…');
        t
    }
}
