//! What a store did, for benchmarks and operators: writes and transactions begun, and the
//! size of each batch every stage handed to the store (orders submitted at once,
//! orders claimed at once, messages received or settled at once, ...).
//!
//! Counting costs one atomic add per transaction and one short lock per batch, never
//! per order. It is a benchmark's business, so it is built only with the `counters`
//! feature (the local runner's bench turns it on); without it [`Stats`] counts nothing,
//! its calls compile to nothing, and every snapshot is empty.

use std::collections::BTreeMap;

#[cfg(any(test, feature = "counters"))]
pub(crate) use counting::RowWrite;
#[cfg(any(test, feature = "counters"))]
pub use counting::Stats;
#[cfg(not(any(test, feature = "counters")))]
pub use silent::Stats;

/// The batches one stage handed to the store.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Batches {
    /// Batches (calls with at least one item).
    pub calls: u64,
    /// Items in all of them.
    pub items: u64,
    /// The largest batch.
    pub max: u64,
    /// Looks that found nothing to hand over (a receive or a claim that came back
    /// empty): each cost a statement, most of them a round trip, for no work.
    pub empty: u64,
}

impl Batches {
    /// Items per batch on average.
    pub fn mean(&self) -> f64 {
        if self.calls == 0 {
            0.0
        } else {
            self.items as f64 / self.calls as f64
        }
    }
}

/// A copy of the counters at one moment; subtract two to measure a run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Writes begun (committed or not): a unit of work the store did atomically.
    pub writes: u64,
    /// Database transactions begun for them. On PostgreSQL one per write; on SQLite
    /// writes that queue for its one writer share a transaction (group commit).
    pub transactions: u64,
    /// How long this handle held the database's write lock in all (SQLite only: its
    /// writers take turns, so this is the share of time the one writer was busy).
    pub write_held: std::time::Duration,
    /// Of which beginning (SQLite: getting a connection and `BEGIN IMMEDIATE` while
    /// holding this process's turn to write).
    pub beginning: std::time::Duration,
    /// Of which committing (SQLite: writing and syncing the log).
    pub committing: std::time::Duration,
    /// Round trips to the database spent on beginning, savepoints and ending (SQLite
    /// only: each is a hand-off to the connection's thread and back inside the turn).
    pub control_round_trips: u64,
    /// Batches by stage.
    pub batches: BTreeMap<String, Batches>,
    /// Transactions that wrote and committed, as the database counts them (SQLite
    /// only: its commit hook, every connection of this handle; single statements that
    /// write outside a transaction included).
    pub commits: u64,
    /// Rows written, table by table (SQLite only: its update hook, every connection of
    /// this handle; tables without row ids, none of them on an order's path, are not
    /// seen).
    pub rows: BTreeMap<String, RowWrites>,
}

/// Rows one table had written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RowWrites {
    /// Rows inserted.
    pub inserted: u64,
    /// Rows updated.
    pub updated: u64,
    /// Rows deleted.
    pub deleted: u64,
}

impl RowWrites {
    /// Rows written in all.
    pub fn total(&self) -> u64 {
        self.inserted + self.updated + self.deleted
    }
}

impl StatsSnapshot {
    /// What happened between `earlier` and this snapshot. The largest batch is the
    /// largest seen so far (not only in between).
    pub fn since(&self, earlier: &StatsSnapshot) -> StatsSnapshot {
        let batches = self
            .batches
            .iter()
            .map(|(stage, b)| {
                let before = earlier.batches.get(stage).copied().unwrap_or_default();
                (
                    stage.clone(),
                    Batches {
                        calls: b.calls - before.calls,
                        items: b.items - before.items,
                        max: b.max,
                        empty: b.empty - before.empty,
                    },
                )
            })
            .filter(|(_, b)| b.calls > 0 || b.empty > 0)
            .collect();
        StatsSnapshot {
            writes: self.writes - earlier.writes,
            transactions: self.transactions - earlier.transactions,
            write_held: self.write_held.saturating_sub(earlier.write_held),
            beginning: self.beginning.saturating_sub(earlier.beginning),
            committing: self.committing.saturating_sub(earlier.committing),
            control_round_trips: self.control_round_trips - earlier.control_round_trips,
            batches,
            commits: self.commits - earlier.commits,
            rows: self
                .rows
                .iter()
                .map(|(table, r)| {
                    let before = earlier.rows.get(table).copied().unwrap_or_default();
                    (
                        table.clone(),
                        RowWrites {
                            inserted: r.inserted - before.inserted,
                            updated: r.updated - before.updated,
                            deleted: r.deleted - before.deleted,
                        },
                    )
                })
                .filter(|(_, r)| r.total() > 0)
                .collect(),
        }
    }
}

#[cfg(any(test, feature = "counters"))]
mod counting {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::{Batches, RowWrites, StatsSnapshot};

    /// The counters of one store handle.
    #[derive(Debug, Default)]
    pub struct Stats {
        writes: AtomicU64,
        transactions: AtomicU64,
        held_micros: AtomicU64,
        begin_micros: AtomicU64,
        commit_micros: AtomicU64,
        control: AtomicU64,
        batches: Mutex<BTreeMap<String, Batches>>,
        commits: AtomicU64,
        rows: Mutex<BTreeMap<String, RowWrites>>,
    }

