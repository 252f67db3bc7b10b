//! Workflow versions: every stored version with its orders not finished (Pending,
//! Processing, Error), versions orders are pinned to that nobody stored, and, for a
//! version with Pending or Error orders, a form that moves them to a compatible
//! version of the same workflow (the store refuses an incompatible one).

use axum::extract::{Form, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};
use orderly_core::ProcessState;
use orderly_core::workflow::{Workflow, WorkflowRef};
use serde::Deserialize;

use super::Dash;
use super::actions::{Acting, acting, done_page, refused};
use super::auth::{cookie, operator};
use super::html::{action_fields, failed, page, when};

pub(super) async fn workflows(State(dash): State<Dash>, headers: HeaderMap) -> Response {
    let store = &dash.backend.store;
    let counts = match store.workflows_in_flight().await {
        Ok(c) => c,
        Err(e) => return failed(e),
    };
    let stored = match store.stored_workflows().await {
        Ok(s) => s,
        Err(e) => return failed(e),
    };
    let csrf = cookie(&headers, "orderly_csrf").unwrap_or("");
    let operator = operator(&headers);
    let live = |r: &WorkflowRef, state: ProcessState| -> i64 {
        counts
            .iter()
            .filter(|c| {
                c.workflow.as_deref() == Some(r.name.as_str())
                    && c.version.as_deref() == Some(r.version.as_str())
                    && c.state == state
            })
            .map(|c| c.orders)
            .sum()
    };
    let flows: Vec<(WorkflowRef, Option<Workflow>)> = stored
        .iter()
        .map(|s| (s.reference.clone(), s.workflow().ok()))
        .collect();
    // Versions orders are pinned to that nobody stored: no scheduler runs them.
    let mut missing = std::collections::BTreeSet::new();
    for c in &counts {
        let (Some(name), Some(version)) = (c.workflow.as_deref(), c.version.as_deref()) else {
            continue;
        };
        if !stored
            .iter()
            .any(|s| s.reference.name == name && s.reference.version == version)
        {
            missing.insert(c.label());
        }
    }
    let body = html! {
        div.card {
            p.muted { "Every version stored is run by any scheduler. Orders keep the \
                version they started on; Pending and Error orders can be moved to a compatible version \
                (the same steps, queues, order and compensations; budgets, retries and probes may differ)." }
            div.scroll { table #workflows data-refresh {
                tr { th { "version" } th { "stored" } th { "by" } th { "Pending" } th { "Processing" }
                     th { "Error" } th { "move to a compatible version" } }
                @for s in &stored {
                    @let r = &s.reference;
                    @let (p, w, e) = (
                        live(r, ProcessState::Pending),
                        live(r, ProcessState::Processing),
                        live(r, ProcessState::Error),
                    );
                    tr {
                        td.mono { (r.to_string()) }
                        td { (when(s.first_seen_at)) }
                        td { (s.first_seen_by) }
                        td { (p) } td { (w) } td { (e) }
                        td { (move_cell(&flows, r, p + e, csrf, &operator)) }
                    }
                }
                @for label in &missing {
                    tr {
                        td.mono { (label) }
                        td colspan="6" {
                            b.bad { "not stored" } ": no scheduler can run its orders; "
                            code { "orderly migrate --workflow FILE" } " with its file stores it"
                        }
                    }
                }
                @if stored.is_empty() && missing.is_empty() {
                    tr { td colspan="7" .muted { "No version stored yet." } }
                }
            } }
        }
    };
    page("Workflows", "/workflows", body).into_response()
}

/// What can be done with version `r`'s `movable` Pending and Error orders: a form
/// moving them to a compatible version, or why there is none.
fn move_cell(
    flows: &[(WorkflowRef, Option<Workflow>)],
    r: &WorkflowRef,
    movable: i64,
    csrf: &str,
    operator: &str,
) -> Markup {
    let this = flows
        .iter()
        .find(|(f, _)| f == r)
        .and_then(|(_, w)| w.as_ref());
    let targets: Vec<&WorkflowRef> = match this {
        Some(this) => flows
            .iter()
            .filter(|(f, w)| f != r && w.as_ref().is_some_and(|w| this.compatible_with(w).is_ok()))
            .map(|(f, _)| f)
            .collect(),
        None => Vec::new(),
    };
    html! {
        @if this.is_none() {
            b.bad { "definition does not check" }
        } @else if movable == 0 {
            span.muted { "no Pending or Error orders" }
        } @else if targets.is_empty() {
            span.muted { "no compatible version stored" }
        } @else {
            form method="post" action="/workflows/move" class="inline" {
                input type="hidden" name="from" value=(r.to_string());
                select name="to" aria-label="version to move to" {
                    @for t in &targets { option value=(t.to_string()) { (t.to_string()) } }
                }
                " "
                input name="reason" placeholder="reason" size="12" aria-label="reason";
                (action_fields(csrf, operator))
                button { "Move " (movable) " orders" }
            }
        }
    }
}

/// The move form.
#[derive(Debug, Deserialize)]
pub(super) struct Move {
    from: String,
    to: String,
    csrf: String,
    operator: Option<String>,
    reason: Option<String>,
}

pub(super) async fn move_orders(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Form(form): Form<Move>,
) -> Response {
    let fields = Acting {
        csrf: form.csrf.clone(),
        operator: form.operator.clone(),
        reason: form.reason.clone(),
    };
    let (actor, reason) = match acting(&headers, &fields) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    let (Ok(from), Ok(to)) = (WorkflowRef::parse(&form.from), WorkflowRef::parse(&form.to)) else {
        return refused(StatusCode::BAD_REQUEST, "bad workflow version");
    };
    let states = [ProcessState::Pending, ProcessState::Error];
    let moved = match orderly_core::store::move_version_all(
        dash.backend.store.as_ref(),
        &from,
        &to,
        &states,
        &actor,
        &reason,
        &mut |_| {},
    )
    .await
    {
        Ok(n) => n,
        Err(e @ orderly_core::Error::Invalid(_)) => {
            return refused(StatusCode::CONFLICT, &e.to_string());
        }
        Err(e) => return failed(e),
    };
    tracing::info!(operator = %actor, from = %from, to = %to, moved, "orders moved to another version from the dashboard");
    done_page(
        &fields,
        "Orders moved",
        html! {
            p.notice #moved { b { (moved) } " orders moved from " b { (from.to_string()) } " to " b { (to.to_string()) } "." }
            p { a href="/workflows" { "Back to the workflows" } }
        },
    )
}
