//! The order actions (retry, cancel): CSRF-checked POST forms, audited with the
//! operator's name in the order's history.

use axum::extract::{Form, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use orderly_core::{Actor, OrderId};
use serde::Deserialize;

use super::Dash;
use super::auth::{cookie, same};
use super::html::{esc, failed, page};

#[derive(Deserialize)]
pub(super) struct Action {
    csrf: String,
    reason: Option<String>,
}

/// The CSRF check: the form's token equals the cookie's.
pub(super) fn csrf_ok(headers: &HeaderMap, form: &Action) -> bool {
    cookie(headers, "orderly_csrf").is_some_and(|c| !c.is_empty() && same(c, &form.csrf))
}

pub(super) async fn act(
    dash: Dash,
    headers: HeaderMap,
    id: String,
    form: Action,
    retry: bool,
) -> Response {
    if !csrf_ok(&headers, &form) {
        return (
            StatusCode::FORBIDDEN,
            page(
                "Refused",
                "<p>The form's CSRF token does not match: reload the page and try again.</p>",
            ),
        )
            .into_response();
    }
    let Ok(order_id) = OrderId::parse(id) else {
        return (StatusCode::BAD_REQUEST, page("Bad order id", "")).into_response();
    };
    let actor = Actor::operator("dashboard");
    let reason = form
        .reason
        .filter(|r| !r.trim().is_empty())
        .unwrap_or_else(|| "from the dashboard".into());
    let store = &dash.backend.store;
    let done = if retry {
        store.resubmit(&order_id, &actor, &reason, &[]).await
    } else {
        store.request_cancel(&order_id, &actor, &reason, &[]).await
    };
    match done {
        Ok(_) => Redirect::to(&format!("/orders/{}", order_id.as_str())).into_response(),
        Err(e @ orderly_core::Error::IllegalTransition { .. }) => (
            StatusCode::CONFLICT,
            page(
                "Not done",
                &format!(
                    "<p>{}</p><p><a href=\"/orders/{}\">back</a></p>",
                    esc(&e.to_string()),
                    esc(order_id.as_str())
                ),
            ),
        )
            .into_response(),
        Err(e) => failed(e),
    }
}

/// Marks a service up (the operator knows it is back): the orders waiting for it
/// resume at its rate, recorded in their histories as the dashboard operator's.
pub(super) async fn resume_service(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Path(service): Path<String>,
    Form(form): Form<Action>,
) -> Response {
    if !csrf_ok(&headers, &form) {
        return (
            StatusCode::FORBIDDEN,
            page(
                "Refused",
                "<p>The form's CSRF token does not match: reload the page and try again.</p>",
            ),
        )
            .into_response();
    }
    let actor = Actor::operator("dashboard");
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
        Ok(()) => Redirect::to("/").into_response(),
        Err(e @ orderly_core::Error::Invalid(_)) => (
            StatusCode::BAD_REQUEST,
            page("Not done", &format!("<p>{}</p>", esc(&e.to_string()))),
        )
            .into_response(),
        Err(e) => failed(e),
    }
}

pub(super) async fn retry(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(form): Form<Action>,
) -> Response {
    act(dash, headers, id, form, true).await
}

pub(super) async fn cancel(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(form): Form<Action>,
) -> Response {
    act(dash, headers, id, form, false).await
}
