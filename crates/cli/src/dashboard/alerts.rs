//! Alerts: about the system (conditions, open and resolved) and about orders (each
//! order that entered Error), either of which an operator acknowledges ("seen, being
//! handled"; a condition's alert stays open until the condition ends).

use axum::extract::{Form, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};

use super::Dash;
use super::actions::{Acting, acting, back, refused};
use super::auth::{cookie, operator};
use super::html::{action_fields, ago, failed, page, url, when};

pub(super) async fn alerts(State(dash): State<Dash>, headers: HeaderMap) -> Response {
    let store = &dash.backend.store;
    let system = match store.system_alerts(false, 200).await {
        Ok(a) => a,
        Err(e) => return failed(e),
    };
    let orders = match store.alerts(false, 200).await {
        Ok(a) => a,
        Err(e) => return failed(e),
    };
    let csrf = cookie(&headers, "orderly_csrf").unwrap_or("");
    let operator = operator(&headers);
    let body = html! {
        div.card {
            h2 { "About the system" }
            div.scroll { table #system-alerts data-refresh {
                tr { th { "#" } th { "raised" } th { "what" } th { "about" } th { "state" } th { "detail" } th { "acknowledged" } }
                @for a in &system {
                    tr {
                        td { (a.alert_id) }
                        td title=(when(a.raised_at)) { (ago(a.raised_at)) " ago" }
                        td { (a.kind.as_str()) }
                        td { (a.subject) }
                        td {
                            @match a.resolved_at {
                                Some(t) => span.ok { "resolved " (ago(t)) " ago" },
                                None => b.bad { "open" },
                            }
                        }
                        td { (a.detail) }
                        td { (acknowledged(a.acknowledged_by.as_deref(), &format!("/alerts/system/{}/ack", a.alert_id), csrf, &operator)) }
                    }
                }
                @if system.is_empty() { tr { td colspan="7" .muted { "None." } } }
            } }
        }
        div.card {
            h2 { "Orders in Error" }
            div.scroll { table #order-alerts data-refresh {
                tr { th { "#" } th { "raised" } th { "order" } th { "step" } th { "failures" } th { "error" } th { "acknowledged" } }
                @for a in &orders {
                    tr {
                        td { (a.alert_id) }
                        td title=(when(a.raised_at)) { (ago(a.raised_at)) " ago" }
                        td.mono { a href={"/orders/" (url(a.order_id.as_str()))} { (a.order_id.as_str()) } }
                        td { (a.step.as_deref().unwrap_or("-")) }
                        td { (a.failure_count) }
                        td { (a.last_error.as_deref().unwrap_or("-")) }
                        td { (acknowledged(a.acknowledged_by.as_deref(), &format!("/alerts/{}/ack", a.alert_id), csrf, &operator)) }
                    }
                }
                @if orders.is_empty() { tr { td colspan="7" .muted { "None." } } }
            } }
        }
    };
    page("Alerts", "/alerts", body).into_response()
}

/// Who acknowledged an alert, or the form that acknowledges it at `action`.
fn acknowledged(by: Option<&str>, action: &str, csrf: &str, operator: &str) -> Markup {
    html! {
        @match by {
            Some(by) => span.ack { (by) },
            None => form.inline method="post" action=(action) {
                (action_fields(csrf, operator))
                " " button.ack { "Acknowledge" }
            },
        }
    }
}

/// Acknowledges an order's alert under the operator's name, then back to the alerts.
pub(super) async fn acknowledge(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Path(id): Path<i64>,
    Form(form): Form<Acting>,
) -> Response {
    let (actor, _) = match acting(&headers, &form) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    let acked = dash.backend.store.acknowledge_alert(id, &actor).await;
    back_from(
        &form,
        acked.map(|a| a.is_some()),
        &format!("No alert #{id}."),
    )
}

/// Acknowledges an alert about the system under the operator's name, then back to the
/// alerts.
pub(super) async fn acknowledge_system(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Path(id): Path<i64>,
    Form(form): Form<Acting>,
) -> Response {
    let (actor, _) = match acting(&headers, &form) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    let acked = dash
        .backend
        .store
        .acknowledge_system_alert(id, &actor)
        .await;
    back_from(
        &form,
        acked.map(|a| a.is_some()),
        &format!("No system alert #{id}."),
    )
}

/// Back to the alerts once acknowledged; `missing` (404) when there was no such alert.
fn back_from(form: &Acting, acked: orderly_core::Result<bool>, missing: &str) -> Response {
    match acked {
        Ok(true) => back(form, "/alerts"),
        Ok(false) => refused(StatusCode::NOT_FOUND, missing),
        Err(e) => failed(e),
    }
}
