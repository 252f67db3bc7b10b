//! How many orders a claim pass may take without counting those the instance holds.
//!
//! Counting them reads every Processing row (all instances', and on PostgreSQL the
//! index entries of rows that have moved on, until a vacuum): at a moderate rate it
//! was a tenth of the database's work, once per claim pass. An upper bound does as
//! well while it leaves a batch of room: it grows by what each pass may claim and
//! shrinks to what it did claim, never by what finishes (that would need to hear of
//! every completion, failure, release and recovery). When it leaves less than a
//! batch, the pass counts and starts the bound again from the count. A pass never
//! claims beyond `max_in_flight`: the bound is never below what is held.

use std::sync::Mutex;

/// An upper bound on the orders held, or unknown.
#[derive(Debug, Default)]
pub(crate) struct Holding {
    bound: Mutex<Option<i64>>,
}

impl Holding {
    /// The room a pass may claim if the bound shows a whole `batch` of it under `max`,
    /// reserved in the bound; `None` if it must count.
    pub(crate) fn reserve(&self, batch: i64, max: i64) -> Option<i64> {
        let mut bound = self.lock();
        match *bound {
            Some(b) if max - b >= batch => {
                *bound = Some(b + batch);
                Some(batch)
            }
            _ => None,
        }
    }

    /// After a count of `held`: the room a pass may claim (at most `batch`, never below
    /// zero), reserved in a bound that starts again from the count. A bound above it
    /// (a pass of its own reserved meanwhile) is kept.
    pub(crate) fn counted(&self, held: i64, batch: i64, max: i64) -> i64 {
        let room = (max - held).clamp(0, batch);
        let mut bound = self.lock();
        *bound = Some(bound.map_or(held + room, |b| b.max(held + room)));
        room
    }

    /// A pass that reserved `reserved` claimed `claimed` of them.
    pub(crate) fn claimed(&self, reserved: i64, claimed: i64) {
        if let Some(b) = self.lock().as_mut() {
            *b -= (reserved - claimed).max(0);
        }
    }

    /// Held orders came from elsewhere (taken back after a restart), or a pass failed
    /// without saying what it claimed: the next pass counts.
    pub(crate) fn forget(&self) {
        *self.lock() = None;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<i64>> {
        self.bound
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_bound_asks_for_a_count() {
        assert_eq!(Holding::default().reserve(10, 100), None);
    }

    #[test]
    fn passes_claim_without_counting_while_a_batch_of_room_is_left() {
        let h = Holding::default();
        assert_eq!(h.counted(0, 10, 35), 10);
        h.claimed(10, 10);
        assert_eq!(h.reserve(10, 35), Some(10));
        h.claimed(10, 4);
        // 14 may be held: 21 of room, two more batches.
        assert_eq!(h.reserve(10, 35), Some(10));
        h.claimed(10, 10);
        assert_eq!(h.reserve(10, 35), Some(10));
        h.claimed(10, 10);
        // 34 may be held: less than a batch of room, so it counts.
        assert_eq!(h.reserve(10, 35), None);
    }

    #[test]
    fn a_count_gives_the_room_left_and_never_less_than_none() {
        let h = Holding::default();
        assert_eq!(h.counted(30, 10, 35), 5);
        h.claimed(5, 5);
        assert_eq!(h.reserve(10, 35), None);
        assert_eq!(h.counted(40, 10, 35), 0);
        // Orders finished meanwhile: the next count finds room again.
        assert_eq!(h.counted(12, 10, 35), 10);
    }

    #[test]
    fn the_bound_never_falls_below_what_may_be_held() {
        let h = Holding::default();
        assert_eq!(h.counted(0, 10, 30), 10);
        // A second pass reserves before the first has said what it claimed.
        assert_eq!(h.reserve(10, 30), Some(10));
        h.claimed(10, 10);
        h.claimed(10, 10);
        // 20 held at most: one more batch, then a count.
        assert_eq!(h.reserve(10, 30), Some(10));
        assert_eq!(h.reserve(10, 30), None);
    }

    #[test]
    fn forgetting_asks_for_a_count_again() {
        let h = Holding::default();
        assert_eq!(h.counted(0, 10, 100), 10);
        h.forget();
        assert_eq!(h.reserve(10, 100), None);
    }
}
