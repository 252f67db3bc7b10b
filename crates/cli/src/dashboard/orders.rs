//! Every order, browsable: filters by state, step, error text, age and customer,
//! search by id (an exact id opens the order), and pages by cursor (stable while
//! orders come and go).

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use orderly_core::store::{Cursor, OrderFilter};
use orderly_core::{OrderId, ProcessState};
use serde::Deserialize;

use super::Dash;
use super::auth::{cookie, operator};
use super::html::{action_fields, ago, badge, failed, notice, page, url, when};

/// The list's filters, as the form sends them (empty fields are no filter).
#[derive(Debug, Default, Deserialize)]
pub(super) struct OrdersQuery {
    state: Option<String>,
    step: Option<String>,
    q: Option<String>,
    customer: Option<String>,
    /// Only orders older than this many minutes.
    older: Option<String>,
    /// An order id, or its start.
    id: Option<String>,
    /// Where the page starts: `CREATED_AT|ORDER_ID` of the last row before it.
    after: Option<String>,
    waiting: Option<String>,
    /// How many a page holds (the JSON API's; the page shows 50).
    limit: Option<String>,
}

fn filled(v: &Option<String>) -> Option<&str> {
    v.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

impl OrdersQuery {
    pub(super) fn filter(&self) -> Result<OrderFilter, String> {
        let state = filled(&self.state)
            .map(|s| s.parse::<ProcessState>())
            .transpose()
            .map_err(|e| format!("state: {e}"))?;
        let current_step = filled(&self.step)
            .map(|s| s.parse::<i32>())
            .transpose()
            .map_err(|_| "step: a number (0 is the first step)".to_owned())?;
        let created_before = filled(&self.older)
            .map(|s| {
                s.parse::<u32>()
                    .ok()
                    .and_then(|m| chrono::Duration::try_minutes(i64::from(m)))
                    .and_then(|span| chrono::Utc::now().checked_sub_signed(span))
                    .ok_or_else(|| "older than: a number of minutes".to_owned())
            })
            .transpose()?;
        let after = filled(&self.after)
            .map(|a| {
                let (t, id) = a.split_once('|').ok_or("bad page cursor")?;
                Ok::<_, &str>(Cursor {
                    created_at: chrono::DateTime::parse_from_rfc3339(t)
                        .map_err(|_| "bad page cursor")?
                        .with_timezone(&chrono::Utc),
                    order_id: OrderId::parse(id).map_err(|_| "bad page cursor")?,
                })
            })
            .transpose()
            .map_err(str::to_owned)?;
        Ok(OrderFilter {
            state,
            error_contains: filled(&self.q).map(str::to_owned),
            current_step,
            created_before,
            customer: filled(&self.customer).map(str::to_owned),
            id_prefix: filled(&self.id).map(str::to_owned),
            waiting_for: filled(&self.waiting).map(str::to_owned),
            limit: filled(&self.limit)
                .map(|l| {
                    l.parse::<u32>()
                        .ok()
                        .filter(|l| (1..=1_000).contains(l))
                        .ok_or_else(|| "limit: 1 to 1000".to_owned())
                })
                .transpose()?
                .unwrap_or(50),
            after,
        })
    }

    /// The filters among a form's fields (`state`, `step`, `q`, `customer`, `older`,
    /// `id`, `waiting`; the rest ignored).
    pub(super) fn from_fields(fields: &[(String, String)]) -> Self {
        let one = |name: &str| {
            fields
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        Self {
            state: one("state"),
            step: one("step"),
            q: one("q"),
            customer: one("customer"),
            older: one("older"),
            id: one("id"),
            after: None,
            waiting: one("waiting"),
            limit: None,
        }
    }

    /// These filters as hidden fields of a form (a bulk action over all they match).
    pub(super) fn hidden(&self) -> Markup {
        html! {
            @for (k, v) in self.pairs() {
                input type="hidden" name=(k) value=(v);
            }
        }
    }

    /// The filters given, by name.
    fn pairs(&self) -> Vec<(&'static str, &str)> {
        [
            ("state", &self.state),
            ("step", &self.step),
            ("q", &self.q),
            ("customer", &self.customer),
            ("older", &self.older),
            ("id", &self.id),
            ("waiting", &self.waiting),
        ]
        .into_iter()
        .filter_map(|(k, v)| filled(v).map(|v| (k, v)))
        .collect()
    }

    /// The query string of these filters (without the cursor).
    pub(super) fn link(&self) -> String {
        self.pairs()
            .into_iter()
            .map(|(k, v)| format!("{k}={}", url(v)))
            .collect::<Vec<_>>()
            .join("&")
    }
}

/// A page cursor as `after` takes it: `CREATED_AT|ORDER_ID` of the last row before it.
pub(super) fn cursor_text(c: &Cursor) -> String {
    format!(
        "{}|{}",
        c.created_at
            .to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        c.order_id
    )
}

pub(super) async fn orders(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Query(query): Query<OrdersQuery>,
) -> Response {
    let store = &dash.backend.store;
    // An exact id opens its order.
    if let Some(id) = filled(&query.id)
        && let Ok(order_id) = OrderId::parse(id)
        && store.get(&order_id).await.is_ok()
    {
        return Redirect::to(&format!("/orders/{}", url(order_id.as_str()))).into_response();
    }
    let filter = match query.filter() {
        Ok(f) => f,
        Err(e) => {
            let body = html! { (notice(true, &e)) (form(&query)) };
            return page("Orders", "/orders", body).into_response();
        }
    };
    let page_of = match store.list(&filter).await {
        Ok(p) => p,
        Err(e) => return failed(e),
    };
    let services = store
        .services()
        .await
        .unwrap_or_default()
        .into_iter()
        .map(|h| (h.service.clone(), h))
        .collect();
    let next = page_of.next.as_ref().map(|next| {
        let link = query.link();
        format!(
            "/orders?{link}{sep}after={}",
            url(&cursor_text(next)),
            sep = if link.is_empty() { "" } else { "&" },
        )
    });
    let csrf = cookie(&headers, "orderly_csrf").unwrap_or("");
    let body = html! {
        (form(&query))
        {
            div.card { form.filters method="post" action="/orders/bulk" #bulk {
                (action_fields(csrf, &operator(&headers)))
                input name="reason" size="28" placeholder="why (for the histories)" aria-label="reason";
                (query.hidden())
                label title="every order these filters match, on every page; you are asked first" {
                    input type="checkbox" name="all" value="1" #bulk-all;
                    " all matching the filters"
                }
                button name="action" value="retry" #bulk-retry { "Retry selected" }
                " "
                button.danger name="action" value="cancel" #bulk-cancel { "Cancel selected" }
            } }
        }
        div.card {
            div.scroll { table #orders data-refresh {
                tr { th { input type="checkbox" #select-page aria-label="select this page"
                        onclick="for (const b of document.querySelectorAll('#orders input[name=order]')) b.checked = this.checked"; }
                     th { "order" } th { "state" } th { "step" } th { "failures" } th { "created" }
                     th { "updated" } th { "last error / waiting" } }
                @for r in &page_of.orders {
                    @let note = r.waiting_note(&services).or_else(|| r.error_note()).unwrap_or_default();
                    tr.order {
                        td { input type="checkbox" name="order" value=(r.order_id.as_str()) form="bulk"
                                aria-label={"select " (r.order_id.as_str())}; }
                        td.mono { a href={"/orders/" (url(r.order_id.as_str()))} { (r.order_id.as_str()) } }
                        td { (badge(r.process_state)) }
                        td { (r.current_step) }
                        td { (r.failure_count) }
                        td title=(when(r.created_at)) { (ago(r.created_at)) " ago" }
                        td { (ago(r.updated_at)) " ago" }
                        td { (note) }
                    }
                }
            } }
            @if page_of.orders.is_empty() { p.muted #no-orders { "No order matches." } }
            @if let Some(next) = &next { p { a #next href=(next) { "Next page" } } }
        }
    };
    page("Orders", "/orders", body).into_response()
}

/// The filter form, filled with the current filters.
fn form(q: &OrdersQuery) -> Markup {
    let value = |v: &Option<String>| filled(v).unwrap_or("").to_owned();
    let states = [
        ProcessState::Pending,
        ProcessState::Processing,
        ProcessState::Processed,
        ProcessState::Error,
        ProcessState::Cancelled,
    ];
    html! {
        div.card { form.filters method="get" action="/orders" #filters {
            label { "State" select name="state" {
                option value="" { "any" }
                @for s in states {
                    option selected[filled(&q.state) == Some(s.as_str())] { (s.as_str()) }
                }
            } }
            label { "Step" input name="step" size="3" value=(value(&q.step)) placeholder="0, 1..."; }
            label { "Error text" input name="q" value=(value(&q.q)) placeholder="declined"; }
            label { "Customer" input name="customer" value=(value(&q.customer)) placeholder="c-1"; }
            label { "Older than (min)" input name="older" size="5" value=(value(&q.older)); }
            label { "Order id" input name="id" value=(value(&q.id)) placeholder="id or its start"; }
            label { "Waiting for" input name="waiting" value=(value(&q.waiting)) placeholder="agent.payment"; }
            button { "Filter" } " " a href="/orders" { "clear" }
        } }
    }
}
