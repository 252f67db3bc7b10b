//! The pages: overview, error triage, one order, dead letters.

use std::fmt::Write as _;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use orderly_core::store::OrderFilter;
use orderly_core::transport::QueueName;
use orderly_core::{OrderId, ProcessState};
use serde::Deserialize;

use super::Dash;
use super::auth::cookie;
use super::html::{ago, esc, failed, page};

pub(super) async fn overview(State(dash): State<Dash>, headers: HeaderMap) -> Response {
    let store = &dash.backend.store;
    let counts = match store.count_by_state().await {
        Ok(c) => c,
        Err(e) => return failed(e),
    };
    let mut body = String::from("<h2>Orders</h2><table><tr>");
    for (state, _) in &counts {
        let _ = write!(body, "<th class={0}>{0}</th>", state.as_str());
    }
    body.push_str("</tr><tr>");
    for (state, n) in &counts {
        let link = if *state == ProcessState::Error {
            format!("<a href=\"/errors\">{n}</a>")
        } else {
            n.to_string()
        };
        let _ = write!(body, "<td id=\"count-{}\">{link}</td>", state.as_str());
    }
    body.push_str("</tr></table>");
    match throughput(&**store).await {
        Ok(table) => body.push_str(&table),
        Err(e) => return failed(e),
    }
    let oldest = store
        .list(&OrderFilter {
            state: Some(ProcessState::Pending),
            limit: 1,
            ..Default::default()
        })
        .await
        .ok()
        .and_then(|p| p.orders.into_iter().next());
    let _ = write!(
        body,
        "<p>Oldest Pending order: {}</p>",
        oldest.map_or("none".into(), |o| format!(
            "<a href=\"/orders/{0}\">{0}</a>, waiting {1}",
            esc(o.order_id.as_str()),
            ago(o.created_at)
        ))
    );
    match store.term(orderly_supervisor::LEADERSHIP).await {
        Ok(Some(t)) => {
            let expired = t.lease_expires_at.is_some_and(|e| e <= chrono::Utc::now());
            let _ = write!(
                body,
                "<p>Supervisor leader: <b id=leader>{}</b>, term {} since {} ago{}</p>",
                esc(t.fence.holder.as_str()),
                t.fence.epoch,
                ago(t.started_at),
                if expired {
                    " <b class=Error>(lease expired: no leader)</b>"
                } else {
                    ""
                }
            );
        }
        Ok(None) => body.push_str("<p>Supervisor leader: <b id=leader>none yet</b></p>"),
        Err(e) => return failed(e),
    }
    match store.services().await {
        Ok(services) => body.push_str(&services_table(
            &services,
            cookie(&headers, "orderly_csrf").unwrap_or(""),
        )),
        Err(e) => return failed(e),
    }
    if let Ok(depths) = dash.backend.inspector.depths().await {
        body.push_str("<h2>Queues</h2><table><tr><th>queue</th><th>ready</th><th>locked</th><th>scheduled</th><th>dead-lettered</th></tr>");
        for d in depths {
            let _ = write!(
                body,
                "<tr><td>{0}</td><td>{1}</td><td>{2}</td><td>{3}</td><td><a href=\"/dead-letters?queue={0}\">{4}</a></td></tr>",
                esc(d.queue.as_str()),
                d.ready,
                d.locked,
                d.scheduled,
                d.dead_lettered
            );
        }
        body.push_str("</table>");
    }
    page("Overview", &body).into_response()
}

