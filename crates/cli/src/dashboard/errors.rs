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
use orderly_core::triage::{ErrorCause, ErrorGroup, GroupKey};
use orderly_core::{OrderId, ProcessState, RetryPlan, StateRow};
use serde::Deserialize;

use super::Dash;
use super::actions::{Acting, acting, done_page, refused};
use super::auth::{cookie, operator};
use super::html::{action_fields, ago, failed, notice, page, url, when};

/// Most orders a group action reads and acts on at once.
pub(super) const MOST: u32 = 100_000;

/// The name of the step each cause failed at, read from its sample order's steps (all
/// the samples' steps in one query); empty where they cannot be read.
pub(super) async fn step_names(store: &dyn StateStore, causes: &[ErrorCause]) -> Vec<String> {
    let samples: Vec<OrderId> = causes.iter().map(|c| c.sample.clone()).collect();
    let steps = store.steps_of_many(&samples).await.unwrap_or_default();
    causes
        .iter()
        .map(|c| {
            steps
                .get(&c.sample)
                .and_then(|s| s.iter().find(|s| s.index == c.key.step))
                .map(|s| s.name.clone())
                .unwrap_or_default()
        })
        .collect()
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
    let causes = match store.error_causes().await {
        Ok(c) => c,
        Err(e) => return failed(e),
    };
    let names = step_names(store, &causes).await;
    let total: u64 = causes.iter().map(|c| c.count).sum();
    // The orders one by one, searchable by error text and step.
    let text = query.q.unwrap_or_default();
    let step = query
        .step
        .as_deref()
        .and_then(|s| s.trim().parse::<i32>().ok());
    let listed = match store
        .list(&OrderFilter {
            state: Some(ProcessState::Error),
            error_contains: Some(text.trim().to_owned()).filter(|t| !t.is_empty()),
            current_step: step,
            limit: 200,
            ..OrderFilter::default()
        })
        .await
    {
        Ok(page) => page.orders,
        Err(e) => return failed(e),
    };
    let body = html! {
        @if causes.is_empty() {
            p.notice #no-errors { "No order is in Error." }
        } @else {
            div.card {
                h2 { (total) " orders in Error, " (causes.len()) " causes" }
                div.scroll { table #groups data-refresh {
                    tr { th { "orders" } th { "step" } th { "cause" } th { "first seen" } th { "last seen" } th {} }
                    @for (i, (c, name)) in causes.iter().zip(&names).enumerate() {
                        @let g = c.key.group_key();
                        @let k = key_query(&g);
                        @let n = c.count;
                        tr.group id={"group-" (i)} {
                            td.n { b { (n) } }
                            td { (g.step) " " b { (name) } br; span.muted { (g.workflow) } }
                            td { span.mono { (g.pattern) } br; span.muted { "e.g. " (c.example) } }
                            td title=(when(c.first_seen)) { (ago(c.first_seen)) " ago" }
                            td title=(when(c.last_seen)) { (ago(c.last_seen)) " ago" }
                            td {
                                a class="act retry-all" href={"/errors/group?action=retry&" (k)} { "Retry all " (n) }
                                " "
                                a class="act danger cancel-all" href={"/errors/group?action=cancel&" (k)} { "Cancel all " (n) }
                                " "
                                a href={"/orders?state=Error&step=" (g.step)} { "list" }
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

/// The group's orders now (up to [`MOST`]), with their rows.
async fn group_now(
    store: &dyn StateStore,
    key: &GroupKey,
) -> orderly_core::Result<Option<(ErrorGroup, HashMap<String, StateRow>)>> {
    let causes = store.error_causes().await?;
    let Some(cause) = causes.into_iter().find(|c| &c.key.group_key() == key) else {
        return Ok(None);
    };
    let rows = store.error_cause_orders(&cause.key, MOST).await?;
    let group = ErrorGroup {
        key: key.clone(),
        orders: rows.iter().map(|r| r.order_id.clone()).collect(),
        example: cause.example,
        first_seen: cause.first_seen,
        last_seen: cause.last_seen,
    };
    let by_id = rows
        .into_iter()
        .map(|r| (r.order_id.as_str().to_owned(), r))
        .collect();
    Ok(Some((group, by_id)))
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
        let mut steps = match store.steps_of_many(&group.orders).await {
            Ok(s) => s,
            Err(e) => return failed(e),
        };
        for id in &group.orders {
            let Some(r) = rows.get(id.as_str()) else {
                continue;
            };
            let steps = steps.remove(id).unwrap_or_default();
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
