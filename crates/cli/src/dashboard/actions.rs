//! What an operator does from the dashboard: retry or cancel an order, resume a
//! service's waiting orders, requeue or discard dead letters (group actions are in
//! `errors`). Every action is a POST form checked against the page's CSRF token and
//! carries who acts; it is recorded under that name (`operator:NAME`) in the orders'
//! histories, and the name is remembered for the next form.

use axum::extract::{Form, Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use orderly_core::transport::QueueName;
use orderly_core::{Actor, OrderId};
use serde::Deserialize;

use super::Dash;
use super::auth::{cookie, same};
use super::html::{failed, notice, page, url};

/// The fields every action form carries.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct Acting {
    pub(super) csrf: String,
    pub(super) operator: Option<String>,
    pub(super) reason: Option<String>,
}

/// A refusal page.
pub(super) fn refused(status: StatusCode, why: &str) -> Response {
    (status, page("Refused", "", notice(true, why))).into_response()
}

/// Checks the CSRF token and who acts; the actor and the reason (or a default).
pub(super) fn acting(headers: &HeaderMap, form: &Acting) -> Result<(Actor, String), Box<Response>> {
    let csrf_ok =
        cookie(headers, "orderly_csrf").is_some_and(|c| !c.is_empty() && same(c, &form.csrf));
    if !csrf_ok {
        return Err(Box::new(refused(
            StatusCode::FORBIDDEN,
            "The form's CSRF token does not match: reload the page and try again.",
        )));
    }
    let actor = who(headers, form.operator.as_deref())
        .map_err(|(status, why)| Box::new(refused(status, &why)))?;
    let reason = form
        .reason
        .as_deref()
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .unwrap_or("from the dashboard")
        .to_owned();
    Ok((actor, reason))
}

/// Who acts: the operator signed in (a request naming someone else is refused: a
/// forgery of the audit trail), else the name `given` (`dashboard` without one).
pub(super) fn who(headers: &HeaderMap, given: Option<&str>) -> Result<Actor, (StatusCode, String)> {
    let given = given.map(str::trim).filter(|n| !n.is_empty());
    let signed_in = headers
        .get(super::auth::SIGNED_IN)
        .and_then(|v| v.to_str().ok());
    let name = match signed_in {
        Some(signed_in) if given.is_some_and(|g| g != signed_in) => {
            return Err((
                StatusCode::FORBIDDEN,
                format!(
                    "You are signed in as {signed_in}: an action is recorded under that name, not another."
                ),
            ));
        }
        Some(signed_in) => signed_in,
        None => given.unwrap_or("dashboard"),
    };
    if !super::access::valid_name(name) {
        return Err((
            StatusCode::BAD_REQUEST,
            "Your name (operator): 1 to 64 letters, digits, '-', '_', '.' or '@'.".to_owned(),
        ));
    }
    Ok(Actor::operator(name))
}

/// The operator's name, remembered for the next form.
fn remember(form: &Acting) -> Option<(header::HeaderName, String)> {
    let name = form.operator.as_deref()?.trim();
    (!name.is_empty()).then(|| {
        (
            header::SET_COOKIE,
            format!("orderly_operator={name}; SameSite=Strict; Path=/"),
        )
    })
}

/// A page saying what was done, remembering who did it.
pub(super) fn done_page(form: &Acting, title: &str, html: Markup) -> Response {
    let page = page(title, "", html);
    match remember(form) {
        Some(cookie) => ([cookie], page).into_response(),
        None => page.into_response(),
    }
}

/// Back to `to`, remembering who acted.
pub(super) fn back(form: &Acting, to: &str) -> Response {
    let redirect = Redirect::to(to);
    match remember(form) {
        Some(cookie) => ([cookie], redirect).into_response(),
        None => redirect.into_response(),
    }
}

