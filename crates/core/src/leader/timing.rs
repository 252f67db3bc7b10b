//! The elector's timings, and the rules that refuse timings under which a leader
//! could outlive its lease.

use std::time::Duration;

use crate::error::Result;
use crate::validation::ValidationError;

/// The elector's timing. Defaults: lease 30 s, renew every 5 s (2 s after a failure),
/// renew deadline 20 s, acquire retry 2 s plus up to 20 % jitter, 3 s per call, a
/// leader task that has not stopped 3 s after its cancellation ends the process, and
/// a heartbeat older than 15 s means the leader task is wedged.
#[derive(Debug, Clone, PartialEq)]
pub struct ElectorTiming {
    /// How long a lease lasts from its acquire or last renewal.
    pub lease: Duration,
    /// Time between renewals.
    pub renew_interval: Duration,
    /// Time before the next try after a failed renewal.
    pub renew_retry: Duration,
    /// Leader work stops this long after the send time of the last successful renewal.
    pub renew_deadline: Duration,
    /// Followers try to acquire this often...
    pub retry: Duration,
    /// ...plus up to this fraction of it, at random.
    pub retry_jitter: f64,
    /// Each lease call is abandoned after this long.
    pub call_timeout: Duration,
    /// A cancelled leader task that has not ended this long after is stuck.
    pub stop_grace: Duration,
    /// A leader task whose heartbeat is older than this is wedged: the lease is not
    /// renewed for it.
    pub heartbeat_timeout: Duration,
}

impl Default for ElectorTiming {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(30),
            renew_interval: Duration::from_secs(5),
            renew_retry: Duration::from_secs(2),
            renew_deadline: Duration::from_secs(20),
            retry: Duration::from_secs(2),
            retry_jitter: 0.2,
            call_timeout: Duration::from_secs(3),
            stop_grace: Duration::from_secs(3),
            heartbeat_timeout: Duration::from_secs(15),
        }
    }
}

impl ElectorTiming {
    /// Refuses timings under which a leader could act after its lease expired, or that
    /// make no sense; the error names the setting (`lease`, `renew_deadline`, ...).
    pub fn validate(&self) -> Result<(), ValidationError> {
        let positive = [
            ("lease", self.lease),
            ("renew_interval", self.renew_interval),
            ("renew_retry", self.renew_retry),
            ("renew_deadline", self.renew_deadline),
            ("retry", self.retry),
            ("call_timeout", self.call_timeout),
            ("heartbeat_timeout", self.heartbeat_timeout),
        ];
        for (name, d) in positive {
            if d.is_zero() {
                return Err(ValidationError::new(name, "must be more than 0"));
            }
        }
        if self.renew_deadline >= self.lease {
            return Err(ValidationError::new(
                "renew_deadline",
                format!(
                    "must be shorter than the lease ({} ms): a leader must stop before its lease can expire",
                    self.lease.as_millis()
                ),
            ));
        }
        if self.renew_deadline + self.stop_grace > self.lease {
            return Err(ValidationError::new(
                "stop_grace",
                format!(
                    "renew_deadline + stop_grace must not exceed the lease ({} ms): a stuck leader must be gone before its lease can expire",
                    self.lease.as_millis()
                ),
            ));
        }
        if self.renew_interval >= self.renew_deadline {
            return Err(ValidationError::new(
                "renew_interval",
                "must be shorter than renew_deadline, or one slow renewal ends the term",
            ));
        }
        if self.renew_retry > self.renew_interval {
            return Err(ValidationError::new(
                "renew_retry",
                "must not exceed renew_interval",
            ));
        }
        if self.call_timeout >= self.renew_deadline {
            return Err(ValidationError::new(
                "call_timeout",
                "must be shorter than renew_deadline",
            ));
        }
        if !(0.0..=1.0).contains(&self.retry_jitter) {
            return Err(ValidationError::new(
                "retry_jitter",
                "must be between 0 and 1",
            ));
        }
        Ok(())
    }

    /// The blob service's rule on top: a lease of 15 to 60 whole seconds.
    pub fn validate_for_blob(&self) -> Result<(), ValidationError> {
        self.validate()?;
        let ms = self.lease.as_millis();
        if !(15_000..=60_000).contains(&ms) || !ms.is_multiple_of(1000) {
            return Err(ValidationError::new(
                "lease",
                format!("a blob lease lasts 15 to 60 whole seconds, not {ms} ms"),
            ));
        }
        Ok(())
    }

    pub(super) fn retry_delay(&self) -> Duration {
        let jitter = self.retry_jitter * rand::random::<f64>();
        self.retry.mul_f64(1.0 + jitter)
    }
}
