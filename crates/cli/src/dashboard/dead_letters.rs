//! Dead letters: per queue, each message with why it was dead-lettered, and Requeue or
//! Discard (one, or all of the queue's); the outbox's undeliverable messages.

use std::fmt::Write as _;

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use orderly_core::transport::QueueName;
use serde::Deserialize;

use super::Dash;
use super::auth::{cookie, operator};
use super::html::{action_fields, esc, failed, page, url, when};

#[derive(Deserialize)]
pub(super) struct DeadQuery {
    queue: Option<String>,
}

pub(super) async fn dead_letters(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Query(query): Query<DeadQuery>,
) -> Response {
    let csrf = cookie(&headers, "orderly_csrf").unwrap_or("");
    let operator = operator(&headers);
    let mut body = String::from("<div class=card><h2>Queues</h2><p>");
    let depths = dash.backend.inspector.count_depths().await;
    match &depths {
        Ok(depths) => {
            for d in depths {
                let _ = write!(
                    body,
                    "<a href=\"/dead-letters?queue={q}\">{n}</a> <span class=muted>({})</span> &nbsp; ",
                    d.dead_lettered,
                    q = url(d.queue.as_str()),
                    n = esc(d.queue.as_str()),
                );
            }
        }
        Err(e) => {
            let _ = write!(body, "<span class=muted>{}</span>", esc(&e.to_string()));
        }
    }
    body.push_str("</p></div>");
    let queue = query.queue.or_else(|| {
        depths.as_ref().ok().and_then(|d| {
            d.iter()
                .find(|d| d.dead_lettered > 0)
                .map(|d| d.queue.as_str().to_owned())
        })
    });
    if let Some(q) = queue.and_then(|q| QueueName::parse(q).ok()) {
        let letters = match dash.backend.transport.dead_letters(&q, 200).await {
            Ok(l) => l,
            Err(e) => return failed(e),
        };
        let form = |action: &str, label: &str, message: Option<&str>, class: &str| {
            format!(
                "<form class=inline method=post action=\"/dead-letters/{action}\">{fields}\
                 <input type=hidden name=queue value=\"{queue}\">{message}\
                 <button class=\"{class}\">{label}</button></form>",
                fields = action_fields(csrf, &operator),
                queue = esc(q.as_str()),
                message = message
                    .map(|m| format!("<input type=hidden name=message_id value=\"{}\">", esc(m)))
                    .unwrap_or_default(),
            )
        };
        let _ = write!(
            body,
            "<div class=card><h2>{} <span class=muted>({} dead letters)</span></h2><p>{} {}</p>\
             <div class=scroll><table id=dead-letters><tr><th>when</th><th>message</th><th>reason</th><th>deliveries</th>\
             <th>description</th><th>body</th><th></th></tr>",
            esc(q.as_str()),
            letters.len(),
            if letters.is_empty() {
                String::new()
            } else {
                form(
                    "requeue",
                    &format!("Requeue all {}", letters.len()),
                    None,
                    "",
                )
            },
            if letters.is_empty() {
                String::new()
            } else {
                form(
                    "discard",
                    &format!("Discard all {}", letters.len()),
                    None,
                    "danger",
                )
            },
        );
        for d in &letters {
            let text = String::from_utf8_lossy(&d.message.body);
            let short: String = text.chars().take(200).collect();
            let _ = write!(
                body,
                "<tr><td>{}</td><td class=mono>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"mono muted\">{}</td><td>{} {}</td></tr>",
                when(d.dead_lettered_at),
                esc(&d.message.message_id),
                esc(&d.reason),
                d.message.delivery_count,
                esc(&d.description),
                esc(&short),
                form("requeue", "Requeue", Some(&d.message.message_id), "plain"),
                form("discard", "Discard", Some(&d.message.message_id), "plain"),
            );
        }
        body.push_str("</table></div></div>");
    }
    // With Service Bus: messages the outbox could not deliver (their queue is missing,
    // or they failed too often), kept with the reason.
    match dash.backend.outbox.outbox_dead_letters(200).await {
        Ok(letters) if !letters.is_empty() => {
            body.push_str("<div class=card><h2>Outbox: not deliverable</h2><div class=scroll><table id=outbox-dead-letters><tr><th>when</th><th>queue</th><th>message</th><th>attempts</th><th>reason</th></tr>");
            for d in &letters {
                let _ = write!(
                    body,
                    "<tr><td>{}</td><td>{}</td><td class=mono>{}</td><td>{}</td><td>{}</td></tr>",
                    when(d.dead_at),
                    esc(&d.queue),
                    esc(&d.message_id),
                    d.attempts,
                    esc(&d.reason)
                );
            }
            body.push_str("</table></div><p class=muted>Publish them again, once the cause is fixed, with <code>orderly outbox --requeue</code>.</p></div>");
        }
        Ok(_) => {}
        Err(e) => return failed(e),
    }
    page("Dead letters", "/dead-letters", &body).into_response()
}
