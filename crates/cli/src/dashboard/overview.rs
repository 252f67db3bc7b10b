//! The overview: orders by state, the charts of the last hour, the supervisors (who
//! leads, or why none does), the remote services, open alerts and the queues; its
//! figures refresh by themselves (`/api/overview`, `/charts`).

use std::time::Duration;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};
use orderly_core::ProcessState;
use orderly_core::activity::ChartRange;
use serde_json::json;

use super::Dash;
use super::auth::{cookie, operator};
use super::html::{action_fields, ago, failed, page, url, when};

/// Supervisors seen within this long run.
const PRESENT: Duration = Duration::from_secs(10);

/// Which charts to show: `?range=1h` (the default), `24h` or `7d`.
#[derive(serde::Deserialize, Default)]
pub(super) struct ChartQuery {
    range: Option<String>,
}

impl ChartQuery {
    /// The range asked for (the hour when none is), `None` if it names none.
    pub(super) fn range_named(&self) -> Option<ChartRange> {
        match self.range.as_deref() {
            None | Some("") => Some(ChartRange::Hour),
            Some(r) => ChartRange::parse(r),
        }
    }

    /// The range asked for, or a 400 saying what it may be.
    fn range(&self) -> Result<ChartRange, Response> {
        self.range_named().ok_or_else(|| {
            (
                axum::http::StatusCode::BAD_REQUEST,
                "range: expected 1h, 24h or 7d",
            )
                .into_response()
        })
    }
}

pub(super) async fn overview(
    State(dash): State<Dash>,
    Query(chart): Query<ChartQuery>,
    headers: HeaderMap,
) -> Response {
    let range = match chart.range() {
        Ok(r) => r,
        Err(refused) => return refused,
    };
    let store = &dash.backend.store;
    let counts = match store.count_by_state().await {
        Ok(c) => c,
        Err(e) => return failed(e),
    };
    let throughput = match throughput(store.as_ref()).await {
        Ok(table) => table,
        Err(e) => return failed(e),
    };
    let oldest = match store.oldest_pending().await {
        Ok((oldest, _)) => oldest,
        Err(e) => return failed(e),
    };
    let charts = match super::charts::bins(
        &dash.activity,
        store.as_ref(),
        range,
        chrono::Utc::now(),
    )
    .await
    {
        Ok(bins) => super::charts::render(&bins, range),
        Err(e) => return failed(e),
    };
    let open = match store.system_alerts(true, 20).await {
        Ok(open) => open,
        Err(e) => return failed(e),
    };
    let leader = match leader_panel(&dash).await {
        Ok(l) => l,
        Err(e) => return failed(e),
    };
    let services = match store.services().await {
        Ok(services) => services_table(
            &services,
            cookie(&headers, "orderly_csrf").unwrap_or(""),
            &operator(&headers),
        ),
        Err(e) => return failed(e),
    };
    let queues = queues_table(dash.backend.inspector.count_depths().await);
    let missing = open
        .iter()
        .filter(|a| a.kind == orderly_core::conditions::ConditionKind::WorkflowMissing);
    let body = html! {
        div data-live {}
        div.card {
            h2 { "Orders" }
            div.tiles {
                @for (state, n) in &counts {
                    @let s = state.as_str();
                    div class={"tile " (s)} {
                        a href={"/orders?state=" (s)} {
                            div.muted { (s) }
                            div.n id={"count-" (s)} { (n) }
                        }
                    }
                }
            }
            (throughput)
            @match oldest {
                Some((id, created)) => p.muted {
                    "Oldest Pending order: " a href={"/orders/" (url(id.as_str()))} { (id.as_str()) }
                    ", waiting " (ago(created)) ". Updated " span #updated { "now" } "."
                },
                None => p.muted { "No order waits. Updated " span #updated { "now" } "." },
            }
        }
        // Orders no scheduler can run never wait silently: a banner above everything.
        @for a in missing {
            div.card #workflow-missing {
                p.bad { b { "Orders wait for workflow " (a.subject) } ": " (a.detail) }
            }
        }
        div #charts { (charts) }
        div.grid {
            div.card { h2 { "Supervisors" } p #leader { (leader) } }
            div.card {
                h2 { "Open alerts" }
                @if open.is_empty() {
                    p.ok #alerts-open { "None." }
                } @else {
                    ul #alerts-open {
                        @for a in &open {
                            li {
                                b.bad { (a.kind.as_str()) } " " (a.subject) " "
                                span.muted { "since " (ago(a.raised_at)) } ": " (a.detail)
                                @if let Some(by) = a.acknowledged_by.as_deref() {
                                    " " span.ack { "acknowledged by " (by) }
                                }
                            }
                        }
                    }
                }
                p { a href="/alerts" { "All alerts" } }
            }
        }
        (services)
        (queues)
    };
    page("Overview", "/", body).into_response()
}

/// Every queue's depths, each figure with an id the overview's script refreshes.
fn queues_table(
    depths: Result<
        Vec<orderly_core::transport::QueueDepth>,
        orderly_core::transport::TransportError,
    >,
) -> Markup {
    html! {
        div.card {
            h2 { "Queues" }
            @match depths {
                Ok(depths) => div.scroll { table #queues {
                    tr { th { "queue" } th { "ready" } th { "locked" } th { "scheduled" } th { "dead-lettered" } }
                    @for d in &depths {
                        @let q = d.queue.as_str();
                        tr {
                            td { (q) }
                            td id={"q-" (q) "-ready"} { (d.ready) }
                            td id={"q-" (q) "-locked"} { (d.locked) }
                            td id={"q-" (q) "-scheduled"} { (d.scheduled) }
                            td { a id={"q-" (q) "-dead_lettered"} href={"/dead-letters?queue=" (url(q))} { (d.dead_lettered) } }
                        }
                    }
                } },
                Err(e) => p.muted { (e.to_string()) },
            }
        }
    }
}

