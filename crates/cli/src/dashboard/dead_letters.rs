//! Dead letters: per queue, each message with why it was dead-lettered, and Requeue or
//! Discard (one, or all of the queue's); the outbox's undeliverable messages.

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};
use orderly_core::transport::QueueName;
use serde::Deserialize;

use super::Dash;
use super::auth::{cookie, operator};
use super::html::{action_fields, failed, page, url, when};

#[derive(Deserialize)]
pub(super) struct DeadQuery {
    queue: Option<String>,
}

/// A dead-letter action's form: on one message of `queue`, or (no message) on all.
fn action(
    csrf: &str,
    operator: &str,
    queue: &QueueName,
    action: &str,
    label: &str,
    message: Option<&str>,
    class: &str,
) -> Markup {
    html! {
        form.inline method="post" action={"/dead-letters/" (action)} {
            (action_fields(csrf, operator))
            input type="hidden" name="queue" value=(queue.as_str());
            @if let Some(m) = message { input type="hidden" name="message_id" value=(m); }
            button class=(class) { (label) }
        }
    }
}

pub(super) async fn dead_letters(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Query(query): Query<DeadQuery>,
) -> Response {
    let csrf = cookie(&headers, "orderly_csrf").unwrap_or("");
    let operator = operator(&headers);
    let depths = dash.backend.inspector.count_depths().await;
    let queue = query.queue.clone().or_else(|| {
        depths.as_ref().ok().and_then(|d| {
            d.iter()
                .find(|d| d.dead_lettered > 0)
                .map(|d| d.queue.as_str().to_owned())
        })
    });
    let letters = match queue.and_then(|q| QueueName::parse(q).ok()) {
        Some(q) => match dash.backend.transport.dead_letters(&q, 200).await {
            Ok(l) => Some((q, l)),
            Err(e) => return failed(e),
        },
        None => None,
    };
    // With Service Bus: messages the outbox could not deliver (their queue is missing,
    // or they failed too often), kept with the reason.
    let undeliverable = match dash.backend.outbox.outbox_dead_letters(200).await {
        Ok(letters) => letters,
        Err(e) => return failed(e),
    };
    let form = |q: &QueueName, act: &str, label: &str, message: Option<&str>, class: &str| {
        action(csrf, &operator, q, act, label, message, class)
    };
    let body = html! {
        div.card {
            h2 { "Queues" }
            p {
                @match &depths {
                    Ok(depths) => {
                        @for d in depths {
                            a href={"/dead-letters?queue=" (url(d.queue.as_str()))} { (d.queue.as_str()) }
                            " " span.muted { "(" (d.dead_lettered) ")" } " \u{a0} "
                        }
                    }
                    Err(e) => span.muted { (e.to_string()) },
                }
            }
        }
        @if let Some((q, letters)) = &letters {
            div.card {
                h2 { (q.as_str()) " " span.muted { "(" (letters.len()) " dead letters)" } }
                p {
                    @if !letters.is_empty() {
                        (form(q, "requeue", &format!("Requeue all {}", letters.len()), None, ""))
                        " "
                        (form(q, "discard", &format!("Discard all {}", letters.len()), None, "danger"))
                    }
                }
                div.scroll { table #dead-letters data-refresh {
                    tr { th { "when" } th { "message" } th { "reason" } th { "deliveries" }
                         th { "description" } th { "body" } th {} }
                    @for d in letters {
                        @let text = String::from_utf8_lossy(&d.message.body);
                        @let short: String = text.chars().take(200).collect();
                        tr {
                            td { (when(d.dead_lettered_at)) }
                            td.mono { (d.message.message_id) }
                            td { (d.reason) }
                            td { (d.message.delivery_count) }
                            td { (d.description) }
                            td class="mono muted" { (short) }
                            td {
                                (form(q, "requeue", "Requeue", Some(&d.message.message_id), "plain"))
                                " "
                                (form(q, "discard", "Discard", Some(&d.message.message_id), "plain"))
                            }
                        }
                    }
                } }
            }
        }
        @if !undeliverable.is_empty() {
            div.card {
                h2 { "Outbox: not deliverable" }
                div.scroll { table #outbox-dead-letters data-refresh {
                    tr { th { "when" } th { "queue" } th { "message" } th { "attempts" } th { "reason" } }
                    @for d in &undeliverable {
                        tr {
                            td { (when(d.dead_at)) }
                            td { (d.queue) }
                            td.mono { (d.message_id) }
                            td { (d.attempts) }
                            td { (d.reason) }
                        }
                    }
                } }
                p.muted { "Publish them again, once the cause is fixed, with " code { "orderly outbox --requeue" } "." }
            }
        }
    };
    page("Dead letters", "/dead-letters", body).into_response()
}
