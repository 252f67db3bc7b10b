//! The batch statements bound: a batch as the JSON object its statement looks each
//! row up in, the parallel arrays of inserts and sends, and the rows they return.

use super::statements as sql;
use crate::driver::{
    HoldFor, MessageRow, NewOrderRow, SendFor, SentAndCompleted, SentWith, StepRow, Touch,
};
use crate::rows::Cols;
use crate::statements as st;
use crate::time::Ts;
use chrono::{DateTime, Utc};
use orderly_core::history::HistoryKind;
use orderly_core::store::{ClaimRequest, ClaimedOrder};
use orderly_core::transport::ReceivedMessage;
use orderly_core::{Fence, Result};
use sqlx::Postgres;
use sqlx::postgres::PgRow;
use std::collections::{HashMap, HashSet};

/// The columns of a claim, as [`ClaimedOrder`]s of `request`'s owner.
pub(super) fn claimed_orders(rows: &[PgRow], request: &ClaimRequest) -> Result<Vec<ClaimedOrder>> {
    rows.iter()
        .map(|r| {
            let c = Cols(r);
            c.claimed_by(&request.owner, &c.get::<String>("details")?)
        })
        .collect()
}

/// A batch's per-order values as the JSON object its statement looks each row up in
/// (see `statements.rs`): order id to `entry(order)`. Order ids are unique in a batch.
/// Bound as `jsonb`, so a kept (generic) plan reads it once, not once per row.
pub(super) fn batch_of<T>(
    items: &[T],
    id: impl Fn(&T) -> &str,
    mut entry: impl FnMut(&T) -> serde_json::Value,
) -> serde_json::Value {
    let map: serde_json::Map<String, serde_json::Value> = items
        .iter()
        .map(|item| (id(item).to_owned(), entry(item)))
        .collect();
    serde_json::Value::Object(map)
}

/// A batch of fences as the COMPLETE statement takes them.
pub(super) fn complete_query(
    now: Option<Ts>,
    fences: &[&Fence],
) -> sqlx::query::Query<'static, Postgres, <Postgres as sqlx::Database>::Arguments> {
    let ids: Vec<String> = fences
        .iter()
        .map(|f| f.order_id.as_str().to_owned())
        .collect();
    let batch = batch_of(
        fences,
        |f| f.order_id.as_str(),
        |f| serde_json::json!({ "owner": f.owner.as_str(), "epoch": f.epoch.0 }),
    );
    sqlx::query(sql::COMPLETE)
        .bind(now)
        .bind(ids)
        .bind(batch)
        .bind(HistoryKind::Completed.as_str())
}

