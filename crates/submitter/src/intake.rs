//! The HTTP intake, for clients that speak neither AMQP nor SQL: served by
//! `orderly-submitter` beside its operations endpoints when `--http-intake` is on.
//!
//! - `POST /orders`: a JSON order (`{"order_id", "details", "reply_to"}`; `order_id`
//!   may instead come as the `Idempotency-Key` header). Answers `202 Accepted` with the
//!   order id once its message is durably on the orders queue (the submitter then
//!   records it as any other), `200` if that order was already accepted, `400` naming
//!   the field at fault, `409` if the id is taken by an order with other details, `413`
//!   for a body over the submitter's limit, `401` without the token, `503` (with
//!   `Retry-After`) while the queue or the store is unavailable: posting again is safe.
//! - `GET /orders/{id}`: the order's state row and its steps, or `404`.
//!
//! A token (`--intake-token` / `ORDERLY_INTAKE_TOKEN`, given as `Authorization: Bearer`)
//! is required on any address but loopback, and checked on every request when set.
//! Without one, a web page the operator opens must not be able to post orders to the
//! loopback intake: a post must say `Content-Type: application/json` (which a page of
//! another site cannot send without the browser asking first, and this server never
//! allows), must be addressed to an address or `localhost` (not to a rebound name), and
//! must not come with another site's `Origin`.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use orderly_core::messages::{MAX_ORDER_MESSAGE, order_submitted};
use orderly_core::store::{NewOrder, OperatorStore};
use orderly_core::transport::{QueueName, Transport, TransportError};
use orderly_core::{Error, OrderId};
use serde_json::{Value, json};

/// The intake's settings.
#[derive(Clone)]
pub struct IntakeConfig {
    /// The orders queue.
    pub orders: QueueName,
    /// Required as `Authorization: Bearer` when set.
    pub token: Option<String>,
    /// Which queues an order may name as its `reply_to`.
    pub reply_queues: orderly_core::store::ReplyQueues,
    /// The names it answers to (without a token: addresses and `localhost` only).
    pub hosts: orderly_runtime::http::Hosts,
}

#[derive(Clone)]
struct Intake {
    store: Arc<dyn OperatorStore>,
    transport: Arc<dyn Transport>,
    cfg: Arc<IntakeConfig>,
}

/// The shortest intake token taken (as for the console's operators).
pub const MIN_TOKEN: usize = 16;

/// Refuses a listen address off loopback without a token, a token shorter than
/// [`MIN_TOKEN`], and an intake without a token unless `open` says that is meant
/// (loopback only: any process of the machine may then post); the error names the
/// settings.
pub fn check(listen: std::net::SocketAddr, token: Option<&str>, open: bool) -> anyhow::Result<()> {
    if token.is_some_and(|t| t.trim().is_empty()) {
        anyhow::bail!("--intake-token / ORDERLY_INTAKE_TOKEN is empty");
    }
    if let Some(t) = token
        && t.trim().chars().count() < MIN_TOKEN
    {
        anyhow::bail!(
            "--intake-token / ORDERLY_INTAKE_TOKEN is {} characters: at least {MIN_TOKEN} (a guessable token lets anyone post orders)",
            t.trim().chars().count()
        );
    }
    match (token.is_some(), open, listen.ip().is_loopback()) {
        (true, true, _) => anyhow::bail!(
            "give either --intake-token / ORDERLY_INTAKE_TOKEN or --intake-open / ORDERLY_INTAKE_OPEN, not both"
        ),
        (false, _, false) => anyhow::bail!(
            "the HTTP intake on {listen} (--http-listen / ORDERLY_HTTP_LISTEN, not loopback) \
             needs --intake-token / ORDERLY_INTAKE_TOKEN: clients send it as Authorization: Bearer"
        ),
        (false, false, true) => anyhow::bail!(
            "the HTTP intake on {listen} has no token, so any process of this machine may \
             post orders: give --intake-token / ORDERLY_INTAKE_TOKEN (or its _FILE), or \
             --intake-open / ORDERLY_INTAKE_OPEN to say that is meant (loopback only)"
        ),
        _ => {}
    }
    Ok(())
}