/// The remote services as the fleet sees them; a service that is not up has a Resume
/// button (for when the operator knows it is back before a probe finds out).
fn services_table(services: &[orderly_core::service::ServiceHealth], csrf: &str) -> String {
    use orderly_core::service::ServiceState;
    let mut out = String::from("<h2>Remote services</h2>");
    if services.is_empty() {
        out.push_str("<p id=services>None has been reported down: all are taken as up.</p>");
        return out;
    }
    out.push_str(
        "<table id=services><tr><th>service</th><th>state</th><th>down since</th><th>next probe</th>         <th>orders waiting</th><th>outages</th><th>last error</th><th></th></tr>",
    );
    for h in services {
        let (class, since, probe) = match h.state {
            ServiceState::Up => ("Processed", "-".to_owned(), "-".to_owned()),
            ServiceState::Down | ServiceState::Probing => (
                "Error",
                h.down_since.map_or("-".into(), |t| {
                    format!("{} ({} ago)", t.format("%H:%M:%S"), ago(t))
                }),
                h.retry_at
                    .map_or("-".into(), |t| t.format("%H:%M:%S").to_string()),
            ),
        };
        let resume = if h.state == ServiceState::Up && h.waiting == 0 {
            String::new()
        } else {
            format!(
                "<form class=inline method=post action=\"/services/{s}/resume\">                 <input type=hidden name=csrf value=\"{csrf}\">                 <button id=\"resume-{s}\">Resume its {n} waiting orders</button></form>",
                s = esc(&h.service),
                csrf = esc(csrf),
                n = h.waiting
            )
        };
        let _ = write!(
            out,
            "<tr><td>{s}</td><td id=\"service-{s}\" class={class}>{state}</td><td>{since}</td>             <td>{probe}</td><td id=\"waiting-{s}\">{waiting}</td><td>{outages}</td><td>{error}</td><td>{resume}</td></tr>",
            s = esc(&h.service),
            state = h.state.as_str(),
            waiting = h.waiting,
            outages = h.outage,
            error = esc(h.last_error.as_deref().unwrap_or("-")),
        );
    }
    out.push_str("</table>");
    out
}

/// Orders finished in the last minute, 5 minutes and hour, by final state, and the
/// rate per minute.
pub(super) async fn throughput(
    store: &dyn orderly_core::store::StateStore,
) -> orderly_core::Result<String> {
    let mut out = String::from(
        "<h2>Throughput</h2><table><tr><th>finished in the last</th><th class=Processed>Processed</th>\
         <th class=Error>Error</th><th class=Cancelled>Cancelled</th><th>per minute</th></tr>",
    );
    let now = chrono::Utc::now();
    for (label, key, minutes) in [
        ("minute", "1m", 1),
        ("5 minutes", "5m", 5),
        ("hour", "1h", 60),
    ] {
        let counts = store
            .finished_since(now - chrono::Duration::minutes(minutes))
            .await?;
        let _ = write!(out, "<tr><td>{label}</td>");
        let mut total = 0;
        for (state, n) in &counts {
            total += n;
            let _ = write!(out, "<td id=\"finished-{key}-{}\">{n}</td>", state.as_str());
        }
        let _ = write!(
            out,
            "<td id=\"rate-{key}\">{:.1}</td></tr>",
            total as f64 / minutes as f64
        );
    }
    out.push_str("</table>");
    Ok(out)
}

#[derive(Deserialize)]
pub(super) struct ErrorQuery {
    q: Option<String>,
    step: Option<String>,
}

pub(super) async fn errors(State(dash): State<Dash>, Query(query): Query<ErrorQuery>) -> Response {
    let text = query.q.unwrap_or_default();
    let step = query
        .step
        .as_deref()
        .and_then(|s| s.trim().parse::<i32>().ok());
    let page_ = match dash
        .backend
        .store
        .list(&OrderFilter {
            state: Some(ProcessState::Error),
            error_contains: Some(text.clone()).filter(|t| !t.is_empty()),
            current_step: step,
            limit: 200,
            ..Default::default()
        })
        .await
    {
        Ok(p) => p,
        Err(e) => return failed(e),
    };
    let mut body = format!(
        "<form method=get action=/errors>Error text <input name=q value=\"{}\"> Step <input name=step size=3 value=\"{}\"> <button>Search</button></form>",
        esc(&text),
        step.map(|s| s.to_string()).unwrap_or_default()
    );
    let _ = write!(
        body,
        "<table id=errors><tr><th>order</th><th>step</th><th>failures</th><th>since</th><th>last error</th></tr>"
    );
    for o in &page_.orders {
        let _ = write!(
            body,
            "<tr><td><a href=\"/orders/{0}\">{0}</a></td><td>{1}</td><td>{2}</td><td>{3} ago</td><td>{4}</td></tr>",
            esc(o.order_id.as_str()),
            o.current_step,
            o.failure_count,
            ago(o.updated_at),
            esc(o.last_error.as_deref().unwrap_or(""))
        );
    }
    body.push_str("</table>");
    if page_.orders.is_empty() {
        body.push_str("<p class=muted>No order in Error matches.</p>");
    } else if page_.next.is_some() {
        body.push_str("<p class=muted>The first 200 shown: narrow the search.</p>");
    }
    page("Orders in Error", &body).into_response()
}