/// Who leads, or why none does: no supervisor running (none seen lately; the last
/// leader stopped cleanly or was lost), or supervisors running but none leading.
pub(super) async fn leader_panel(dash: &Dash) -> orderly_core::Result<Markup> {
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
            t.fence.holder.as_str(),
            t.fence.epoch,
            when(t.started_at)
        )
    });
    if let Some(leader) = running.iter().find(|p| p.leading) {
        let followers: Vec<&str> = running
            .iter()
            .filter(|p| !p.leading)
            .map(|p| p.instance.as_str())
            .collect();
        return Ok(html! {
            b.ok { "Leader: " (leader.instance) }
            @if let Some(t) = &term { ", term " (t.fence.epoch) " since " (ago(t.started_at)) " ago" }
            "; "
            @if followers.is_empty() { "no follower" } @else { "followers: " (followers.join(", ")) }
        });
    }
    if !running.is_empty() {
        let names: Vec<&str> = running.iter().map(|p| p.instance.as_str()).collect();
        return Ok(html! {
            b.bad { "Leader lost: " (running.len()) " supervisor(s) run but none leads" }
            " (" (names.join(", ")) "); last leader " (last.as_deref().unwrap_or("none"))
            ". Timed-out orders are not recovered until one takes over."
        });
    }
    // None running. A supervisor that stopped cleanly leaves; one still listed but not
    // seen lately was lost.
    let lost: Vec<String> = everyone
        .iter()
        .map(|p| format!("{} (last seen {} ago)", p.instance, ago(p.seen_at)))
        .collect();
    Ok(if lost.is_empty() {
        html! {
            b.warn { "No supervisor running" } ": the last ones stopped cleanly"
            @if let Some(l) = &last { "; the last leader was " (l) }
            ". Start one (orderly-supervisor) to recover timed-out orders."
        }
    } else {
        html! {
            b.bad { "No supervisor running: lost without stopping" } ": " (lost.join(", "))
            ". Start one (orderly-supervisor) to recover timed-out orders."
        }
    })
}

/// The remote services as the fleet sees them; one that is not up has a Resume button
/// (for when the operator knows it is back before a probe finds out).
fn services_table(
    services: &[orderly_core::service::ServiceHealth],
    csrf: &str,
    operator: &str,
) -> Markup {
    use orderly_core::service::ServiceState;
    if services.is_empty() {
        return html! { div.card {
            h2 { "Remote services" }
            p #services .ok { "None has been reported down: all are taken as up." }
        } };
    }
    html! { div.card {
        h2 { "Remote services" }
        div.scroll { table #services {
            tr { th { "service" } th { "state" } th { "down since" } th { "next probe" }
                 th { "orders waiting" } th { "outages" } th { "last error" } th {} }
            @for h in services {
                @let (class, since, probe) = match h.state {
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
                @let s = h.service.as_str();
                tr {
                    td { (s) }
                    td id={"service-" (s)} class=(class) { (h.state.as_str()) }
                    td { (since) }
                    td { (probe) }
                    td id={"waiting-" (s)} { (h.waiting) }
                    td { (h.outage) }
                    td { (h.last_error.as_deref().unwrap_or("-")) }
                    td {
                        @if h.state != ServiceState::Up || h.waiting != 0 {
                            form.inline method="post" action={"/services/" (url(s)) "/resume"} {
                                (action_fields(csrf, operator))
                                button id={"resume-" (s)} { "Resume its " (h.waiting) " waiting orders" }
                            }
                        }
                    }
                }
            }
        } }
    } }
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
    let leader = leader_panel(&dash)
        .await
        .map(Markup::into_string)
        .unwrap_or_default();
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
pub(super) async fn charts(State(dash): State<Dash>, Query(chart): Query<ChartQuery>) -> Response {
    let range = match chart.range() {
        Ok(r) => r,
        Err(refused) => return refused,
    };
    let store = dash.backend.store.as_ref();
    match super::charts::bins(&dash.activity, store, range, chrono::Utc::now()).await {
        Ok(bins) => {
            axum::response::Html(super::charts::render(&bins, range).into_string()).into_response()
        }
        Err(e) => failed(e),
    }
}

/// Orders finished in the last minute, 5 minutes and hour, by final state, and the
/// rate per minute.
pub(super) async fn throughput(
    store: &dyn orderly_core::store::StateStore,
) -> orderly_core::Result<Markup> {
    let now = chrono::Utc::now();
    let mut rows = Vec::with_capacity(3);
    for (label, key, minutes) in [
        ("minute", "1m", 1),
        ("5 minutes", "5m", 5),
        ("hour", "1h", 60),
    ] {
        let counts = store
            .finished_since(now - chrono::Duration::minutes(minutes))
            .await?;
        rows.push((label, key, minutes, counts));
    }
    Ok(html! { div.scroll { table #throughput {
        tr { th { "finished in the last" } th { "Processed" } th { "Error" } th { "Cancelled" } th { "per minute" } }
        @for (label, key, minutes, counts) in &rows {
            @let total: i64 = counts.iter().map(|(_, n)| n).sum();
            tr {
                td { (label) }
                @for (state, n) in counts {
                    td id={"finished-" (key) "-" (state.as_str())} { (n) }
                }
                td id={"rate-" (key)} { (format!("{:.1}", total as f64 / *minutes as f64)) }
            }
        }
    } } })
}
