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
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use chrono::{DateTime, Utc};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

/// Latency and faults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimConfig {
    /// Time before each answer.
    pub latency: Duration,
    /// Share of calls failing transiently (0.0 to 1.0).
    pub transient_rate: f64,
    /// Share of idempotency keys failing permanently (0.0 to 1.0; per key).
    pub permanent_rate: f64,
    /// Share of calls that hang for `hang_for` and then fail: half of them before
    /// taking effect, half after (the caller cannot tell which: only the idempotency
    /// key keeps a retry from applying the effect again).
    pub hang_rate: f64,
    /// How long a hanging call hangs.
    pub hang_for: Duration,
    /// Actions that always fail permanently (e.g. `ship`).
    pub permanent_actions: Vec<String>,
    /// Actions that always hang for `hang_for`, without taking effect, then fail (a
    /// service that is down in the way that ends in timeouts).
    pub hang_actions: Vec<String>,
    /// Actions whose first call of a key takes effect, then hangs for `hang_for` and
    /// fails: the caller never learns that it was applied.
    #[serde(default)]
    pub lose_reply_actions: Vec<String>,
    /// Forget an idempotency key this long after it was applied: a repeat after that
    /// applies the effect again (as services that keep keys only for a window do).
    /// `None`: keys are kept for good.
    #[serde(default)]
    pub forget_keys_after: Option<Duration>,
    /// Outages planned from the start: each action answers every call with 503 (and
    /// applies nothing) from `after` for `lasting`.
    #[serde(default)]
    pub outages: Vec<Outage>,
    /// Seed of the fault dice.
    pub seed: u64,
}

/// A planned outage of one action (a service that is down, then back).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outage {
    /// The action that is down.
    pub action: String,
    /// When it goes down, after the simulator starts serving.
    pub after: Duration,
    /// How long it stays down.
    pub lasting: Duration,
}

impl std::str::FromStr for Outage {
    type Err = String;
    /// `ACTION@START+DURATION` in milliseconds or with a unit (`ms`, `s`, `m`), e.g.
    /// `charge-payment@30s+30s`.
    fn from_str(raw: &str) -> Result<Self, String> {
        let (action, times) = raw.split_once('@').ok_or_else(|| {
            format!("{raw:?}: expected ACTION@START+DURATION, e.g. charge-payment@30s+30s")
        })?;
        let (after, lasting) = times.split_once('+').ok_or_else(|| {
            format!("{raw:?}: expected ACTION@START+DURATION, e.g. charge-payment@30s+30s")
        })?;
        if action.trim().is_empty() {
            return Err(format!("{raw:?}: the action is empty"));
        }
        Ok(Outage {
            action: action.trim().to_owned(),
            after: span(after)?,
            lasting: span(lasting)?,
        })
    }
}

/// `30s`, `1500ms`, `2m` or a bare number of milliseconds.
fn span(raw: &str) -> Result<Duration, String> {
    let raw = raw.trim();
    let (number, scale) = if let Some(n) = raw.strip_suffix("ms") {
        (n, 1)
    } else if let Some(n) = raw.strip_suffix('s') {
        (n, 1_000)
    } else if let Some(n) = raw.strip_suffix('m') {
        (n, 60_000)
    } else {
        (raw, 1)
    };
    number
        .parse::<u64>()
        .map(|n| Duration::from_millis(n.saturating_mul(scale)))
        .map_err(|_| format!("{raw:?}: expected a whole number of ms, s or m"))
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            latency: Duration::ZERO,
            transient_rate: 0.0,
            permanent_rate: 0.0,
            hang_rate: 0.0,
            hang_for: Duration::from_secs(30),
            permanent_actions: Vec::new(),
            hang_actions: Vec::new(),
            lose_reply_actions: Vec::new(),
            forget_keys_after: None,
            outages: Vec::new(),
            seed: 1,
        }
    }
}

impl SimConfig {
    /// Refuses rates outside 0..=1; the error names the setting.
    pub fn validate(&self) -> Result<(), String> {
        for (name, rate) in [
            ("transient_rate", self.transient_rate),
            ("permanent_rate", self.permanent_rate),
            ("hang_rate", self.hang_rate),
        ] {
            if !(0.0..=1.0).contains(&rate) {
                return Err(format!("{name} must be between 0 and 1, got {rate}"));
            }
        }
        if self.transient_rate + self.hang_rate > 1.0 {
            return Err("transient_rate + hang_rate must not exceed 1".into());
        }
        Ok(())
    }
}

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

    /// Serves on `listener` until `shutdown`.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: CancellationToken,
    ) -> std::io::Result<()> {
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
        let listener = axum::serve::ListenerExt::tap_io(listener, move |_| {
            connections.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        });
        axum::serve(listener, self.router())
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await
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

fn answer(status: StatusCode, text: impl Into<String>) -> Response {
    (status, text.into()).into_response()
}

async fn act(
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
fn apply(
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
fn forgot(applied_at: DateTime<Utc>, window: Duration) -> bool {
    chrono::Duration::from_std(window).is_ok_and(|w| Utc::now() - applied_at >= w)
}

/// The status endpoint: whether the action under `key` took effect.
async fn status(State(sim): State<Sim>, Path(key): Path<String>) -> Response {
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

async fn ledger(State(sim): State<Sim>) -> Json<Vec<Effect>> {
    Json(sim.effects())
}

async fn stats(State(sim): State<Sim>) -> Json<SimStats> {
    Json(sim.stats())
}

async fn take_down(State(sim): State<Sim>, Path(action): Path<String>) -> StatusCode {
    sim.set_down(&action, true);
    StatusCode::NO_CONTENT
}

async fn bring_back(State(sim): State<Sim>, Path(action): Path<String>) -> StatusCode {
    sim.set_down(&action, false);
    StatusCode::NO_CONTENT
}

/// How many times each effect's key was undone (by compensations naming it).
pub fn undone_keys(effects: &[Effect]) -> HashMap<&str, usize> {
    let mut undone: HashMap<&str, usize> = HashMap::new();
    for e in effects {
        if let Some(key) = &e.compensates {
            *undone.entry(key.as_str()).or_default() += 1;
        }
    }
    undone
}

/// The `do` effects of `action` for `order` that are in effect: applied and not undone.
pub fn in_force<'a>(effects: &'a [Effect], order: &str, action: &str) -> Vec<&'a Effect> {
    let undone = undone_keys(effects);
    effects
        .iter()
        .filter(|e| e.order_id == order && e.action == action && e.kind == "do")
        .filter(|e| !undone.contains_key(e.key.as_str()))
        .collect()
}

/// Effects that break "no step takes visible effect twice": an action of an order in
/// effect under more than one key (an effect that a compensation undid no longer
/// counts, so a fresh run after an undo is not a double), or one effect undone more
/// than once. Empty when all is well.
pub fn double_effects(effects: &[Effect]) -> Vec<(String, String, usize)> {
    let undone = undone_keys(effects);
    let mut seen: HashMap<(&str, &str), usize> = HashMap::new();
    for e in effects {
        if e.kind == "do" && !undone.contains_key(e.key.as_str()) {
            *seen.entry((&e.order_id, &e.action)).or_default() += e.applied as usize;
        }
    }
    for e in effects {
        if let Some(key) = &e.compensates
            && undone.get(key.as_str()).copied().unwrap_or(0) > 1
        {
            seen.insert((&e.order_id, &e.action), undone[key.as_str()]);
        }
    }
    let mut doubles: Vec<_> = seen
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|((o, a), n)| (o.to_owned(), a.to_owned(), n))
        .collect();
    doubles.sort();
    doubles
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
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
