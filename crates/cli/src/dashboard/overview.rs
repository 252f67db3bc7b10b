//! The overview: orders by state, the charts of the last hour, the supervisors (who
//! leads, or why none does), the remote services, open alerts and the queues; its
//! figures refresh by themselves (`/api/overview`, `/charts`).

use std::fmt::Write as _;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use orderly_core::ProcessState;
use serde_json::json;

use super::Dash;
use super::auth::{cookie, operator};
use super::html::{action_fields, ago, esc, failed, page, when};

/// Supervisors seen within this long run.
const PRESENT: Duration = Duration::from_secs(10);

pub(super) async fn overview(State(dash): State<Dash>, headers: HeaderMap) -> Response {
    let store = &dash.backend.store;
    let counts = match store.count_by_state().await {
        Ok(c) => c,
        Err(e) => return failed(e),
    };
    let mut body =
        String::from("<div data-live></div><div class=card><h2>Orders</h2><div class=tiles>");
    for (state, n) in &counts {
        let _ = write!(
            body,
            "<div class=\"tile {s}\"><a href=\"/orders?state={s}\"><div class=muted>{s}</div>\
             <div class=n id=\"count-{s}\">{n}</div></a></div>",
            s = state.as_str()
        );
    }
    body.push_str("</div>");
    match throughput(store.as_ref()).await {
        Ok(table) => body.push_str(&table),
        Err(e) => return failed(e),
    }
    match store.oldest_pending().await {
        Ok((Some((id, created)), _)) => {
            let _ = write!(
                body,
                "<p class=muted>Oldest Pending order: <a href=\"/orders/{0}\">{0}</a>, waiting {1}. \
                 Updated <span id=updated>now</span>.</p>",
                esc(id.as_str()),
                ago(created)
            );
        }
        Ok((None, _)) => {
            body.push_str("<p class=muted>No order waits. Updated <span id=updated>now</span>.</p>")
        }
        Err(e) => return failed(e),
    }
    body.push_str("</div>");
    let charts = match dash.activity.hour(store.as_ref(), chrono::Utc::now()).await {
        Ok(minutes) => super::charts::render(&minutes),
        Err(e) => return failed(e),
    };
    let open = match store.system_alerts(true, 20).await {
        Ok(open) => open,
        Err(e) => return failed(e),
    };
    // Orders no scheduler can run never wait silently: a banner above everything.
    for a in open
        .iter()
        .filter(|a| a.kind == orderly_core::conditions::ConditionKind::WorkflowMissing)
    {
        let _ = write!(
            body,
            "<div class=card id=workflow-missing><p class=bad><b>Orders wait for workflow {}</b>: {}</p></div>",
            esc(&a.subject),
            esc(&a.detail)
        );
    }
    let _ = write!(body, "<div id=charts>{charts}</div>");
    body.push_str("<div class=grid>");
    let leader = match leader_panel(&dash).await {
        Ok(l) => l,
        Err(e) => return failed(e),
    };
    let _ = write!(
        body,
        "<div class=card><h2>Supervisors</h2><p id=leader>{leader}</p></div>"
    );
    body.push_str("<div class=card><h2>Open alerts</h2>");
    if open.is_empty() {
        body.push_str("<p class=ok id=alerts-open>None.</p>");
    } else {
        body.push_str("<ul id=alerts-open>");
        for a in &open {
            let _ = write!(
                body,
                "<li><b class=bad>{}</b> {} <span class=muted>since {}</span>: {}</li>",
                a.kind.as_str(),
                esc(&a.subject),
                ago(a.raised_at),
                esc(&a.detail)
            );
        }
        body.push_str("</ul>");
    }
    body.push_str("<p><a href=\"/alerts\">All alerts</a></p></div>");
    body.push_str("</div>");
    match store.services().await {
        Ok(services) => body.push_str(&services_table(
            &services,
            cookie(&headers, "orderly_csrf").unwrap_or(""),
            &operator(&headers),
        )),
        Err(e) => return failed(e),
    }
    match dash.backend.inspector.count_depths().await {
        Ok(depths) => {
            body.push_str("<div class=card><h2>Queues</h2><div class=scroll><table id=queues><tr><th>queue</th><th>ready</th><th>locked</th><th>scheduled</th><th>dead-lettered</th></tr>");
            for d in depths {
                let q = esc(d.queue.as_str());
                let _ = write!(
                    body,
                    "<tr><td>{q}</td><td id=\"q-{q}-ready\">{}</td><td id=\"q-{q}-locked\">{}</td>\
                     <td id=\"q-{q}-scheduled\">{}</td><td><a id=\"q-{q}-dead_lettered\" href=\"/dead-letters?queue={q}\">{}</a></td></tr>",
                    d.ready, d.locked, d.scheduled, d.dead_lettered
                );
            }
            body.push_str("</table></div></div>");
        }
        Err(e) => {
            let _ = write!(
                body,
                "<div class=card><h2>Queues</h2><p class=muted>{}</p></div>",
                esc(&e.to_string())
            );
        }
    }
    page("Overview", "/", &body).into_response()
}

