//! The batch statements run: rows written as one JSONB batch a statement reads with
//! `jsonb_each`, a claim and its history, step records, and message inserts with
//! their duplicate check.

use super::SqliteDriver;
use super::jsonb;
use super::jsonb::Hex;
use super::statements as sql;
use crate::driver::{FromCol, List, MessageRow, Q, Query, StepRow, Touch, q};
use crate::error::{corrupt, db};
use crate::rows::Cols;
use crate::statements as st;
use crate::time::Ts;
use chrono::{DateTime, Utc};
use orderly_core::Result;
use orderly_core::store::{ClaimRequest, ClaimedOrder};
use sqlx::sqlite::SqliteRow;
use sqlx::{Sqlite, SqliteConnection};
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

/// Runs a batch statement taking `$1` now and `$2` the batch; the rows it returns.
pub(super) async fn run_batch(
    conn: &mut SqliteConnection,
    statement: &'static str,
    now: DateTime<Utc>,
    batch: Vec<u8>,
) -> Result<Vec<SqliteRow>> {
    q(statement)
        .bind(Ts(now))
        .bind(batch)
        .fetch_all::<SqliteDriver>(conn)
        .await
        .map_err(db)
}

/// Runs a statement text taking `$1` now, `$2` a batch of rows and `$3` their
/// history entries (two statements in one round trip).
pub(super) async fn run_with_history(
    conn: &mut SqliteConnection,
    statements: &'static str,
    now: DateTime<Utc>,
    batch: Vec<u8>,
    history: Vec<u8>,
) -> Result<()> {
    q(statements)
        .bind(Ts(now))
        .bind(batch)
        .bind(history)
        .execute::<SqliteDriver>(conn)
        .await
        .map(|_| ())
        .map_err(db)
}

/// The `order_id` of each row.
pub(super) fn order_ids(rows: &[SqliteRow]) -> Result<HashSet<String>> {
    rows.iter()
        .map(|r| Cols(r).get::<String>("order_id"))
        .collect()
}

impl SqliteDriver {
    /// Claims up to the request's limit in the caller's transaction at `now`, with
    /// the claims' history.
    pub(super) async fn claim_in(
        conn: &mut SqliteConnection,
        now: DateTime<Utc>,
        request: &ClaimRequest,
        timeout_micros: i64,
    ) -> Result<Vec<ClaimedOrder>> {
        let deadline = now + chrono::Duration::microseconds(timeout_micros);
        let rows = q(sql::CLAIM)
            .bind(request.owner.as_str())
            .bind(Ts(deadline))
            .bind(Ts(now))
            .bind(i64::from(request.limit))
            .bind(&request.workflows.default_name)
            .bind(st::start_json(&request.workflows)?)
            .bind(st::carry_on(&request.workflows))
            .fetch_all::<Self>(conn)
            .await
            .map_err(db)?;
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let ids = rows
            .iter()
            .map(|r| Cols(r).get::<String>("order_id"))
            .collect::<Result<Vec<_>>>()?;
        let mut details = HashMap::with_capacity(rows.len());
        for r in q(sql::CLAIMED_HISTORY_AND_DETAILS)
            .bind(ids)
            .bind(Ts(now))
            .bind(request.owner.as_str())
            .bind(orderly_core::history::HistoryKind::Claimed.as_str())
            .fetch_all::<Self>(conn)
            .await
            .map_err(db)?
        {
            let c = Cols(&r);
            details.insert(c.get::<String>("order_id")?, c.get::<String>("details")?);
        }
        rows.iter()
            .map(|r| {
                let c = Cols(r);
                let order_id = c.get::<String>("order_id")?;
                let details = details.remove(&order_id).ok_or_else(|| {
                    corrupt(
                        "orders",
                        format!("order {order_id} has a state row but no details"),
                    )
                })?;
                c.claimed_by(&request.owner, &details)
            })
            .collect()
    }

