//! Settling requests: each request's reply (if any) and its completion go to one task
//! that settles them in batches, so a busy agent sends its replies and completes their
//! requests in one call per batch (one transaction on the SQL queue).

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use orderly_core::Clock;
use orderly_core::transport::{OutgoingMessage, QueueName, ReceivedMessage, Transport};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};

use crate::Agent;

/// A request to settle: send its reply (if any), then complete it.
pub(crate) struct Settle {
    reply: Option<(QueueName, OutgoingMessage)>,
    complete_by: DateTime<Utc>,
    request: ReceivedMessage,
    /// Whether the reply went out (false: its deadline came first), or why not settled.
    done: oneshot::Sender<Result<bool, String>>,
}

impl Agent {
    /// Hands a request to the settling task and waits for it to be settled; says
    /// whether the reply (if any) went out.
    pub(crate) async fn settle(
        &self,
        request: ReceivedMessage,
        complete_by: DateTime<Utc>,
        reply: Option<(QueueName, OutgoingMessage)>,
    ) -> Result<bool, String> {
        let (done, settled) = oneshot::channel();
        let item = Settle {
            reply,
            complete_by,
            request,
            done,
        };
        if self.settler.send(item).is_err() {
            return Err("the settling task has stopped".into());
        }
        settled
            .await
            .unwrap_or_else(|_| Err("the settling task has stopped".into()))
    }
}

/// Most requests settled together.
const SETTLE_BATCH: usize = 256;

/// Settles requests in batches: the replies of a batch go out in one send per reply
/// queue, then the requests are completed in one call. What waits while a batch is
/// being written forms the next batch, so the batch grows with the load and a lone
/// request is settled at once. A reply whose deadline has come meanwhile is not sent.
pub(crate) async fn settle_batches(
    transport: Arc<dyn Transport>,
    clock: Arc<dyn Clock>,
    margin: Duration,
    mut settles: mpsc::UnboundedReceiver<Settle>,
) {
    let margin = chrono::Duration::from_std(margin).unwrap_or_default();
    while let Some(first) = settles.recv().await {
        let mut batch = vec![first];
        while batch.len() < SETTLE_BATCH {
            match settles.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        debug!(batch = batch.len(), "settling requests");
        let now = clock.now();
        let mut sends = Vec::new();
        let mut requests = Vec::with_capacity(batch.len());
        let mut waiting = Vec::with_capacity(batch.len());
        for s in batch {
            // The deadline is checked here, as close to the send as it can be.
            let sent = match s.reply {
                Some(_) if now + margin >= s.complete_by => {
                    debug!(message_id = %s.request.message_id, "deadline came before the reply could go: not sent");
                    false
                }
                Some((queue, message)) => {
                    sends.push(orderly_core::transport::Envelope { queue, message });
                    true
                }
                None => false,
            };
            requests.push(s.request);
            waiting.push((s.done, sent));
        }
        // On the SQL queue the replies and the completions commit together.
        match transport.send_and_complete(&sends, &requests).await {
            Ok(_) => {
                // A lost lock after the reply went out is harmless: the request comes
                // back and is answered again under the same idempotency key and id.
                for (done, sent) in waiting {
                    let _ = done.send(Ok(sent));
                }
            }
            Err(e) => {
                warn!(error = %e, batch = requests.len(), "could not settle requests; they will come back");
                for request in &requests {
                    let _ = transport.abandon(request).await;
                }
                for (done, _) in waiting {
                    let _ = done.send(Err(e.to_string()));
                }
            }
        }
    }
}
