//! What operators do with Service Bus queues, over AMQP like everything else: count a
//! queue's messages and dead letters by peeking (AMQP offers no count; the exact figures
//! are Azure Monitor metrics), and requeue or discard dead letters by receiving them
//! from the `$DeadLetterQueue` sub-queue, sending a copy back (for a requeue), and
//! completing them.

use std::collections::HashSet;

use azservicebus::{
    ServiceBusPeekedMessage, ServiceBusReceiveMode, ServiceBusReceiverOptions, SubQueue,
};
use orderly_core::transport::{OutgoingMessage, QueueDepth, QueueName, TransportError};

use super::connection::{Closing, Links};
use super::{ServiceBusTransport, bounded, classify, properties};

/// Most messages counted per queue (and per dead-letter sub-queue) by peeking.
pub const PEEK_COUNT_CAP: usize = 5_000;

/// Messages peeked per request.
const PEEK_PAGE: u32 = 250;

/// Most dead letters one requeue or discard goes through.
const SETTLE_CAP: usize = 10_000;

/// Most dead letters passed over to reach the one asked for.
const SKIP_CAP: u32 = 256;

/// How long a receive of dead letters waits for the next one before it counts them
/// all seen.
const RECEIVE_DEAD_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

impl ServiceBusTransport {
    /// Up to `max` messages of `queue` (or its dead-letter sub-queue) from sequence
    /// number `from`, peeked on a link of its own without prefetch: nothing is locked
    /// or taken from consumers.
    pub(super) async fn peek(
        &self,
        queue: &QueueName,
        sub_queue: SubQueue,
        max: u32,
        from: i64,
    ) -> Result<Vec<ServiceBusPeekedMessage>, TransportError> {
        Ok(self
            .peek_pages(queue, sub_queue, max as usize, from)
            .await?
            .0)
    }

    /// Peeks page after page from `from` until `cap` messages or the end; says whether
    /// it stopped at the cap.
    async fn peek_pages(
        &self,
        queue: &QueueName,
        sub_queue: SubQueue,
        cap: usize,
        from: i64,
    ) -> Result<(Vec<ServiceBusPeekedMessage>, bool), TransportError> {
        let conn = self.connection().await?;
        let limit = self.settings.try_timeout;
        let options = ServiceBusReceiverOptions {
            receive_mode: ServiceBusReceiveMode::PeekLock,
            prefetch_count: 0,
            sub_queue,
            ..Default::default()
        };
        let result = Box::pin(async {
            let receiver = self
                .attach_receiver(&conn, queue, "the attach of a peeker", None, options)
                .await?;
            let mut got: Vec<ServiceBusPeekedMessage> = Vec::new();
            let mut next = from;
            let peeked = loop {
                let want = PEEK_PAGE.min(u32::try_from(cap - got.len()).unwrap_or(PEEK_PAGE));
                let page = bounded(limit, queue, "a peek", async {
                    receiver.lock().await.peek_messages(want, Some(next)).await
                })
                .await
                .and_then(|r| r.map_err(|e| classify(e, queue, None)));
                let page = match page {
                    Ok(p) => p,
                    Err(e) => break Err(e),
                };
                let full = page.len() as u32 == want;
                if let Some(last) = page.last() {
                    next = last.sequence_number() + 1;
                }
                got.extend(page);
                if !full || got.len() >= cap {
                    let capped = got.len() >= cap;
                    break Ok((got, capped));
                }
            };
            Closing::close_now(receiver).await;
            peeked
        })
        .await;
        self.judge(&conn, queue, Links::Own, &result);
        result
    }

    /// Counts the messages of `queue` (or its dead-letter sub-queue) by peeking, up to
    /// [`PEEK_COUNT_CAP`]: nothing is locked or delivered. Returns the count and whether
    /// it stopped at the cap.
    pub async fn count_by_peeking(
        &self,
        queue: &QueueName,
        sub_queue: SubQueue,
    ) -> Result<(usize, bool), TransportError> {
        let (peeked, capped) = self.peek_pages(queue, sub_queue, PEEK_COUNT_CAP, 0).await?;
        Ok((peeked.len(), capped))
    }

    /// The depths of `queues`, counted by peeking (see [`Self::count_by_peeking`]):
    /// `ready` holds every message of the queue (locked and scheduled ones included:
    /// a peek cannot tell them apart), `dead_lettered` its dead-letter sub-queue.
    pub async fn depths_by_peeking(
        &self,
        queues: &[QueueName],
    ) -> Result<Vec<QueueDepth>, TransportError> {
        Box::pin(self.depths_now(queues)).await
    }

    async fn depths_now(&self, queues: &[QueueName]) -> Result<Vec<QueueDepth>, TransportError> {
        let mut out = Vec::with_capacity(queues.len());
        for q in queues {
            let (ready, _) = self.count_by_peeking(q, SubQueue::None).await?;
            let (dead, _) = self.count_by_peeking(q, SubQueue::DeadLetter).await?;
            out.push(QueueDepth {
                queue: q.clone(),
                ready: ready as i64,
                locked: 0,
                scheduled: 0,
                dead_lettered: dead as i64,
            });
        }
        Ok(out)
    }