/// The intake's routes.
pub fn router(
    store: Arc<dyn OperatorStore>,
    transport: Arc<dyn Transport>,
    cfg: IntakeConfig,
) -> axum::Router {
    let state = Intake {
        store,
        transport,
        cfg: Arc::new(cfg),
    };
    axum::Router::new()
        .route("/orders", post(post_order))
        .route("/orders/{id}", get(get_order))
        .layer(DefaultBodyLimit::max(MAX_ORDER_MESSAGE))
        .with_state(state)
}

fn problem(status: StatusCode, error: impl Into<String>) -> Response {
    (status, Json(json!({ "error": error.into() }))).into_response()
}

fn unavailable(what: &str, e: &dyn std::fmt::Display) -> Response {
    tracing::warn!(error = %e, "intake: {what} unavailable");
    let mut r = problem(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("{what} unavailable, retry later (posting again is safe): {e}"),
    );
    r.headers_mut()
        .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    r
}

impl Intake {
    fn authorized(&self, headers: &HeaderMap) -> bool {
        let Some(token) = &self.cfg.token else {
            return true;
        };
        orderly_runtime::http::bearer_is(headers, token)
    }
}

fn unauthorized() -> Response {
    let mut r = problem(
        StatusCode::UNAUTHORIZED,
        "missing or wrong token: send Authorization: Bearer <token>",
    );
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer"),
    );
    r
}

/// Why a posted order is refused: the status and what to say.
struct Refusal(StatusCode, String);

fn refusal(status: StatusCode, why: impl Into<String>) -> Refusal {
    Refusal(status, why.into())
}

/// The order in `body`, its id taken from `Idempotency-Key` when the body has none.
fn parse_order(
    headers: &HeaderMap,
    body: &[u8],
    reply_queues: &orderly_core::store::ReplyQueues,
) -> Result<NewOrder, Refusal> {
    let mut value: Value = serde_json::from_slice(body).map_err(|e| {
        refusal(
            StatusCode::BAD_REQUEST,
            format!("the body is not JSON: {e}"),
        )
    })?;
    let Some(fields) = value.as_object_mut() else {
        return Err(refusal(
            StatusCode::BAD_REQUEST,
            "the body must be one JSON order object: {\"order_id\", \"details\", \"reply_to\"}",
        ));
    };
    let key = match headers.get("idempotency-key") {
        None => None,
        Some(v) => Some(v.to_str().map(str::trim).map_err(|_| {
            refusal(
                StatusCode::BAD_REQUEST,
                "invalid Idempotency-Key: not printable ASCII",
            )
        })?),
    };
    match (fields.get("order_id"), key) {
        (None, Some(key)) => {
            fields.insert("order_id".into(), Value::String(key.to_owned()));
        }
        (None, None) => {
            return Err(refusal(
                StatusCode::BAD_REQUEST,
                "invalid order_id: missing; give it in the body or as the Idempotency-Key header",
            ));
        }
        (Some(id), Some(key)) if id.as_str() != Some(key) => {
            return Err(refusal(
                StatusCode::BAD_REQUEST,
                "invalid Idempotency-Key: it differs from the body's order_id (it is the order id)",
            ));
        }
        _ => {}
    }
    let order: NewOrder = serde_json::from_value(value)
        .map_err(|e| refusal(StatusCode::BAD_REQUEST, format!("invalid order: {e}")))?;
    reply_queues
        .check(&order)
        .map_err(|e| refusal(StatusCode::BAD_REQUEST, e.to_string()))?;
    if let Some(q) = &order.reply_to
        && let Err(e) = QueueName::parse(q.clone())
    {
        return Err(refusal(
            StatusCode::BAD_REQUEST,
            format!("invalid reply_to: {}", e.reason),
        ));
    }
    Ok(order)
}

