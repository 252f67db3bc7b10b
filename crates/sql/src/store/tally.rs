//! The tallies of finished orders (migration 0022): the Processed and Cancelled orders
//! counted per minute of their finish, so that the count by state reads the tallies and
//! the few rows finished since, not every finished order of the store. Such an order
//! never changes again; only retention removes it, and the store's trigger takes it off
//! its tally then, whoever removes it.
//!
//! The mark says up to when the tallies go. A tally moves it to the start of the minute
//! [`TALLY_GRACE`] ago (an order's finish is stamped when its transaction begins and
//! seen when it commits), counting again the last [`TALLY_RECOUNT`] it already tallied
//! (an order whose transaction took longer than the grace); a first tally of a large
//! store goes [`TALLY_STRIDE`] a transaction. The tally holds the mark FOR UPDATE, a
//! removal FOR SHARE: each sees the other's work whole.

use chrono::{DateTime, Utc};
use orderly_core::Result;
use orderly_core::activity::{bucket_sql, minute_of};
use orderly_core::store::{TALLY_GRACE, TALLY_RECOUNT, TALLY_STRIDE, Tallied};

use super::SqlStore;
use crate::driver::{Driver, Q, q};
use crate::error::db;
use crate::rows::Cols;
use crate::time::Ts;

/// The tallies' mark before the first tally.
const NEVER: DateTime<Utc> = DateTime::<Utc>::UNIX_EPOCH;

/// The earliest finish kept: where a first tally starts.
const FIRST_FINISH: &str =
    "SELECT min(finished_at) AS first FROM order_state WHERE finished_at IS NOT NULL";

/// The tallies of the minutes from `$1` to `$2`, to be counted again.
const FORGET: &str = "DELETE FROM finished_tally WHERE minute >= $1 AND minute < $2";

/// Moves the mark to `$1`.
const MOVE_MARK: &str = "UPDATE finished_tally_mark SET upto = $1";

impl<D: Driver> SqlStore<D> {
    /// See [`orderly_core::store::SupervisorStore::tally_finished`].
    pub(crate) async fn tally_now(&self) -> Result<Tallied> {
        let mut done = Tallied {
            upto: NEVER,
            orders: 0,
            transactions: 0,
        };
        loop {
            let (mut tx, now) = self.begin().await?;
            let mark = Q::dynamic(format!(
                "{}{}",
                crate::statements::TALLY_MARK,
                D::SQL.for_update
            ))
            .fetch_one::<D>(&mut tx)
            .await
            .map_err(db)?;
            let upto = Cols(&mark).ts("upto")?;
            done.upto = upto;
            let target = minute_of(now - TALLY_GRACE);
            if target <= upto {
                D::commit(tx).await.map_err(db)?;
                return Ok(done);
            }
            let from = if upto == NEVER {
                let first = q(FIRST_FINISH).fetch_one::<D>(&mut tx).await.map_err(db)?;
                Cols(&first)
                    .opt_ts("first")?
                    .map_or(target, minute_of)
                    .min(target)
            } else {
                upto - TALLY_RECOUNT
            };
            let to = target.min(from.max(upto) + TALLY_STRIDE);
            q(FORGET)
                .bind(Ts(from))
                .bind(Ts(to))
                .execute::<D>(&mut tx)
                .await
                .map_err(db)?;
            let counted = Q::dynamic(format!(
                "INSERT INTO finished_tally (minute, process_state, bucket, orders) \
                 SELECT {minute}, process_state, \
                 CASE WHEN process_state = 'Processed' THEN {bucket} ELSE -1 END, count(*) \
                 FROM order_state \
                 WHERE finished_at >= $1 AND finished_at < $2 \
                 AND process_state IN ('Processed', 'Cancelled') \
                 GROUP BY 1, 2, 3 RETURNING orders",
                minute = D::SQL.minute_of.replace("{}", "finished_at"),
                bucket = bucket_sql(D::SQL.latency_ms),
            ))
            .bind(Ts(from))
            .bind(Ts(to))
            .fetch_all::<D>(&mut tx)
            .await
            .map_err(db)?;
            for r in &counted {
                done.orders += u64::try_from(Cols(r).get::<i64>("orders")?).unwrap_or(0);
            }
            q(MOVE_MARK)
                .bind(Ts(to))
                .execute::<D>(&mut tx)
                .await
                .map_err(db)?;
            D::commit(tx).await.map_err(db)?;
            done.upto = to;
            done.transactions += 1;
            if to >= target {
                return Ok(done);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use orderly_core::activity::LATENCY_BOUNDS_MS;

    /// The bounds of the latency buckets a migration's trigger writes, in order.
    fn bounds_in(migration: &str) -> Vec<u64> {
        migration
            .lines()
            .filter_map(|l| {
                let (_, rest) = l.split_once(") < ")?;
                rest.split_once(" THEN ")?.0.trim().parse().ok()
            })
            .collect()
    }

    /// The trigger takes a removed order off the tally of its latency bucket, computed
    /// in SQL written out in each migration: the same buckets as orderly's.
    #[test]
    fn the_migrations_buckets_are_orderlys() {
        for migration in [
            include_str!("../../../../migrations/sqlite/0022_finished_tally.sql"),
            include_str!("../../../../migrations/postgres/0022_finished_tally.sql"),
        ] {
            assert_eq!(bounds_in(migration), LATENCY_BOUNDS_MS.to_vec());
            assert!(migration.contains(&format!("ELSE {} END", LATENCY_BOUNDS_MS.len())));
        }
    }
}
