//! One order: its state and what it waits for, Retry (saying what a retry will do) and
//! Cancel, a visual timeline of its steps and attempts, the steps, the full history,
//! and the details.

use std::fmt::Write as _;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use orderly_core::history::{HistoryEvent, HistoryKind};
use orderly_core::store::OrderView;
use orderly_core::{OrderId, ProcessState};

use super::Dash;
use super::auth::{cookie, operator};
use super::html::{action_fields, badge, esc, failed, page, url};

pub(super) async fn order(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let Ok(order_id) = OrderId::parse(id) else {
        return (StatusCode::BAD_REQUEST, page("Bad order id", "/orders", "")).into_response();
    };
    let view = match dash.backend.store.get(&order_id).await {
        Ok(v) => v,
        Err(orderly_core::Error::OrderNotFound(_)) => {
            return (
                StatusCode::NOT_FOUND,
                page(
                    "No such order",
                    "/orders",
                    "<p class=notice>No order has this id (finished orders are removed after the retention period).</p>",
                ),
            )
                .into_response();
        }
        Err(e) => return failed(e),
    };
    let s = &view.state;
    let csrf = cookie(&headers, "orderly_csrf").unwrap_or("");
    let operator = operator(&headers);
    let mut body = format!(
        "<div class=card><p>State <b id=state class=\"{0}\">{0}</b> {1}{2} &middot; step {3} &middot; failures {4} \
         &middot; epoch {5} &middot; held by {6} &middot; workflow <b id=workflow>{7}</b></p>",
        s.process_state.as_str(),
        badge(s.process_state),
        s.finish_as
            .map(|f| format!(" (undoing its steps, then {f})"))
            .unwrap_or_default(),
        s.current_step,
        s.failure_count,
        s.lock_epoch,
        esc(s.locked_by.as_ref().map_or("nobody", |l| l.as_str())),
        esc(&s.workflow_label())
    );
    if s.waiting_on.is_some() {
        let services = dash
            .backend
            .store
            .services()
            .await
            .unwrap_or_default()
            .into_iter()
            .map(|h| (h.service.clone(), h))
            .collect();
        if let Some(note) = s.waiting_note(&services) {
            let _ = write!(body, "<p><b id=waiting class=warn>{}</b></p>", esc(&note));
        }
    }
    if let Some(e) = &s.error_note() {
        let _ = write!(
            body,
            "<p>Last error: <b id=last-error class=bad>{}</b></p>",
            esc(e)
        );
    }
    let form = |action: &str, label: &str, reason: &str, class: &str| {
        format!(
            "<form class=inline method=post action=\"/orders/{id}/{action}\">{fields}\
             <input name=reason value=\"{reason}\" size=24 aria-label=reason> <button id={action} class=\"{class}\">{label}</button></form> ",
            id = url(s.order_id.as_str()),
            fields = action_fields(csrf, &operator),
        )
    };
    if s.process_state == ProcessState::Error {
        // Say what a retry will do: continue, or run afresh because steps were undone.
        let plan = orderly_core::RetryPlan::for_order(s.generation, s.current_step, &view.steps);
        let label = match &plan {
            orderly_core::RetryPlan::Continue { .. } => "Retry from the failed step",
            orderly_core::RetryPlan::FreshRun { .. } => "Retry as a fresh run from the first step",
            orderly_core::RetryPlan::UndoFirst { .. } => {
                "Finish undoing, then retry as a fresh run"
            }
        };
        let _ = write!(
            body,
            "<p id=retry-plan class=muted>A retry {}.</p>",
            esc(&plan.describe())
        );
        body.push_str(&form("retry", label, "retried from the dashboard", ""));
    }
    if s.process_state.can_become(ProcessState::Cancelled) {
        body.push_str(&form(
            "cancel",
            "Cancel (undo its steps)",
            "cancelled from the dashboard",
            "danger",
        ));
    }
    body.push_str("</div>");
    let _ = write!(
        body,
        "<div class=\"card chart\"><h2>Timeline</h2>{}</div>",
        timeline_svg(&view)
    );
    body.push_str("<div class=card><h2>Steps</h2><div class=scroll><table id=steps><tr><th>#</th><th>step</th><th>status</th><th>attempts</th><th>key</th><th>detail</th></tr>");
    for st in &view.steps {
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"mono muted\">{}</td><td>{}</td></tr>",
            st.index,
            esc(&st.name),
            st.status.as_str(),
            st.attempts,
            esc(&st.idempotency_key),
            esc(st.detail.as_deref().unwrap_or(""))
        );
    }
    body.push_str("</table></div></div><div class=card><h2>History</h2><div class=scroll><table id=timeline><tr><th>when</th><th>what</th><th>from</th><th>to</th><th>who</th><th>epoch</th><th>why</th></tr>");
    for h in &view.history {
        let _ = write!(
            body,
            "<tr><td class=mono>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            h.at.format("%Y-%m-%d %H:%M:%S%.3f"),
            h.kind.as_str(),
            h.from_state.map_or("", |f| f.as_str()),
            badge(h.to_state),
            esc(h.actor.as_str()),
            h.epoch,
            esc(h.reason.as_deref().unwrap_or(""))
        );
    }
    body.push_str("</table></div></div><div class=card><h2>Details</h2><pre class=mono>");
    body.push_str(&esc(
        &serde_json::to_string_pretty(&view.details).unwrap_or_default()
    ));
    body.push_str("</pre></div>");
    page(&format!("Order {}", s.order_id), "/orders", &body).into_response()
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
fn timeline_svg(view: &OrderView) -> String {
    let events: &[HistoryEvent] = &view.history;
    let (Some(first), Some(last)) = (events.first(), events.last()) else {
        return String::new();
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
    let mut svg = format!(
        "<svg id=\"order-timeline\" viewBox=\"0 0 {w} {h}\" role=\"img\" aria-label=\"the order's timeline\">\
         <text x=\"0\" y=\"15\" font-size=\"11\" fill=\"#374151\">order</text>"
    );
    for (i, name) in lanes.iter().enumerate() {
        let y = lane_h * (i + 1) as f64 + 15.0;
        let _ = write!(
            svg,
            "<text x=\"0\" y=\"{y}\" font-size=\"11\" fill=\"#374151\">{}</text>\
             <line x1=\"{left}\" y1=\"{y2}\" x2=\"{w}\" y2=\"{y2}\" stroke=\"#eef0f3\"/>",
            esc(&truncate(name, 16)),
            y2 = y - 4.0
        );
    }
    // Each step's attempts: from a start to the next entry about that step.
    let mut open: Vec<Option<DateTime<Utc>>> = vec![None; lanes.len().max(1)];
    let lane_of = |step: Option<i32>| step.and_then(|s| indices.iter().position(|i| *i == s));
    for e in events {
        if let Some(colour) = step_colour(e.kind)
            && let Some(lane) = lane_of(e.step)
        {
            let y = lane_h * (lane + 1) as f64 + 4.0;
            if e.kind == HistoryKind::StepStarted {
                open[lane] = Some(e.at);
                let _ = write!(
                    svg,
                    "<circle class=attempt cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{colour}\"><title>{} sent at {}</title></circle>",
                    x(e.at),
                    y + 6.0,
                    esc(&lanes[lane]),
                    e.at.format("%H:%M:%S%.3f")
                );
            } else {
                let from = open[lane].take().unwrap_or(e.at);
                let _ = write!(
                    svg,
                    "<rect class=\"step-{}\" x=\"{:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"12\" rx=\"2\" fill=\"{colour}\">\
                     <title>{}: {} at {} ({} ms)</title></rect>",
                    e.kind.as_str(),
                    x(from),
                    (x(e.at) - x(from)).max(2.0),
                    esc(&lanes[lane]),
                    e.kind.as_str(),
                    e.at.format("%H:%M:%S%.3f"),
                    (e.at - from).num_milliseconds()
                );
            }
        } else if e.from_state != Some(e.to_state) || e.kind == HistoryKind::WaitEnded {
            let colour = match e.to_state {
                ProcessState::Processed => "#15803d",
                ProcessState::Error => "#b91c1c",
                ProcessState::Cancelled => "#6b7280",
                ProcessState::Processing => "#d97706",
                ProcessState::Pending => "#2563eb",
            };
            let _ = write!(
                svg,
                "<rect class=\"mark {}\" x=\"{:.1}\" y=\"4\" width=\"3\" height=\"14\" fill=\"{colour}\">\
                 <title>{} at {}: {} -> {}{}</title></rect>",
                e.kind.as_str(),
                x(e.at) - 1.5,
                e.kind.as_str(),
                e.at.format("%H:%M:%S%.3f"),
                e.from_state.map_or("-", |f| f.as_str()),
                e.to_state.as_str(),
                e.reason
                    .as_deref()
                    .map(|r| format!(" ({})", esc(r)))
                    .unwrap_or_default()
            );
        }
    }
    // Still waiting for an answer: an open bar to now.
    for (lane, since) in open.iter().enumerate() {
        if let Some(from) = since
            && lane < lanes.len()
        {
            let y = lane_h * (lane + 1) as f64 + 4.0;
            let _ = write!(
                svg,
                "<rect class=\"step-open\" x=\"{:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"12\" rx=\"2\" fill=\"#93c5fd\">\
                 <title>{}: no answer yet</title></rect>",
                x(*from),
                (x(end) - x(*from)).max(2.0),
                esc(&lanes[lane])
            );
        }
    }
    let _ = write!(
        svg,
        "<text x=\"{left}\" y=\"{}\" font-size=\"10\" fill=\"#6b7280\">{}</text>\
         <text x=\"{w}\" y=\"{}\" font-size=\"10\" text-anchor=\"end\" fill=\"#6b7280\">+{:.3} s</text></svg>",
        h - 2.0,
        start.format("%H:%M:%S%.3f"),
        h - 2.0,
        span / 1e6
    );
    svg
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
