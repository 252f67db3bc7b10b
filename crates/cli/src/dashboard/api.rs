//! The dashboard's JSON API: what every page shows and every action it takes, for
//! scripts (`curl`, docs/running.md), under the same sign-in as the pages (the token,
//! an operator's token or the proxy's name; a `read` operator may only read) and the
//! same site checks (a `Host` it answers to; a state-changing request from another
//! site refused).
//!
//! An action is a POST whose body is JSON (`Content-Type: application/json`, at least
//! `{}`): a page on another site cannot send that without asking the dashboard first
//! (a CORS preflight), which it never grants, so the JSON body stands where the pages'
//! forms carry their CSRF token. Its fields: `operator` (who acts; a signed-in
//! operator acts under their own name only) and `reason` (for the orders' histories),
//! and what the action needs. Answers are JSON; a refusal is `{"error": "..."}` with
//! 400 (invalid), 403, 404 (no such order, alert or dead letter), 409 (the order's
//! state does not allow it) or 503 (the store cannot be reached).

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use orderly_core::transport::QueueName;
use orderly_core::triage::GroupKey;
use orderly_core::{Actor, OrderId};
use serde::Deserialize;
use serde_json::{Value, json};

use super::Dash;
use super::actions::{one_message, settle_dead_letters, who};
use super::bulk::{act_on, matching};
use super::errors::{GroupDone, act_on_group, step_names};
use super::orders::{OrdersQuery, cursor_text};
use super::overview::ChartQuery;

/// Most order ids listed with an error group (its count says how many it holds).
const GROUP_IDS: u32 = 100;

/// The API's routes (`/api/overview` is the overview's own).
pub(super) fn routes() -> axum::Router<Dash> {
    axum::Router::new()
        .route("/api/orders", get(orders))
        .route("/api/orders/bulk", post(bulk))
        .route("/api/orders/{id}", get(order))
        .route("/api/orders/{id}/retry", post(retry))
        .route("/api/orders/{id}/cancel", post(cancel))
        .route("/api/activity", get(activity))
        .route("/api/errors", get(errors))
        .route("/api/errors/group", post(group))
        .route("/api/alerts", get(alerts))
        .route("/api/alerts/{id}/ack", post(acknowledge))
        .route("/api/alerts/system/{id}/ack", post(acknowledge_system))
        .route("/api/workflows", get(workflows))
        .route("/api/services", get(services))
        .route("/api/services/{service}/resume", post(resume))
        .route("/api/leader", get(leader))
        .route("/api/queues", get(queues))
        .route("/api/dead-letters", get(dead_letters))
        .route("/api/dead-letters/requeue", post(requeue))
        .route("/api/dead-letters/discard", post(discard))
}

/// A refusal: `{"error": why}` with `status`.
fn refused(status: StatusCode, why: impl std::fmt::Display) -> Response {
    (status, Json(json!({ "error": why.to_string() }))).into_response()
}

/// The store's refusal or failure, with the status that says which.
fn store_error(e: orderly_core::Error) -> Response {
    use orderly_core::Error;
    let status = match &e {
        Error::OrderNotFound(_) => StatusCode::NOT_FOUND,
        Error::IllegalTransition { .. } | Error::PastReturn { .. } => StatusCode::CONFLICT,
        Error::Invalid(_) | Error::OrderIdConflict(_) => StatusCode::BAD_REQUEST,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    refused(status, e)
}

/// An action's body, or its refusal as JSON: not JSON (415), not well-formed (400),
/// a field missing, unknown or of the wrong type (422).
fn parsed<T>(body: Result<Json<T>, JsonRejection>) -> Result<T, Box<Response>> {
    body.map(|Json(b)| b)
        .map_err(|r| Box::new(refused(r.status(), r.body_text())))
}

/// `Ok` as JSON.
fn answer(value: Value) -> Response {
    Json(value).into_response()
}

/// What every action's body may carry.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Acting {
    operator: Option<String>,
    reason: Option<String>,
    /// Cancel: at once, without undoing completed steps.
    #[serde(default)]
    no_compensation: bool,
}

