//! Back-off for role loops whose store or queue is failing.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// Exponential back-off for a loop whose store or queue is failing: 100 ms doubling
/// to 10 s.
#[derive(Debug)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

impl Backoff {
    /// Starting at 100 ms.
    pub fn new() -> Self {
        Self {
            next: Duration::from_millis(100),
        }
    }

    /// Back to 100 ms after a success.
    pub fn reset(&mut self) {
        self.next = Duration::from_millis(100);
    }

    /// Sleeps the current back-off (or until `shutdown`); returns whether shutdown came.
    pub async fn sleep(&mut self, shutdown: &CancellationToken) -> bool {
        let wait = self.next;
        self.next = (self.next * 2).min(Duration::from_secs(10));
        tokio::select! {
            () = shutdown.cancelled() => true,
            () = tokio::time::sleep(wait) => false,
        }
    }
}
