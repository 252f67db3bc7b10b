//! Error triage: Error orders grouped by cause (workflow, the step they failed at, the
//! error with ids and numbers stripped), each with its count, first and last seen, and
//! Retry all / Cancel all. A group action asks first, saying how many orders it moves
//! and what a retry will do to them (continue from the failed step, or run afresh when
//! steps were undone), then acts on exactly the group's orders, recorded in each
//! order's history under the operator's name. Below, the Error orders one by one.

use std::collections::HashMap;
use std::fmt::Write as _;

use axum::extract::{Form, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use orderly_core::store::{OrderFilter, StateStore};
use orderly_core::triage::{ErrorGroup, GroupKey, group_errors};
use orderly_core::{ProcessState, RetryPlan, StateRow};
use serde::Deserialize;

use super::Dash;
use super::actions::{Acting, acting, done_page, refused};
use super::auth::{cookie, operator};
use super::html::{action_fields, ago, esc, failed, page, url, when};

/// Most Error orders read for grouping.
const MOST: usize = 20_000;

/// Every Error order (up to [`MOST`]), oldest first.
async fn error_rows(store: &dyn StateStore) -> orderly_core::Result<Vec<StateRow>> {
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
async fn step_name(store: &dyn StateStore, group: &ErrorGroup) -> String {
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
    let mut body = String::new();
    if rows.is_empty() {
        body.push_str("<p class=\"notice\" id=no-errors>No order is in Error.</p>");
    } else {
        let _ = write!(
            body,
            "<div class=card><h2>{} orders in Error, {} causes</h2><div class=scroll><table id=groups>\
             <tr><th>orders</th><th>step</th><th>cause</th><th>first seen</th><th>last seen</th><th></th></tr>",
            rows.len(),
            groups.len()
        );
        for (i, g) in groups.iter().enumerate() {
            let name = step_name(store, g).await;
            let k = key_query(&g.key);
            let _ = write!(
                body,
                "<tr class=group id=\"group-{i}\"><td class=n><b>{n}</b></td><td>{step} <b>{name}</b><br><span class=muted>{wf}</span></td>\
                 <td><span class=mono>{pattern}</span><br><span class=muted>e.g. {example}</span></td>\
                 <td title=\"{first_at}\">{first} ago</td><td title=\"{last_at}\">{last} ago</td>\
                 <td><a class=\"act retry-all\" href=\"/errors/group?action=retry&{k}\">Retry all {n}</a> \
                 <a class=\"act danger cancel-all\" href=\"/errors/group?action=cancel&{k}\">Cancel all {n}</a> \
                 <a href=\"/orders?state=Error&step={step}\">list</a></td></tr>",
                n = g.count(),
                step = g.key.step,
                name = esc(&name),
                wf = esc(&g.key.workflow),
                pattern = esc(&g.key.pattern),
                example = esc(&g.example),
                first_at = when(g.first_seen),
                first = ago(g.first_seen),
                last_at = when(g.last_seen),
                last = ago(g.last_seen),
            );
        }
        body.push_str("</table></div></div>");
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
    let _ = write!(
        body,
        "<div class=card><h2>Error orders</h2><form class=filters method=get action=\"/errors\">\
         <label>Error text<input name=q value=\"{}\"></label>\
         <label>Step<input name=step size=3 value=\"{}\"></label><button>Search</button></form>\
         <div class=scroll><table id=errors><tr><th>order</th><th>step</th><th>failures</th><th>created</th><th>last error</th></tr>",
        esc(&text),
        step.map(|s| s.to_string()).unwrap_or_default()
    );
    for r in listed {
        let _ = write!(
            body,
            "<tr><td class=mono><a href=\"/orders/{id}\">{id}</a></td><td>{}</td><td>{}</td><td>{} ago</td><td>{}</td></tr>",
            r.current_step,
            r.failure_count,
            ago(r.created_at),
            esc(r.last_error.as_deref().unwrap_or("")),
            id = esc(r.order_id.as_str()),
        );
    }
    body.push_str("</table></div></div>");
    page("Errors", "/errors", &body).into_response()
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
        return (StatusCode::BAD_REQUEST, page("Bad action", "/errors", "")).into_response();
    };
    let (group, rows) = match group_now(store, &q.key()).await {
        Ok(Some(g)) => g,
        Ok(None) => {
            return page(
                "Nothing to do",
                "/errors",
                "<p class=notice>No order is in Error for this cause any more. <a href=\"/errors\">Back</a></p>",
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
        format!(
            "<p id=confirm-what>Retry <b id=confirm-count>{n}</b> orders: <b>{continuing}</b> continue from the failed step \
             (the steps done before still stand), <b>{afresh}</b> run afresh from the first step under new idempotency keys \
             (some of their steps had been undone), <b>{undo_first}</b> finish undoing first and then run afresh \
             (they stopped half undone).</p>"
        )
    } else {
        format!(
            "<p id=confirm-what>Cancel <b id=confirm-count>{n}</b> orders: the steps they completed are undone first \
             (their compensations), then each ends Cancelled. This cannot be taken back.</p>"
        )
    };
    let csrf = cookie(&headers, "orderly_csrf").unwrap_or("");
    let body = format!(
        "<div class=card><p>Cause: <span class=mono>{pattern}</span> at step {step} of {wf}</p>{what}\
         <form method=post action=\"/errors/group\">{fields}\
         <input type=hidden name=action value=\"{action}\"><input type=hidden name=workflow value=\"{wf}\">\
         <input type=hidden name=step value=\"{step}\"><input type=hidden name=pattern value=\"{pattern}\">\
         <input type=hidden name=expected value=\"{n}\">\
         <input name=reason size=40 value=\"{reason}\" aria-label=\"reason\"> \
         <button id=confirm class=\"{class}\">{label} {n} orders</button> <a href=\"/errors\">Back</a></form></div>",
        pattern = esc(&group.key.pattern),
        step = group.key.step,
        wf = esc(&group.key.workflow),
        fields = action_fields(csrf, &operator(&headers)),
        action = esc(&q.action),
        reason = if retry {
            "retried from the dashboard"
        } else {
            "cancelled from the dashboard"
        },
        class = if retry { "" } else { "danger" },
        label = if retry { "Retry" } else { "Cancel" },
    );
    page(
        if retry {
            "Retry a cause"
        } else {
            "Cancel a cause"
        },
        "/errors",
        &body,
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
    let (group, _) = match group_now(store, &group_query.key()).await {
        Ok(Some(g)) => g,
        Ok(None) => (
            ErrorGroup {
                key: group_query.key(),
                orders: Vec::new(),
                example: String::new(),
                first_seen: chrono::Utc::now(),
                last_seen: chrono::Utc::now(),
            },
            HashMap::new(),
        ),
        Err(e) => return failed(e),
    };
    let (mut moved, mut refused_n) = (0, Vec::new());
    for id in &group.orders {
        let done = if retry {
            store.resubmit(id, &actor, &reason, &[]).await.map(|_| ())
        } else {
            store
                .request_cancel(id, &actor, &reason, &[])
                .await
                .map(|_| ())
        };
        match done {
            Ok(()) => moved += 1,
            Err(e) => refused_n.push(e.about(id)),
        }
    }
    let verb = if retry { "Retried" } else { "Cancelled" };
    let mut text = format!(
        "<p class=notice id=group-done>{verb} <b id=moved>{moved}</b> orders of this cause \
         (as {}).</p>",
        esc(actor.as_str())
    );
    if let Some(expected) = form.expected
        && expected != group.count()
    {
        let _ = write!(
            text,
            "<p class=muted>The cause had {expected} orders when you confirmed and {} when it was done.</p>",
            group.count()
        );
    }
    if !refused_n.is_empty() {
        let _ = write!(
            text,
            "<p class=\"notice bad\">Not moved: {}</p>",
            esc(&refused_n.join("; "))
        );
    }
    text.push_str("<p><a href=\"/errors\">Back to the errors</a></p>");
    done_page(&fields, verb, &text)
}