/// Who acts and why (`default` when no reason is given).
fn acting(
    headers: &HeaderMap,
    operator: Option<&str>,
    reason: Option<&str>,
    default: &str,
) -> Result<(Actor, String), Box<Response>> {
    let actor = who(headers, operator).map_err(|(status, why)| Box::new(refused(status, why)))?;
    let reason = reason
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .unwrap_or(default)
        .to_owned();
    Ok((actor, reason))
}

/// A group or bulk action's `action` (retry: `true`, or cancel), who acts and why.
fn retry_or_cancel(
    headers: &HeaderMap,
    action: &str,
    operator: Option<&str>,
    reason: Option<&str>,
) -> Result<(bool, Actor, String), Box<Response>> {
    let retry = match action {
        "retry" => true,
        "cancel" => false,
        other => {
            return Err(Box::new(refused(
                StatusCode::BAD_REQUEST,
                format!("action: retry or cancel, not {other:?}"),
            )));
        }
    };
    let (actor, reason) = acting(headers, operator, reason, default_reason(retry))?;
    Ok((retry, actor, reason))
}

/// The reason recorded when an API action gives none.
fn default_reason(retry: bool) -> &'static str {
    if retry {
        "retried from the dashboard's API"
    } else {
        "cancelled from the dashboard's API"
    }
}

/// `GET /api/orders`: the orders page's filters (`state`, `step`, `q` error text,
/// `customer`, `older` minutes, `id` or its start, `waiting` service) and `limit`
/// (1-1000, 50); `next` is the cursor of the following page (`after=`), or null.
async fn orders(State(dash): State<Dash>, Query(query): Query<OrdersQuery>) -> Response {
    let filter = match query.filter() {
        Ok(f) => f,
        Err(e) => return refused(StatusCode::BAD_REQUEST, e),
    };
    let store = &dash.backend.store;
    let page = match store.list(&filter).await {
        Ok(p) => p,
        Err(e) => return store_error(e),
    };
    let services = store
        .services()
        .await
        .unwrap_or_default()
        .into_iter()
        .map(|h| (h.service.clone(), h))
        .collect();
    let rows: Vec<Value> = match page
        .orders
        .iter()
        .map(|r| crate::shapes::state_row(r, &services))
        .collect()
    {
        Ok(rows) => rows,
        Err(e) => return refused(StatusCode::INTERNAL_SERVER_ERROR, e),
    };
    answer(json!({ "orders": rows, "next": page.next.as_ref().map(cursor_text) }))
}

/// `GET /api/orders/{id}`: its state, details, steps and full history.
async fn order(State(dash): State<Dash>, Path(id): Path<String>) -> Response {
    let Ok(id) = OrderId::parse(id) else {
        return refused(StatusCode::BAD_REQUEST, "bad order id");
    };
    match dash.backend.store.get(&id).await {
        Ok(view) => answer(crate::shapes::order(&view)),
        Err(e) => store_error(e),
    }
}

/// `POST /api/orders/{id}/retry` (an Error order round again: it says whether it
/// continues from the failed step or runs afresh) and `.../cancel` (undoing what took
/// effect first, unless `no_compensation`).
async fn act_on_order(
    dash: &Dash,
    headers: &HeaderMap,
    id: String,
    body: Acting,
    retry: bool,
) -> Response {
    let Ok(id) = OrderId::parse(id) else {
        return refused(StatusCode::BAD_REQUEST, "bad order id");
    };
    let (actor, reason) = match acting(
        headers,
        body.operator.as_deref(),
        body.reason.as_deref(),
        default_reason(retry),
    ) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    let store = &dash.backend.store;
    if retry {
        let before = match store.get(&id).await {
            Ok(view) => view,
            Err(e) => return store_error(e),
        };
        let plan = orderly_core::RetryPlan::for_order(
            before.state.generation,
            before.state.current_step,
            &before.steps,
        );
        return match store.resubmit(&id, &actor, &reason, &[]).await {
            Ok(row) => {
                let what = if row.generation > before.state.generation || row.finish_as.is_some() {
                    plan.describe()
                } else {
                    orderly_core::RetryPlan::Continue {
                        from_step: row.current_step,
                    }
                    .describe()
                };
                answer(json!({
                    "order_id": row.order_id,
                    "state": row.process_state,
                    "generation": row.generation,
                    "from_step": row.current_step,
                    "plan": what,
                    "by": actor.as_str(),
                }))
            }
            Err(e) => store_error(e),
        };
    }
    let done = if body.no_compensation {
        store.cancel(&id, &actor, &reason, &[]).await
    } else {
        store.request_cancel(&id, &actor, &reason, &[]).await
    };
    match done {
        Ok(row) => answer(json!({
            "order_id": row.order_id,
            "state": row.process_state,
            "finish_as": row.finish_as,
            "by": actor.as_str(),
        })),
        Err(e) => store_error(e),
    }
}

