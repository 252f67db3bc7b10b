//! Wake-ups inside one process: per-queue signals that a message may be waiting,
//! the claimers' signal that orders became claimable, and the outbox relay's; raised
//! by this process's commits and by other processes' (PostgreSQL's notifications, the
//! SQLite file's watcher). Used by the SQL queue, the claims and the outbox.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

/// One queue's wake-up (or the claimers', where what is sent is claimable orders): a
/// signal that something may be waiting, and a count of the sends heard (this process's
/// commits, other processes' notifications), so a waiter can tell whether anything was
/// sent since it last looked.
#[derive(Debug)]
pub(crate) struct QueueSignal {
    pub(crate) notify: Notify,
    sent: std::sync::atomic::AtomicU64,
    /// `sent` as it was when the latest look began: that look takes everything it can
    /// see or, when it cannot, wakes another receiver.
    answered: std::sync::atomic::AtomicU64,
    /// Until when no look of this process is needed but for a send: a poll interval
    /// after the latest look began or, after one that found nothing while sends are
    /// heard, until the queue's next message comes due by the clock alone (a lock that
    /// runs out, a scheduled time), at most [`QUEUE_SAFETY_POLL`]. Messages that come
    /// back without a send need one look then, not one per receiver.
    quiet_until: Mutex<Option<tokio::time::Instant>>,
    /// When a look of this process last found something: while the queue is busy
    /// (within a poll interval of that), a look that finds nothing does not ask when
    /// the next message comes due (a read on the path between two messages, for a
    /// quiet the next send ends anyway).
    found_at: Mutex<Option<tokio::time::Instant>>,
}

/// The longest an idle queue goes without a look while sends to it are heard and the
/// look before found nothing: a safety net, for a wake-up that was lost or a change by
/// a version that sends none, and the longest a listener that died without a word
/// (its silence is noticed after 30 s) leaves sends unheard. Messages that come back
/// by the clock (a lock that ran out, a scheduled time) are looked for when they come
/// due.
pub(crate) const QUEUE_SAFETY_POLL: Duration = Duration::from_secs(5);

impl Default for QueueSignal {
    fn default() -> Self {
        // `answered` behind `sent`: the first look is always made.
        Self {
            notify: Notify::new(),
            sent: 1.into(),
            answered: 0.into(),
            quiet_until: Mutex::new(None),
            found_at: Mutex::new(None),
        }
    }
}

impl QueueSignal {
    /// Sends heard so far.
    pub(crate) fn sent(&self) -> u64 {
        self.sent.load(std::sync::atomic::Ordering::Acquire)
    }

    /// A look began when `sent` was `before`: no other look is needed for a poll
    /// interval (`poll`) but for a send.
    pub(crate) fn look_began(&self, before: u64, poll: Duration) {
        self.answered
            .fetch_max(before, std::sync::atomic::Ordering::AcqRel);
        self.quiet_until(tokio::time::Instant::now() + poll);
    }

    /// No look is needed until `at` but for a send.
    pub(crate) fn quiet_until(&self, at: tokio::time::Instant) {
        *self
            .quiet_until
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(at);
    }

    /// How long until a look is needed but for a send (zero: now; `None`: no look
    /// was made yet).
    pub(crate) fn quiet_left(&self) -> Option<Duration> {
        self.quiet_until
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .map(|at| at.saturating_duration_since(tokio::time::Instant::now()))
    }

    /// A look found something.
    pub(crate) fn found(&self) {
        *self
            .found_at
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(tokio::time::Instant::now());
    }

    /// No look of this process found anything for `poll` (or ever).
    pub(crate) fn idle_for(&self, poll: Duration) -> bool {
        self.found_at
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .is_none_or(|at| at.elapsed() >= poll)
    }

    /// Nothing was sent since the latest look began.
    pub(crate) fn all_answered(&self) -> bool {
        self.answered.load(std::sync::atomic::Ordering::Acquire) == self.sent()
    }

    /// Something was sent: one waiting receiver is woken (or, with none waiting, the
    /// next to wait goes at once), and every receiver's next look is made.
    pub(crate) fn sent_one(&self) {
        self.sent.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        self.notify.notify_one();
    }

    /// Anything may have been sent: every receiver looks.
    pub(crate) fn anything(&self) {
        self.sent.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        self.notify.notify_waiters();
    }
}

/// Per-queue signals that a message may be waiting.
#[derive(Debug)]
pub(crate) struct Wakeups {
    queues: Mutex<HashMap<String, Arc<QueueSignal>>>,
    /// The fallback poll interval.
    pub poll: Duration,
    /// Whether the cross-process listener was started.
    pub listening: std::sync::atomic::AtomicBool,
    /// Whether other processes' sends are heard now (PostgreSQL, while its `LISTEN`
    /// stands; SQLite, while the file's watcher runs): only then may a receive skip its
    /// first look (`until_found`).
    pub hearing: std::sync::atomic::AtomicBool,
    /// Names this store in its notifications, so its listener ignores its own: this
    /// process's receivers were woken at commit already, and waking them again only
    /// sent them to find nothing (a round trip and a transaction on the server each).
    origin: String,
    /// Sends through this database so far: every [`SWEEP_EVERY`]th also removes
    /// expired duplicate-detection rows (housekeeping, kept off most sends).
    pub sends: std::sync::atomic::AtomicU64,
    /// Orders became claimable: one waiting scheduler is woken, and the count tells a
    /// scheduler that was busy claiming when it happened not to wait for the next one.
    pub claims: QueueSignal,
    /// The services' rows were written (a service went down, is probed or is up
    /// again): every view of them reads them again.
    pub services: QueueSignal,
    /// Signalled after each commit that wrote to the outbox (a permit is kept when no
    /// relay waits, so a write during a relay pass is not missed).
    pub outbox: Notify,
    /// Each queue's settings as last read, and when: every receive and send needs
    /// them, and a statement of its own costs a round trip inside the write lock.
    settings: Mutex<HashMap<String, (Settings, std::time::Instant)>>,
}