/// A batch of step writes as [`sql::WRITE_STEPS`] takes it: the order ids and the
/// batch object (per order its touch and, in order, its step records).
pub(super) fn steps_batch(
    touches: &[Touch<'_>],
    rows: &[StepRow<'_>],
) -> (Vec<String>, serde_json::Value) {
    let mut steps: HashMap<&str, Vec<serde_json::Value>> = HashMap::new();
    for r in rows {
        steps
            .entry(r.fence.order_id.as_str())
            .or_default()
            .push(serde_json::json!({
                "index": r.index,
                "name": r.name,
                "status": r.status,
                "key": r.idempotency_key,
                "detail": r.detail,
                "kind": r.kind,
                "irreversible": r.irreversible,
                "attempts": r.attempts,
            }));
    }
    let batch = batch_of(
        touches,
        |t| t.fence.order_id.as_str(),
        |t| {
            serde_json::json!({
                "owner": t.fence.owner.as_str(),
                "epoch": t.fence.epoch.0,
                "expect": t.expect,
                "step": t.new_step,
                "failed": t.failed,
                "error": t.error,
                "complete": t.complete,
                "steps": steps.remove(t.fence.order_id.as_str()).unwrap_or_default(),
            })
        },
    );
    let ids = touches
        .iter()
        .map(|t| t.fence.order_id.as_str().to_owned())
        .collect();
    (ids, batch)
}

/// Binds the parameters of [`sql::INSERT_ORDERS`] (and the first of
/// [`sql::INSERT_ORDERS_SENDING`]'s): `now`, the orders as parallel arrays, `actor` and
/// the history kind.
pub(super) fn bind_orders<'q, O>(
    query: sqlx::query::QueryAs<'q, Postgres, O, <Postgres as sqlx::Database>::Arguments>,
    now: DateTime<Utc>,
    actor: &'q str,
    orders: &'q [NewOrderRow<'q>],
) -> sqlx::query::QueryAs<'q, Postgres, O, <Postgres as sqlx::Database>::Arguments> {
    query
        .bind(Ts(now))
        .bind(orders.iter().map(|o| o.order_id).collect::<Vec<_>>())
        .bind(
            orders
                .iter()
                .map(|o| o.details.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(orders.iter().map(|o| o.reply_to).collect::<Vec<_>>())
        .bind(orders.iter().map(|o| o.workflow).collect::<Vec<_>>())
        .bind(actor)
        .bind(HistoryKind::Submitted.as_str())
}

/// What a write that sends returns ([`sql::WRITE_STEPS_SENDING`],
/// [`sql::INSERT_ORDERS_SENDING`]): an order it wrote, or a hold it completed.
pub(super) type SentWithRow = (Option<String>, Option<i64>, Option<String>);

pub(super) type SendingQuery<'q> =
    sqlx::query::QueryAs<'q, Postgres, SentWithRow, <Postgres as sqlx::Database>::Arguments>;

/// Binds, after a write's own parameters, those of its sends and holds ([`SENDS`]
/// in `statements.rs`): the messages' order ids, queues, ids, correlations,
/// properties, bodies and scheduled times, the channel and `origin`, the holds' order
/// ids, seqs and lock tokens.
pub(super) fn bind_sending<'q>(
    query: SendingQuery<'q>,
    sends: &'q [SendFor<'q>],
    holds: &'q [HoldFor<'q>],
    origin: &'q str,
) -> SendingQuery<'q> {
    query
        .bind(sends.iter().map(|m| m.order_id).collect::<Vec<_>>())
        .bind(sends.iter().map(|m| m.queue.as_str()).collect::<Vec<_>>())
        .bind(sends.iter().map(|m| m.row.message_id).collect::<Vec<_>>())
        .bind(
            sends
                .iter()
                .map(|m| m.row.correlation_id)
                .collect::<Vec<_>>(),
        )
        .bind(
            sends
                .iter()
                .map(|m| m.row.properties.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(sends.iter().map(|m| m.row.body).collect::<Vec<_>>())
        .bind(
            sends
                .iter()
                .map(|m| m.row.scheduled_at.map(|at| at.0))
                .collect::<Vec<_>>(),
        )
        .bind(crate::wakeups::CHANNEL)
        .bind(origin)
        .bind(holds.iter().map(|h| h.order_id).collect::<Vec<_>>())
        .bind(
            holds
                .iter()
                .map(|h| h.held.sequence_number)
                .collect::<Vec<_>>(),
        )
        .bind(
            holds
                .iter()
                .map(|h| h.held.lock_token.0.as_str())
                .collect::<Vec<_>>(),
        )
}

pub(super) fn sent_with(rows: Vec<SentWithRow>) -> SentWith {
    let mut sent = SentWith {
        applied: HashSet::with_capacity(rows.len()),
        completed: HashMap::new(),
    };
    for (order_id, seq, token) in rows {
        match (order_id, seq.zip(token)) {
            (Some(order_id), _) => {
                sent.applied.insert(order_id);
            }
            (None, Some((seq, token))) => {
                sent.completed.insert(seq, token);
            }
            (None, None) => {}
        }
    }
    sent
}

/// What [`sql::Q_SEND`] returns: how many it inserted, and per completed hold its seq
/// and lock token.
pub(super) type SentRow = (i64, Option<i64>, Option<String>);

/// [`sql::Q_SEND`] (or, to a queue that detects duplicates within `dedup_ms`,
/// [`sql::Q_SEND_DEDUP`]; with holds to complete, [`sql::Q_SEND_COMPLETING`] or
/// [`sql::Q_SEND_DEDUP_COMPLETING`]): `rows` sent to `queue` at `now` (NULL: the
/// server's), the holds `held` completed.
pub(super) fn send_query<'q>(
    queue: &'q str,
    now: Option<Ts>,
    dedup_ms: Option<i64>,
    rows: &'q [MessageRow<'q>],
    held: &'q [&'q ReceivedMessage],
    notice: &'q str,
) -> sqlx::query::QueryAs<'q, Postgres, SentRow, <Postgres as sqlx::Database>::Arguments> {
    let statement = match (dedup_ms.is_some(), held.is_empty()) {
        (false, true) => sql::Q_SEND,
        (false, false) => sql::Q_SEND_COMPLETING,
        (true, true) => sql::Q_SEND_DEDUP,
        (true, false) => sql::Q_SEND_DEDUP_COMPLETING,
    };
    let query = sqlx::query_as(statement)
        .bind(queue)
        .bind(rows.iter().map(|r| r.message_id).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.correlation_id).collect::<Vec<_>>())
        .bind(
            rows.iter()
                .map(|r| r.properties.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(rows.iter().map(|r| r.body).collect::<Vec<_>>())
        .bind(now)
        .bind(
            rows.iter()
                .map(|r| r.scheduled_at.map(|at| at.0))
                .collect::<Vec<_>>(),
        )
        .bind(dedup_ms)
        .bind(crate::wakeups::CHANNEL)
        .bind(notice);
    if held.is_empty() {
        return query;
    }
    query
        .bind(held.iter().map(|m| m.sequence_number).collect::<Vec<_>>())
        .bind(
            held.iter()
                .map(|m| m.lock_token.0.as_str())
                .collect::<Vec<_>>(),
        )
}

pub(super) fn sent_and_completed(rows: Vec<SentRow>) -> SentAndCompleted {
    let inserted = rows.first().map_or(0, |(n, _, _)| *n);
    SentAndCompleted {
        inserted: usize::try_from(inserted).unwrap_or_default(),
        completed: rows
            .into_iter()
            .filter_map(|(_, seq, token)| seq.zip(token))
            .collect(),
    }
}

pub(super) fn order_ids(rows: Vec<PgRow>) -> Result<HashSet<String>> {
    rows.iter()
        .map(|r| Cols(r).get::<String>("order_id"))
        .collect()
}

/// The claim statement for `request` at `now` (`None`: the server's clock).
pub(super) fn claim_query(
    now: Option<Ts>,
    request: &ClaimRequest,
    timeout_micros: i64,
) -> Result<sqlx::query::Query<'static, Postgres, <Postgres as sqlx::Database>::Arguments>> {
    Ok(sqlx::query(sql::CLAIM)
        .bind(now)
        .bind(i64::from(request.limit))
        .bind(request.owner.as_str().to_owned())
        .bind(timeout_micros)
        .bind(request.workflows.default_name.clone())
        .bind(st::start_json(&request.workflows)?)
        .bind(st::carry_on(&request.workflows))
        .bind(HistoryKind::Claimed.as_str()))
}
