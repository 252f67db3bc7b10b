//! A role's clock, kept on the state store's time: the deadlines a role compares
//! against (a reply in time, a request still worth calling) are set by the store on
//! the database server's clock, so a host whose clock is off by minutes would drop
//! every reply or call services past their deadline. The offset is measured at start
//! and every [`EVERY`], logged when it is over [`WARN_OVER`], and exported as
//! `orderly_clock_offset_seconds`.

use std::sync::Arc;
use std::time::Duration;

use orderly_core::store::OperatorStore;
use orderly_core::{Clock, OffsetClock, SystemClock};
use tokio_util::sync::CancellationToken;

/// How often the offset is measured again.
pub const EVERY: Duration = Duration::from_secs(30);

/// An offset above this is logged as a warning.
pub const WARN_OVER: Duration = Duration::from_secs(1);

/// One reading: how far the store's clock is ahead of this host's, from the midpoint
/// of the round trip.
pub async fn measure(
    host: &dyn Clock,
    store: &dyn OperatorStore,
) -> orderly_core::Result<chrono::Duration> {
    let sent = host.now();
    let theirs = store.store_now().await?;
    let back = host.now();
    Ok(theirs - (sent + (back - sent) / 2))
}

/// A clock on the store's time: measured once now (a failure leaves the host's clock,
/// logged), then again every [`EVERY`] until `shutdown`.
pub async fn on_store_time(
    store: Arc<dyn OperatorStore>,
    shutdown: &CancellationToken,
) -> Arc<OffsetClock> {
    on_store_time_from(Arc::new(SystemClock), store, shutdown).await
}

/// [`on_store_time`] from the host clock `host`.
pub async fn on_store_time_from(
    host: Arc<dyn Clock>,
    store: Arc<dyn OperatorStore>,
    shutdown: &CancellationToken,
) -> Arc<OffsetClock> {
    let clock = Arc::new(OffsetClock::on(host));
    let mut last_warned = None;
    update(&clock, store.as_ref(), &mut last_warned).await;
    let (kept, stop) = (clock.clone(), shutdown.clone());
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(EVERY) => update(&kept, store.as_ref(), &mut last_warned).await,
            }
        }
    });
    clock
}

async fn update(clock: &OffsetClock, store: &dyn OperatorStore, warned: &mut Option<i64>) {
    match measure(clock.base(), store).await {
        Ok(offset) => {
            clock.set_offset(offset);
            let ms = offset.num_milliseconds();
            metrics::gauge!("orderly_clock_offset_seconds").set(ms as f64 / 1000.0);
            let over = ms.unsigned_abs() > WARN_OVER.as_millis() as u64;
            // Said once, and again when it moves by more than the threshold.
            let moved =
                warned.is_none_or(|w: i64| (w - ms).unsigned_abs() > WARN_OVER.as_millis() as u64);
            if over && moved {
                tracing::warn!(
                    offset_ms = ms,
                    "this host's clock is {} ms {} the state store's: deadlines are read on the store's time",
                    ms.unsigned_abs(),
                    if ms > 0 { "behind" } else { "ahead of" }
                );
                *warned = Some(ms);
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the state store's time; keeping the last offset")
        }
    }
}
