//! The overview's charts of the last hour, drawn as SVG on the server: orders finished
//! per minute by outcome, submit-to-Processed latency percentiles, recoveries and dead
//! letters. The minutes come from the store's per-minute counts; minutes that are over
//! are kept here, so a refresh asks the database only for the last two.

use std::sync::Mutex;

use chrono::{DateTime, Duration, Utc};
use orderly_core::activity::{ChartRange, MinuteActivity, last_bins, last_minutes, minute_of};
use orderly_core::store::StateStore;

use maud::{Markup, html};

/// Minutes shown.
pub(super) const MINUTES: u32 = 60;

/// Minutes already counted, by start.
#[derive(Debug, Default)]
pub(super) struct ActivityCache {
    minutes: Mutex<Vec<MinuteActivity>>,
}

impl ActivityCache {
    /// The last hour, minute by minute, reading from the store only what may still
    /// change (the last two minutes) once the rest is known.
    pub(super) async fn hour(
        &self,
        store: &dyn StateStore,
        now: DateTime<Utc>,
    ) -> orderly_core::Result<Vec<MinuteActivity>> {
        let start = minute_of(now) - Duration::minutes(i64::from(MINUTES) - 1);
        let known_until = {
            let cached = self.lock();
            cached.last().map(|m| m.minute)
        };
        // A minute is settled once the next one has begun for a while: re-read the last
        // two so commits that straddled a minute's end are counted.
        let since = match known_until {
            Some(last) if last >= start => (last - Duration::minutes(1)).max(start),
            _ => start,
        };
        let fresh = store.activity(since).await?;
        let mut cached = self.lock();
        cached.retain(|m| m.minute >= start && m.minute < since);
        cached.extend(fresh);
        cached.sort_by_key(|m| m.minute);
        Ok(last_minutes(&cached, now, MINUTES))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<MinuteActivity>> {
        self.minutes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

const W: f64 = 600.0;
const H: f64 = 150.0;
const LEFT: f64 = 44.0;
const BOTTOM: f64 = 18.0;

/// A round upper bound for an axis showing values up to `max`.
fn nice(max: f64) -> f64 {
    if max <= 0.0 {
        return 1.0;
    }
    let mag = 10f64.powf(max.log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if max <= m * mag {
            return m * mag;
        }
    }
    10.0 * mag
}

/// How a range's bins are labelled: every how many bins, and the time's format on the
/// axis and when a bar is pointed at.
fn labels(range: ChartRange) -> (usize, &'static str, &'static str) {
    match range {
        ChartRange::Hour => (10, "%H:%M", "%H:%M"),
        ChartRange::Day => (16, "%H:%M", "%a %H:%M"),
        ChartRange::Week => (24, "%a %d", "%a %d %H:00"),
    }
}

/// The frame: axes, the top value, and time labels along the bottom.
fn frame(minutes: &[MinuteActivity], range: ChartRange, top: &str) -> Markup {
    let (every, axis, _) = labels(range);
    let plot_h = H - BOTTOM;
    let x = LEFT - 4.0;
    let step = (W - LEFT) / minutes.len().max(1) as f64;
    html! {
        line x1=(LEFT) y1=(plot_h) x2=(W) y2=(plot_h) stroke="#cbd5e1" {}
        line x1=(LEFT) y1="0" x2=(LEFT) y2=(plot_h) stroke="#cbd5e1" {}
        text x=(x) y="10" font-size="10" text-anchor="end" fill="#6b7280" { (top) }
        text x=(x) y=(plot_h) font-size="10" text-anchor="end" fill="#6b7280" { "0" }
        @for (i, m) in minutes.iter().enumerate() {
            @if i % every == 0 {
                text x=(f1(LEFT + i as f64 * step)) y=(H - 4.0) font-size="10" fill="#6b7280" {
                    (m.minute.format(axis))
                }
            }
        }
    }
}

/// A coordinate, to a tenth.
fn f1(v: f64) -> String {
    format!("{v:.1}")
}

/// A latency axis' top value: in ms below a second, else in seconds (the label has
/// room for five characters).
fn duration_label(ms: f64) -> String {
    if ms >= 1_000.0 {
        format!("{} s", format_value(ms / 1_000.0))
    } else {
        format!("{} ms", format_value(ms))
    }
}

fn format_value(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else {
        format!("{v:.0}")
    }
}

/// A series of a bar chart: its name (the bars' class), colour, and value per minute.
type Series<'a> = (&'a str, &'a str, fn(&MinuteActivity) -> u64);

/// Stacked bars: each series' value per bin, in its colour; each bar says its figures
/// when pointed at.
fn bars(
    id: &str,
    title: &str,
    minutes: &[MinuteActivity],
    range: ChartRange,
    series: &[Series<'_>],
) -> Markup {
    let (_, _, tip_time) = labels(range);
    let max = minutes
        .iter()
        .map(|m| series.iter().map(|(_, _, f)| f(m)).sum::<u64>())
        .max()
        .unwrap_or(0);
    let top = nice(max as f64);
    let plot_h = H - BOTTOM;
    let step = (W - LEFT) / minutes.len().max(1) as f64;
    let stacked = |m: &MinuteActivity| {
        let mut y = plot_h;
        series
            .iter()
            .filter(|(_, _, f)| f(m) > 0)
            .map(|(name, colour, f)| {
                let h = f(m) as f64 / top * plot_h;
                y -= h;
                (*name, *colour, y, h)
            })
            .collect::<Vec<_>>()
    };
    html! {
        svg id=(id) viewBox={"0 0 " (W) " " (H)} role="img" aria-label=(title) {
            (frame(minutes, range, &format_value(top)))
            @for (i, m) in minutes.iter().enumerate() {
                @let tip = series
                    .iter()
                    .map(|(name, _, f)| format!("{name} {}", f(m)))
                    .collect::<Vec<_>>()
                    .join(", ");
                @for (name, colour, y, h) in stacked(m) {
                    rect class=(name) x=(f1(LEFT + i as f64 * step + 0.5)) y=(f1(y))
                        width=(f1((step - 1.0).max(0.5))) height=(f1(h)) fill=(colour) {
                        title { (m.minute.format(tip_time)) " " (tip) }
                    }
                }
            }
        }
    }
}

/// Lines of the latency percentiles per bin (bins without Processed orders are gaps).
fn latency(minutes: &[MinuteActivity], range: ChartRange) -> Markup {
    let (_, _, tip_time) = labels(range);
    let lines: [(&str, &str, f64); 3] = [
        ("p50", "#15803d", 0.5),
        ("p95", "#d97706", 0.95),
        ("p99", "#b91c1c", 0.99),
    ];
    let max = minutes
        .iter()
        .filter_map(|m| m.latency_quantile(0.99))
        .max()
        .unwrap_or(0);
    let top = nice(max as f64);
    let plot_h = H - BOTTOM;
    let step = (W - LEFT) / minutes.len().max(1) as f64;
    // Per line, its points (minute, x, y, milliseconds) and the path through them.
    let points = |q: f64| -> Vec<Option<(&MinuteActivity, f64, f64, u64)>> {
        minutes
            .iter()
            .enumerate()
            .map(|(i, m)| {
                m.latency_quantile(q).map(|ms| {
                    let x = LEFT + (i as f64 + 0.5) * step;
                    (m, x, plot_h - ms as f64 / top * plot_h, ms)
                })
            })
            .collect()
    };
    let path = |points: &[Option<(&MinuteActivity, f64, f64, u64)>]| {
        let mut d = String::new();
        let mut pen_up = true;
        for p in points {
            match p {
                Some((_, x, y, _)) => {
                    d.push_str(&format!("{}{x:.1},{y:.1} ", if pen_up { "M" } else { "L" }));
                    pen_up = false;
                }
                None => pen_up = true,
            }
        }
        d
    };
    html! {
        svg id="chart-latency" viewBox={"0 0 " (W) " " (H)} role="img" aria-label="submit to Processed latency" {
            (frame(minutes, range, &duration_label(top)))
            @for (name, colour, q) in lines {
                @let points = points(q);
                @for (m, x, y, ms) in points.iter().flatten() {
                    circle class=(name) cx=(f1(*x)) cy=(f1(*y)) r="1.8" fill=(colour) {
                        title { (m.minute.format(tip_time)) " " (name) " under " (ms) " ms" }
                    }
                }
                @let d = path(&points);
                @if !d.is_empty() {
                    path class=(name) d=(d) fill="none" stroke=(colour) stroke-width="1.5" {}
                }
            }
        }
    }
}

fn legend(items: &[(&str, &str)]) -> Markup {
    html! {
        div.legend {
            @for (label, colour) in items {
                span { i style={"background:" (colour)} {} (label) }
            }
        }
    }
}

/// What a range's bin and span are called.
fn words(range: ChartRange) -> (&'static str, &'static str) {
    match range {
        ChartRange::Hour => ("minute", "hour"),
        ChartRange::Day => ("15 minutes", "24 hours"),
        ChartRange::Week => ("hour", "7 days"),
    }
}

/// The bins of `range` at `now`: the last hour from the cache of minutes, a day or a
/// week read from the store (its tallies of finished orders, then the rows since).
pub(super) async fn bins(
    cache: &ActivityCache,
    store: &dyn StateStore,
    range: ChartRange,
    now: DateTime<Utc>,
) -> orderly_core::Result<Vec<MinuteActivity>> {
    match range {
        ChartRange::Hour => cache.hour(store, now).await,
        _ => Ok(last_bins(
            &store.activity(range.start(now)).await?,
            now,
            range,
        )),
    }
}

/// The three charts as HTML (what `/charts` answers and the overview embeds), with the
/// links to the other ranges.
pub(super) fn render(minutes: &[MinuteActivity], range: ChartRange) -> Markup {
    let (bin, span) = words(range);
    let finished = bars(
        "chart-finished",
        &format!("orders finished per {bin} by outcome"),
        minutes,
        range,
        &[
            ("processed", "#15803d", |m| m.processed),
            ("error", "#b91c1c", |m| m.error),
            ("cancelled", "#6b7280", |m| m.cancelled),
        ],
    );
    let trouble = bars(
        "chart-trouble",
        &format!("recoveries and dead letters per {bin}"),
        minutes,
        range,
        &[
            ("recoveries", "#d97706", |m| m.recoveries),
            ("dead-letters", "#7c3aed", |m| m.dead_letters),
        ],
    );
    let total: u64 = minutes
        .iter()
        .map(|m| m.processed + m.error + m.cancelled)
        .sum();
    html! {
        p.ranges #chart-ranges {
            "Charts of the last "
            @for (i, r) in ChartRange::ALL.into_iter().enumerate() {
                @if i > 0 { " · " }
                @if r == range {
                    strong { (words(r).1) }
                } @else {
                    a href={"/?range=" (r.key())} { (words(r).1) }
                }
            }
        }
        div class="grid charts" {
            div class="card chart" {
                h2 { "Finished per " (bin) " " span.muted { "(" (total) " in the last " (span) ")" } }
                (finished)
                (legend(&[("Processed", "#15803d"), ("Error", "#b91c1c"), ("Cancelled", "#6b7280")]))
            }
            div class="card chart" {
                h2 { "Submit to Processed latency" }
                (latency(minutes, range))
                (legend(&[("p50", "#15803d"), ("p95", "#d97706"), ("p99", "#b91c1c")]))
            }
            div class="card chart" {
                h2 { "Recoveries and dead letters" }
                (trouble)
                (legend(&[("recovered or given up", "#d97706"), ("dead-lettered", "#7c3aed")]))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn bars_are_drawn_for_the_minutes_with_orders_and_say_their_figures() {
        let now = Utc.with_ymd_and_hms(2026, 11, 24, 10, 30, 20).unwrap();
        let mut busy = MinuteActivity::new(minute_of(now));
        busy.processed = 40;
        busy.error = 2;
        busy.add_latency(3, 40);
        let minutes = last_minutes(&[busy], now, MINUTES);
        let html = render(&minutes, ChartRange::Hour).into_string();
        assert_eq!(html.matches("<rect class=\"processed\"").count(), 1);
        assert_eq!(html.matches("<rect class=\"error\"").count(), 1);
        assert!(
            html.contains("processed 40, error 2, cancelled 0"),
            "{html}"
        );
        assert!(html.contains("(42 in the last hour)"));
        assert!(html.contains("<circle class=\"p99\""), "latency drawn");
        assert!(html.contains(">09:31<"), "minutes labelled");
        assert!(
            html.contains("href=\"/?range=24h\""),
            "the other ranges linked"
        );
    }

    #[test]
    fn a_week_is_drawn_by_hour_and_labelled_by_day() {
        let now = Utc.with_ymd_and_hms(2026, 11, 24, 10, 30, 20).unwrap();
        let mut busy = MinuteActivity::new(Utc.with_ymd_and_hms(2026, 11, 20, 7, 12, 0).unwrap());
        busy.cancelled = 5;
        let mut later = MinuteActivity::new(Utc.with_ymd_and_hms(2026, 11, 20, 7, 48, 0).unwrap());
        later.cancelled = 2;
        let bins = last_bins(&[busy, later], now, ChartRange::Week);
        let html = render(&bins, ChartRange::Week).into_string();
        assert_eq!(
            html.matches("<rect class=\"cancelled\"").count(),
            1,
            "one bar for the hour"
        );
        assert!(
            html.contains("Fri 20 07:00 processed 0, error 0, cancelled 7"),
            "{html}"
        );
        assert!(html.contains("(7 in the last 7 days)"));
        assert!(html.contains("Finished per hour"));
        assert!(
            html.contains("<strong>7 days</strong>"),
            "the range shown, not linked"
        );
    }

    #[test]
    fn a_latency_axis_of_a_second_or_more_reads_in_seconds() {
        assert_eq!(duration_label(500.0), "500 ms");
        assert_eq!(duration_label(5_000.0), "5 s");
        assert_eq!(duration_label(3_600_000.0), "3600 s");
    }

    #[test]
    fn axes_end_at_round_values() {
        assert_eq!(nice(0.0), 1.0);
        assert_eq!(nice(7.0), 10.0);
        assert_eq!(nice(42.0), 50.0);
        assert_eq!(nice(120.0), 200.0);
    }
}
