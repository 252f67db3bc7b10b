//! Minute-by-minute activity for the operators' charts, counted by the database (one
//! row per minute and kind, never one per order): finished orders by outcome with a
//! histogram of their submit-to-Processed latency, recoveries, dead letters. Each reads
//! an index of its own (migrations 0009 and 0011), so the cost follows the window, not
//! the size of the store.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use orderly_core::Result;
use orderly_core::activity::{MinuteActivity, bucket_sql};

use super::SqlStore;
use crate::driver::{Driver, Q, q};
use crate::error::db;
use crate::rows::Cols;
use crate::time::Ts;

/// Per minute, what happened in it.
type Minutes = BTreeMap<DateTime<Utc>, MinuteActivity>;

/// The minute `at` in `minutes`, made if it is not there yet.
fn minute_at(minutes: &mut Minutes, at: DateTime<Utc>) -> &mut MinuteActivity {
    minutes.entry(at).or_insert_with(|| MinuteActivity::new(at))
}

impl<D: Driver> SqlStore<D> {
    /// The activity of every minute from the one `since` falls in, oldest first;
    /// minutes without any are left out.
    pub(crate) async fn activity_since(&self, since: DateTime<Utc>) -> Result<Vec<MinuteActivity>> {
        let since = orderly_core::activity::minute_of(since);
        let mut conn = self.driver.acquire().await?;
        let mut minutes = Minutes::new();
        Self::add_finished(&mut conn, since, &mut minutes).await?;
        let recovered = "order_history WHERE kind IN ('Recovered', 'GaveUp') AND";
        for (at, n) in Self::per_minute(&mut conn, since, recovered, "at").await? {
            minute_at(&mut minutes, at).recoveries += n;
        }
        let dead = "queue_dead_letters WHERE";
        for (at, n) in Self::per_minute(&mut conn, since, dead, "dead_lettered_at").await? {
            minute_at(&mut minutes, at).dead_letters += n;
        }
        Ok(minutes.into_values().collect())
    }

    /// The orders that finished from `since` on, per minute: Processed ones by latency
    /// bucket, Error and Cancelled ones counted. The Processed and Cancelled ones of the
    /// minutes the tallies hold (before their mark, read first: see
    /// [`crate::statements::COUNT_BY_STATE`]) from the tallies, the rest from their rows,
    /// so a day or a week costs the minutes, not the orders; those in Error from theirs.
    async fn add_finished(
        conn: &mut D::Conn,
        since: DateTime<Utc>,
        minutes: &mut Minutes,
    ) -> Result<()> {
        let mark = q(crate::statements::TALLY_MARK)
            .fetch_one::<D>(&mut *conn)
            .await
            .map_err(db)?;
        let mark = Cols(&mark).ts("upto")?;
        let tallied = q(
            "SELECT minute, process_state, CAST(bucket AS BIGINT) AS bucket, \
             CAST(orders AS BIGINT) AS n FROM finished_tally WHERE minute >= $1 AND minute < $2",
        )
        .bind(Ts(since))
        .bind(Ts(mark))
        .fetch_all::<D>(&mut *conn)
        .await
        .map_err(db)?;
        let latest = Q::dynamic(format!(
            "SELECT {m} AS minute, process_state, \
             CAST(CASE WHEN process_state = 'Processed' THEN {bucket} ELSE -1 END AS BIGINT) \
             AS bucket, \
             count(*) AS n FROM order_state \
             WHERE finished_at >= $1 AND process_state IN ('Processed', 'Cancelled') \
             GROUP BY 1, 2, 3 \
             UNION ALL \
             SELECT {m} AS minute, process_state, CAST(-1 AS BIGINT) AS bucket, count(*) AS n \
             FROM order_state WHERE process_state = 'Error' AND finished_at >= $2 \
             GROUP BY 1, 2",
            m = D::SQL.minute_of.replace("{}", "updated_at"),
            bucket = bucket_sql(D::SQL.latency_ms),
        ))
        .bind(Ts(since.max(mark)))
        .bind(Ts(since))
        .fetch_all::<D>(&mut *conn)
        .await
        .map_err(db)?;
        for r in tallied.iter().chain(&latest) {
            let c = Cols(r);
            let n = u64::try_from(c.get::<i64>("n")?).unwrap_or(0);
            let m = minute_at(minutes, c.ts("minute")?);
            match c.get::<String>("process_state")?.as_str() {
                "Processed" => {
                    m.processed += n;
                    let bucket = c.get::<i64>("bucket")?;
                    m.add_latency(usize::try_from(bucket).unwrap_or(0), n);
                }
                "Error" => m.error += n,
                _ => m.cancelled += n,
            }
        }
        Ok(())
    }

    /// How many rows of `rows` (a table and the start of its condition, ending in
    /// `WHERE` or `AND`) have their timestamp `at` from `since` on, per minute.
    async fn per_minute(
        conn: &mut D::Conn,
        since: DateTime<Utc>,
        rows: &'static str,
        at: &'static str,
    ) -> Result<Vec<(DateTime<Utc>, u64)>> {
        let sql = format!(
            "SELECT {m} AS minute, count(*) AS n FROM {rows} {at} >= $1 GROUP BY 1",
            m = D::SQL.minute_of.replace("{}", at),
        );
        Q::dynamic(sql)
            .bind(Ts(since))
            .fetch_all::<D>(conn)
            .await
            .map_err(db)?
            .iter()
            .map(|r| {
                let c = Cols(r);
                Ok((
                    c.ts("minute")?,
                    u64::try_from(c.get::<i64>("n")?).unwrap_or(0),
                ))
            })
            .collect()
    }
}
