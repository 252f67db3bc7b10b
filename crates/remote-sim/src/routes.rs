//! The HTTP endpoints: an action applied at most once per key, the status of a
//! key, the ledger, and the faults taken down and brought back.

use super::{Call, Effect, Sim, SimStats};
use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use std::time::Duration;

pub(super) fn answer(status: StatusCode, text: impl Into<String>) -> Response {
    (status, text.into()).into_response()
}

pub(super) async fn act(
    State(sim): State<Sim>,
    Path(action): Path<String>,
    headers: HeaderMap,
    body: String,
) -> Response {
    if !sim.cfg.latency.is_zero() {
        tokio::time::sleep(sim.cfg.latency).await;
    }
    let Some(key) = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .filter(|k| !k.is_empty())
        .map(str::to_owned)
    else {
        return answer(
            StatusCode::BAD_REQUEST,
            "Idempotency-Key header is required",
        );
    };
    let call: Call = match serde_json::from_str(&body) {
        Ok(c) => c,
        Err(e) => return answer(StatusCode::BAD_REQUEST, format!("invalid body: {e}")),
    };
    if call.action != action {
        return answer(StatusCode::BAD_REQUEST, "body action differs from the URL");
    }
    if sim.is_down(&action) {
        sim.ledger().stats.outage_refusals += 1;
        return answer(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{action}: service down (simulated outage)"),
        );
    }
    {
        let mut l = sim.ledger();
        l.stats.calls += 1;
        let forgotten = |e: &Effect| {
            sim.cfg
                .forget_keys_after
                .is_some_and(|window| forgot(e.applied_at, window))
        };
        if let Some(e) = l.effects.get_mut(&key) {
            e.calls += 1;
            if forgotten(e) {
                // The key is forgotten: the repeat is applied again, as new.
                e.applied += 1;
                e.applied_at = Utc::now();
                l.stats.applied += 1;
                return answer(StatusCode::OK, format!("{action} {key}: applied"));
            }
            l.stats.replays += 1;
            return answer(StatusCode::OK, format!("{action} {key}: already applied"));
        }
        if l.tombstones.contains(&key) {
            l.stats.permanent += 1;
            return answer(
                StatusCode::CONFLICT,
                format!("{action} {key}: already compensated"),
            );
        }
    }
    if sim.cfg.hang_actions.contains(&action) {
        sim.ledger().stats.hangs += 1;
        tokio::time::sleep(sim.cfg.hang_for).await;
        return answer(StatusCode::SERVICE_UNAVAILABLE, "hung");
    }
    let roll = sim.roll();
    // A key it declines stays declined whatever fault fires: a fault may hang or fail
    // the call, but never applies what it declines.
    let declined = call.kind == "do" && sim.declines(&action, &key);
    let hang_after_effect = !declined
        && (roll < sim.cfg.hang_rate / 2.0 || sim.cfg.lose_reply_actions.contains(&action));
    if roll < sim.cfg.hang_rate && !hang_after_effect {
        sim.ledger().stats.hangs += 1;
        tokio::time::sleep(sim.cfg.hang_for).await;
        return answer(StatusCode::SERVICE_UNAVAILABLE, "hung");
    }
    if !hang_after_effect && roll < sim.cfg.hang_rate + sim.cfg.transient_rate {
        sim.ledger().stats.transient += 1;
        return if roll * 1e6 % 2.0 < 1.0 {
            answer(StatusCode::SERVICE_UNAVAILABLE, "temporarily unavailable")
        } else {
            (
                StatusCode::TOO_MANY_REQUESTS,
                [("retry-after", "0")],
                "slow down",
            )
                .into_response()
        };
    }
    if declined {
        sim.ledger().stats.permanent += 1;
        return answer(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("{action} declined for order {}", call.order_id),
        );
    }
    let traceparent = headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if let Some(replay) = apply(&sim, &action, &key, call, traceparent, hang_after_effect) {
        return replay;
    }
    if hang_after_effect {
        tokio::time::sleep(sim.cfg.hang_for).await;
        return answer(StatusCode::SERVICE_UNAVAILABLE, "hung");
    }
    answer(StatusCode::OK, format!("{action} {key}: applied"))
}

/// Applies the effect of `key` once; `Some(answer)` if it was applied already.
pub(super) fn apply(
    sim: &Sim,
    action: &str,
    key: &str,
    call: Call,
    traceparent: Option<String>,
    hang_after_effect: bool,
) -> Option<Response> {
    let mut l = sim.ledger();
    // Checked again under the lock: two concurrent first calls apply once.
    if let Some(e) = l.effects.get_mut(key) {
        e.calls += 1;
        l.stats.replays += 1;
        return Some(answer(
            StatusCode::OK,
            format!("{action} {key}: already applied"),
        ));
    }
    if let Some(undone) = &call.compensates {
        l.tombstones.insert(undone.clone());
    }
    l.effects.insert(
        key.to_owned(),
        Effect {
            key: key.to_owned(),
            order_id: call.order_id,
            action: action.to_owned(),
            kind: call.kind,
            compensates: call.compensates,
            applied_at: Utc::now(),
            calls: 1,
            applied: 1,
            traceparent,
        },
    );
    l.stats.applied += 1;
    if hang_after_effect {
        l.stats.hangs += 1;
    }
    None
}

/// Whether a key applied at `applied_at` is forgotten after `window`.
pub(super) fn forgot(applied_at: DateTime<Utc>, window: Duration) -> bool {
    chrono::Duration::from_std(window).is_ok_and(|w| Utc::now() - applied_at >= w)
}

/// The status endpoint: whether the action under `key` took effect.
pub(super) async fn status(State(sim): State<Sim>, Path(key): Path<String>) -> Response {
    let l = sim.ledger();
    match l.effects.get(&key) {
        Some(e) => answer(
            StatusCode::OK,
            format!(
                "{} {key}: applied at {}",
                e.action,
                e.applied_at.to_rfc3339()
            ),
        ),
        None => answer(StatusCode::NOT_FOUND, format!("{key}: no such action")),
    }
}

pub(super) async fn ledger(State(sim): State<Sim>) -> Json<Vec<Effect>> {
    Json(sim.effects())
}

pub(super) async fn stats(State(sim): State<Sim>) -> Json<SimStats> {
    Json(sim.stats())
}

pub(super) async fn take_down(State(sim): State<Sim>, Path(action): Path<String>) -> StatusCode {
    sim.set_down(&action, true);
    StatusCode::NO_CONTENT
}

pub(super) async fn bring_back(State(sim): State<Sim>, Path(action): Path<String>) -> StatusCode {
    sim.set_down(&action, false);
    StatusCode::NO_CONTENT
}