pub(super) async fn act(
    dash: Dash,
    headers: HeaderMap,
    id: String,
    form: Acting,
    retry: bool,
) -> Response {
    let (actor, reason) = match acting(&headers, &form) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    let Ok(order_id) = OrderId::parse(id) else {
        return refused(StatusCode::BAD_REQUEST, "bad order id");
    };
    let store = &dash.backend.store;
    let done = if retry {
        store.resubmit(&order_id, &actor, &reason, &[]).await
    } else {
        store.request_cancel(&order_id, &actor, &reason, &[]).await
    };
    let to = format!("/orders/{}", url(order_id.as_str()));
    match done {
        Ok(_) => back(&form, &to),
        Err(
            e @ (orderly_core::Error::IllegalTransition { .. }
            | orderly_core::Error::PastReturn { .. }),
        ) => (
            StatusCode::CONFLICT,
            page(
                "Not done",
                "",
                html! { (notice(true, &e.to_string())) p { a href=(to) { "back" } } },
            ),
        )
            .into_response(),
        Err(e) => failed(e),
    }
}

pub(super) async fn retry(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(form): Form<Acting>,
) -> Response {
    act(dash, headers, id, form, true).await
}

pub(super) async fn cancel(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(form): Form<Acting>,
) -> Response {
    act(dash, headers, id, form, false).await
}

/// Marks a service up (the operator knows it is back): the orders waiting for it
/// resume at its rate, recorded in their histories under the operator's name.
pub(super) async fn resume_service(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Path(service): Path<String>,
    Form(form): Form<Acting>,
) -> Response {
    let (actor, _) = match acting(&headers, &form) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    let store = &dash.backend.store;
    let done = match store.report_success(&service, actor.as_str()).await {
        Ok(Some(_)) => Ok(()),
        Ok(None) => store
            .resume_waiting(&service, actor.as_str())
            .await
            .map(|_| ()),
        Err(e) => Err(e),
    };
    match done {
        Ok(()) => back(&form, "/"),
        Err(e @ orderly_core::Error::Invalid(_)) => {
            refused(StatusCode::BAD_REQUEST, &e.to_string())
        }
        Err(e) => failed(e),
    }
}

/// A dead-letter action: one message (`message_id`) or all of the queue's.
#[derive(Debug, Deserialize)]
pub(super) struct DeadAction {
    queue: String,
    message_id: Option<String>,
    csrf: String,
    operator: Option<String>,
}

/// The one message an action names (blank: none, so all of the queue's).
pub(super) fn one_message(message_id: Option<&str>) -> Option<&str> {
    message_id.map(str::trim).filter(|m| !m.is_empty())
}

/// Requeues (or discards) `message` of `queue`, or all its dead letters; logged under
/// `actor`. How many.
pub(super) async fn settle_dead_letters(
    dash: &Dash,
    actor: &Actor,
    queue: &QueueName,
    message: Option<&str>,
    requeue: bool,
) -> Result<usize, orderly_core::transport::TransportError> {
    let inspector = &dash.backend.inspector;
    let n = if requeue {
        inspector.requeue_dead_letters(queue, message).await?
    } else {
        inspector.discard_dead_letters(queue, message).await?
    };
    tracing::info!(operator = %actor, queue = %queue, message_id = message.unwrap_or("(all)"), count = n, requeue, "dead letters handled from the dashboard");
    Ok(n)
}

async fn dead(dash: Dash, headers: HeaderMap, form: DeadAction, requeue: bool) -> Response {
    let acting_fields = Acting {
        csrf: form.csrf.clone(),
        operator: form.operator.clone(),
        reason: None,
    };
    let (actor, _) = match acting(&headers, &acting_fields) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    let Ok(queue) = QueueName::parse(form.queue.clone()) else {
        return refused(StatusCode::BAD_REQUEST, "bad queue name");
    };
    let message = one_message(form.message_id.as_deref());
    match settle_dead_letters(&dash, &actor, &queue, message, requeue).await {
        Ok(_) => back(
            &acting_fields,
            &format!("/dead-letters?queue={}", url(queue.as_str())),
        ),
        Err(e) => refused(StatusCode::CONFLICT, &e.to_string()),
    }
}

pub(super) async fn requeue(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Form(form): Form<DeadAction>,
) -> Response {
    dead(dash, headers, form, true).await
}

pub(super) async fn discard(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Form(form): Form<DeadAction>,
) -> Response {
    dead(dash, headers, form, false).await
}
