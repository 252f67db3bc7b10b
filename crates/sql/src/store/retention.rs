//! Retention: removing what is no longer needed (finished orders with their steps,
//! history and alerts; old dead letters and relayed outbox rows; expired duplicate
//! detection rows) in short transactions, so the hot path never waits long behind it.

use chrono::{DateTime, Utc};
use orderly_core::store::{Pruned, Retention, TIDY_MIN_DEAD, Tidied, Vacuumed};
use orderly_core::{Error, Result};

use super::SqlStore;
use crate::driver::{Driver, Q, q};
use crate::error::db;
use crate::rows::Cols;
use crate::time::Ts;

/// Finished orders (`$1` the cutoff): the condition, and the batch of ids (`$2` limit).
/// `created_at` bounds the scan by the age index: an order finished before the cutoff
/// was created before it.
const FINISHED: &str = "created_at < $1 AND updated_at < $1 \
    AND process_state IN ('Processed', 'Cancelled')";

/// What belongs to an order, removed in this order: the history while the state row
/// still says the order is finished (the append-only trigger checks it), the state
/// row before the order it references.
const OF_ORDER: [&str; 4] = ["order_history", "order_steps", "alerts", "order_state"];

/// Rows removed on their own, `$1` the cutoff (or now, for expired dedup rows) and `$2`
/// the batch: what each counts toward, and the statement.
const LOOSE: [(Loose, &str); 4] = [
    (
        Loose::DeadLetters,
        "DELETE FROM queue_dead_letters WHERE seq IN \
         (SELECT seq FROM queue_dead_letters WHERE dead_lettered_at < $1 LIMIT $2)",
    ),
    (
        Loose::Outbox,
        "DELETE FROM outbox WHERE seq IN \
         (SELECT seq FROM outbox WHERE sent_at IS NOT NULL AND sent_at < $1 LIMIT $2)",
    ),
    (
        Loose::Outbox,
        "DELETE FROM outbox WHERE seq IN \
         (SELECT seq FROM outbox WHERE dead_at IS NOT NULL AND dead_at < $1 LIMIT $2)",
    ),
    (
        Loose::Dedup,
        "DELETE FROM queue_dedup WHERE (queue, message_id) IN \
         (SELECT queue, message_id FROM queue_dedup WHERE expires_at <= $1 \
         ORDER BY expires_at LIMIT $2)",
    ),
];

/// The same rows, counted (`$1` as above).
const LOOSE_COUNTS: [(Loose, &str); 4] = [
    (
        Loose::DeadLetters,
        "SELECT count(*) AS n FROM queue_dead_letters WHERE dead_lettered_at < $1",
    ),
    (
        Loose::Outbox,
        "SELECT count(*) AS n FROM outbox WHERE sent_at IS NOT NULL AND sent_at < $1",
    ),
    (
        Loose::Outbox,
        "SELECT count(*) AS n FROM outbox WHERE dead_at IS NOT NULL AND dead_at < $1",
    ),
    (
        Loose::Dedup,
        "SELECT count(*) AS n FROM queue_dedup WHERE expires_at <= $1",
    ),
];

#[derive(Clone, Copy)]
enum Loose {
    DeadLetters,
    Outbox,
    Dedup,
}

impl Loose {
    fn add(self, pruned: &mut Pruned, n: u64) {
        match self {
            Loose::DeadLetters => pruned.dead_letters += n,
            Loose::Outbox => pruned.outbox += n,
            Loose::Dedup => pruned.dedup += n,
        }
    }
}

impl<D: Driver> SqlStore<D> {
    pub(crate) async fn prune_now(&self, retention: &Retention, dry_run: bool) -> Result<Pruned> {
        let keep = chrono::Duration::from_std(retention.keep).map_err(|_| {
            Error::from(orderly_core::ValidationError::new(
                "retain_finished",
                "is too long",
            ))
        })?;
        let batch = i64::from(retention.batch.max(1));
        let now = {
            let mut conn = self.driver.acquire().await?;
            self.driver.now(&mut conn).await?
        };
        let cutoff = now - keep;
        if dry_run {
            return self.count_prunable(cutoff, now).await;
        }
        let mut pruned = Pruned::default();
        // Finished orders, one batch per transaction.
        while self.prune_orders(cutoff, batch, &mut pruned).await? {}
        // The rest, each kind a batch per transaction.
        for (kind, statement) in LOOSE {
            let before = match kind {
                Loose::Dedup => now,
                _ => cutoff,
            };
            loop {
                let (mut tx, _) = self.begin().await?;
                let n = q(statement)
                    .bind(Ts(before))
                    .bind(batch)
                    .execute::<D>(&mut tx)
                    .await
                    .map_err(db)?;
                D::commit(tx).await.map_err(db)?;
                kind.add(&mut pruned, n);
                if (n as i64) < batch {
                    break;
                }
            }
        }
        Ok(pruned)
    }

