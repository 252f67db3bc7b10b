//! The overview's charts of the last hour, drawn as SVG on the server: orders finished
//! per minute by outcome, submit-to-Processed latency percentiles, recoveries and dead
//! letters. The minutes come from the store's per-minute counts; minutes that are over
//! are kept here, so a refresh asks the database only for the last two.

use std::fmt::Write as _;
use std::sync::Mutex;

use chrono::{DateTime, Duration, Utc};
use orderly_core::activity::{MinuteActivity, last_minutes, minute_of};
use orderly_core::store::StateStore;

use super::html::esc;

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

/// The frame: axes, the top value, and minute labels every 10 minutes.
fn frame(out: &mut String, minutes: &[MinuteActivity], top: f64, unit: &str) {
    let plot_h = H - BOTTOM;
    let _ = write!(
        out,
        "<line x1=\"{LEFT}\" y1=\"{plot_h}\" x2=\"{W}\" y2=\"{plot_h}\" stroke=\"#cbd5e1\"/>\
         <line x1=\"{LEFT}\" y1=\"0\" x2=\"{LEFT}\" y2=\"{plot_h}\" stroke=\"#cbd5e1\"/>\
         <text x=\"{x}\" y=\"10\" font-size=\"10\" text-anchor=\"end\" fill=\"#6b7280\">{top}{unit}</text>\
         <text x=\"{x}\" y=\"{plot_h}\" font-size=\"10\" text-anchor=\"end\" fill=\"#6b7280\">0</text>",
        x = LEFT - 4.0,
        top = format_value(top),
    );
    let step = (W - LEFT) / minutes.len().max(1) as f64;
    for (i, m) in minutes.iter().enumerate() {
        if i % 10 == 0 {
            let _ = write!(
                out,
                "<text x=\"{:.1}\" y=\"{}\" font-size=\"10\" fill=\"#6b7280\">{}</text>",
                LEFT + i as f64 * step,
                H - 4.0,
                m.minute.format("%H:%M")
            );
        }
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

/// Stacked bars: each series' value per minute, in its colour; each bar says its
/// figures when pointed at.
fn bars(id: &str, title: &str, minutes: &[MinuteActivity], series: &[Series<'_>]) -> String {
    let max = minutes
        .iter()
        .map(|m| series.iter().map(|(_, _, f)| f(m)).sum::<u64>())
        .max()
        .unwrap_or(0);
    let top = nice(max as f64);
    let plot_h = H - BOTTOM;
    let step = (W - LEFT) / minutes.len().max(1) as f64;
    let mut svg = format!(
        "<svg id=\"{id}\" viewBox=\"0 0 {W} {H}\" role=\"img\" aria-label=\"{t}\">",
        t = esc(title)
    );
    frame(&mut svg, minutes, top, "");
    for (i, m) in minutes.iter().enumerate() {
        let mut y = plot_h;
        let tip: Vec<String> = series
            .iter()
            .map(|(name, _, f)| format!("{name} {}", f(m)))
            .collect();
        for (name, colour, f) in series {
            let v = f(m);
            if v == 0 {
                continue;
            }
            let h = v as f64 / top * plot_h;
            y -= h;
            let _ = write!(
                svg,
                "<rect class=\"{name}\" x=\"{:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{h:.1}\" fill=\"{colour}\">\
                 <title>{} {}</title></rect>",
                LEFT + i as f64 * step + 0.5,
                (step - 1.0).max(0.5),
                m.minute.format("%H:%M"),
                tip.join(", ")
            );
        }
    }
    svg.push_str("</svg>");
    svg
}

/// Lines of the latency percentiles per minute (minutes without Processed orders are
/// gaps).
fn latency(minutes: &[MinuteActivity]) -> String {
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
    let mut svg = format!(
        "<svg id=\"chart-latency\" viewBox=\"0 0 {W} {H}\" role=\"img\" aria-label=\"submit to Processed latency\">"
    );
    frame(&mut svg, minutes, top, " ms");
    for (name, colour, q) in lines {
        let mut path = String::new();
        let mut pen_up = true;
        for (i, m) in minutes.iter().enumerate() {
            match m.latency_quantile(q) {
                Some(ms) => {
                    let x = LEFT + (i as f64 + 0.5) * step;
                    let y = plot_h - ms as f64 / top * plot_h;
                    let _ = write!(path, "{}{x:.1},{y:.1} ", if pen_up { "M" } else { "L" });
                    pen_up = false;
                    let _ = write!(
                        svg,
                        "<circle class=\"{name}\" cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"1.8\" fill=\"{colour}\">\
                         <title>{} {name} under {ms} ms</title></circle>",
                        m.minute.format("%H:%M")
                    );
                }
                None => pen_up = true,
            }
        }
        if !path.is_empty() {
            let _ = write!(
                svg,
                "<path class=\"{name}\" d=\"{path}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\"/>"
            );
        }
    }
    svg.push_str("</svg>");
    svg
}

fn legend(items: &[(&str, &str)]) -> String {
    let mut out = String::from("<div class=legend>");
    for (label, colour) in items {
        let _ = write!(
            out,
            "<span><i style=\"background:{colour}\"></i>{label}</span>"
        );
    }
    out.push_str("</div>");
    out
}

/// The three charts as HTML (what `/charts` answers and the overview embeds).
pub(super) fn render(minutes: &[MinuteActivity]) -> String {
    let finished = bars(
        "chart-finished",
        "orders finished per minute by outcome",
        minutes,
        &[
            ("processed", "#15803d", |m| m.processed),
            ("error", "#b91c1c", |m| m.error),
            ("cancelled", "#6b7280", |m| m.cancelled),
        ],
    );
    let trouble = bars(
        "chart-trouble",
        "recoveries and dead letters per minute",
        minutes,
        &[
            ("recoveries", "#d97706", |m| m.recoveries),
            ("dead-letters", "#7c3aed", |m| m.dead_letters),
        ],
    );
    let total: u64 = minutes
        .iter()
        .map(|m| m.processed + m.error + m.cancelled)
        .sum();
    format!(
        "<div class=\"grid charts\">\
         <div class=\"card chart\"><h2>Finished per minute <span class=muted>({total} in the last hour)</span></h2>{finished}{}</div>\
         <div class=\"card chart\"><h2>Submit to Processed latency</h2>{}{}</div>\
         <div class=\"card chart\"><h2>Recoveries and dead letters</h2>{trouble}{}</div>\
         </div>",
        legend(&[
            ("Processed", "#15803d"),
            ("Error", "#b91c1c"),
            ("Cancelled", "#6b7280")
        ]),
        latency(minutes),
        legend(&[("p50", "#15803d"), ("p95", "#d97706"), ("p99", "#b91c1c")]),
        legend(&[
            ("recovered or given up", "#d97706"),
            ("dead-lettered", "#7c3aed")
        ]),
    )
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
        let html = render(&minutes);
        assert_eq!(html.matches("<rect class=\"processed\"").count(), 1);
        assert_eq!(html.matches("<rect class=\"error\"").count(), 1);
        assert!(
            html.contains("processed 40, error 2, cancelled 0"),
            "{html}"
        );
        assert!(html.contains("(42 in the last hour)"));
        assert!(html.contains("<circle class=\"p99\""), "latency drawn");
        assert!(html.contains(">09:31<"), "minutes labelled");
    }

    #[test]
    fn axes_end_at_round_values() {
        assert_eq!(nice(0.0), 1.0);
        assert_eq!(nice(7.0), 10.0);
        assert_eq!(nice(42.0), 50.0);
        assert_eq!(nice(120.0), 200.0);
    }
}
