use std::time::Duration;

use orderly_core::transport::QueueName;

use crate::wakeups::{CLAIMABLE, QueueSignal, Wakeups};

/// Whether `f` is ready when polled once.
/// Whether `wakeups`' receivers on `queue` are woken by `heard(payload)`.
fn wakes(wakeups: &Wakeups, queue: &str, payload: &str) -> bool {
    let signal = wakeups.of(queue);
    let woken = signal.notify.notified();
    tokio::pin!(woken);
    woken.as_mut().enable();
    wakeups.heard(payload);
    ready(woken)
}

#[test]
fn a_store_ignores_its_own_notifications_and_hears_everyone_elses() {
    let (mine, theirs) = (Wakeups::new(POLL_FOR_TESTS), Wakeups::new(POLL_FOR_TESTS));
    assert!(!wakes(&mine, "replies", &mine.notice("replies")));
    assert!(wakes(&mine, "replies", &theirs.notice("replies")));
    assert!(!wakes(&mine, "orders", &theirs.notice("replies")));
    // An older version's notification names only the queue.
    assert!(wakes(&mine, "replies", "replies"));

    let seen = mine.claims.sent();
    mine.heard(&mine.notice(CLAIMABLE));
    assert_eq!(mine.claims.sent(), seen);
    mine.heard(&theirs.notice(CLAIMABLE));
    assert_eq!(mine.claims.sent(), seen + 1);
    // A lost listener: the claimers look again too, waiting or not.
    mine.wake_all();
    assert_eq!(mine.claims.sent(), seen + 2);
}

fn ready(f: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>) -> bool {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    std::future::Future::poll(f, &mut cx).is_ready()
}

#[test]
fn a_send_wakes_one_waiting_receiver_and_a_lost_listener_wakes_them_all() {
    let wakeups = Wakeups::new(POLL_FOR_TESTS);
    let signal = wakeups.of("replies");
    let (a, b) = (signal.notify.notified(), signal.notify.notified());
    tokio::pin!(a);
    tokio::pin!(b);
    a.as_mut().enable();
    b.as_mut().enable();
    wakeups.wake("replies");
    let (a_woken, b_woken) = (ready(a.as_mut()), ready(b.as_mut()));
    assert!(a_woken != b_woken, "one of the two: {a_woken} {b_woken}");
    wakeups.wake_all();
    assert!(ready(a.as_mut()) && ready(b.as_mut()));
    // With nobody waiting, a send is kept for the next receiver to wait.
    wakeups.wake("replies");
    let c = signal.notify.notified();
    tokio::pin!(c);
    c.as_mut().enable();
    assert!(ready(c.as_mut()));
}

#[test]
fn sends_count_as_answered_only_until_the_next_send() {
    let s = QueueSignal::default();
    assert!(!s.all_answered(), "the first look is always made");
    let before = s.sent();
    s.look_began(before, Duration::from_secs(1));
    assert!(s.all_answered());
    // A send committed after a look began: the look may not have seen it.
    let before = s.sent();
    s.sent_one();
    s.look_began(before, Duration::from_secs(1));
    assert!(!s.all_answered());
    let before = s.sent();
    s.look_began(before, Duration::from_secs(1));
    assert!(s.all_answered());
    // A look that read the count earlier, marking last, does not undo a later one.
    s.look_began(before - 1, Duration::from_secs(1));
    assert!(s.all_answered());
    s.anything();
    assert!(!s.all_answered());
}

/// A store whose receives may skip a look, as while other processes' sends are heard
/// (PostgreSQL's `LISTEN` stands, a SQLite file's watcher runs), on the paused clock;
/// and its queue. Its store clock is injected, so an empty look is followed by a poll
/// interval's quiet, as while nothing is heard: the store is not asked when the next
/// message comes due (that real time is
/// `a_receiver_that_found_nothing_waits_for_a_send_or_the_next_message_due`).
async fn hearing_store() -> (crate::SqliteStore, QueueName) {
    let (store, _clock) = crate::testing::sqlite_at(chrono::Utc::now()).await;
    store
        .wakeups
        .hearing
        .store(true, std::sync::atomic::Ordering::Release);
    tokio::time::pause();
    (store, QueueName::parse("replies").unwrap())
}

/// Drives `f` for `d` of the (paused) clock; whether it finished.
async fn drive<F: std::future::Future>(f: std::pin::Pin<&mut F>, d: Duration) -> bool {
    tokio::select! {
        biased;
        _ = f => true,
        _ = tokio::time::sleep(d) => false,
    }
}