    /// Removes one batch of the orders finished before `cutoff`, with everything kept
    /// of them, in one transaction, and counts it in `pruned`. True if there may be
    /// more.
    async fn prune_orders(
        &self,
        cutoff: DateTime<Utc>,
        batch: i64,
        pruned: &mut Pruned,
    ) -> Result<bool> {
        let (mut tx, _) = self.begin().await?;
        let ids: Vec<String> = Q::dynamic(format!(
            "SELECT order_id FROM order_state WHERE {FINISHED} ORDER BY created_at, order_id LIMIT $2"
        ))
        .bind(Ts(cutoff))
        .bind(batch)
        .fetch_all::<D>(&mut tx)
        .await
        .map_err(db)?
        .iter()
        .map(|r| Cols(r).get::<String>("order_id"))
        .collect::<Result<_>>()?;
        if ids.is_empty() {
            return Ok(false);
        }
        let mut removed = [0u64; 4];
        for (table, n) in OF_ORDER.iter().zip(&mut removed) {
            *n = Q::dynamic(format!(
                "DELETE FROM {table} WHERE order_id IN ({})",
                D::SQL.texts_of_1
            ))
            .bind(ids.clone())
            .execute::<D>(&mut tx)
            .await
            .map_err(db)?;
        }
        let orders = Q::dynamic(format!(
            "DELETE FROM orders WHERE order_id IN ({})",
            D::SQL.texts_of_1
        ))
        .bind(ids.clone())
        .execute::<D>(&mut tx)
        .await
        .map_err(db)?;
        D::commit(tx).await.map_err(db)?;
        pruned.history += removed[0];
        pruned.steps += removed[1];
        pruned.alerts += removed[2];
        pruned.orders += orders;
        Ok(ids.len() as i64 >= batch)
    }

    /// What [`Self::prune_now`] would remove.
    async fn count_prunable(&self, cutoff: DateTime<Utc>, now: DateTime<Utc>) -> Result<Pruned> {
        let mut conn = self.driver.acquire().await?;
        let mut count = async |sql: String, at: DateTime<Utc>| -> Result<u64> {
            let row = Q::dynamic(sql)
                .bind(Ts(at))
                .fetch_one::<D>(&mut conn)
                .await
                .map_err(db)?;
            Ok(u64::try_from(Cols(&row).get::<i64>("n")?).unwrap_or(0))
        };
        let mut pruned = Pruned {
            orders: count(
                format!("SELECT count(*) AS n FROM order_state WHERE {FINISHED}"),
                cutoff,
            )
            .await?,
            ..Pruned::default()
        };
        let of_finished = |table: &str| {
            format!(
                "SELECT count(*) AS n FROM {table} WHERE order_id IN (SELECT order_id FROM order_state WHERE {FINISHED})"
            )
        };
        pruned.history = count(of_finished("order_history"), cutoff).await?;
        pruned.steps = count(of_finished("order_steps"), cutoff).await?;
        pruned.alerts = count(of_finished("alerts"), cutoff).await?;
        for (kind, statement) in LOOSE_COUNTS {
            let at = match kind {
                Loose::Dedup => now,
                _ => cutoff,
            };
            let n = count(statement.to_owned(), at).await?;
            kind.add(&mut pruned, n);
        }
        Ok(pruned)
    }
}

/// Per hot table, the horizon its latest vacuum ran under, and whether a skip under it
/// was reported.
pub(crate) type VacuumedUnder = std::collections::HashMap<String, (String, bool)>;