    /// Goes through the dead letters of `queue` (all of them, or the one whose message
    /// id is `message_id`): for a requeue each is sent back to the queue first, under a
    /// new message id (`ID~requeued-SEQ`: the queue's duplicate detection would drop
    /// the old one), with its body and properties; then it is completed, which removes
    /// it from the dead letters. For one message, the dead letters before it in the
    /// sub-queue are received on the way and given back. Returns how many were handled
    /// (0: no such dead letter).
    pub async fn settle_dead_letters(
        &self,
        queue: &QueueName,
        message_id: Option<&str>,
        requeue: bool,
    ) -> Result<usize, TransportError> {
        // Its future is large (a link's attach, receives, sends): kept on the heap.
        Box::pin(self.settle_dead_letters_now(queue, message_id, requeue)).await
    }

    async fn settle_dead_letters_now(
        &self,
        queue: &QueueName,
        message_id: Option<&str>,
        requeue: bool,
    ) -> Result<usize, TransportError> {
        let limit = self.settings.try_timeout;
        // For one message: is it there, and not too far back?
        if let Some(id) = message_id {
            {
                let (peeked, _) = self
                    .peek_pages(queue, SubQueue::DeadLetter, SKIP_CAP as usize + 1, 0)
                    .await?;
                match peeked
                    .iter()
                    .position(|m| m.message_id().is_some_and(|m| m == id))
                {
                    None => return Ok(0),
                    Some(k) if k >= SKIP_CAP as usize => {
                        return Err(TransportError::Unsupported(format!(
                            "the dead letter {id} is behind more than {SKIP_CAP} others on {queue}: \
                             requeue or discard them all, or use Service Bus Explorer"
                        )));
                    }
                    Some(_) => {}
                }
            }
        }
        let conn = self.connection().await?;
        // A link of its own, without prefetch: each receive asks for one message, so
        // nothing is fetched (and locked) ahead of what is handled.
        let options = ServiceBusReceiverOptions {
            receive_mode: ServiceBusReceiveMode::PeekLock,
            prefetch_count: 0,
            sub_queue: SubQueue::DeadLetter,
            ..Default::default()
        };
        let attached = self
            .attach_receiver(
                &conn,
                queue,
                "the attach of a dead-letter receiver",
                None,
                options,
            )
            .await;
        let receiver = match attached {
            Ok(r) => r,
            Err(e) => {
                let failed = Err::<(), _>(e);
                self.judge(&conn, queue, Links::Own, &failed);
                return failed.map(|()| 0);
            }
        };
        let mut seen: HashSet<i64> = HashSet::new();
        // Dead letters before the one asked for: given back at the end (without
        // prefetch, nothing is delivered again on this link meanwhile).
        let mut passed: Vec<azservicebus::ServiceBusReceivedMessage> = Vec::new();
        let mut handled = 0usize;
        let outcome: Result<(), TransportError> = Box::pin(async {
            loop {
                let batch = bounded(limit + limit, queue, "a receive of dead letters", async {
                    receiver
                        .lock()
                        .await
                        .receive_messages_with_max_wait_time(1, RECEIVE_DEAD_WAIT)
                        .await
                })
                .await
                .and_then(|r| r.map_err(|e| classify(e, queue, None)))?;
                let fresh: Vec<_> = batch
                    .into_iter()
                    .filter(|m| seen.insert(m.sequence_number()))
                    .collect();
                if fresh.is_empty() {
                    return match message_id {
                        // Listed, but held by an earlier operation (its lock runs out
                        // after the queue's lock duration).
                        Some(id) => Err(TransportError::Unsupported(format!(
                            "the dead letter {id} on {queue} is held by an earlier operation \
                             until its lock runs out (the queue's lock duration): try again then"
                        ))),
                        None => Ok(()),
                    };
                }
                for m in fresh {
                    let id = m.message_id().map(|c| c.into_owned()).unwrap_or_default();
                    if message_id.is_some_and(|w| w != id) {
                        passed.push(m);
                        continue;
                    }
                    if requeue {
                        let mut props = properties(m.application_properties());
                        props.remove("DeadLetterReason");
                        props.remove("DeadLetterErrorDescription");
                        let mut copy = OutgoingMessage::new(
                            format!("{id}~requeued-{}", m.sequence_number()),
                            m.body().map(<[u8]>::to_vec).unwrap_or_default(),
                        );
                        copy.correlation_id = m.correlation_id().map(|c| c.into_owned());
                        copy.properties = props;
                        let copies = [copy];
                        Box::pin(orderly_core::transport::Transport::send(
                            self, queue, &copies,
                        ))
                        .await?;
                    }
                    bounded(limit, queue, "a completion of a dead letter", async {
                        receiver.lock().await.complete_message(&m).await
                    })
                    .await
                    .and_then(|r| r.map_err(|e| classify(e, queue, Some(&id))))?;
                    handled += 1;
                    // One id is one message (the queue's duplicate detection).
                    if handled >= SETTLE_CAP || message_id.is_some() {
                        return Ok(());
                    }
                }
            }
        })
        .await;
        for m in &passed {
            let given_back = bounded(limit, queue, "giving a dead letter back", async {
                receiver.lock().await.abandon_message(m, None).await
            })
            .await;
            if let Ok(Err(e)) | Err(e) = given_back.map(|r| r.map_err(|e| classify(e, queue, None)))
            {
                tracing::debug!(queue = %queue, error = %e, "a dead letter passed over is held until its lock runs out");
            }
        }
        Closing::close_now(receiver).await;
        self.judge(&conn, queue, Links::Own, &outcome);
        outcome.map(|()| handled)
    }
}