/// The refusal of a request not addressed to this intake or sent by another site.
fn foreign(refusal: orderly_runtime::http::SiteRefusal) -> Response {
    match refusal {
        orderly_runtime::http::SiteRefusal::Host(host) => {
            tracing::warn!(
                host,
                "intake: refused a Host it does not answer to (DNS rebinding?)"
            );
            problem(
                StatusCode::MISDIRECTED_REQUEST,
                "this intake answers to its address or localhost only; with --intake-token / ORDERLY_INTAKE_TOKEN set it answers to any name",
            )
        }
        orderly_runtime::http::SiteRefusal::CrossSite(origin) => {
            tracing::warn!(origin, "intake: refused a post from another site");
            problem(
                StatusCode::FORBIDDEN,
                "refused: this request comes from another site",
            )
        }
    }
}

/// Whether the body is declared JSON (`application/json`, parameters allowed).
fn declared_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

async fn post_order(
    State(intake): State<Intake>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(refusal) = orderly_runtime::http::same_site(&intake.cfg.hosts, &headers, &uri, true)
    {
        return foreign(refusal);
    }
    if !intake.authorized(&headers) {
        return unauthorized();
    }
    if !declared_json(&headers) {
        return problem(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "an order is posted as Content-Type: application/json",
        );
    }
    let order = match parse_order(&headers, &body, &intake.cfg.reply_queues) {
        Ok(order) => order,
        Err(Refusal(status, why)) => return problem(status, why),
    };
    let id = order.order_id.clone();
    // Already accepted? Answer at once; the same id with other details is a conflict
    // (the submitter would dead-letter it).
    match intake.store.get(&id).await {
        Ok(view) if view.details == order.details => {
            return (
                StatusCode::OK,
                Json(json!({
                    "order_id": id,
                    "status": "already accepted",
                    "process_state": view.state.process_state,
                })),
            )
                .into_response();
        }
        Ok(_) => {
            return problem(
                StatusCode::CONFLICT,
                format!("order {id} already exists with different details"),
            );
        }
        Err(Error::OrderNotFound(_)) => {}
        Err(e) => return unavailable("the state store", &e),
    }
    let message = match order_submitted(&order) {
        Ok(m) => m,
        Err(TransportError::PayloadTooLarge { size, limit }) => {
            return problem(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the order's message is {size} bytes, over the {limit}-byte limit"),
            );
        }
        Err(e) => return problem(StatusCode::BAD_REQUEST, e.to_string()),
    };
    match intake.transport.send(&intake.cfg.orders, &[message]).await {
        Ok(_) => {
            tracing::info!(order_id = %id, "order posted over HTTP");
            let mut r = (
                StatusCode::ACCEPTED,
                Json(json!({ "order_id": id, "status": "queued" })),
            )
                .into_response();
            if let Ok(location) = header::HeaderValue::from_str(&format!("/orders/{id}")) {
                r.headers_mut().insert(header::LOCATION, location);
            }
            r
        }
        Err(e) => unavailable(&format!("the orders queue {}", intake.cfg.orders), &e),
    }
}

async fn get_order(
    State(intake): State<Intake>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    // A rebound page could read what it asks for: the Host is checked on reads too.
    if let Err(refusal) = orderly_runtime::http::same_site(&intake.cfg.hosts, &headers, &uri, false)
    {
        return foreign(refusal);
    }
    if !intake.authorized(&headers) {
        return unauthorized();
    }
    let Ok(id) = OrderId::parse(id) else {
        return problem(StatusCode::NOT_FOUND, "no such order");
    };
    match intake.store.get(&id).await {
        Ok(view) => Json(json!({
            "order_id": view.state.order_id,
            "process_state": view.state.process_state,
            "failure_count": view.state.failure_count,
            "current_step": view.state.current_step,
            "locked_by": view.state.locked_by,
            "complete_by": view.state.complete_by,
            "last_error": view.state.last_error,
            "created_at": view.state.created_at,
            "updated_at": view.state.updated_at,
            "steps": view.steps.iter().map(|s| json!({
                "index": s.index,
                "name": s.name,
                "status": s.status,
                "attempts": s.attempts,
                "detail": s.detail,
            })).collect::<Vec<_>>(),
        }))
        .into_response(),
        Err(Error::OrderNotFound(_)) => problem(StatusCode::NOT_FOUND, format!("no order {id}")),
        Err(e) => unavailable("the state store", &e),
    }
}
