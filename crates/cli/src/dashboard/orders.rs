//! Every order, browsable: filters by state, step, error text, age and customer,
//! search by id (an exact id opens the order), and pages by cursor (stable while
//! orders come and go).

use std::fmt::Write as _;

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use orderly_core::store::{Cursor, OrderFilter};
use orderly_core::{OrderId, ProcessState};
use serde::Deserialize;

use super::Dash;
use super::html::{ago, badge, esc, failed, page, url, when};

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
}

fn filled(v: &Option<String>) -> Option<&str> {
    v.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

impl OrdersQuery {
    fn filter(&self) -> Result<OrderFilter, String> {
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
            limit: 50,
            after,
        })
    }

    /// The query string of these filters (without the cursor).
    fn link(&self) -> String {
        [
            ("state", &self.state),
            ("step", &self.step),
            ("q", &self.q),
            ("customer", &self.customer),
            ("older", &self.older),
            ("id", &self.id),
            ("waiting", &self.waiting),
        ]
        .iter()
        .filter_map(|(k, v)| filled(v).map(|v| format!("{k}={}", url(v))))
        .collect::<Vec<_>>()
        .join("&")
    }
}

pub(super) async fn orders(State(dash): State<Dash>, Query(query): Query<OrdersQuery>) -> Response {
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
            return page(
                "Orders",
                "/orders",
                &format!("<p class=\"notice bad\">{}</p>{}", esc(&e), form(&query)),
            )
            .into_response();
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
    let mut body = form(&query);
    body.push_str("<div class=card><div class=scroll><table id=orders><tr><th>order</th><th>state</th><th>step</th><th>failures</th><th>created</th><th>updated</th><th>last error / waiting</th></tr>");
    for r in &page_of.orders {
        let note = r
            .waiting_note(&services)
            .or_else(|| r.error_note())
            .unwrap_or_default();
        let _ = write!(
            body,
            "<tr><td class=mono><a href=\"/orders/{id}\">{id}</a></td><td>{}</td><td>{}</td><td>{}</td>\
             <td title=\"{}\">{} ago</td><td>{} ago</td><td>{}</td></tr>",
            badge(r.process_state),
            r.current_step,
            r.failure_count,
            when(r.created_at),
            ago(r.created_at),
            ago(r.updated_at),
            esc(&note),
            id = esc(r.order_id.as_str()),
        );
    }
    body.push_str("</table></div>");
    if page_of.orders.is_empty() {
        body.push_str("<p class=muted id=no-orders>No order matches.</p>");
    }
    if let Some(next) = &page_of.next {
        let link = query.link();
        let _ = write!(
            body,
            "<p><a id=next href=\"/orders?{link}{sep}after={}\">Next page</a></p>",
            url(&format!(
                "{}|{}",
                next.created_at
                    .to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
                next.order_id
            )),
            sep = if link.is_empty() { "" } else { "&" },
        );
    }
    body.push_str("</div>");
    page("Orders", "/orders", &body).into_response()
}

/// The filter form, filled with the current filters.
fn form(q: &OrdersQuery) -> String {
    let value = |v: &Option<String>| esc(filled(v).unwrap_or(""));
    let mut states = String::from("<option value=\"\">any</option>");
    for s in [
        ProcessState::Pending,
        ProcessState::Processing,
        ProcessState::Processed,
        ProcessState::Error,
        ProcessState::Cancelled,
    ] {
        let selected = if filled(&q.state) == Some(s.as_str()) {
            " selected"
        } else {
            ""
        };
        let _ = write!(states, "<option{selected}>{}</option>", s.as_str());
    }
    format!(
        "<div class=card><form class=filters method=get action=\"/orders\" id=filters>\
         <label>State<select name=state>{states}</select></label>\
         <label>Step<input name=step size=3 value=\"{}\" placeholder=\"0, 1...\"></label>\
         <label>Error text<input name=q value=\"{}\" placeholder=\"declined\"></label>\
         <label>Customer<input name=customer value=\"{}\" placeholder=\"c-1\"></label>\
         <label>Older than (min)<input name=older size=5 value=\"{}\"></label>\
         <label>Order id<input name=id value=\"{}\" placeholder=\"id or its start\"></label>\
         <label>Waiting for<input name=waiting value=\"{}\" placeholder=\"agent.payment\"></label>\
         <button>Filter</button> <a href=\"/orders\">clear</a></form></div>",
        value(&q.step),
        value(&q.q),
        value(&q.customer),
        value(&q.older),
        value(&q.id),
        value(&q.waiting),
    )
}
