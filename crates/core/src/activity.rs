//! What the system did minute by minute, for the operators' charts: orders finished
//! by outcome, how long submit to Processed took (as a histogram, so any percentile can
//! be read from it), recoveries and dead letters.

use chrono::{DateTime, Duration, DurationRound, Utc};
use serde::{Deserialize, Serialize};

/// Upper bounds (exclusive) of the latency histogram's buckets, in milliseconds; one
/// more bucket holds everything slower.
pub const LATENCY_BOUNDS_MS: [u64; 16] = [
    5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 30_000, 60_000, 300_000, 1_800_000,
    3_600_000,
];

/// One minute of activity.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MinuteActivity {
    /// The minute's start (UTC, seconds zero).
    pub minute: DateTime<Utc>,
    /// Orders that finished Processed in it.
    pub processed: u64,
    /// Orders that entered Error in it (and are still there).
    pub error: u64,
    /// Orders that finished Cancelled in it.
    pub cancelled: u64,
    /// Submit-to-Processed latencies of the Processed ones: counts per bucket of
    /// [`LATENCY_BOUNDS_MS`], the last one for anything slower.
    pub latency: Vec<u64>,
    /// Timed-out orders the supervisor recovered or gave up on.
    pub recoveries: u64,
    /// Messages dead-lettered on the SQL queues.
    pub dead_letters: u64,
}

impl MinuteActivity {
    /// An empty minute starting at `minute`.
    pub fn new(minute: DateTime<Utc>) -> Self {
        Self {
            minute,
            latency: vec![0; LATENCY_BOUNDS_MS.len() + 1],
            ..Self::default()
        }
    }

    /// Adds `n` Processed orders whose latency fell in bucket `bucket`.
    pub fn add_latency(&mut self, bucket: usize, n: u64) {
        if self.latency.len() <= LATENCY_BOUNDS_MS.len() {
            self.latency.resize(LATENCY_BOUNDS_MS.len() + 1, 0);
        }
        let i = bucket.min(LATENCY_BOUNDS_MS.len());
        self.latency[i] += n;
    }

    /// The `q` quantile (0 to 1) of the minute's latencies, as the upper bound of the
    /// bucket it falls in, in ms (`None` without Processed orders; the slowest bucket
    /// answers its lower bound).
    pub fn latency_quantile(&self, q: f64) -> Option<u64> {
        let total: u64 = self.latency.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, n) in self.latency.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Some(
                    LATENCY_BOUNDS_MS
                        .get(i)
                        .copied()
                        .unwrap_or(LATENCY_BOUNDS_MS[LATENCY_BOUNDS_MS.len() - 1]),
                );
            }
        }
        None
    }
}

/// The SQL expression of the bucket of a latency given in milliseconds by `ms`.
pub fn bucket_sql(ms: &str) -> String {
    let mut sql = String::from("CASE");
    for (i, bound) in LATENCY_BOUNDS_MS.iter().enumerate() {
        sql.push_str(&format!(" WHEN {ms} < {bound} THEN {i}"));
    }
    sql.push_str(&format!(" ELSE {} END", LATENCY_BOUNDS_MS.len()));
    sql
}

/// The start of the minute `t` falls in.
pub fn minute_of(t: DateTime<Utc>) -> DateTime<Utc> {
    t.duration_trunc(Duration::minutes(1)).unwrap_or(t)
}

/// `minutes` consecutive minutes ending with the one `now` falls in, each filled from
/// `known` where it has that minute and empty otherwise: a chart's x axis.
pub fn last_minutes(
    known: &[MinuteActivity],
    now: DateTime<Utc>,
    minutes: u32,
) -> Vec<MinuteActivity> {
    let last = minute_of(now);
    (0..i64::from(minutes))
        .rev()
        .map(|back| {
            let m = last - Duration::minutes(back);
            known
                .iter()
                .find(|a| a.minute == m)
                .cloned()
                .unwrap_or_else(|| MinuteActivity::new(m))
        })
        .collect()
}

/// The span of the operators' charts: the last hour by minute, the last day by quarter
/// hour, the last week by hour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ChartRange {
    /// 60 bins of a minute.
    #[default]
    Hour,
    /// 96 bins of 15 minutes.
    Day,
    /// 168 bins of an hour.
    Week,
}

impl ChartRange {
    /// Every range, shortest first.
    pub const ALL: [ChartRange; 3] = [ChartRange::Hour, ChartRange::Day, ChartRange::Week];

    /// The range written `1h`, `24h` or `7d` (how URLs name it).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.key() == s)
    }

    /// How URLs name it.
    pub fn key(self) -> &'static str {
        match self {
            ChartRange::Hour => "1h",
            ChartRange::Day => "24h",
            ChartRange::Week => "7d",
        }
    }

    /// How many bins it shows.
    pub fn bins(self) -> u32 {
        match self {
            ChartRange::Hour => 60,
            ChartRange::Day => 96,
            ChartRange::Week => 168,
        }
    }

    /// The minutes of one bin.
    pub fn bin_minutes(self) -> u32 {
        match self {
            ChartRange::Hour => 1,
            ChartRange::Day => 15,
            ChartRange::Week => 60,
        }
    }

    /// The start of the first bin shown at `now`: what to read from.
    pub fn start(self, now: DateTime<Utc>) -> DateTime<Utc> {
        self.bin_of(now) - Duration::minutes(i64::from((self.bins() - 1) * self.bin_minutes()))
    }

    /// The start of the bin `t` falls in (bins start on the hour, UTC).
    fn bin_of(self, t: DateTime<Utc>) -> DateTime<Utc> {
        let width = Duration::minutes(i64::from(self.bin_minutes()));
        t.duration_trunc(width).unwrap_or(t)
    }
}