    impl Stats {
        /// One write begun.
        pub(crate) fn write(&self) {
            self.writes.fetch_add(1, Ordering::Relaxed);
        }

        /// One database transaction begun for writes.
        pub(crate) fn transaction(&self) {
            self.transactions.fetch_add(1, Ordering::Relaxed);
        }

        /// One write in a database transaction of its own.
        pub(crate) fn write_alone(&self) {
            self.write();
            self.transaction();
        }

        /// The write lock was held for `d`.
        pub(crate) fn held(&self, d: std::time::Duration) {
            self.held_micros
                .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
        }

        /// Beginning a write transaction took `d` (its turn held).
        pub(crate) fn begun(&self, d: std::time::Duration) {
            self.begin_micros
                .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
        }

        /// A commit took `d`.
        pub(crate) fn committed(&self, d: std::time::Duration) {
            self.commit_micros
                .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
        }

        /// One round trip of transaction control (begin, savepoint, commit, rollback).
        pub(crate) fn control(&self) {
            self.control.fetch_add(1, Ordering::Relaxed);
        }

        /// `stage` handed over `items` at once (an empty batch is counted as `empty`, not
        /// as a batch).
        pub(crate) fn batch(&self, stage: &str, items: usize) {
            let items = items as u64;
            let mut batches = self
                .batches
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let b = match batches.get_mut(stage) {
                Some(b) => b,
                None => batches.entry(stage.to_owned()).or_default(),
            };
            if items == 0 {
                b.empty += 1;
                return;
            }
            b.calls += 1;
            b.items += items;
            b.max = b.max.max(items);
        }

        /// A write transaction committed (SQLite's commit hook).
        pub(crate) fn commit(&self) {
            self.commits.fetch_add(1, Ordering::Relaxed);
        }

        /// A row of `table` written (SQLite's update hook): inserted, updated or deleted.
        pub(crate) fn row(&self, table: &str, write: RowWrite) {
            let mut rows = self
                .rows
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let r = match rows.get_mut(table) {
                Some(r) => r,
                None => rows.entry(table.to_owned()).or_default(),
            };
            match write {
                RowWrite::Insert => r.inserted += 1,
                RowWrite::Update => r.updated += 1,
                RowWrite::Delete => r.deleted += 1,
            }
        }

        /// The counters now.
        pub fn snapshot(&self) -> StatsSnapshot {
            StatsSnapshot {
                writes: self.writes.load(Ordering::Relaxed),
                transactions: self.transactions.load(Ordering::Relaxed),
                write_held: std::time::Duration::from_micros(
                    self.held_micros.load(Ordering::Relaxed),
                ),
                beginning: std::time::Duration::from_micros(
                    self.begin_micros.load(Ordering::Relaxed),
                ),
                committing: std::time::Duration::from_micros(
                    self.commit_micros.load(Ordering::Relaxed),
                ),
                control_round_trips: self.control.load(Ordering::Relaxed),
                batches: self
                    .batches
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .clone(),
                commits: self.commits.load(Ordering::Relaxed),
                rows: self
                    .rows
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .clone(),
            }
        }
    }

    /// What a row write was.
    #[derive(Debug, Clone, Copy)]
    pub(crate) enum RowWrite {
        Insert,
        Update,
        Delete,
    }
}

/// [`Stats`] without the `counters` feature: the same calls, counting nothing.
#[cfg(not(any(test, feature = "counters")))]
mod silent {
    use super::StatsSnapshot;

    /// The counters of one store handle, not built: nothing is counted.
    #[derive(Debug, Default)]
    pub struct Stats;

    impl Stats {
        #[inline]
        pub(crate) fn write(&self) {}

        #[inline]
        pub(crate) fn transaction(&self) {}

        #[inline]
        pub(crate) fn write_alone(&self) {}

        #[inline]
        pub(crate) fn held(&self, _: std::time::Duration) {}

        #[inline]
        pub(crate) fn begun(&self, _: std::time::Duration) {}

        #[inline]
        pub(crate) fn committed(&self, _: std::time::Duration) {}

        #[inline]
        pub(crate) fn control(&self) {}

        #[inline]
        pub(crate) fn batch(&self, _: &str, _: usize) {}

        /// Nothing counted: an empty snapshot.
        pub fn snapshot(&self) -> StatsSnapshot {
            StatsSnapshot::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_batches_and_differences() {
        let s = Stats::default();
        s.write();
        s.batch("claim", 3);
        s.batch("claim", 0);
        let first = s.snapshot();
        s.write();
        s.write();
        s.batch("claim", 5);
        s.batch("submit", 64);
        let d = s.snapshot().since(&first);
        assert_eq!(d.writes, 2);
        assert_eq!(
            d.batches["claim"],
            Batches {
                calls: 1,
                items: 5,
                max: 5,
                empty: 0
            }
        );
        assert_eq!(d.batches["submit"].mean(), 64.0);
        assert_eq!(first.batches["claim"].calls, 1, "an empty batch is not one");
        assert_eq!(
            first.batches["claim"].empty, 1,
            "but it is counted as empty"
        );
    }
}
