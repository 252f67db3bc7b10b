//! A simulator of the three demo remote services (inventory, payment, shipping) over
//! HTTP, with configurable latency and fault injection, that honours the
//! `Idempotency-Key` contract and keeps a ledger of every effect it applied, so a test
//! can prove that no step took effect twice.
//!
//! Contract, as a real idempotent service would keep it:
//! - `POST /actions/{action}` with an `Idempotency-Key` header and a JSON body
//!   (order id, step, action, kind, details, and for a compensation the key it undoes);
//! - the first success for a key applies the effect; a repeat of the key answers the
//!   same without applying it again;
//! - a compensation tombstones the key it undoes: that action, arriving later, is
//!   refused permanently (409) and applies nothing;
//! - faults apply nothing: a transient failure answers 503 or 429, a permanent one 422
//!   (decided per key, so every retry of a key sees the same), a hang holds the request.
//!
//! `GET /status/{key}` is the services' status endpoint: 200 with the answer when the
//! action under that key took effect (a service keeps that record even after it has
//! forgotten the key for idempotency), 404 when it did not. Two faults stress what
//! idempotency alone cannot cover: `lose_reply_actions` apply their first call, then
//! hang and fail (the reply is lost after the effect), and `forget_keys_after` makes the
//! service forget an idempotency key after a window, so a repeat applies again.
//!
//! `GET /ledger` returns the applied effects; `GET /healthz` answers 200;
//! `PUT /faults/repair` fixes the cause of the permanent refusals (nothing is refused
//! for good from then on: what an operator does before retrying orders in Error);
//! `PUT`/`DELETE /faults/down/{action}` take one action's service down and back.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use chrono::{DateTime, Utc};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

mod config;
mod ledger;
mod routes;

pub use config::*;
pub use ledger::*;
use routes::*;

/// One applied effect.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Effect {
    /// The idempotency key.
    pub key: String,
    /// The order.
    pub order_id: String,
    /// The action applied.
    pub action: String,
    /// `do` or `compensate`.
    pub kind: String,
    /// For a compensation: the key it undid.
    pub compensates: Option<String>,
    /// When it was applied.
    pub applied_at: DateTime<Utc>,
    /// Calls that carried this key (the applying one and every repeat).
    pub calls: u32,
    /// Times the effect was applied under this key: more than 1 only when a repeat came
    /// after the service forgot the key (each one an effect applied twice).
    #[serde(default = "once")]
    pub applied: u32,
    /// The W3C `traceparent` the applying call carried, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

fn once() -> u32 {
    1
}

/// What the simulator counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimStats {
    /// Calls received.
    pub calls: u64,
    /// Effects applied.
    pub applied: u64,
    /// Repeats answered without applying.
    pub replays: u64,
    /// Transient failures injected.
    pub transient: u64,
    /// Permanent failures answered.
    pub permanent: u64,
    /// Hangs injected.
    pub hangs: u64,
    /// Calls refused because their action was down (an outage).
    #[serde(default)]
    pub outage_refusals: u64,
    /// Connections accepted: a client that keeps its connections for reuse opens
    /// about as many as it had calls in flight at once, not one per call.
    #[serde(default)]
    pub connections: u64,
}

#[derive(Debug, Default)]
struct Ledger {
    effects: HashMap<String, Effect>,
    /// Keys undone by a compensation.
    tombstones: HashSet<String>,
    stats: SimStats,
}

/// The simulator's state, shared by its handlers and readable in-process.
#[derive(Debug, Clone)]
pub struct Sim {
    cfg: Arc<SimConfig>,
    ledger: Arc<Mutex<Ledger>>,
    dice: Arc<Mutex<StdRng>>,
    /// Set once the cause of the permanent refusals is fixed (an operator's repair).
    repaired: Arc<std::sync::atomic::AtomicBool>,
    /// Actions that are down now (an outage): every call answers 503, nothing applied.
    down: Arc<Mutex<HashSet<String>>>,
    /// Connections accepted by [`Sim::serve`].
    connections: Arc<std::sync::atomic::AtomicU64>,
}

#[derive(Debug, Deserialize)]
struct Call {
    order_id: String,
    action: String,
    kind: String,
    #[serde(default)]
    compensates: Option<String>,
}

impl Sim {
    /// A simulator with `cfg`.
    pub fn new(cfg: SimConfig) -> Self {
        Self {
            dice: Arc::new(Mutex::new(StdRng::seed_from_u64(cfg.seed))),
            cfg: Arc::new(cfg),
            ledger: Arc::default(),
            repaired: Arc::default(),
            down: Arc::default(),
            connections: Arc::default(),
        }
    }

    /// Takes `action` down (every call answers 503 and applies nothing) or brings it
    /// back.
    pub fn set_down(&self, action: &str, down: bool) {
        let mut set = self
            .down
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if down {
            set.insert(action.to_owned());
        } else {
            set.remove(action);
        }
        tracing::info!(action, down, "simulated outage");
    }

