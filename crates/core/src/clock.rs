//! Time. Wall-clock reads go through [`Clock`] so tests can control them; deadlines
//! shared between hosts are computed on the database's clock ([`TimeSource::Database`])
//! unless a test injects its own ([`TimeSource::Clock`]).

use std::fmt;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Duration, DurationRound, Utc};

/// A source of the current time.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current time.
    fn now(&self) -> DateTime<Utc>;
}

/// The host's real clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// The host's clock corrected by an offset to a reference clock: a role reads the
/// deadlines the state store set (on the database server's clock) against the store's
/// time, so a host clock that is off by minutes neither drops replies in time nor
/// calls services past their deadline. The offset is measured and updated by its
/// owner ([`OffsetClock::set_offset`]); zero until then.
#[derive(Debug)]
pub struct OffsetClock {
    base: Arc<dyn Clock>,
    offset_ms: std::sync::atomic::AtomicI64,
}

impl Default for OffsetClock {
    fn default() -> Self {
        Self::on(Arc::new(SystemClock))
    }
}

impl OffsetClock {
    /// `base` (the host's clock) corrected by an offset, zero until set.
    pub fn on(base: Arc<dyn Clock>) -> Self {
        Self {
            base,
            offset_ms: std::sync::atomic::AtomicI64::new(0),
        }
    }

    /// The uncorrected clock, for measuring the offset against.
    pub fn base(&self) -> &dyn Clock {
        self.base.as_ref()
    }

    /// The reference clock is `offset` ahead of this host's (negative: behind).
    pub fn set_offset(&self, offset: Duration) {
        self.offset_ms.store(
            offset.num_milliseconds(),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// How far the reference clock is ahead of this host's.
    pub fn offset(&self) -> Duration {
        Duration::milliseconds(self.offset_ms.load(std::sync::atomic::Ordering::Relaxed))
    }
}

impl Clock for OffsetClock {
    fn now(&self) -> DateTime<Utc> {
        self.base.now() + self.offset()
    }
}

type Observer = Box<dyn Fn(DateTime<Utc>) + Send + Sync>;

/// A clock that only moves when told to. Cloning shares the same time.
#[derive(Clone)]
pub struct ManualClock {
    now: Arc<Mutex<DateTime<Utc>>>,
    observers: Arc<Mutex<Vec<Observer>>>,
}

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManualClock")
            .field("now", &self.now())
            .finish_non_exhaustive()
    }
}

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: DateTime<Utc>) -> Self {
        Self {
            now: Arc::new(Mutex::new(start)),
            observers: Arc::default(),
        }
    }

    /// A clock standing at the current real time (rounded to whole seconds).
    pub fn starting_now() -> Self {
        let now = Utc::now();
        Self::new(now.duration_trunc(Duration::seconds(1)).unwrap_or(now))
    }

    /// Calls `observer` with the time now and on every change, e.g. to move the clock
    /// of an external test double along with this one.
    pub fn on_change(&self, observer: impl Fn(DateTime<Utc>) + Send + Sync + 'static) {
        observer(self.now());
        self.observers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(Box::new(observer));
    }

    fn changed(&self) {
        let now = self.now();
        let observers = self
            .observers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        observers.iter().for_each(|observe| observe(now));
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: std::time::Duration) {
        let by = Duration::from_std(by).unwrap_or(Duration::MAX);
        *self
            .now
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) += by;
        self.changed();
    }

    /// Sets the clock to `t`.
    pub fn set(&self, t: DateTime<Utc>) {
        *self
            .now
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = t;
        self.changed();
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self
            .now
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Which clock a state store compares deadlines on.
#[derive(Debug, Clone, Default)]
pub enum TimeSource {
    /// The database server's clock (PostgreSQL `now()`, the transaction's start); for SQLite, whose
    /// file only one host can safely share, the host's clock. One clock for every host
    /// of a deployment, so clock skew between workers cannot move a deadline.
    #[default]
    Database,
    /// An injected clock (tests).
    Clock(Arc<dyn Clock>),
}

impl TimeSource {
    /// The injected time, if any, rounded down to the microsecond the stores keep.
    pub fn injected_now(&self) -> Option<DateTime<Utc>> {
        match self {
            TimeSource::Database => None,
            TimeSource::Clock(clock) => Some(truncate_micros(clock.now())),
        }
    }

    /// The injected time or, without one, the host's clock.
    pub fn now_or_host(&self) -> DateTime<Utc> {
        self.injected_now()
            .unwrap_or_else(|| truncate_micros(Utc::now()))
    }
}

/// `t` rounded down to whole microseconds (what both SQL dialects store).
pub fn truncate_micros(t: DateTime<Utc>) -> DateTime<Utc> {
    t.duration_trunc(Duration::microseconds(1)).unwrap_or(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told_and_clones_share_it() {
        let c = ManualClock::starting_now();
        let shared = c.clone();
        let t0 = c.now();
        assert_eq!(c.now(), t0);
        shared.advance(std::time::Duration::from_secs(90));
        assert_eq!(c.now() - t0, Duration::seconds(90));
    }

    #[test]
    fn injected_time_is_kept_at_microsecond_precision() {
        let t = DateTime::parse_from_rfc3339("2026-01-01T00:00:00.123456789Z")
            .unwrap()
            .to_utc();
        let src = TimeSource::Clock(Arc::new(ManualClock::new(t)));
        assert_eq!(
            src.injected_now().unwrap().timestamp_subsec_nanos(),
            123_456_000
        );
        assert!(TimeSource::Database.injected_now().is_none());
    }
}