/// Two receivers of one queue: one that comes back while the other's look runs does
/// not look beside it (it would find that look's messages locked: a statement for
/// nothing), but waits; and a look that fails wakes it at once, not at its poll.
#[tokio::test]
async fn a_receiver_back_while_a_look_runs_waits_and_a_failed_look_wakes_it() {
    let (store, queue) = hearing_store().await;
    let wait = Duration::from_secs(60);
    let (a_looks, b_looks) = (
        std::sync::atomic::AtomicUsize::new(0),
        std::sync::atomic::AtomicUsize::new(0),
    );
    let release = tokio::sync::Semaphore::new(0);
    let a = store.until_found(&queue, wait, || async {
        a_looks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let _ = release.acquire().await;
        Err::<Option<((), bool)>, &str>("the connection was lost")
    });
    let b = store.until_found(&queue, wait, || async {
        b_looks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok::<_, &str>(Some(((), true)))
    });
    tokio::pin!(a);
    tokio::pin!(b);
    assert!(!drive(a.as_mut(), Duration::from_millis(1)).await);
    assert_eq!(a_looks.load(std::sync::atomic::Ordering::Relaxed), 1);

    // B comes back while A's look runs: no look of its own, however long A takes
    // (short of B's poll).
    assert!(!drive(b.as_mut(), POLL / 2).await);
    assert_eq!(b_looks.load(std::sync::atomic::Ordering::Relaxed), 0);

    // A's look fails: B looks at once.
    release.add_permits(1);
    assert!(drive(a.as_mut(), Duration::from_millis(1)).await);
    let started = tokio::time::Instant::now();
    assert!(drive(b.as_mut(), POLL).await);
    assert_eq!(b_looks.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert!(started.elapsed() < POLL / 10, "{:?}", started.elapsed());
}

/// A waiting receiver woken for a send that another receiver's look, begun after
/// it, answers does not look too (it would find that look's messages locked); the
/// next send it is woken for, it looks.
#[tokio::test]
async fn a_receiver_woken_for_a_send_a_later_look_answers_waits_for_the_next() {
    let (store, queue) = hearing_store().await;
    let wait = Duration::from_secs(60);
    let b_looks = std::sync::atomic::AtomicUsize::new(0);
    let b = store.until_found(&queue, wait, || async {
        let n = b_looks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok::<_, &str>((n > 0).then_some(((), true)))
    });
    tokio::pin!(b);
    // B looks, finds nothing, and waits.
    assert!(!drive(b.as_mut(), Duration::from_millis(1)).await);
    assert_eq!(b_looks.load(std::sync::atomic::Ordering::Relaxed), 1);

    // A send wakes B; before B runs, A begins a look, which answers it.
    store.wakeups.wake(queue.as_str());
    let release = tokio::sync::Semaphore::new(0);
    let a = store.until_found(&queue, wait, || async {
        let _ = release.acquire().await;
        Ok::<_, &str>(Some(((), true)))
    });
    tokio::pin!(a);
    assert!(!drive(a.as_mut(), Duration::from_millis(1)).await);
    assert!(!drive(b.as_mut(), POLL / 2).await);
    assert_eq!(b_looks.load(std::sync::atomic::Ordering::Relaxed), 1);
    release.add_permits(1);
    assert!(drive(a.as_mut(), Duration::from_millis(1)).await);

    // The next send: B looks at once.
    store.wakeups.wake(queue.as_str());
    let started = tokio::time::Instant::now();
    assert!(drive(b.as_mut(), POLL).await);
    assert_eq!(b_looks.load(std::sync::atomic::Ordering::Relaxed), 2);
    assert!(started.elapsed() < POLL / 10, "{:?}", started.elapsed());
}

/// The SQLite store's fallback poll (the test's store is one).
const POLL: Duration = Duration::from_millis(200);

const POLL_FOR_TESTS: Duration = Duration::from_secs(1);

/// An idle queue costs one look a poll interval however many receivers wait on it and
/// however short their waits: a receive whose wait ends, with nothing sent since a
/// look of the queue began within the poll interval, ends with no look of its own. A
/// message that comes back without a send (a lock that ran out) is still found by the
/// next poll, and a send is still taken at once.
#[tokio::test]
async fn idle_receivers_with_short_waits_share_one_look_a_poll_interval() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let (store, queue) = hearing_store().await;
    let looks = AtomicUsize::new(0);
    let back = AtomicBool::new(false);
    let found = AtomicUsize::new(0);
    let receiver = || async {
        loop {
            let got = store
                .until_found(&queue, Duration::from_millis(50), || async {
                    looks.fetch_add(1, Ordering::Relaxed);
                    Ok::<_, &str>(back.swap(false, Ordering::AcqRel).then_some(((), true)))
                })
                .await
                .unwrap();
            if got.is_some() {
                found.fetch_add(1, Ordering::Relaxed);
            }
            tokio::task::yield_now().await;
        }
    };
    let (a, b) = (receiver(), receiver());
    tokio::pin!(a);
    tokio::pin!(b);
    let both = async { tokio::join!(a.as_mut(), b.as_mut()) };
    tokio::pin!(both);
    // Ten poll intervals idle: two receivers with 50 ms waits would look 80 times.
    assert!(!drive(both.as_mut(), POLL * 10).await);
    let idle = looks.load(Ordering::Relaxed);
    assert!(
        (9..=12).contains(&idle),
        "{idle} looks in ten poll intervals"
    );

    // A message comes back without a send: found within a poll interval.
    back.store(true, Ordering::Release);
    let started = tokio::time::Instant::now();
    while found.load(Ordering::Relaxed) == 0 {
        assert!(!drive(both.as_mut(), Duration::from_millis(10)).await);
        assert!(
            started.elapsed() <= POLL + Duration::from_millis(60),
            "not found by the poll"
        );
    }

    // A send: taken at once.
    let seen = looks.load(Ordering::Relaxed);
    back.store(true, Ordering::Release);
    store.wakeups.wake(queue.as_str());
    assert!(!drive(both.as_mut(), Duration::from_millis(1)).await);
    assert_eq!(found.load(Ordering::Relaxed), 2);
    assert_eq!(looks.load(Ordering::Relaxed), seen + 1);
}