async fn retry(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Result<Json<Acting>, JsonRejection>,
) -> Response {
    let body = match parsed(body) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    act_on_order(&dash, &headers, id, body, true).await
}

async fn cancel(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Result<Json<Acting>, JsonRejection>,
) -> Response {
    let body = match parsed(body) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    act_on_order(&dash, &headers, id, body, false).await
}

/// A bulk action's body: `order_ids`, or a `filter` (the orders page's, as
/// `GET /api/orders` takes it: `state`, `step`, `q`, `customer`, `older`, `id`,
/// `waiting`) whose every match it covers, up to 100,000, oldest first; `dry_run` only
/// counts them.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BulkAction {
    /// `retry` or `cancel`.
    action: String,
    order_ids: Option<Vec<String>>,
    filter: Option<serde_json::Map<String, Value>>,
    #[serde(default)]
    dry_run: bool,
    operator: Option<String>,
    reason: Option<String>,
}

/// `POST /api/orders/bulk`: the orders named, or all a filter matches, retried or
/// cancelled; says how many were selected, how many moved, and each refusal.
async fn bulk(
    State(dash): State<Dash>,
    headers: HeaderMap,
    body: Result<Json<BulkAction>, JsonRejection>,
) -> Response {
    let body = match parsed(body) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let (retry, actor, reason) = match retry_or_cancel(
        &headers,
        &body.action,
        body.operator.as_deref(),
        body.reason.as_deref(),
    ) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    let store = dash.backend.store.as_ref();
    let (ids, more) = match (body.order_ids, body.filter) {
        (Some(ids), None) => {
            let mut named = Vec::with_capacity(ids.len());
            for id in ids {
                match OrderId::parse(id) {
                    Ok(id) => named.push(id),
                    Err(e) => return refused(StatusCode::BAD_REQUEST, e),
                }
            }
            (named, false)
        }
        (None, Some(filter)) => {
            // A misspelt filter would select every order: refused, named.
            const FILTERS: [&str; 7] = ["state", "step", "q", "customer", "older", "id", "waiting"];
            if let Some(unknown) = filter.keys().find(|k| !FILTERS.contains(&k.as_str())) {
                return refused(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "filter: no field {unknown:?} (one of {})",
                        FILTERS.join(", ")
                    ),
                );
            }
            let fields: Vec<(String, String)> = filter
                .into_iter()
                .map(|(k, v)| {
                    let v = match v {
                        Value::String(s) => s,
                        other => other.to_string(),
                    };
                    (k, v)
                })
                .collect();
            let filter = match OrdersQuery::from_fields(&fields).filter() {
                Ok(f) => f,
                Err(e) => return refused(StatusCode::BAD_REQUEST, e),
            };
            match matching(store, filter).await {
                Ok(m) => m,
                Err(e) => return store_error(e),
            }
        }
        _ => {
            return refused(
                StatusCode::BAD_REQUEST,
                "give order_ids or a filter (one of them)",
            );
        }
    };
    if body.dry_run {
        return answer(json!({ "action": body.action, "selected": ids.len(), "more": more }));
    }
    let (moved, not_moved) = act_on(store, &ids, retry, &actor, &reason).await;
    answer(json!({
        "action": body.action,
        "selected": ids.len(),
        "more": more,
        "moved": moved,
        "refused": not_moved
            .iter()
            .map(|(id, why)| json!({ "order_id": id, "error": why }))
            .collect::<Vec<_>>(),
        "by": actor.as_str(),
    }))
}