/// Who leads, or why none does: no supervisor running (none seen lately; the last
/// leader stopped cleanly or was lost), or supervisors running but none leading.
pub(super) async fn leader_panel(dash: &Dash) -> orderly_core::Result<String> {
    let store = &dash.backend.store;
    let role = orderly_core::leader::SUPERVISORS;
    let (everyone, now) = store
        .presence(role, Duration::from_secs(86_400 * 365))
        .await?;
    let fresh = |p: &&orderly_core::conditions::Presence| {
        (now - p.seen_at).to_std().unwrap_or_default() <= PRESENT
    };
    let running: Vec<_> = everyone.iter().filter(fresh).collect();
    let term = store.term(role).await?;
    let last = term.as_ref().map(|t| {
        format!(
            "{} (term {}, since {})",
            esc(t.fence.holder.as_str()),
            t.fence.epoch,
            when(t.started_at)
        )
    });
    if let Some(leader) = running.iter().find(|p| p.leading) {
        let followers: Vec<String> = running
            .iter()
            .filter(|p| !p.leading)
            .map(|p| esc(&p.instance))
            .collect();
        return Ok(format!(
            "<b class=ok>Leader: {}</b>{}; {}",
            esc(&leader.instance),
            term.as_ref()
                .map(|t| format!(", term {} since {} ago", t.fence.epoch, ago(t.started_at)))
                .unwrap_or_default(),
            if followers.is_empty() {
                "no follower".to_owned()
            } else {
                format!("followers: {}", followers.join(", "))
            }
        ));
    }
    if !running.is_empty() {
        let names: Vec<String> = running.iter().map(|p| esc(&p.instance)).collect();
        return Ok(format!(
            "<b class=bad>Leader lost: {} supervisor(s) run but none leads</b> ({}); last leader {}. \
             Timed-out orders are not recovered until one takes over.",
            running.len(),
            names.join(", "),
            last.unwrap_or_else(|| "none".into())
        ));
    }
    // None running. A supervisor that stopped cleanly leaves; one still listed but not
    // seen lately was lost.
    let lost: Vec<String> = everyone
        .iter()
        .map(|p| format!("{} (last seen {} ago)", esc(&p.instance), ago(p.seen_at)))
        .collect();
    Ok(if lost.is_empty() {
        format!(
            "<b class=warn>No supervisor running</b>: the last ones stopped cleanly{}. \
             Start one (orderly-supervisor) to recover timed-out orders.",
            last.map(|l| format!("; the last leader was {l}"))
                .unwrap_or_default()
        )
    } else {
        format!(
            "<b class=bad>No supervisor running: lost without stopping</b>: {}. \
             Start one (orderly-supervisor) to recover timed-out orders.",
            lost.join(", ")
        )
    })
}

/// The remote services as the fleet sees them; one that is not up has a Resume button
/// (for when the operator knows it is back before a probe finds out).
fn services_table(
    services: &[orderly_core::service::ServiceHealth],
    csrf: &str,
    operator: &str,
) -> String {
    use orderly_core::service::ServiceState;
    let mut out = String::from("<div class=card><h2>Remote services</h2>");
    if services.is_empty() {
        out.push_str(
            "<p id=services class=ok>None has been reported down: all are taken as up.</p></div>",
        );
        return out;
    }
    out.push_str(
        "<div class=scroll><table id=services><tr><th>service</th><th>state</th><th>down since</th><th>next probe</th>\
         <th>orders waiting</th><th>outages</th><th>last error</th><th></th></tr>",
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
                "<form class=inline method=post action=\"/services/{s}/resume\">{fields}\
                 <button id=\"resume-{s}\">Resume its {n} waiting orders</button></form>",
                s = esc(&h.service),
                fields = action_fields(csrf, operator),
                n = h.waiting
            )
        };
        let _ = write!(
            out,
            "<tr><td>{s}</td><td id=\"service-{s}\" class={class}>{state}</td><td>{since}</td>\
             <td>{probe}</td><td id=\"waiting-{s}\">{waiting}</td><td>{outages}</td><td>{error}</td><td>{resume}</td></tr>",
            s = esc(&h.service),
            state = h.state.as_str(),
            waiting = h.waiting,
            outages = h.outage,
            error = esc(h.last_error.as_deref().unwrap_or("-")),
        );
    }
    out.push_str("</table></div></div>");
    out
}

/// The live figures of the overview, for its script.
pub(super) async fn api(State(dash): State<Dash>) -> Response {
    let store = &dash.backend.store;
    let counts = match store.count_by_state().await {
        Ok(c) => c,
        Err(e) => return failed(e),
    };
    let counts: serde_json::Map<String, serde_json::Value> = counts
        .into_iter()
        .map(|(s, n): (ProcessState, i64)| (s.as_str().to_owned(), n.into()))
        .collect();
    let queues = dash.backend.inspector.depths().await.unwrap_or_default();
    let leader = leader_panel(&dash).await.unwrap_or_default();
    let open_alerts = store
        .system_alerts(true, 100)
        .await
        .map(|a| a.len())
        .unwrap_or(0);
    Json(json!({
        "counts": counts,
        "queues": queues.iter().map(|d| json!({
            "queue": d.queue.as_str(),
            "ready": d.ready,
            "locked": d.locked,
            "scheduled": d.scheduled,
            "dead_lettered": d.dead_lettered,
        })).collect::<Vec<_>>(),
        "leader": leader,
        "open_alerts": open_alerts,
    }))
    .into_response()
}

/// The charts, for the overview's script to redraw.
pub(super) async fn charts(State(dash): State<Dash>) -> Response {
    match dash
        .activity
        .hour(dash.backend.store.as_ref(), chrono::Utc::now())
        .await
    {
        Ok(minutes) => axum::response::Html(super::charts::render(&minutes)).into_response(),
        Err(e) => failed(e),
    }
}

/// Orders finished in the last minute, 5 minutes and hour, by final state, and the
/// rate per minute.
pub(super) async fn throughput(
    store: &dyn orderly_core::store::StateStore,
) -> orderly_core::Result<String> {
    let mut out = String::from(
        "<div class=scroll><table id=throughput><tr><th>finished in the last</th><th>Processed</th>\
         <th>Error</th><th>Cancelled</th><th>per minute</th></tr>",
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
    out.push_str("</table></div>");
    Ok(out)
}