/// While other processes' sends are heard, a receiver that found nothing waits for a
/// send or for the next message due by the clock (a scheduled time, a lock that runs
/// out), at most the safety poll: an idle queue is not looked at every poll interval.
#[tokio::test]
async fn a_receiver_that_found_nothing_waits_for_a_send_or_the_next_message_due() {
    use orderly_core::transport::{OutgoingMessage, QueueSettings, Transport};
    let store = crate::SqliteStore::open("sqlite::memory:", orderly_core::TimeSource::Database)
        .await
        .unwrap();
    store
        .wakeups
        .hearing
        .store(true, std::sync::atomic::Ordering::Release);
    let queue = QueueName::parse("replies").unwrap();
    store
        .declare_queue(&queue, &QueueSettings::default())
        .await
        .unwrap();
    let signal = store.wakeups.of(queue.as_str());

    // Empty: after its look, none is needed for the safety poll but for a send.
    let none = store
        .receive(&queue, 10, Duration::from_millis(300))
        .await
        .unwrap();
    assert!(none.is_empty());
    let quiet = signal.quiet_left().expect("a look was made");
    assert!(
        quiet > crate::wakeups::QUEUE_SAFETY_POLL - Duration::from_secs(2),
        "quiet for {quiet:?} only"
    );

    // A message scheduled 700 ms ahead: its send wakes the receiver, which finds it
    // not yet visible and waits until it is, not for the safety poll.
    let mut scheduled = OutgoingMessage::new("later", b"x".to_vec());
    scheduled.scheduled_enqueue_time =
        Some(chrono::Utc::now() + chrono::Duration::milliseconds(700));
    store.send(&queue, &[scheduled]).await.unwrap();
    let started = std::time::Instant::now();
    let got = store
        .receive(&queue, 10, Duration::from_secs(10))
        .await
        .unwrap();
    let waited = started.elapsed();
    assert_eq!(got.len(), 1);
    assert!(
        (Duration::from_millis(500)..Duration::from_secs(3)).contains(&waited),
        "received after {waited:?}"
    );

    // Busy (a look found something within a poll interval): a look that finds nothing
    // (woken by a send scheduled far ahead) is not followed by the question of what comes due, only a poll interval's quiet;
    // once no look found anything for a poll interval, it is asked again.
    store.complete(&got[0]).await.unwrap();
    let mut far = OutgoingMessage::new("far", b"x".to_vec());
    far.scheduled_enqueue_time = Some(chrono::Utc::now() + chrono::Duration::seconds(30));
    store.send(&queue, &[far]).await.unwrap();
    let none = store
        .receive(&queue, 10, Duration::from_millis(50))
        .await
        .unwrap();
    assert!(none.is_empty());
    let quiet = signal.quiet_left().expect("a look was made");
    assert!(
        quiet <= store.wakeups.poll,
        "quiet for {quiet:?} while busy"
    );
    assert!(!signal.idle_for(store.wakeups.poll));
    tokio::time::sleep(store.wakeups.poll).await;
    let none = store
        .receive(&queue, 10, Duration::from_millis(100))
        .await
        .unwrap();
    assert!(none.is_empty());
    let quiet = signal.quiet_left().expect("a look was made");
    assert!(
        quiet > crate::wakeups::QUEUE_SAFETY_POLL - Duration::from_secs(2),
        "quiet for {quiet:?} only once idle"
    );
}