/// `GET /api/activity?range=1h|24h|7d`: the charts' figures bin by bin, oldest first
/// (bins of a minute, 15 minutes or an hour): orders finished by outcome, recoveries,
/// dead letters and the submit-to-Processed latency percentiles (the upper bound of the
/// histogram bucket each falls in; null without Processed orders).
async fn activity(State(dash): State<Dash>, Query(chart): Query<ChartQuery>) -> Response {
    let Some(range) = chart.range_named() else {
        return refused(StatusCode::BAD_REQUEST, "range: expected 1h, 24h or 7d");
    };
    let store = dash.backend.store.as_ref();
    let bins = match super::charts::bins(&dash.activity, store, range, chrono::Utc::now()).await {
        Ok(bins) => bins,
        Err(e) => return store_error(e),
    };
    answer(json!({
        "range": range.key(),
        "bin_minutes": range.bin_minutes(),
        "bins": bins.iter().map(|b| json!({
            "start": b.minute,
            "processed": b.processed,
            "error": b.error,
            "cancelled": b.cancelled,
            "recoveries": b.recoveries,
            "dead_letters": b.dead_letters,
            "latency_ms": {
                "p50": b.latency_quantile(0.5),
                "p95": b.latency_quantile(0.95),
                "p99": b.latency_quantile(0.99),
            },
        })).collect::<Vec<_>>(),
    }))
}

/// `GET /api/errors`: the Error orders grouped by cause (workflow, step, the error
/// with ids and numbers stripped), largest first, each with its count and its oldest
/// order ids (up to 100).
async fn errors(State(dash): State<Dash>) -> Response {
    let store = dash.backend.store.as_ref();
    let causes = match store.error_causes().await {
        Ok(c) => c,
        Err(e) => return store_error(e),
    };
    let keys: Vec<_> = causes.iter().map(|c| c.key.clone()).collect();
    let ids = match store.error_cause_ids(&keys, GROUP_IDS).await {
        Ok(ids) => ids,
        Err(e) => return store_error(e),
    };
    let names = step_names(store, &causes).await;
    let mut groups = Vec::with_capacity(causes.len());
    for ((c, orders), step_name) in causes.iter().zip(ids).zip(names) {
        let key = c.key.group_key();
        groups.push(json!({
            "workflow": key.workflow,
            "step": key.step,
            "step_name": step_name,
            "pattern": key.pattern,
            "count": c.count,
            "example": c.example,
            "first_seen": c.first_seen,
            "last_seen": c.last_seen,
            "orders": orders,
        }));
    }
    let total: u64 = causes.iter().map(|c| c.count).sum();
    answer(json!({ "error_orders": total, "groups": groups }))
}

/// A group action's body: the group (as `GET /api/errors` names it) and what to do.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GroupAction {
    /// `retry` or `cancel`.
    action: String,
    workflow: String,
    step: i32,
    pattern: String,
    operator: Option<String>,
    reason: Option<String>,
}

/// `POST /api/errors/group`: retries (or cancels) every order of one cause as it is
/// now; says how many moved and which the store refused, with why.
async fn group(
    State(dash): State<Dash>,
    headers: HeaderMap,
    body: Result<Json<GroupAction>, JsonRejection>,
) -> Response {
    let body = match parsed(body) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let (retry, actor, reason) = match retry_or_cancel(
        &headers,
        &body.action,
        body.operator.as_deref(),
        body.reason.as_deref(),
    ) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    let key = GroupKey {
        workflow: body.workflow,
        step: body.step,
        pattern: body.pattern,
    };
    let store = dash.backend.store.as_ref();
    match act_on_group(store, &key, retry, &actor, &reason).await {
        Ok(GroupDone {
            group,
            moved,
            refused: not_moved,
        }) => answer(json!({
            "action": body.action,
            "count": group.count(),
            "moved": moved,
            "refused": not_moved
                .iter()
                .map(|(id, why)| json!({ "order_id": id, "error": why }))
                .collect::<Vec<_>>(),
            "by": actor.as_str(),
        })),
        Err(e) => store_error(e),
    }
}