    fn is_down(&self, action: &str) -> bool {
        self.down
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .contains(action)
    }

    /// The cause of the permanent refusals is fixed: from now on nothing is refused
    /// permanently (what an operator does before retrying orders in Error).
    pub fn repair(&self) {
        self.repaired
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Every applied effect, ordered by time.
    pub fn effects(&self) -> Vec<Effect> {
        let mut effects: Vec<Effect> = self.ledger().effects.values().cloned().collect();
        effects.sort_by(|a, b| a.applied_at.cmp(&b.applied_at).then(a.key.cmp(&b.key)));
        effects
    }

    /// The counters.
    pub fn stats(&self) -> SimStats {
        SimStats {
            connections: self.connections.load(std::sync::atomic::Ordering::Relaxed),
            ..self.ledger().stats
        }
    }

    /// The HTTP routes.
    pub fn router(&self) -> axum::Router {
        axum::Router::new()
            .route("/actions/{action}", post(act))
            .route("/status/{key}", get(status))
            .route("/ledger", get(ledger))
            .route("/stats", get(stats))
            .route("/healthz", get(|| async { "ok" }))
            .route(
                "/faults/repair",
                axum::routing::put(|State(sim): State<Sim>| async move {
                    sim.repair();
                    StatusCode::NO_CONTENT
                }),
            )
            .route(
                "/faults/down/{action}",
                axum::routing::put(take_down).delete(bring_back),
            )
            .with_state(self.clone())
    }

    /// Serves on `listener` until `shutdown`, bounded as every orderly listener is,
    /// with connection caps that a bench's agents stay within
    /// (`orderly_runtime::http::Limits::test_service`).
    pub async fn serve(self, listener: tokio::net::TcpListener, shutdown: CancellationToken) {
        self.serve_within(
            listener,
            orderly_runtime::http::Limits::test_service(),
            shutdown,
        )
        .await;
    }

    /// [`Self::serve`] within `limits`.
    pub async fn serve_within(
        self,
        listener: tokio::net::TcpListener,
        limits: orderly_runtime::http::Limits,
        shutdown: CancellationToken,
    ) {
        for o in &self.cfg.outages {
            let (sim, o, shutdown) = (self.clone(), o.clone(), shutdown.clone());
            tokio::spawn(async move {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(o.after) => {}
                }
                sim.set_down(&o.action, true);
                tokio::select! {
                    () = shutdown.cancelled() => {}
                    () = tokio::time::sleep(o.lasting) => {}
                }
                sim.set_down(&o.action, false);
            });
        }
        let connections = self.connections.clone();
        orderly_runtime::http::serve_counting(
            listener,
            self.router(),
            limits,
            "remote-sim",
            shutdown,
            move || {
                connections.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            },
        )
        .await;
    }

    fn roll(&self) -> f64 {
        self.dice
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .random::<f64>()
    }

    /// Whether `key` fails permanently: a stable function of the key and the seed.
    fn declines(&self, action: &str, key: &str) -> bool {
        if self.repaired.load(std::sync::atomic::Ordering::Relaxed) {
            return false;
        }
        if self.cfg.permanent_actions.iter().any(|a| a == action) {
            return true;
        }
        if self.cfg.permanent_rate <= 0.0 {
            return false;
        }
        let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ self.cfg.seed;
        for b in key.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        (h % 1_000_000) as f64 / 1_000_000.0 < self.cfg.permanent_rate
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// One call over HTTP/1.0; the status code.
    async fn call(addr: std::net::SocketAddr, action: &str, key: &str) -> u16 {
        let body = format!(r#"{{"order_id":"o-1","action":"{action}","kind":"do"}}"#);
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!(
            "POST /actions/{action} HTTP/1.0\r\nIdempotency-Key: {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).await.unwrap();
        answer
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap()
    }

    /// The oracle of every invariant test: a key it declines stays declined, whatever
    /// fault fires on a later call of it (a hang after the effect never applies it).
    #[tokio::test]
    async fn a_declined_key_stays_declined_whatever_fault_fires() {
        let sim = Sim::new(SimConfig {
            permanent_rate: 1.0,
            hang_rate: 0.6,
            hang_for: Duration::from_millis(1),
            transient_rate: 0.2,
            ..SimConfig::default()
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        tokio::spawn(sim.clone().serve(listener, stop.clone()));
        let mut declined = 0;
        for _ in 0..60 {
            match call(addr, "reserve-inventory", "k-1").await {
                422 => declined += 1,
                503 | 429 => {}
                other => panic!("a declined key answered {other}"),
            }
        }
        assert!(declined > 0, "some calls got to the decline");
        assert!(
            sim.effects().is_empty(),
            "nothing applied: {:?}",
            sim.effects()
        );
        stop.cancel();
    }
}