    /// The fenced touches of a batch of step writes; returns the ids touched.
    pub(super) async fn touch_steps(
        conn: &mut SqliteConnection,
        now: DateTime<Utc>,
        touches: &[Touch<'_>],
    ) -> Result<HashSet<String>> {
        let batch = jsonb::rows(touches, |t, row| {
            row.field(t.fence.order_id.as_str())
                .field(t.fence.owner.as_str())
                .field(t.fence.epoch.0)
                .field(t.expect)
                .field(t.new_step)
                .field(t.failed)
                .field(t.error.as_deref());
        });
        order_ids(&run_batch(conn, sql::TOUCH_STEPS, now, batch).await?)
    }

    /// Step records and their history entries, in order, in one round trip.
    pub(super) async fn write_step_rows(
        conn: &mut SqliteConnection,
        now: DateTime<Utc>,
        rows: &[StepRow<'_>],
    ) -> Result<()> {
        let steps = jsonb::rows(rows, |r, row| {
            row.field(r.fence.order_id.as_str())
                .field(r.index)
                .field(r.name)
                .field(r.status)
                .field(r.idempotency_key)
                .field(r.detail.as_deref())
                .field(r.fence.epoch.0)
                .field(r.irreversible)
                .field(r.attempts);
        });
        let history = jsonb::rows(rows, |r, row| {
            row.field(r.fence.order_id.as_str())
                .field(r.fence.owner.as_str())
                .field(r.kind)
                .field("Processing")
                .field("Processing")
                .field(r.fence.epoch.0)
                .field(r.index)
                .field(r.detail.as_deref());
        });
        run_with_history(conn, sql::STEP_ROWS, now, steps, history).await
    }
}

/// The rows of a message insert sent at `now`, as its statements take them.
pub(super) fn message_batch<'r, 'm: 'r>(
    now: Ts,
    rows: impl IntoIterator<Item = &'r MessageRow<'m>>,
) -> Vec<u8> {
    // Most messages are visible at once: their time is the batch's, written once.
    let now_text = now.to_text();
    jsonb::rows(rows, |r, row| {
        let visible_at = match r.scheduled_at {
            Some(at) if at > now => Cow::Owned(at.to_text()),
            _ => Cow::Borrowed(now_text.as_str()),
        };
        row.field(r.message_id)
            .field(r.correlation_id)
            .field(r.properties.as_str())
            .field(Hex(r.body))
            .field(visible_at);
    })
}

/// The ids of `rows` not seen on `queue` within its duplicate window of `ms`
/// Inserts into `queue` those of `rows` its duplicate window (`dedup_ms` long; `None`:
/// none) lets through, each fresh id once; returns how many it inserted.
pub(super) async fn insert_fresh(
    conn: &mut SqliteConnection,
    now: Ts,
    queue: &str,
    dedup_ms: Option<i64>,
    rows: &[MessageRow<'_>],
) -> Result<usize, sqlx::Error> {
    let fresh = match dedup_ms {
        Some(ms) => Some(fresh_ids(conn, now, queue, ms, rows).await?),
        None => None,
    };
    let accepted = accepted(rows, fresh.as_ref());
    if accepted.is_empty() {
        return Ok(0);
    }
    q(sql::Q_INSERT_MANY)
        .bind(queue)
        .bind(now)
        .bind(message_batch(now, accepted.iter().copied()))
        .execute::<SqliteDriver>(conn)
        .await?;
    Ok(accepted.len())
}

/// milliseconds, recorded as seen until the window ends.
pub(super) async fn fresh_ids(
    conn: &mut SqliteConnection,
    now: Ts,
    queue: &str,
    ms: i64,
    rows: &[MessageRow<'_>],
) -> Result<HashSet<String>, sqlx::Error> {
    let until = Ts(now.0 + chrono::Duration::milliseconds(ms));
    let ids: Vec<&str> = rows.iter().map(|r| r.message_id).collect();
    q(sql::Q_DEDUP_MANY)
        .bind(queue)
        .bind(until)
        .bind(now)
        .bind(serde_json::to_string(&ids).map_err(|e| sqlx::Error::Encode(e.into()))?)
        .fetch_all::<SqliteDriver>(conn)
        .await?
        .iter()
        .map(|r| sqlx::Row::try_get::<String, _>(r, "message_id"))
        .collect()
}

/// The rows to insert: all of them, or with duplicate detection (`fresh`, the ids not
/// seen before) each fresh id once, as its first row.
pub(super) fn accepted<'r, 'm>(
    rows: &'r [MessageRow<'m>],
    fresh: Option<&HashSet<String>>,
) -> Vec<&'r MessageRow<'m>> {
    let mut taken = HashSet::new();
    rows.iter()
        .filter(|r| fresh.is_none_or(|f| f.contains(r.message_id) && taken.insert(r.message_id)))
        .collect()
}

/// The holds a completion ended, from the rows it returned: seq and lock token.
pub(super) fn completions(rows: &[SqliteRow]) -> Result<HashMap<i64, String>, sqlx::Error> {
    rows.iter()
        .map(|r| Ok((i64::from_col(r, "seq")?, String::from_col(r, "lock_token")?)))
        .collect()
}

/// Binds a list as a JSON array.
pub(super) fn bind_list(query: Query<Sqlite>, list: List) -> Query<Sqlite> {
    match list {
        List::I64s(v) => query.bind(json_list(v)),
        List::Texts(v) => query.bind(json_list(v)),
    }
}

pub(super) fn json_list<T: serde::Serialize>(values: Vec<T>) -> String {
    serde_json::to_string(&values).expect("a list of numbers or strings writes as JSON")
}

pub(super) fn prepare(q: Q<'_>) -> Query<Sqlite> {
    crate::driver::prepare(q, bind_list)
}
