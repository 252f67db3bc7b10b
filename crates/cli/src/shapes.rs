//! The JSON shapes that `orderly --json` and the dashboard's API both answer with, so a
//! script reads one shape whichever it asks.

use orderly_core::leader::Term;
use orderly_core::store::OrderView;
use orderly_core::transport::DeadLetter;
use serde_json::{Value, json};

/// An order's state row as lists show it; one waiting for a service that is down
/// says so (`waiting`; `services`: the services' health by name).
pub fn state_row(
    row: &orderly_core::StateRow,
    services: &std::collections::HashMap<String, orderly_core::service::ServiceHealth>,
) -> serde_json::Result<Value> {
    let mut v = serde_json::to_value(row)?;
    if let Some(note) = row.waiting_note(services) {
        v["waiting"] = note.into();
    }
    Ok(v)
}

/// One order in full: its state row, details, steps and history.
pub fn order(view: &OrderView) -> Value {
    json!({
        "state": view.state,
        "details": view.details,
        "steps": view.steps,
        "history": view.history,
    })
}

/// The supervisors' current term (`holder` null and `live` false when none has led).
pub fn leader(term: Option<&Term>) -> Value {
    let Some(t) = term else {
        return json!({ "name": orderly_core::leader::SUPERVISORS, "holder": null, "live": false });
    };
    let live = t.lease_expires_at.is_none_or(|e| e > chrono::Utc::now());
    json!({
        "name": t.fence.name,
        "holder": t.fence.holder.as_str(),
        "epoch": t.fence.epoch.0,
        "started_at": t.started_at,
        "renewed_at": t.renewed_at,
        "lease_expires_at": t.lease_expires_at,
        "lease_in": if t.lease_expires_at.is_some() { "sql" } else { "blob" },
        "live": live,
    })
}

/// A dead letter with why, and its body as text.
pub fn dead_letter(d: &DeadLetter) -> Value {
    let m = &d.message;
    json!({
        "queue": m.queue.as_str(),
        "message_id": m.message_id,
        "correlation_id": m.correlation_id,
        "reason": d.reason,
        "description": d.description,
        "dead_lettered_at": d.dead_lettered_at,
        "enqueued_at": m.enqueued_at,
        "delivery_count": m.delivery_count,
        "properties": m.properties,
        "body": String::from_utf8_lossy(&m.body),
    })
}
