//! Error triage: Error orders grouped by cause (workflow, the step they failed at, the
//! error with ids and numbers stripped), each with its count, first and last seen, and
//! Retry all / Cancel all. A group action asks first, saying how many orders it moves
//! and what a retry will do to them (continue from the failed step, or run afresh when
//! steps were undone), then acts on exactly the group's orders, recorded in each
//! order's history under the operator's name. Below, the Error orders one by one.

use std::collections::HashMap;

use axum::extract::{Form, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use maud::html;
use orderly_core::store::{OrderFilter, StateStore};
use orderly_core::triage::{ErrorGroup, GroupKey, group_errors};
use orderly_core::{ProcessState, RetryPlan, StateRow};
use serde::Deserialize;

use super::Dash;
use super::actions::{Acting, acting, done_page, refused};
use super::auth::{cookie, operator};
use super::html::{action_fields, ago, failed, notice, page, url, when};

/// Most Error orders read for grouping.
const MOST: usize = 20_000;

/// Every Error order (up to [`MOST`]), oldest first.
pub(super) async fn error_rows(store: &dyn StateStore) -> orderly_core::Result<Vec<StateRow>> {
    let mut filter = OrderFilter {
        state: Some(ProcessState::Error),
        limit: 1_000,
        ..OrderFilter::default()
    };
    let mut rows = Vec::new();
    loop {
        let page = store.list(&filter).await?;
        rows.extend(page.orders);
        match page.next {
            Some(next) if rows.len() < MOST => filter.after = Some(next),
            _ => return Ok(rows),
        }
    }
}

/// The name of step `step` of the orders of `group` (read from one of them).
pub(super) async fn step_name(store: &dyn StateStore, group: &ErrorGroup) -> String {
    let Some(sample) = group.orders.first() else {
        return String::new();
    };
    store
        .steps(sample)
        .await
        .ok()
        .and_then(|steps| {
            steps
                .into_iter()
                .find(|s| s.index == group.key.step)
                .map(|s| s.name)
        })
        .unwrap_or_default()
}

#[derive(Deserialize)]
pub(super) struct ErrorQuery {
    q: Option<String>,
    step: Option<String>,
}

fn key_query(key: &GroupKey) -> String {
    format!(
        "workflow={}&step={}&pattern={}",
        url(&key.workflow),
        key.step,
        url(&key.pattern)
    )
}

pub(super) async fn errors(State(dash): State<Dash>, Query(query): Query<ErrorQuery>) -> Response {
    let store = dash.backend.store.as_ref();
    let rows = match error_rows(store).await {
        Ok(r) => r,
        Err(e) => return failed(e),
    };
    let groups = group_errors(&rows);
    let mut names = Vec::with_capacity(groups.len());
    for g in &groups {
        names.push(step_name(store, g).await);
    }
    // The orders one by one, searchable by error text and step.
    let text = query.q.unwrap_or_default();
    let step = query
        .step
        .as_deref()
        .and_then(|s| s.trim().parse::<i32>().ok());
    let needle = text.to_lowercase();
    let listed: Vec<&StateRow> = rows
        .iter()
        .filter(|r| {
            needle.is_empty()
                || r.last_error
                    .as_deref()
                    .is_some_and(|e| e.to_lowercase().contains(&needle))
        })
        .filter(|r| step.is_none_or(|s| r.current_step == s))
        .take(200)
        .collect();
    let body = html! {
        @if rows.is_empty() {
            p.notice #no-errors { "No order is in Error." }
        } @else {
            div.card {
                h2 { (rows.len()) " orders in Error, " (groups.len()) " causes" }
                div.scroll { table #groups data-refresh {
                    tr { th { "orders" } th { "step" } th { "cause" } th { "first seen" } th { "last seen" } th {} }
                    @for (i, (g, name)) in groups.iter().zip(&names).enumerate() {
                        @let k = key_query(&g.key);
                        @let n = g.count();
                        tr.group id={"group-" (i)} {
                            td.n { b { (n) } }
                            td { (g.key.step) " " b { (name) } br; span.muted { (g.key.workflow) } }
                            td { span.mono { (g.key.pattern) } br; span.muted { "e.g. " (g.example) } }
                            td title=(when(g.first_seen)) { (ago(g.first_seen)) " ago" }
                            td title=(when(g.last_seen)) { (ago(g.last_seen)) " ago" }
                            td {
                                a class="act retry-all" href={"/errors/group?action=retry&" (k)} { "Retry all " (n) }
                                " "
                                a class="act danger cancel-all" href={"/errors/group?action=cancel&" (k)} { "Cancel all " (n) }
                                " "
                                a href={"/orders?state=Error&step=" (g.key.step)} { "list" }
                            }
                        }
                    }
                } }
            }
        }
        div.card {
            h2 { "Error orders" }
            form.filters method="get" action="/errors" {
                label { "Error text" input name="q" value=(text); }
                label { "Step" input name="step" size="3" value=(step.map(|s| s.to_string()).unwrap_or_default()); }
                button { "Search" }
            }
            div.scroll { table #errors data-refresh {
                tr { th { "order" } th { "step" } th { "failures" } th { "created" } th { "last error" } }
                @for r in listed {
                    tr {
                        td.mono { a href={"/orders/" (url(r.order_id.as_str()))} { (r.order_id.as_str()) } }
                        td { (r.current_step) }
                        td { (r.failure_count) }
                        td { (ago(r.created_at)) " ago" }
                        td { (r.last_error.as_deref().unwrap_or("")) }
                    }
                }
            } }
        }
    };
    page("Errors", "/errors", body).into_response()
}

