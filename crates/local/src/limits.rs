//! The work per order a bench phase may do: limits on counters that do not move with
//! the machine (rows written, log written, transactions), kept in the repository
//! (`crates/local/bench-limits.toml`) and checked by `orderly-local bench --limits` in
//! the test command, so a change that adds work per order fails with the figure, while
//! timings stay in benchmarks only.
//!
//! The file holds one table per store and phase, each a figure and its upper limit:
//!
//! ```toml
//! [postgres.low]
//! rows_per_order = 44.5
//! ```
//!
//! Stores are `sqlite` and `postgres`; phases `burst` and `low` (the low-load phase at
//! 100 orders/s, whose batches are the smallest, so its costs per order the highest);
//! figures those of [`FIGURES`]. An unknown store, phase or figure is an error, so a
//! misspelt limit cannot pass unchecked, and so is a limit on a figure the phase did
//! not measure.

use std::collections::BTreeMap;

/// The figures a limit may name, and what each is.
pub const FIGURES: &[(&str, &str)] = &[
    (
        "write_transactions_per_order",
        "write transactions the store began (its own count)",
    ),
    (
        "server_transactions_per_order",
        "transactions the PostgreSQL server committed, reads included",
    ),
    (
        "log_bytes_per_order",
        "bytes of write-ahead log the PostgreSQL server wrote (a counters run: the database's own, read from the log where it can be)",
    ),
    (
        "log_records_per_order",
        "write-ahead log records the PostgreSQL server wrote (a counters run: the database's own, read from the log where it can be)",
    ),
    (
        "vacuum_log_records_per_order",
        "write-ahead log records vacuuming the database wrote after the phase (a counters run on PostgreSQL)",
    ),
    (
        "rows_per_order",
        "rows written (inserted, updated, deleted) in every table",
    ),
    (
        "statements_per_order",
        "statements the roles sent, transaction control included (a counters run)",
    ),
    (
        "round_trips_per_order",
        "waits for the database: PostgreSQL's on the wire, SQLite's hand-offs to a connection's thread (a counters run)",
    ),
    (
        "commits_per_order",
        "commits: PostgreSQL's COMMITs on the wire (a counters run), SQLite's write transactions committed",
    ),
];

const STORES: &[&str] = &["sqlite", "postgres"];
const PHASES: &[&str] = &["burst", "low"];

/// Upper limits by store, phase and figure.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Limits(BTreeMap<(String, String), BTreeMap<String, f64>>);

impl Limits {
    /// Reads limits from the text of a limits file; the error names what is wrong.
    pub fn parse(text: &str) -> Result<Self, String> {
        let doc: toml::Table = text.parse().map_err(|e| format!("not TOML: {e}"))?;
        let mut limits = BTreeMap::new();
        for (store, phases) in doc {
            if !STORES.contains(&store.as_str()) {
                return Err(format!("unknown store [{store}] (one of {STORES:?})"));
            }
            let phases = phases
                .as_table()
                .ok_or_else(|| format!("[{store}] is not a table of phases"))?;
            for (phase, figures) in phases {
                if !PHASES.contains(&phase.as_str()) {
                    return Err(format!(
                        "unknown phase [{store}.{phase}] (one of {PHASES:?})"
                    ));
                }
                let figures = figures
                    .as_table()
                    .ok_or_else(|| format!("[{store}.{phase}] is not a table of figures"))?;
                let mut each = BTreeMap::new();
                for (figure, limit) in figures {
                    if !FIGURES.iter().any(|(name, _)| name == figure) {
                        return Err(format!("unknown figure {store}.{phase}.{figure}"));
                    }
                    let limit = limit
                        .as_float()
                        .or_else(|| limit.as_integer().map(|i| i as f64))
                        .filter(|l| l.is_finite() && *l >= 0.0)
                        .ok_or_else(|| {
                            format!("{store}.{phase}.{figure} is not a number of at least 0")
                        })?;
                    each.insert(figure.clone(), limit);
                }
                limits.insert((store.clone(), phase.clone()), each);
            }
        }
        Ok(Self(limits))
    }

    /// Checks the figures a phase measured against its limits: the figures over their
    /// limit, or a limit whose figure the phase did not measure, one line each.
    pub fn check(&self, store: &str, phase: &str, measured: &BTreeMap<&str, f64>) -> Vec<String> {
        let Some(limits) = self.0.get(&(store.to_owned(), phase.to_owned())) else {
            return Vec::new();
        };
        limits
            .iter()
            .filter_map(|(figure, limit)| match measured.get(figure.as_str()) {
                None => Some(format!(
                    "{store}.{phase}.{figure}: not measured by this run, yet limited to {limit}"
                )),
                Some(value) if value > limit => Some(format!(
                    "{store}.{phase}.{figure} = {value:.2}, over its limit of {limit} \
                     (crates/local/bench-limits.toml): this change does more work per order"
                )),
                Some(_) => None,
            })
            .collect()
    }

    /// Whether any limit concerns `store`.
    pub fn covers(&self, store: &str) -> bool {
        self.0.keys().any(|(s, _)| s == store)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_figure_over_its_limit_is_named_with_its_value_and_limit() {
        let limits =
            Limits::parse("[postgres.low]\nrows_per_order = 44.5\nlog_bytes_per_order = 19000\n")
                .unwrap();
        let ok = BTreeMap::from([("rows_per_order", 44.0), ("log_bytes_per_order", 17_500.0)]);
        assert!(limits.check("postgres", "low", &ok).is_empty());
        let more = BTreeMap::from([("rows_per_order", 45.0), ("log_bytes_per_order", 17_500.0)]);
        let over = limits.check("postgres", "low", &more);
        assert_eq!(over.len(), 1, "{over:?}");
        assert!(
            over[0].contains("postgres.low.rows_per_order = 45.00")
                && over[0].contains("limit of 44.5"),
            "{}",
            over[0]
        );
        assert!(
            limits.check("sqlite", "low", &more).is_empty(),
            "no limits there"
        );
    }

    #[test]
    fn a_limit_on_a_figure_the_run_did_not_measure_fails() {
        let limits = Limits::parse("[sqlite.burst]\nwrite_transactions_per_order = 1\n").unwrap();
        let missing = limits.check("sqlite", "burst", &BTreeMap::new());
        assert_eq!(missing.len(), 1);
        assert!(missing[0].contains("not measured"), "{}", missing[0]);
    }

    #[test]
    fn unknown_stores_phases_figures_and_bad_numbers_are_refused_by_name() {
        for (text, names) in [
            ("[mysql.low]\nrows_per_order = 1", "[mysql]"),
            ("[postgres.paced]\nrows_per_order = 1", "postgres.paced"),
            (
                "[postgres.low]\nrow_per_order = 1",
                "postgres.low.row_per_order",
            ),
            (
                "[postgres.low]\nrows_per_order = -1",
                "postgres.low.rows_per_order",
            ),
            (
                "[postgres.low]\nrows_per_order = \"44\"",
                "postgres.low.rows_per_order",
            ),
            ("[postgres]\nlow = 3", "[postgres.low]"),
            ("not toml =", "not TOML"),
        ] {
            let e = Limits::parse(text).unwrap_err();
            assert!(e.contains(names), "{text:?}: {e}");
        }
    }

    #[test]
    fn the_limits_kept_in_the_repository_parse_and_cover_both_stores() {
        let limits = Limits::parse(include_str!("../bench-limits.toml")).unwrap();
        assert!(limits.covers("sqlite") && limits.covers("postgres"));
    }
}
