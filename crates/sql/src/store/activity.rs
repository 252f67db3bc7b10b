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
use crate::driver::{Driver, Q};
use crate::error::db;
use crate::rows::Cols;
use crate::time::Ts;

impl<D: Driver> SqlStore<D> {
    /// The activity of every minute from the one `since` falls in, oldest first;
    /// minutes without any are left out.
    pub(crate) async fn activity_since(&self, since: DateTime<Utc>) -> Result<Vec<MinuteActivity>> {
        let since = orderly_core::activity::minute_of(since);
        let minute = |col: &str| D::SQL.minute_of.replace("{}", col);
        let mut conn = self.driver.acquire().await?;
        let mut minutes: BTreeMap<DateTime<Utc>, MinuteActivity> = BTreeMap::new();
        let finished = Q::dynamic(format!(
            "SELECT {m} AS minute, process_state, \
             CAST(CASE WHEN process_state = 'Processed' THEN {bucket} ELSE -1 END AS BIGINT) \
             AS bucket, \
             count(*) AS n FROM order_state \
             WHERE finished_at >= $1 \
             GROUP BY 1, 2, 3",
            m = minute("updated_at"),
            bucket = bucket_sql(D::SQL.latency_ms),
        ))
        .bind(Ts(since))
        .fetch_all::<D>(&mut conn)
        .await
        .map_err(db)?;
        for r in &finished {
            let c = Cols(r);
            let at = c.ts("minute")?;
            let n = u64::try_from(c.get::<i64>("n")?).unwrap_or(0);
            let m = minutes.entry(at).or_insert_with(|| MinuteActivity::new(at));
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
        for (sql, recoveries) in [
            (
                format!(
                    "SELECT {m} AS minute, count(*) AS n FROM order_history \
                     WHERE kind IN ('Recovered', 'GaveUp') AND at >= $1 GROUP BY 1",
                    m = minute("at")
                ),
                true,
            ),
            (
                format!(
                    "SELECT {m} AS minute, count(*) AS n FROM queue_dead_letters \
                     WHERE dead_lettered_at >= $1 GROUP BY 1",
                    m = minute("dead_lettered_at")
                ),
                false,
            ),
        ] {
            for r in Q::dynamic(sql)
                .bind(Ts(since))
                .fetch_all::<D>(&mut conn)
                .await
                .map_err(db)?
            {
                let c = Cols(&r);
                let at = c.ts("minute")?;
                let n = u64::try_from(c.get::<i64>("n")?).unwrap_or(0);
                let m = minutes.entry(at).or_insert_with(|| MinuteActivity::new(at));
                if recoveries {
                    m.recoveries += n;
                } else {
                    m.dead_letters += n;
                }
            }
        }
        Ok(minutes.into_values().collect())
    }
}