impl MinuteActivity {
    /// Adds `other`'s figures (another minute of the same bin) to this one's.
    pub fn add(&mut self, other: &MinuteActivity) {
        self.processed += other.processed;
        self.error += other.error;
        self.cancelled += other.cancelled;
        self.recoveries += other.recoveries;
        self.dead_letters += other.dead_letters;
        for (bucket, n) in other.latency.iter().enumerate() {
            if *n > 0 {
                self.add_latency(bucket, *n);
            }
        }
    }
}

/// The bins of `range` ending with the one `now` falls in, each the sum of the minutes
/// of `known` in it (its `minute` the bin's start): a chart's x axis.
pub fn last_bins(
    known: &[MinuteActivity],
    now: DateTime<Utc>,
    range: ChartRange,
) -> Vec<MinuteActivity> {
    let start = range.start(now);
    let width = i64::from(range.bin_minutes());
    let mut bins: Vec<MinuteActivity> = (0..i64::from(range.bins()))
        .map(|i| MinuteActivity::new(start + Duration::minutes(i * width)))
        .collect();
    for m in known {
        let i = (m.minute - start).num_minutes().div_euclid(width);
        if let Some(bin) = usize::try_from(i).ok().and_then(|i| bins.get_mut(i)) {
            bin.add(m);
        }
    }
    bins
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn bins_sum_their_minutes_and_start_on_the_hour() {
        let now = Utc.with_ymd_and_hms(2026, 12, 7, 10, 37, 12).unwrap();
        let mut a = MinuteActivity::new(Utc.with_ymd_and_hms(2026, 12, 7, 10, 31, 0).unwrap());
        a.processed = 2;
        a.add_latency(3, 2);
        let mut b = MinuteActivity::new(Utc.with_ymd_and_hms(2026, 12, 7, 10, 44, 0).unwrap());
        b.processed = 1;
        b.error = 4;
        b.add_latency(5, 1);
        let mut old = MinuteActivity::new(Utc.with_ymd_and_hms(2026, 12, 6, 10, 29, 0).unwrap());
        old.cancelled = 9;
        let known = [old.clone(), a, b];

        let day = last_bins(&known, now, ChartRange::Day);
        assert_eq!(day.len(), 96);
        let last = day.last().unwrap();
        assert_eq!(
            last.minute,
            Utc.with_ymd_and_hms(2026, 12, 7, 10, 30, 0).unwrap()
        );
        assert_eq!((last.processed, last.error), (3, 4));
        assert_eq!((last.latency[3], last.latency[5]), (2, 1));
        assert_eq!(
            day[0].minute,
            Utc.with_ymd_and_hms(2026, 12, 6, 10, 45, 0).unwrap()
        );
        assert_eq!(
            day.iter().map(|b| b.cancelled).sum::<u64>(),
            0,
            "before the first bin"
        );

        let week = last_bins(&known, now, ChartRange::Week);
        assert_eq!(week.len(), 168);
        assert_eq!(
            week.last().unwrap().minute,
            Utc.with_ymd_and_hms(2026, 12, 7, 10, 0, 0).unwrap()
        );
        assert_eq!(week.iter().map(|b| b.cancelled).sum::<u64>(), 9);
        assert_eq!(week[167 - 24].cancelled, 9, "a day before, in its hour");

        let hour = last_bins(&known, now, ChartRange::Hour);
        assert_eq!(hour, last_minutes(&known, now, 60), "by minute, as before");
        assert_eq!(ChartRange::parse("24h"), Some(ChartRange::Day));
        assert_eq!(ChartRange::parse("1d"), None);
    }

    #[test]
    fn quantiles_are_read_from_the_histogram_as_bucket_bounds() {
        let mut m = MinuteActivity::new(Utc::now());
        assert_eq!(m.latency_quantile(0.5), None);
        m.add_latency(1, 90); // under 10 ms
        m.add_latency(4, 9); // under 100 ms
        m.add_latency(8, 1); // under 2 s
        assert_eq!(m.latency_quantile(0.5), Some(10));
        assert_eq!(m.latency_quantile(0.95), Some(100));
        assert_eq!(m.latency_quantile(0.99), Some(100));
        assert_eq!(m.latency_quantile(1.0), Some(2_000));
        m.add_latency(99, 1_000);
        assert_eq!(
            m.latency_quantile(0.99),
            Some(3_600_000),
            "the slowest bucket"
        );
    }

    #[test]
    fn the_bucket_expression_names_every_bound() {
        let sql = bucket_sql("x");
        assert!(sql.starts_with("CASE WHEN x < 5 THEN 0"));
        assert!(sql.ends_with("ELSE 16 END"));
    }

    #[test]
    fn a_chart_gets_every_minute_empty_ones_too() {
        let t = |m: u32, s: u32| Utc.with_ymd_and_hms(2026, 11, 24, 10, m, s).unwrap();
        let mut busy = MinuteActivity::new(t(58, 0));
        busy.processed = 7;
        let minutes = last_minutes(&[busy], t(59, 30), 3);
        assert_eq!(
            minutes.iter().map(|m| m.minute).collect::<Vec<_>>(),
            vec![t(57, 0), t(58, 0), t(59, 0)]
        );
        assert_eq!(
            minutes.iter().map(|m| m.processed).collect::<Vec<_>>(),
            vec![0, 7, 0]
        );
    }
}