/// A group and what to do with it.
#[derive(Debug, Deserialize)]
pub(super) struct GroupQuery {
    action: String,
    workflow: String,
    step: i32,
    pattern: String,
}

impl GroupQuery {
    fn key(&self) -> GroupKey {
        GroupKey {
            workflow: self.workflow.clone(),
            step: self.step,
            pattern: self.pattern.clone(),
        }
    }

    fn retry(&self) -> Option<bool> {
        match self.action.as_str() {
            "retry" => Some(true),
            "cancel" => Some(false),
            _ => None,
        }
    }
}

/// The group's orders now, with their rows.
async fn group_now(
    store: &dyn StateStore,
    key: &GroupKey,
) -> orderly_core::Result<Option<(ErrorGroup, HashMap<String, StateRow>)>> {
    let rows = error_rows(store).await?;
    let group = group_errors(&rows).into_iter().find(|g| &g.key == key);
    let by_id = rows
        .into_iter()
        .map(|r| (r.order_id.as_str().to_owned(), r))
        .collect();
    Ok(group.map(|g| (g, by_id)))
}

/// What acting on a group will do: asked before it is done.
pub(super) async fn confirm(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Query(q): Query<GroupQuery>,
) -> Response {
    let store = dash.backend.store.as_ref();
    let Some(retry) = q.retry() else {
        return (
            StatusCode::BAD_REQUEST,
            page("Bad action", "/errors", html! {}),
        )
            .into_response();
    };
    let (group, rows) = match group_now(store, &q.key()).await {
        Ok(Some(g)) => g,
        Ok(None) => {
            return page(
                "Nothing to do",
                "/errors",
                html! { p.notice { "No order is in Error for this cause any more. " a href="/errors" { "Back" } } },
            )
            .into_response();
        }
        Err(e) => return failed(e),
    };
    let n = group.count();
    let what = if retry {
        let (mut continuing, mut afresh, mut undo_first) = (0, 0, 0);
        for id in &group.orders {
            let Some(r) = rows.get(id.as_str()) else {
                continue;
            };
            let steps = store.steps(id).await.unwrap_or_default();
            match RetryPlan::for_order(r.generation, r.current_step, &steps) {
                RetryPlan::Continue { .. } => continuing += 1,
                RetryPlan::FreshRun { .. } => afresh += 1,
                RetryPlan::UndoFirst { .. } => undo_first += 1,
            }
        }
        html! { p #confirm-what {
            "Retry " b #confirm-count { (n) } " orders: " b { (continuing) } " continue from the failed step \
             (the steps done before still stand), " b { (afresh) } " run afresh from the first step under new idempotency keys \
             (some of their steps had been undone), " b { (undo_first) } " finish undoing first and then run afresh \
             (they stopped half undone)."
        } }
    } else {
        html! { p #confirm-what {
            "Cancel " b #confirm-count { (n) } " orders: the steps they completed are undone first \
             (their compensations), then each ends Cancelled. This cannot be taken back."
        } }
    };
    let csrf = cookie(&headers, "orderly_csrf").unwrap_or("");
    let body = html! { div.card {
        p { "Cause: " span.mono { (group.key.pattern) } " at step " (group.key.step) " of " (group.key.workflow) }
        (what)
        form method="post" action="/errors/group" {
            (action_fields(csrf, &operator(&headers)))
            input type="hidden" name="action" value=(q.action);
            input type="hidden" name="workflow" value=(group.key.workflow);
            input type="hidden" name="step" value=(group.key.step);
            input type="hidden" name="pattern" value=(group.key.pattern);
            input type="hidden" name="expected" value=(n);
            input name="reason" size="40" value=(if retry { "retried from the dashboard" } else { "cancelled from the dashboard" }) aria-label="reason";
            " "
            button #confirm class=(if retry { "" } else { "danger" }) { (if retry { "Retry" } else { "Cancel" }) " " (n) " orders" }
            " " a href="/errors" { "Back" }
        }
    } };
    page(
        if retry {
            "Retry a cause"
        } else {
            "Cancel a cause"
        },
        "/errors",
        body,
    )
    .into_response()
}

