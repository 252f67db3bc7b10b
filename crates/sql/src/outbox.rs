//! The transactional outbox of the SQL store: used when messages go to an external
//! transport (Azure Service Bus). State changes write their messages here, in their own
//! transaction; [`Outbox::relay_once`](orderly_core::transport::Outbox) publishes them.
//! A relay leases a batch, so several relays share the work and one that dies only
//! delays its batch until the lease runs out.

use std::time::Duration;

/// How long a relay holds a leased batch before another may take it over.
pub(crate) const LEASE: Duration = Duration::from_secs(30);
/// Wait before retrying messages the target refused.
pub(crate) const RETRY_AFTER: Duration = Duration::from_secs(5);

pub(crate) const O_INSERT: &str = "INSERT INTO outbox \
    (queue, message_id, correlation_id, properties, body, scheduled_at, created_at) \
    VALUES ($1, $2, $3, $4, $5, $6, $7)";

pub(crate) const O_BACKLOG: &str = "SELECT count(*) FROM outbox WHERE sent_at IS NULL";

/// Implements the outbox for one dialect's store (see `queue_ops!` for the hooks).
macro_rules! outbox_ops {
    ($Store:ident, $DB:ident) => {
        mod outbox_impl {
            use ::async_trait::async_trait;
            use ::orderly_core::transport::{
                Envelope, OutgoingMessage, Outbox, QueueName, RelayOutcome, Transport, TransportError,
            };
            use ::orderly_core::InstanceId;

            use super::{$DB, $Store};
            use super::sql;
            use $crate::outbox as o;
            use $crate::rows::Cols;
            use $crate::time::Ts;

            type Result<T> = std::result::Result<T, TransportError>;

            fn db(e: ::sqlx::Error) -> TransportError {
                TransportError::Unavailable(format!("the outbox (in the state store's database) is unavailable: {e}").into())
            }

            fn after(now: ::chrono::DateTime<::chrono::Utc>, d: ::std::time::Duration) -> Ts {
                Ts(now + ::chrono::Duration::from_std(d).unwrap_or(::chrono::Duration::MAX))
            }

            impl $Store {
                /// Writes the messages a state change causes to the outbox, inside its
                /// transaction.
                pub(super) async fn write_outbox(
                    &self,
                    conn: &mut <$DB as ::sqlx::Database>::Connection,
                    now: ::chrono::DateTime<::chrono::Utc>,
                    sends: &[Envelope],
                ) -> Result<()> {
                    for Envelope { queue, message } in sends {
                        message.validate()?;
                        let properties = ::serde_json::to_string(&message.properties)
                            .map_err(|e| TransportError::Unavailable(Box::new(e)))?;
                        ::sqlx::query(o::O_INSERT)
                            .bind(queue.as_str())
                            .bind(&message.message_id)
                            .bind(message.correlation_id.as_deref())
                            .bind(properties)
                            .bind(&message.body)
                            .bind(message.scheduled_enqueue_time.map(|t| Ts(::orderly_core::clock::truncate_micros(t))))
                            .bind(Ts(now))
                            .execute(&mut *conn)
                            .await
                            .map_err(db)?;
                    }
                    Ok(())
                }

                async fn mark_sent(&self, relay: &InstanceId, seqs: &[i64]) -> Result<()> {
                    let mut tx = self.begin_write().await?;
                    let now = self.tx_now(&mut tx).await?;
                    ::sqlx::query(sql::O_SENT)
                        .bind(Self::seqs_param(seqs))
                        .bind(relay.as_str())
                        .bind(Ts(now))
                        .execute(&mut *tx)
                        .await
                        .map_err(db)?;
                    tx.commit().await.map_err(db)
                }

                async fn mark_failed(&self, relay: &InstanceId, seqs: &[i64], error: &str) -> Result<()> {
                    let mut tx = self.begin_write().await?;
                    let now = self.tx_now(&mut tx).await?;
                    ::sqlx::query(sql::O_FAILED)
                        .bind(Self::seqs_param(seqs))
                        .bind(relay.as_str())
                        .bind(::orderly_core::store::bounded_text(error))
                        .bind(after(now, o::RETRY_AFTER))
                        .execute(&mut *tx)
                        .await
                        .map_err(db)?;
                    tx.commit().await.map_err(db)
                }
            }

            #[async_trait]
            impl Outbox for $Store {
                #[::tracing::instrument(level = "debug", skip_all, fields(instance_id = %relay, limit))]
                async fn relay_once(&self, relay: &InstanceId, target: &dyn Transport, limit: u32) -> Result<RelayOutcome> {
                    let mut tx = self.begin_write().await?;
                    let now = self.tx_now(&mut tx).await?;
                    let rows = ::sqlx::query(sql::O_LEASE)
                        .bind(relay.as_str())
                        .bind(after(now, o::LEASE))
                        .bind(Ts(now))
                        .bind(i64::from(limit.clamp(1, ::orderly_core::transport::MAX_MESSAGES)))
                        .fetch_all(&mut *tx)
                        .await
                        .map_err(db)?;
                    tx.commit().await.map_err(db)?;
                    // Group by queue, keeping the order they were written in.
                    let mut batches: Vec<(QueueName, Vec<i64>, Vec<OutgoingMessage>)> = Vec::new();
                    let mut leased = rows
                        .iter()
                        .map(|r| {
                            let c = Cols(r);
                            let properties: String = c.get("properties")?;
                            Ok((
                                c.get::<i64>("seq")?,
                                c.get::<String>("queue")?,
                                OutgoingMessage {
                                    message_id: c.get("message_id")?,
                                    correlation_id: c.get("correlation_id")?,
                                    properties: ::serde_json::from_str(&properties)
                                        .map_err(|e| ::orderly_core::Error::Corrupt(e.to_string()))?,
                                    body: c.get("body")?,
                                    scheduled_enqueue_time: c.opt_ts("scheduled_at")?,
                                },
                            ))
                        })
                        .collect::<::orderly_core::Result<Vec<_>>>()?;
                    leased.sort_by_key(|(seq, _, _)| *seq);
                    for (seq, queue, message) in leased {
                        let queue = QueueName::parse(queue)?;
                        match batches.iter_mut().find(|(q, _, _)| *q == queue) {
                            Some((_, seqs, messages)) => {
                                seqs.push(seq);
                                messages.push(message);
                            }
                            None => batches.push((queue, vec![seq], vec![message])),
                        }
                    }
                    let mut outcome = RelayOutcome::default();
                    for (queue, seqs, messages) in batches {
                        match target.send(&queue, &messages).await {
                            Ok(_) => {
                                self.mark_sent(relay, &seqs).await?;
                                outcome.sent += seqs.len();
                            }
                            Err(e) => {
                                ::tracing::warn!(queue = %queue, count = seqs.len(), error = %e, "outbox relay could not publish; will retry");
                                self.mark_failed(relay, &seqs, &e.to_string()).await?;
                                outcome.failed += seqs.len();
                            }
                        }
                    }
                    Ok(outcome)
                }

                async fn outbox_backlog(&self) -> Result<i64> {
                    ::sqlx::query_scalar(o::O_BACKLOG).fetch_one(&self.pool).await.map_err(db)
                }

                async fn wait_written(&self, within: ::std::time::Duration) {
                    let _ = ::tokio::time::timeout(within, self.wakeups.outbox.notified()).await;
                }
            }
        }
    };
}
pub(crate) use outbox_ops;