/// `?all=true`: acknowledged order alerts and resolved system alerts too.
#[derive(Debug, Default, Deserialize)]
struct AlertsQuery {
    all: Option<bool>,
}

/// `GET /api/alerts`: alerts about the system and about orders, newest first.
async fn alerts(State(dash): State<Dash>, Query(q): Query<AlertsQuery>) -> Response {
    let open_only = !q.all.unwrap_or(false);
    let store = &dash.backend.store;
    let system = match store.system_alerts(open_only, 200).await {
        Ok(a) => a,
        Err(e) => return store_error(e),
    };
    let orders = match store.alerts(open_only, 200).await {
        Ok(a) => a,
        Err(e) => return store_error(e),
    };
    answer(json!({ "system": system, "orders": orders }))
}

/// `POST /api/alerts/{id}/ack`: an order's alert acknowledged ("seen, being handled").
async fn acknowledge(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Path(id): Path<i64>,
    body: Result<Json<Acting>, JsonRejection>,
) -> Response {
    let actor = match acknowledging(&headers, body) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    match dash.backend.store.acknowledge_alert(id, &actor).await {
        Ok(Some(alert)) => answer(json!(alert)),
        Ok(None) => refused(StatusCode::NOT_FOUND, format!("no alert #{id}")),
        Err(e) => store_error(e),
    }
}

/// `POST /api/alerts/system/{id}/ack`: an alert about the system acknowledged ("seen,
/// being handled"); it stays open until its condition ends.
async fn acknowledge_system(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Path(id): Path<i64>,
    body: Result<Json<Acting>, JsonRejection>,
) -> Response {
    let actor = match acknowledging(&headers, body) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    match dash
        .backend
        .store
        .acknowledge_system_alert(id, &actor)
        .await
    {
        Ok(Some(alert)) => answer(json!(alert)),
        Ok(None) => refused(StatusCode::NOT_FOUND, format!("no system alert #{id}")),
        Err(e) => store_error(e),
    }
}

/// Who acknowledges: the body's operator, under the request's access rules.
fn acknowledging(
    headers: &HeaderMap,
    body: Result<Json<Acting>, JsonRejection>,
) -> Result<Actor, Box<Response>> {
    let body = parsed(body)?;
    acting(headers, body.operator.as_deref(), None, "").map(|(actor, _)| actor)
}

/// `GET /api/workflows`: every stored version (and whether it is valid), and the
/// orders not finished per version and state (a version no one stored included).
async fn workflows(State(dash): State<Dash>) -> Response {
    let store = &dash.backend.store;
    let counts = match store.workflows_in_flight().await {
        Ok(c) => c,
        Err(e) => return store_error(e),
    };
    let stored = match store.stored_workflows().await {
        Ok(s) => s,
        Err(e) => return store_error(e),
    };
    let stored: Vec<Value> = stored
        .iter()
        .map(|s| {
            json!({
                "workflow": s.reference.name,
                "version": s.reference.version,
                "first_seen_at": s.first_seen_at,
                "first_seen_by": s.first_seen_by,
                "invalid": s.workflow().err().map(|e| e.to_string()),
            })
        })
        .collect();
    answer(json!({ "stored": stored, "in_flight": counts }))
}

/// `GET /api/services`: the remote services as the fleet sees them.
async fn services(State(dash): State<Dash>) -> Response {
    match dash.backend.store.services().await {
        Ok(s) => answer(json!(s)),
        Err(e) => store_error(e),
    }
}