impl<D: Driver> SqlStore<D> {
    /// [`orderly_core::store::SupervisorStore::tidy`]: the hot tables with enough
    /// left-behind row versions, vacuumed one by one outside any transaction.
    ///
    /// A table is not vacuumed again while the horizon its last vacuum ran under
    /// stands: a transaction (or snapshot) older than that vacuum still runs, so what
    /// it left is still not removable, and neither is anything deleted since. Without
    /// this, a session left open in a transaction (a long report, a backup, a
    /// forgotten `BEGIN`) had the leader vacuum each hot table at every turn, every
    /// second by default, for as long as it stayed open. The first such skip per
    /// table and horizon is logged as a warning.
    pub(crate) async fn tidy_now(&self) -> Result<Tidied> {
        let Some(tidy) = D::SQL.tidy else {
            return Ok(Tidied::default());
        };
        let mut conn = self.driver.acquire().await?;
        let tables: Vec<String> = tidy.vacuum.iter().map(|(t, _)| t.to_string()).collect();
        let due = q(tidy.dead_rows)
            .bind(tables)
            .fetch_all::<D>(&mut conn)
            .await
            .map_err(db)?
            .iter()
            .map(|r| {
                let c = Cols(r);
                let dead = u64::try_from(c.get::<i64>("dead")?).unwrap_or(0);
                let live = u64::try_from(c.get::<i64>("live")?).unwrap_or(0);
                Ok((c.get::<String>("table_name")?, dead, live))
            })
            .collect::<Result<Vec<_>>>()?;
        let dead_rows = Some(due.iter().map(|(_, dead, _)| dead).sum());
        let due = due
            .into_iter()
            .filter(|(_, dead, live)| *dead >= TIDY_MIN_DEAD.max(live / 10))
            .collect::<Vec<_>>();
        if due.is_empty() {
            return Ok(Tidied {
                vacuumed: Vec::new(),
                dead_rows,
            });
        }
        // Read before the vacuums: the horizon they run under is this one or later.
        let horizon: Option<String> = q(tidy.horizon)
            .fetch_optional::<D>(&mut conn)
            .await
            .map_err(db)?
            .map(|r| Cols(&r).get::<String>("horizon"))
            .transpose()?;
        D::run_script(&mut conn, tidy.unbounded).await.map_err(db)?;
        let vacuumed = self.vacuum_due(&mut conn, &tidy, due, horizon).await;
        // The session's statement timeout again, whatever the vacuums did (a
        // connection that cannot take it is broken, and its statements fail).
        D::run_script(&mut conn, tidy.bounded).await.map_err(db)?;
        Ok(Tidied {
            vacuumed: vacuumed?,
            dead_rows,
        })
    }

    async fn vacuum_due(
        &self,
        conn: &mut D::Conn,
        tidy: &crate::driver::Tidy,
        due: Vec<(String, u64, u64)>,
        horizon: Option<String>,
    ) -> Result<Vec<Vacuumed>> {
        let mut vacuumed = Vec::new();
        for (table, dead_rows, _) in due {
            let Some((_, vacuum)) = tidy.vacuum.iter().find(|(t, _)| *t == table) else {
                continue;
            };
            if let Some(horizon) = &horizon
                && self.held_back(&table, horizon, dead_rows)
            {
                continue;
            }
            D::run_script(conn, vacuum).await.map_err(db)?;
            if let Some(horizon) = &horizon {
                self.lock_vacuumed_under()
                    .insert(table.clone(), (horizon.clone(), false));
            }
            vacuumed.push(Vacuumed { table, dead_rows });
        }
        Ok(vacuumed)
    }

    /// Whether `table`'s latest vacuum ran under `horizon` (so vacuuming it again
    /// would remove nothing); the first time, says so in a warning.
    fn held_back(&self, table: &str, horizon: &str, dead_rows: u64) -> bool {
        let mut under = self.lock_vacuumed_under();
        let Some((last, reported)) = under.get_mut(table) else {
            return false;
        };
        if last != horizon {
            return false;
        }
        if !std::mem::replace(reported, true) {
            tracing::warn!(
                table,
                dead_rows,
                horizon,
                "a transaction older than the last vacuum still runs, so the rows left \
                 behind cannot be removed: not vacuumed again until it ends (see \
                 pg_stat_activity for sessions idle in transaction)"
            );
        }
        true
    }

    fn lock_vacuumed_under(&self) -> std::sync::MutexGuard<'_, VacuumedUnder> {
        self.vacuumed_under
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