pub(super) async fn order(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let Ok(order_id) = OrderId::parse(id) else {
        return (StatusCode::BAD_REQUEST, page("Bad order id", "")).into_response();
    };
    let view = match dash.backend.store.get(&order_id).await {
        Ok(v) => v,
        Err(orderly_core::Error::OrderNotFound(_)) => {
            return (StatusCode::NOT_FOUND, page("No such order", "")).into_response();
        }
        Err(e) => return failed(e),
    };
    let s = &view.state;
    let csrf = cookie(&headers, "orderly_csrf").unwrap_or("");
    let mut body = format!(
        "<p>State <b id=state class={0}>{0}</b>{1} &middot; step {2} &middot; failures {3} &middot; epoch {4} &middot; held by {5}</p>",
        s.process_state.as_str(),
        s.finish_as
            .map(|f| format!(" (undoing its steps, then {f})"))
            .unwrap_or_default(),
        s.current_step,
        s.failure_count,
        s.lock_epoch,
        esc(s.locked_by.as_ref().map_or("nobody", |l| l.as_str()))
    );
    let _ = write!(
        body,
        "<p>Workflow <b id=workflow>{}</b></p>",
        esc(&s.workflow_label())
    );
    if s.waiting_on.is_some() {
        let services = dash
            .backend
            .store
            .services()
            .await
            .unwrap_or_default()
            .into_iter()
            .map(|h| (h.service.clone(), h))
            .collect();
        if let Some(note) = s.waiting_note(&services) {
            let _ = write!(
                body,
                "<p><b id=waiting class=Pending>{}</b></p>",
                esc(&note)
            );
        }
    }
    if let Some(e) = &s.last_error {
        let _ = write!(
            body,
            "<p>Last error: <b id=last-error class=Error>{}</b></p>",
            esc(e)
        );
    }
    let form = |action: &str, label: &str, reason: &str| {
        format!(
            "<form class=inline method=post action=\"/orders/{id}/{action}\"><input type=hidden name=csrf value=\"{csrf}\">\
             <input name=reason value=\"{reason}\" size=24> <button id={action}>{label}</button></form> ",
            id = esc(s.order_id.as_str()),
            csrf = esc(csrf),
        )
    };
    if s.process_state == ProcessState::Error {
        // Say what a retry will do: continue, or run afresh because steps were undone.
        let plan = orderly_core::RetryPlan::for_order(s.generation, s.current_step, &view.steps);
        let label = match &plan {
            orderly_core::RetryPlan::Continue { .. } => "Retry from the failed step",
            orderly_core::RetryPlan::FreshRun { .. } => "Retry as a fresh run from the first step",
        };
        let _ = write!(
            body,
            "<p id=retry-plan class=muted>A retry {}.</p>",
            esc(&plan.describe())
        );
        body.push_str(&form("retry", label, "retried from the dashboard"));
    }
    if s.process_state.can_become(ProcessState::Cancelled) {
        body.push_str(&form(
            "cancel",
            "Cancel (undo its steps)",
            "cancelled from the dashboard",
        ));
    }
    body.push_str("<h2>Steps</h2><table><tr><th>#</th><th>step</th><th>status</th><th>attempts</th><th>key</th><th>detail</th></tr>");
    for st in &view.steps {
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td>{:?}</td><td>{}</td><td class=muted>{}</td><td>{}</td></tr>",
            st.index,
            esc(&st.name),
            st.status,
            st.attempts,
            esc(&st.idempotency_key),
            esc(st.detail.as_deref().unwrap_or(""))
        );
    }
    body.push_str("</table><h2>Timeline</h2><table id=timeline><tr><th>when</th><th>what</th><th>from</th><th>to</th><th>who</th><th>epoch</th><th>why</th></tr>");
    for h in &view.history {
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{:?}</td><td>{}</td><td class={3}>{3}</td><td>{4}</td><td>{5}</td><td>{6}</td></tr>",
            h.at.format("%Y-%m-%d %H:%M:%S%.3f"),
            h.kind,
            h.from_state.map_or("", |f| f.as_str()),
            h.to_state.as_str(),
            esc(h.actor.as_str()),
            h.epoch,
            esc(h.reason.as_deref().unwrap_or(""))
        );
    }
    body.push_str("</table><h2>Details</h2><pre>");
    body.push_str(&esc(
        &serde_json::to_string_pretty(&view.details).unwrap_or_default()
    ));
    body.push_str("</pre>");
    page(&format!("Order {}", s.order_id), &body).into_response()
}

