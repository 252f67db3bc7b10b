//! The simulator's settings: latency, fault rates, outages and the idempotency
//! window, from the command line or a test.

use serde::{Deserialize, Serialize};
use std::time::Duration;

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
