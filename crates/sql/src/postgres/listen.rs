//! The queue listener: one connection LISTENing for the queue's notifications, which
//! wake the receivers they concern in this process; between connections, receivers
//! poll.

use std::time::Duration;

use super::conn::Pools;
use crate::wakeups::Wakeups;

/// How long the queue listener waits for a notification before it asks its
/// connection for an answer.
const LISTENER_SILENCE: Duration = Duration::from_secs(30);

/// Listens for queue sends on one connection and wakes the receivers they concern,
/// until the connection is lost (`Continue`: connect again) or the wake-ups are
/// dropped (`Break`).
pub(super) async fn listen(
    pools: &Pools,
    answer_timeout: Duration,
    wakeups: &std::sync::Weak<Wakeups>,
) -> std::ops::ControlFlow<()> {
    use std::ops::ControlFlow;
    let generation = pools.current();
    let mut listener = match sqlx::postgres::PgListener::connect_with(&generation.pool).await {
        Ok(listener) => listener,
        Err(e) => {
            tracing::warn!(error = %e, "cannot connect the queue listener; polling instead");
            return ControlFlow::Continue(());
        }
    };
    if let Err(e) = listener.listen(crate::wakeups::CHANNEL).await {
        tracing::warn!(error = %e, "cannot LISTEN for queue sends; polling instead");
        return ControlFlow::Continue(());
    }
    let _lent = Pools::lend(generation);
    // Heard from now on; what was sent before, every receiver looks for once.
    let Some(w) = wakeups.upgrade() else {
        return ControlFlow::Break(());
    };
    w.hearing_began();
    drop(w);
    loop {
        let heard = next_notice(&mut listener, answer_timeout).await;
        let Some(w) = wakeups.upgrade() else {
            return ControlFlow::Break(());
        };
        match heard {
            Ok(Some(n)) => w.heard(n.payload()),
            // The connection was lost and is back, listening again: what was sent in
            // between, every receiver looks for.
            Ok(None) => {
                tracing::warn!("queue listener lost its connection and reconnected");
                w.wake_all();
            }
            Err(e) => {
                tracing::warn!(error = %e, "queue listener lost its connection; polling until it is back");
                return ControlFlow::Continue(());
            }
        }
    }
}

/// The next notice on `listener`. `try_recv`, not `recv`: `recv` reconnects without a
/// word and what was sent meanwhile is never heard. After a silence of
/// [`LISTENER_SILENCE`] the connection is asked for an answer: one gone silent would
/// otherwise be listened on for ever, and nothing heard.
async fn next_notice(
    listener: &mut sqlx::postgres::PgListener,
    answer_timeout: Duration,
) -> Result<Option<sqlx::postgres::PgNotification>, sqlx::Error> {
    loop {
        let Ok(heard) = tokio::time::timeout(LISTENER_SILENCE, listener.try_recv()).await else {
            let asked = tokio::time::timeout(
                answer_timeout,
                sqlx::query("SELECT 1").execute(&mut *listener),
            )
            .await;
            match asked {
                Ok(Ok(_)) => continue,
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(sqlx::Error::Io(std::io::ErrorKind::TimedOut.into())),
            }
        };
        return heard;
    }
}
