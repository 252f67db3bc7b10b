//! A circuit breaker per remote service: after `failure_threshold` transient failures
//! in a row it opens and no call is made for `open_for`; then one probe is let
//! through, and its outcome closes or re-opens it.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// When a breaker opens and for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Transient failures in a row that open it.
    pub failure_threshold: u32,
    /// How long it stays open before a probe.
    pub open_for: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            failure_threshold: 5,
            open_for: Duration::from_secs(2),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed {
        failures: u32,
    },
    Open {
        until: Instant,
    },
    /// One probe is out; others wait for its outcome.
    HalfOpen,
}

/// One remote service's breaker.
#[derive(Debug)]
pub struct Breaker {
    cfg: BreakerConfig,
    state: Mutex<State>,
}

/// How long others wait while a half-open probe is out.
const PROBE_WAIT: Duration = Duration::from_millis(50);

impl Breaker {
    /// A closed breaker.
    pub fn new(cfg: BreakerConfig) -> Self {
        Self {
            cfg,
            state: Mutex::new(State::Closed { failures: 0 }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// `Ok` if a call may be made now; otherwise how long to wait before asking again.
    pub fn allow(&self) -> Result<(), Duration> {
        let mut state = self.state();
        match *state {
            State::Closed { .. } => Ok(()),
            State::Open { until } => {
                let now = Instant::now();
                if now >= until {
                    *state = State::HalfOpen;
                    Ok(())
                } else {
                    Err(until - now)
                }
            }
            State::HalfOpen => Err(PROBE_WAIT),
        }
    }

    /// The service answered (success or a permanent refusal): it is up.
    pub fn record_success(&self) {
        *self.state() = State::Closed { failures: 0 };
    }

    /// A transient failure (error, timeout, 5xx, 429). Returns whether it opened the
    /// breaker (the threshold was reached, or a probe failed).
    pub fn record_failure(&self) -> bool {
        let mut state = self.state();
        let mut opened = false;
        *state = match *state {
            State::Closed { failures } if failures + 1 < self.cfg.failure_threshold => {
                State::Closed {
                    failures: failures + 1,
                }
            }
            State::Open { until } => State::Open { until },
            _ => {
                opened = true;
                tracing::warn!(
                    open_for_ms = self.cfg.open_for.as_millis() as u64,
                    "circuit opened: the remote service keeps failing"
                );
                State::Open {
                    until: Instant::now() + self.cfg.open_for,
                }
            }
        };
        opened
    }

    /// How long calls are held back still (`None`: a call may be tried now), without
    /// letting a probe through: for a consumer deciding whether to take work at all.
    pub fn held_back_for(&self) -> Option<Duration> {
        match *self.state() {
            State::Closed { .. } => None,
            State::Open { until } => {
                let now = Instant::now();
                (now < until).then(|| until - now)
            }
            State::HalfOpen => Some(PROBE_WAIT),
        }
    }

    /// Whether calls are held back now.
    pub fn is_open(&self) -> bool {
        !matches!(*self.state(), State::Closed { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn opens_after_the_threshold_then_lets_one_probe_through_after_the_pause() {
        let b = Breaker::new(BreakerConfig {
            failure_threshold: 3,
            open_for: Duration::from_secs(2),
        });
        for _ in 0..2 {
            assert!(b.allow().is_ok());
            b.record_failure();
        }
        assert!(!b.is_open(), "two failures are below the threshold");
        assert!(b.record_failure(), "the third opens it");
        assert!(b.is_open());
        assert!(
            !b.record_failure(),
            "already open: a late failure changes nothing"
        );
        let wait = b.allow().unwrap_err();
        assert_eq!(wait, Duration::from_secs(2));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(b.allow().is_ok(), "the probe goes through");
        assert!(b.allow().is_err(), "only one probe at a time");
        b.record_failure();
        assert!(b.allow().is_err(), "a failed probe re-opens it");
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(b.allow().is_ok());
        b.record_success();
        assert!(!b.is_open());
        assert!(b.allow().is_ok());
    }
}