/// A confirmed group action (fields spelled out: a form cannot carry nested ones).
#[derive(Debug, Deserialize)]
pub(super) struct GroupAction {
    action: String,
    workflow: String,
    step: i32,
    pattern: String,
    expected: Option<usize>,
    csrf: String,
    operator: Option<String>,
    reason: Option<String>,
}

impl GroupAction {
    fn group(&self) -> GroupQuery {
        GroupQuery {
            action: self.action.clone(),
            workflow: self.workflow.clone(),
            step: self.step,
            pattern: self.pattern.clone(),
        }
    }

    fn acting(&self) -> Acting {
        Acting {
            csrf: self.csrf.clone(),
            operator: self.operator.clone(),
            reason: self.reason.clone(),
        }
    }
}

/// What a group action did: the group as it was when acted on, how many of its orders
/// moved, and each one the store refused with why.
pub(super) struct GroupDone {
    pub(super) group: ErrorGroup,
    pub(super) moved: usize,
    pub(super) refused: Vec<(orderly_core::OrderId, String)>,
}

/// Retries (or cancels) the orders of the group `key` as they are now, each recorded
/// under `actor` with `reason`.
pub(super) async fn act_on_group(
    store: &dyn StateStore,
    key: &GroupKey,
    retry: bool,
    actor: &orderly_core::Actor,
    reason: &str,
) -> orderly_core::Result<GroupDone> {
    let group = match group_now(store, key).await? {
        Some((group, _)) => group,
        None => ErrorGroup {
            key: key.clone(),
            orders: Vec::new(),
            example: String::new(),
            first_seen: chrono::Utc::now(),
            last_seen: chrono::Utc::now(),
        },
    };
    let (moved, refused) = super::bulk::act_on(store, &group.orders, retry, actor, reason).await;
    Ok(GroupDone {
        group,
        moved,
        refused,
    })
}

pub(super) async fn act(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Form(form): Form<GroupAction>,
) -> Response {
    let fields = form.acting();
    let (actor, reason) = match acting(&headers, &fields) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    let group_query = form.group();
    let Some(retry) = group_query.retry() else {
        return refused(StatusCode::BAD_REQUEST, "unknown action");
    };
    let store = dash.backend.store.as_ref();
    let GroupDone {
        group,
        moved,
        refused: refused_n,
    } = match act_on_group(store, &group_query.key(), retry, &actor, &reason).await {
        Ok(done) => done,
        Err(e) => return failed(e),
    };
    let refused_n: Vec<String> = refused_n.into_iter().map(|(_, why)| why).collect();
    let verb = if retry { "Retried" } else { "Cancelled" };
    let changed = form.expected.filter(|expected| *expected != group.count());
    let text = html! {
        p.notice #group-done { (verb) " " b #moved { (moved) } " orders of this cause (as " (actor.as_str()) ")." }
        @if let Some(expected) = changed {
            p.muted { "The cause had " (expected) " orders when you confirmed and " (group.count()) " when it was done." }
        }
        @if !refused_n.is_empty() {
            (notice(true, &format!("Not moved: {}", refused_n.join("; "))))
        }
        p { a href="/errors" { "Back to the errors" } }
    };
    done_page(&fields, verb, text)
}
