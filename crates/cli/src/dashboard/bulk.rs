//! Bulk actions from the orders list: the orders ticked, or every order the filters
//! match ("all matching the filters", on every page: first a confirmation that says how
//! many), retried or cancelled under the operator's name, each order's refusal said.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use maud::html;
use orderly_core::OrderId;
use orderly_core::store::StateStore;

use super::Dash;
use super::actions::{Acting, acting, done_page, refused};
use super::html::{action_fields, failed, notice, page};
use super::orders::OrdersQuery;

/// Most orders one bulk action over the filters moves (the confirmation says so when
/// more match).
const MOST: usize = 100_000;

/// Every order `filter` matches, oldest first, up to [`MOST`]; and whether there were
/// more.
pub(super) async fn matching(
    store: &dyn StateStore,
    mut filter: orderly_core::store::OrderFilter,
) -> orderly_core::Result<(Vec<OrderId>, bool)> {
    filter.limit = 1_000;
    filter.after = None;
    let mut ids = Vec::new();
    loop {
        let page = store.list(&filter).await?;
        ids.extend(page.orders.into_iter().map(|o| o.order_id));
        match page.next {
            Some(_) if ids.len() >= MOST => {
                ids.truncate(MOST);
                return Ok((ids, true));
            }
            Some(next) => filter.after = Some(next),
            None => return Ok((ids, false)),
        }
    }
}

/// `POST /orders/bulk`: the form's `action` (retry or cancel) on the ticked `order`s,
/// or with `all` on every order the filters match: asked first, then done once
/// `confirmed`.
pub(super) async fn bulk(State(dash): State<Dash>, headers: HeaderMap, body: String) -> Response {
    let fields: Vec<(String, String)> = form_urlencoded::parse(body.as_bytes())
        .into_owned()
        .collect();
    let one = |name: &str| {
        fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let form = Acting {
        csrf: one("csrf").unwrap_or_default(),
        operator: one("operator"),
        reason: one("reason"),
    };
    let (actor, reason) = match acting(&headers, &form) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    let retry = match one("action").as_deref() {
        Some("retry") => true,
        Some("cancel") => false,
        _ => return refused(StatusCode::BAD_REQUEST, "Retry or Cancel: no other action."),
    };
    let store = dash.backend.store.as_ref();
    let ids: Vec<OrderId> = if one("all").is_some() {
        let query = OrdersQuery::from_fields(&fields);
        let filter = match query.filter() {
            Ok(f) => f,
            Err(e) => return refused(StatusCode::BAD_REQUEST, &e),
        };
        let (ids, more) = match matching(store, filter).await {
            Ok(m) => m,
            Err(e) => return failed(e),
        };
        if one("confirmed").is_none() {
            return confirm(&form, &query, retry, ids.len(), more);
        }
        ids
    } else {
        let mut ids = Vec::new();
        for (_, id) in fields.iter().filter(|(k, _)| k == "order") {
            match OrderId::parse(id.clone()) {
                Ok(id) => ids.push(id),
                Err(_) => return refused(StatusCode::BAD_REQUEST, "bad order id"),
            }
        }
        if ids.is_empty() {
            return refused(
                StatusCode::BAD_REQUEST,
                "No order selected: tick the orders, or \"all matching the filters\".",
            );
        }
        ids
    };
    let (moved, not_moved) = act_on(store, &ids, retry, &actor, &reason).await;
    let not_moved: Vec<String> = not_moved.into_iter().map(|(_, why)| why).collect();
    let verb = if retry { "Retried" } else { "Cancelled" };
    let text = html! {
        p.notice #bulk-done { (verb) " " b #bulk-moved { (moved) } " of " (ids.len()) " orders (as " (actor.as_str()) ")." }
        @if !not_moved.is_empty() {
            p { b #bulk-refused { (not_moved.len()) } " not moved:" }
            ul { @for why in &not_moved { li { (why) } } }
        }
        p { a href="/orders" { "Back to the orders" } }
    };
    done_page(&form, verb, text)
}

/// Retries (or cancels) each of `ids` under `actor` with `reason`: how many moved, and
/// each the store refused with why.
pub(super) async fn act_on(
    store: &dyn StateStore,
    ids: &[OrderId],
    retry: bool,
    actor: &orderly_core::Actor,
    reason: &str,
) -> (usize, Vec<(OrderId, String)>) {
    let (mut moved, mut not_moved) = (0usize, Vec::new());
    for id in ids {
        let done = if retry {
            store.resubmit(id, actor, reason, &[]).await.map(|_| ())
        } else {
            store
                .request_cancel(id, actor, reason, &[])
                .await
                .map(|_| ())
        };
        match done {
            Ok(()) => moved += 1,
            Err(e) => not_moved.push((id.clone(), e.about(id))),
        }
    }
    tracing::info!(operator = %actor, retry, moved, refused = not_moved.len(), "bulk action from the dashboard");
    (moved, not_moved)
}

/// The question before acting on every order the filters match: how many, and what.
fn confirm(form: &Acting, query: &OrdersQuery, retry: bool, n: usize, more: bool) -> Response {
    let filters = query.link();
    let what = if retry {
        "Retry: an Error order goes round again (from its failed step, or afresh when steps \
         were undone); an order in another state is refused and left as it is."
    } else {
        "Cancel: the steps each order completed are undone first, then it ends Cancelled. \
         This cannot be taken back."
    };
    let body = html! { div.card {
        p { (if retry { "Retry " } else { "Cancel " }) b #bulk-count { (n) } " orders matching "
            span.mono { (if filters.is_empty() { "(no filter: every order)".to_owned() } else { filters.replace('&', " ") }) } "." }
        @if more { (notice(true, &format!("More orders match: only the first {MOST} (oldest first) are acted on; act again for the rest."))) }
        p.muted { (what) }
        form method="post" action="/orders/bulk" {
            (action_fields(&form.csrf, form.operator.as_deref().unwrap_or("dashboard")))
            (query.hidden())
            input type="hidden" name="all" value="1";
            input type="hidden" name="confirmed" value="1";
            input type="hidden" name="action" value=(if retry { "retry" } else { "cancel" });
            input name="reason" size="40" aria-label="reason"
                value=(form.reason.as_deref().unwrap_or(if retry { "retried from the dashboard" } else { "cancelled from the dashboard" }));
            " "
            button #bulk-confirm class=(if retry { "" } else { "danger" }) { (if retry { "Retry " } else { "Cancel " }) (n) " orders" }
            " " a href={"/orders?" (filters)} { "Back" }
        }
    } };
    page(
        if retry {
            "Retry the matching orders"
        } else {
            "Cancel the matching orders"
        },
        "/orders",
        body,
    )
    .into_response()
}