#[derive(Deserialize)]
pub(super) struct DeadQuery {
    queue: Option<String>,
}

pub(super) async fn dead_letters(
    State(dash): State<Dash>,
    Query(query): Query<DeadQuery>,
) -> Response {
    let depths = match dash.backend.inspector.depths().await {
        Ok(d) => d,
        Err(e) => return failed(e),
    };
    let mut body = String::from("<p>");
    for d in &depths {
        let _ = write!(
            body,
            "<a href=\"/dead-letters?queue={0}\">{0}</a> ({1}) ",
            esc(d.queue.as_str()),
            d.dead_lettered
        );
    }
    body.push_str("</p>");
    let queue = query.queue.or_else(|| {
        depths
            .iter()
            .find(|d| d.dead_lettered > 0)
            .map(|d| d.queue.as_str().to_owned())
    });
    if let Some(q) = queue.and_then(|q| QueueName::parse(q).ok()) {
        let letters = match dash.backend.transport.dead_letters(&q, 200).await {
            Ok(l) => l,
            Err(e) => return failed(e),
        };
        let _ = write!(
            body,
            "<h2>{}</h2><table id=dead-letters><tr><th>when</th><th>message</th><th>reason</th><th>deliveries</th><th>description</th><th>body</th></tr>",
            esc(q.as_str())
        );
        for d in &letters {
            let text = String::from_utf8_lossy(&d.message.body);
            let short: String = text.chars().take(200).collect();
            let _ = write!(
                body,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=muted>{}</td></tr>",
                d.dead_lettered_at.format("%Y-%m-%d %H:%M:%S"),
                esc(&d.message.message_id),
                esc(&d.reason),
                d.message.delivery_count,
                esc(&d.description),
                esc(&short)
            );
        }
        body.push_str("</table><p class=muted>Requeue with <code>orderly requeue QUEUE MESSAGE_ID</code>.</p>");
    }
    // With Service Bus: messages the outbox could not deliver (their queue is missing,
    // or they failed too often), kept with the reason.
    match dash.backend.outbox.outbox_dead_letters(200).await {
        Ok(letters) if !letters.is_empty() => {
            body.push_str("<h2>Outbox: not deliverable</h2><table id=outbox-dead-letters><tr><th>when</th><th>queue</th><th>message</th><th>attempts</th><th>reason</th></tr>");
            for d in &letters {
                let _ = write!(
                    body,
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    d.dead_at.format("%Y-%m-%d %H:%M:%S"),
                    esc(&d.queue),
                    esc(&d.message_id),
                    d.attempts,
                    esc(&d.reason)
                );
            }
            body.push_str("</table><p class=muted>Publish them again, once the cause is fixed, with <code>orderly outbox --requeue</code>.</p>");
        }
        Ok(_) => {}
        Err(e) => return failed(e),
    }
    page("Dead letters", &body).into_response()
}
