//! `orderly outbox`: what the store's outbox (used with Service Bus) holds back: its
//! backlog, and the messages it set aside as undeliverable, with why; `--requeue`
//! publishes those again once the cause (a missing queue, say) is fixed.

use anyhow::Context;
use orderly_cli::outln;

/// Runs `orderly outbox`.
pub async fn run(database_url: &str, requeue: bool, json: bool) -> anyhow::Result<()> {
    let outbox = orderly_runtime::backend::connect_outbox_store(database_url)
        .await
        .context("cannot open the state store named by --database-url / ORDERLY_DATABASE_URL")?
        .outbox;
    if requeue {
        let n = outbox.requeue_outbox_dead_letters().await?;
        if json {
            return orderly_cli::out::json_line(&serde_json::json!({ "requeued": n }));
        }
        outln!("{n} outbox message(s) put back to be published");
        return Ok(());
    }
    let backlog = outbox.outbox_backlog().await?;
    let dead = outbox
        .outbox_dead_letters(orderly_core::transport::MAX_MESSAGES)
        .await?;
    if json {
        return orderly_cli::out::json_line(
            &serde_json::json!({ "backlog": backlog, "dead_letters": dead }),
        );
    }
    outln!("waiting to be published: {backlog}");
    outln!("not deliverable: {}", dead.len());
    for d in &dead {
        outln!(
            "  {}  {}  {}  after {} attempt(s): {}",
            d.dead_at.format("%Y-%m-%d %H:%M:%S"),
            d.queue,
            d.message_id,
            d.attempts,
            d.reason
        );
    }
    if !dead.is_empty() {
        outln!("fix the cause (e.g. create the queue), then: orderly outbox --requeue");
    }
    Ok(())
}