/// How long a queue's settings read from the database are used before being read
/// again: a change declared by another process takes effect within this (one
/// declared through this process at once). Queues are declared when roles start, so
/// a read a second (one per queue looked at) was most of an idle deployment's work
/// after the looks themselves.
pub(crate) const SETTINGS_FRESH: Duration = Duration::from_secs(10);

/// How often a send also sweeps expired duplicate-detection rows. Correctness does not
/// depend on it: an expired row counts as absent when the next send checks it.
pub(crate) const SWEEP_EVERY: u64 = 32;

impl Wakeups {
    pub fn new(poll: Duration) -> Self {
        Self {
            queues: Mutex::default(),
            poll,
            listening: false.into(),
            hearing: false.into(),
            origin: uuid::Uuid::new_v4().simple().to_string(),
            sends: 0.into(),
            claims: QueueSignal::default(),
            services: QueueSignal::default(),
            outbox: Notify::new(),
            settings: Mutex::default(),
        }
    }

    /// The settings of `queue` if read less than [`SETTINGS_FRESH`] ago.
    pub(crate) fn cached_settings(&self, queue: &str) -> Option<Settings> {
        let cache = self
            .settings
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        cache
            .get(queue)
            .filter(|(_, read)| read.elapsed() < SETTINGS_FRESH)
            .map(|(settings, _)| *settings)
    }

    pub(crate) fn remember_settings(&self, queue: &str, settings: Option<Settings>) {
        let mut cache = self
            .settings
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match settings {
            Some(s) => {
                cache.insert(queue.to_owned(), (s, std::time::Instant::now()));
            }
            None => {
                cache.remove(queue);
            }
        }
    }

    /// The signal of `queue`.
    pub fn of(&self, queue: &str) -> Arc<QueueSignal> {
        let mut queues = self
            .queues
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        queues.entry(queue.to_owned()).or_default().clone()
    }

    /// The queues receivers of this process waited on so far.
    pub(crate) fn queue_names(&self) -> Vec<String> {
        let queues = self
            .queues
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        queues.keys().cloned().collect()
    }

    /// Messages were sent to `queue`: wakes one waiting receiver. It takes what it can;
    /// one that took a whole batch wakes the next (`until_found`), so a burst is shared
    /// out while a trickle no longer sends every receiver to look and all but one to
    /// find nothing.
    pub fn wake(&self, queue: &str) {
        self.of(queue).sent_one();
    }

    /// Orders became claimable: wakes one waiting scheduler (it claims a whole batch;
    /// the others are not woken to find nothing, and one that was busy sees the count
    /// moved and looks again).
    pub fn wake_claimers(&self) {
        self.claims.sent_one();
    }

    /// The notification that `what` (a queue's name, or [`CLAIMABLE`]) was filled by
    /// this store: `what` and this store's origin, apart by a space (neither holds one).
    pub fn notice(&self, what: &str) -> String {
        format!("{what} {}", self.origin)
    }

    /// The origin this store's notices carry ([`Self::notice`]).
    pub(crate) fn origin(&self) -> &str {
        &self.origin
    }

    /// A notification heard by the listener (see [`Self::notice`]). This store's own
    /// are ignored: its receivers were woken when it committed. One without an origin
    /// (an older version's) wakes as well.
    pub fn heard(&self, payload: &str) {
        let what = match payload.split_once(' ') {
            Some((_, origin)) if origin == self.origin => return,
            Some((what, _)) => what,
            None => payload,
        };
        if what == CLAIMABLE {
            self.wake_claimers();
        } else if what == SERVICES {
            self.services.anything();
        } else {
            self.wake(what);
        }
    }

    /// Other processes' sends are heard from now on (a listener stands): receives may
    /// skip their first look, and what was sent before, every receiver looks for once.
    pub(crate) fn hearing_began(&self) {
        self.hearing
            .store(true, std::sync::atomic::Ordering::Release);
        self.wake_all();
    }

    /// Other processes' sends are no longer heard (the listener was lost): every
    /// receive begins with a look again, and every receiver looks now.
    pub(crate) fn hearing_lost(&self) {
        self.hearing
            .store(false, std::sync::atomic::Ordering::Release);
        self.wake_all();
    }

    /// Wakes every waiting receiver (after a lost listener connection, say).
    pub fn wake_all(&self) {
        let queues = self
            .queues
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        queues.values().for_each(|n| n.anything());
        self.claims.anything();
        self.services.anything();
    }
}

/// The notification that orders became claimable (submitted, released, sent back to
/// Pending): not a queue name (those cannot start with `#`).
pub(crate) const CLAIMABLE: &str = "#claimable";

/// The notification that the services' rows were written.
pub(crate) const SERVICES: &str = "#services";

/// The notification channel for sends (PostgreSQL `NOTIFY`; payload: the queue,
/// [`CLAIMABLE`] or [`SERVICES`]).
pub(crate) const CHANNEL: &str = "orderly_queue_sends";

#[derive(Debug, Clone, Copy)]
/// A queue's settings as the SQL queue reads them (cached by [`Wakeups`]).
pub(crate) struct Settings {
    pub(crate) lock_ms: i64,
    pub(crate) max_deliveries: i32,
    pub(crate) dedup_ms: i64,
}