/// `POST /api/services/{service}/resume`: marked up (the operator knows it is back);
/// the orders waiting for it resume at its rate.
async fn resume(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Path(service): Path<String>,
    body: Result<Json<Acting>, JsonRejection>,
) -> Response {
    let body = match parsed(body) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let (actor, _) = match acting(&headers, body.operator.as_deref(), None, "") {
        Ok(a) => a,
        Err(r) => return *r,
    };
    let store = &dash.backend.store;
    match store.report_success(&service, actor.as_str()).await {
        Ok(Some(back)) => answer(json!({
            "service": service,
            "was_up": false,
            "resumed": back.resumed,
            "health": back.health,
            "by": actor.as_str(),
        })),
        Ok(None) => match store.resume_waiting(&service, actor.as_str()).await {
            Ok(waiting) => answer(json!({
                "service": service,
                "was_up": true,
                "resumed": waiting,
                "by": actor.as_str(),
            })),
            Err(e) => store_error(e),
        },
        Err(e) => store_error(e),
    }
}

/// `GET /api/leader`: the supervisors' current term, or `holder` null.
async fn leader(State(dash): State<Dash>) -> Response {
    match dash
        .backend
        .store
        .term(orderly_core::leader::SUPERVISORS)
        .await
    {
        Ok(term) => answer(crate::shapes::leader(term.as_ref())),
        Err(e) => store_error(e),
    }
}

/// `GET /api/queues`: every queue's depth.
async fn queues(State(dash): State<Dash>) -> Response {
    match dash.backend.inspector.count_depths().await {
        Ok(d) => answer(json!(d)),
        Err(e) => refused(StatusCode::SERVICE_UNAVAILABLE, e),
    }
}

#[derive(Debug, Deserialize)]
struct DeadLettersQuery {
    queue: String,
    limit: Option<u32>,
}

/// `GET /api/dead-letters?queue=Q[&limit=N]`: the queue's dead letters, oldest first,
/// each with why and its body.
async fn dead_letters(State(dash): State<Dash>, Query(q): Query<DeadLettersQuery>) -> Response {
    let Ok(queue) = QueueName::parse(q.queue) else {
        return refused(StatusCode::BAD_REQUEST, "bad queue name");
    };
    let limit = q.limit.unwrap_or(200).clamp(1, 1_000);
    match dash.backend.transport.dead_letters(&queue, limit).await {
        Ok(letters) => answer(json!(
            letters
                .iter()
                .map(crate::shapes::dead_letter)
                .collect::<Vec<_>>()
        )),
        Err(e) => refused(StatusCode::SERVICE_UNAVAILABLE, e),
    }
}

/// A dead-letter action's body: the queue, and one message (else all of the queue's).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeadAction {
    queue: String,
    message_id: Option<String>,
    operator: Option<String>,
}

async fn settle(dash: &Dash, headers: &HeaderMap, body: DeadAction, requeue: bool) -> Response {
    let (actor, _) = match acting(headers, body.operator.as_deref(), None, "") {
        Ok(a) => a,
        Err(r) => return *r,
    };
    let Ok(queue) = QueueName::parse(body.queue) else {
        return refused(StatusCode::BAD_REQUEST, "bad queue name");
    };
    let message = one_message(body.message_id.as_deref());
    let done = settle_dead_letters(dash, &actor, &queue, message, requeue).await;
    match done {
        Ok(0) if message.is_some() => refused(
            StatusCode::NOT_FOUND,
            format!("no such dead letter on {queue}"),
        ),
        Ok(n) => answer(json!({
            "queue": queue.as_str(),
            "message_id": message,
            if requeue { "requeued" } else { "discarded" }: n,
            "by": actor.as_str(),
        })),
        Err(e) => refused(StatusCode::CONFLICT, e),
    }
}

/// `POST /api/dead-letters/requeue`: back on their queue.
async fn requeue(
    State(dash): State<Dash>,
    headers: HeaderMap,
    body: Result<Json<DeadAction>, JsonRejection>,
) -> Response {
    let body = match parsed(body) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    settle(&dash, &headers, body, true).await
}

/// `POST /api/dead-letters/discard`: removed for good.
async fn discard(
    State(dash): State<Dash>,
    headers: HeaderMap,
    body: Result<Json<DeadAction>, JsonRejection>,
) -> Response {
    let body = match parsed(body) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    settle(&dash, &headers, body, false).await
}
