//! Alerts: about the system (conditions, open and resolved) and about orders (each
//! order that entered Error).

use std::fmt::Write as _;

use axum::extract::State;
use axum::response::{IntoResponse, Response};

use super::Dash;
use super::html::{ago, esc, failed, page, url, when};

pub(super) async fn alerts(State(dash): State<Dash>) -> Response {
    let store = &dash.backend.store;
    let system = match store.system_alerts(false, 200).await {
        Ok(a) => a,
        Err(e) => return failed(e),
    };
    let orders = match store.alerts(false, 200).await {
        Ok(a) => a,
        Err(e) => return failed(e),
    };
    let mut body = String::from(
        "<div class=card><h2>About the system</h2><div class=scroll><table id=system-alerts>\
         <tr><th>#</th><th>raised</th><th>what</th><th>about</th><th>state</th><th>detail</th></tr>",
    );
    for a in &system {
        let state = match a.resolved_at {
            Some(t) => format!("<span class=ok>resolved {} ago</span>", ago(t)),
            None => "<b class=bad>open</b>".to_owned(),
        };
        let _ = write!(
            body,
            "<tr><td>{}</td><td title=\"{}\">{} ago</td><td>{}</td><td>{}</td><td>{state}</td><td>{}</td></tr>",
            a.alert_id,
            when(a.raised_at),
            ago(a.raised_at),
            a.kind.as_str(),
            esc(&a.subject),
            esc(&a.detail)
        );
    }
    if system.is_empty() {
        body.push_str("<tr><td colspan=6 class=muted>None.</td></tr>");
    }
    body.push_str("</table></div></div><div class=card><h2>Orders in Error</h2><div class=scroll><table id=order-alerts>\
        <tr><th>#</th><th>raised</th><th>order</th><th>step</th><th>failures</th><th>error</th><th>acknowledged</th></tr>");
    for a in &orders {
        let _ = write!(
            body,
            "<tr><td>{}</td><td title=\"{}\">{} ago</td><td class=mono><a href=\"/orders/{}\">{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            a.alert_id,
            when(a.raised_at),
            ago(a.raised_at),
            url(a.order_id.as_str()),
            esc(a.order_id.as_str()),
            esc(a.step.as_deref().unwrap_or("-")),
            a.failure_count,
            esc(a.last_error.as_deref().unwrap_or("-")),
            esc(a.acknowledged_by.as_deref().unwrap_or("-"))
        );
    }
    if orders.is_empty() {
        body.push_str("<tr><td colspan=7 class=muted>None.</td></tr>");
    }
    body.push_str("</table></div></div>");
    page("Alerts", "/alerts", &body).into_response()
}
