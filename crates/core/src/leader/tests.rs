//! The elector's state machine on tokio's paused clock, over in-memory doubles of the
//! two ports (a lease service with expiry, and a term counter). The real leases run
//! the conformance suite in `orderly-testkit`.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;

use super::*;
use crate::error::Result;
use crate::id::InstanceId;
use crate::state::Epoch;

/// A lease service: one holder at a time, until its expiry on tokio's clock.
#[derive(Default)]
struct Service {
    state: Mutex<Option<(String, Instant)>>,
    /// Renewals and acquires fail as if the service were down.
    down: AtomicBool,
    releases: AtomicU32,
}

struct MemLease {
    service: Arc<Service>,
    id: String,
    lease: Duration,
}

#[async_trait]
impl Lease for MemLease {
    fn describe(&self) -> String {
        "memory".into()
    }
    async fn try_acquire(&self) -> Result<Acquired, LeaseError> {
        if self.service.down.load(Ordering::SeqCst) {
            return Err(LeaseError::Unavailable("down".into()));
        }
        let mut s = self.service.state.lock().unwrap();
        match &*s {
            Some((holder, until)) if *until > Instant::now() && *holder != self.id => {
                Ok(Acquired::HeldByOther)
            }
            _ => {
                *s = Some((self.id.clone(), Instant::now() + self.lease));
                Ok(Acquired::Yes(None))
            }
        }
    }
    async fn renew(&self) -> Result<(), LeaseError> {
        if self.service.down.load(Ordering::SeqCst) {
            return Err(LeaseError::Unavailable("down".into()));
        }
        let mut s = self.service.state.lock().unwrap();
        match &mut *s {
            Some((holder, until)) if *holder == self.id && *until > Instant::now() => {
                *until = Instant::now() + self.lease;
                Ok(())
            }
            _ => Err(LeaseError::Lost("not ours".into())),
        }
    }
    async fn release(&self) -> Result<(), LeaseError> {
        let mut s = self.service.state.lock().unwrap();
        if matches!(&*s, Some((holder, _)) if *holder == self.id) {
            *s = None;
            self.service.releases.fetch_add(1, Ordering::SeqCst);
            Ok(())
        } else {
            Err(LeaseError::Lost("not ours".into()))
        }
    }
}

#[derive(Default)]
struct Terms {
    epoch: Mutex<i64>,
}

#[async_trait]
impl LeadershipStore for Terms {
    async fn begin_term(&self, name: &str, holder: &InstanceId) -> Result<LeaderFence> {
        let mut e = self.epoch.lock().unwrap();
        *e += 1;
        Ok(LeaderFence {
            name: name.into(),
            holder: holder.clone(),
            epoch: Epoch(*e),
        })
    }
    async fn acquire_lease(
        &self,
        _: &str,
        _: &InstanceId,
        _: Duration,
    ) -> Result<Option<LeaderFence>> {
        unreachable!("the memory lease keeps its own state")
    }
    async fn renew_lease(&self, _: &LeaderFence, _: Duration) -> Result<bool> {
        unreachable!()
    }
    async fn release_lease(&self, _: &LeaderFence) -> Result<bool> {
        unreachable!()
    }
    async fn term(&self, _: &str) -> Result<Option<Term>> {
        Ok(None)
    }
}

fn timing() -> ElectorTiming {
    ElectorTiming {
        lease: Duration::from_secs(15),
        renew_interval: Duration::from_secs(2),
        renew_retry: Duration::from_secs(1),
        renew_deadline: Duration::from_secs(10),
        retry: Duration::from_secs(2),
        retry_jitter: 0.2,
        call_timeout: Duration::from_secs(1),
        stop_grace: Duration::from_secs(3),
        heartbeat_timeout: Duration::from_secs(5),
    }
}

fn elector(service: &Arc<Service>, terms: &Arc<Terms>, name: &str) -> Elector {
    let lease = Arc::new(MemLease {
        service: service.clone(),
        id: name.into(),
        lease: timing().lease,
    });
    Elector::new(
        "supervisor",
        InstanceId::parse(name).unwrap(),
        lease,
        terms.clone(),
        timing(),
    )
    .unwrap()
}

/// What a leader task saw: when it started and when it noticed cancellation.
type Held = (Epoch, Instant, Option<Instant>);

#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<Held>>>);

impl Log {
    /// A task that beats every second until cancelled (or, with `beat_for`, stops
    /// beating after that long; with `ignore_cancel`, never ends).
    fn task(
        &self,
        beat_for: Option<Duration>,
        ignore_cancel: bool,
    ) -> impl FnMut(Leadership) -> futures_task::Boxed + use<> {
        let log = self.clone();
        move |l: Leadership| {
            let log = log.clone();
            Box::pin(async move {
                let start = Instant::now();
                let idx = {
                    let mut v = log.0.lock().unwrap();
                    v.push((l.fence.epoch, start, None));
                    v.len() - 1
                };
                loop {
                    if !ignore_cancel && l.cancelled.is_cancelled() {
                        break;
                    }
                    if beat_for.is_none_or(|d| start.elapsed() < d) {
                        l.heartbeat.beat();
                    }
                    sleep(Duration::from_millis(100)).await;
                }
                log.0.lock().unwrap()[idx].2 = Some(Instant::now());
                LeaderExit::Cancelled
            })
        }
    }

    fn terms(&self) -> Vec<Held> {
        self.0.lock().unwrap().clone()
    }
}

mod futures_task {
    pub type Boxed = std::pin::Pin<Box<dyn std::future::Future<Output = super::LeaderExit> + Send>>;
}

#[tokio::test(start_paused = true)]
async fn a_leader_whose_renewals_fail_stops_at_the_renew_deadline_before_the_lease_expires() {
    let service = Arc::new(Service::default());
    let terms = Arc::new(Terms::default());
    let e = elector(&service, &terms, "a");
    let log = Log::default();
    let shutdown = CancellationToken::new();
    let t0 = Instant::now();
    let run = {
        let (task, shutdown) = (log.task(None, false), shutdown.clone());
        tokio::spawn(async move { e.run(task, shutdown).await })
    };
    sleep(Duration::from_secs(5)).await;
    assert_eq!(log.terms().len(), 1);
    // Renewals at 2 s and 4 s succeeded: the last was sent at 4 s.
    service.down.store(true, Ordering::SeqCst);
    sleep(Duration::from_secs(20)).await;
    let (_, start, end) = log.terms()[0];
    assert_eq!(start, t0);
    let end = end.expect("the leader task stopped");
    // Deadline = 4 s + 10 s; the task notices within its 100 ms poll.
    let stopped = end - t0;
    assert!(
        stopped >= Duration::from_secs(14) && stopped < Duration::from_millis(14_200),
        "stopped {stopped:?} after start"
    );
    // The service still thinks the lease runs to 4 s + 15 s: no overlap possible.
    assert!(stopped < Duration::from_secs(19));
    shutdown.cancel();
    run.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_stalled_leader_task_loses_the_lease_and_a_follower_leads() {
    let service = Arc::new(Service::default());
    let terms = Arc::new(Terms::default());
    let (a, b) = (
        elector(&service, &terms, "a"),
        elector(&service, &terms, "b"),
    );
    let (log_a, log_b) = (Log::default(), Log::default());
    let shutdown = CancellationToken::new();
    let mut status_a = a.status();
    let ra = {
        let (task, s) = (
            log_a.task(Some(Duration::from_secs(3)), false),
            shutdown.clone(),
        );
        tokio::spawn(async move { a.run(task, s).await })
    };
    status_a.wait_for(|s| s.is_leader).await.unwrap();
    let rb = {
        let (task, s) = (log_b.task(None, false), shutdown.clone());
        tokio::spawn(async move { b.run(task, s).await })
    };
    sleep(Duration::from_secs(15)).await;
    // a stopped beating at 3 s; at the first renewal after 3 + 5 s it gave up (and
    // released the lease), and b took over at its next try.
    let (_, _, a_end) = log_a.terms()[0];
    let a_end = a_end.expect("a's task was cancelled");
    let b_terms = log_b.terms();
    assert_eq!(b_terms.len(), 1, "b leads");
    assert!(b_terms[0].1 >= a_end, "no overlap");
    assert!(b_terms[0].0 > log_a.terms()[0].0, "b's term is newer");
    assert!(service.releases.load(Ordering::SeqCst) >= 1);
    shutdown.cancel();
    ra.await.unwrap();
    rb.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_leader_task_that_ignores_cancellation_triggers_the_stuck_hook_after_the_grace() {
    let service = Arc::new(Service::default());
    let terms = Arc::new(Terms::default());
    let stuck = Arc::new(Mutex::new(None::<Instant>));
    let e = elector(&service, &terms, "a").on_stuck({
        let stuck = stuck.clone();
        Arc::new(move |_| *stuck.lock().unwrap() = Some(Instant::now()))
    });
    let log = Log::default();
    let shutdown = CancellationToken::new();
    let t0 = Instant::now();
    let run = {
        let (task, s) = (
            log.task(Some(Duration::from_millis(500)), true),
            shutdown.clone(),
        );
        tokio::spawn(async move { e.run(task, s).await })
    };
    sleep(Duration::from_secs(20)).await;
    // Heartbeat stale (> 5 s) at the renewal at 6 s; grace 3 s.
    let at = stuck.lock().unwrap().expect("the stuck hook ran") - t0;
    assert_eq!(at, Duration::from_secs(9));
    shutdown.cancel();
    run.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn shutdown_cancels_the_task_and_releases_the_lease_so_a_follower_leads_at_its_next_try() {
    let service = Arc::new(Service::default());
    let terms = Arc::new(Terms::default());
    let (a, b) = (
        elector(&service, &terms, "a"),
        elector(&service, &terms, "b"),
    );
    let (log_a, log_b) = (Log::default(), Log::default());
    let (stop_a, stop_all) = (CancellationToken::new(), CancellationToken::new());
    let mut sa = a.status();
    let ra = {
        let (task, s) = (log_a.task(None, false), stop_a.clone());
        tokio::spawn(async move { a.run(task, s).await })
    };
    sa.wait_for(|s| s.is_leader).await.unwrap();
    let mut sb = b.status();
    let rb = {
        let (task, s) = (log_b.task(None, false), stop_all.clone());
        tokio::spawn(async move { b.run(task, s).await })
    };
    sleep(Duration::from_secs(7)).await;
    assert!(log_b.terms().is_empty(), "b follows while a leads");
    stop_a.cancel();
    ra.await.unwrap();
    assert_eq!(service.releases.load(Ordering::SeqCst), 1);
    // Measured from the release, not from the stop: a try of b's that falls while a is
    // still stopping finds the lease held and waits one more pause (with some jitters
    // the bound from the stop was missed: 1 run in about 60).
    let released = Instant::now();
    sb.wait_for(|s| s.is_leader).await.unwrap();
    let took = Instant::now() - released;
    assert!(
        took <= Duration::from_millis(2400),
        "b led {took:?} after a released the lease: within one retry and its jitter"
    );
    assert!(log_a.terms()[0].2.unwrap() <= log_b.terms()[0].1);
    stop_all.cancel();
    rb.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_deposed_leader_task_ends_the_term() {
    let service = Arc::new(Service::default());
    let terms = Arc::new(Terms::default());
    let e = elector(&service, &terms, "a");
    let shutdown = CancellationToken::new();
    let mut status = e.status();
    let started = Arc::new(AtomicU32::new(0));
    let run = {
        let (s, started) = (shutdown.clone(), started.clone());
        tokio::spawn(async move {
            e.run(
                move |_l: Leadership| {
                    started.fetch_add(1, Ordering::SeqCst);
                    async { LeaderExit::Deposed }
                },
                s,
            )
            .await
        })
    };
    status.wait_for(|s| s.terms_led >= 2).await.unwrap();
    // Each term ended at once, the lease was given back, and a new term began at the
    // next try: a new epoch each time.
    assert!(service.releases.load(Ordering::SeqCst) >= 1);
    assert!(started.load(Ordering::SeqCst) >= 2);
    assert!(status.borrow().term.unwrap() >= Epoch(2));
    shutdown.cancel();
    run.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn followers_retry_at_the_retry_interval_plus_at_most_the_jitter() {
    let service = Arc::new(Service::default());
    *service.state.lock().unwrap() =
        Some(("other".into(), Instant::now() + Duration::from_secs(3600)));
    let tries = Arc::new(Mutex::new(Vec::new()));
    struct Counting(MemLease, Arc<Mutex<Vec<Instant>>>);
    #[async_trait]
    impl Lease for Counting {
        fn describe(&self) -> String {
            "counting".into()
        }
        async fn try_acquire(&self) -> Result<Acquired, LeaseError> {
            self.1.lock().unwrap().push(Instant::now());
            self.0.try_acquire().await
        }
        async fn renew(&self) -> Result<(), LeaseError> {
            self.0.renew().await
        }
        async fn release(&self) -> Result<(), LeaseError> {
            self.0.release().await
        }
    }
    let lease = Counting(
        MemLease {
            service: service.clone(),
            id: "f".into(),
            lease: timing().lease,
        },
        tries.clone(),
    );
    let e = Elector::new(
        "supervisor",
        InstanceId::parse("f").unwrap(),
        Arc::new(lease),
        Arc::new(Terms::default()),
        timing(),
    )
    .unwrap();
    let shutdown = CancellationToken::new();
    let run = {
        let s = shutdown.clone();
        tokio::spawn(async move { e.run(|_l| async { LeaderExit::Cancelled }, s).await })
    };
    sleep(Duration::from_secs(60)).await;
    shutdown.cancel();
    run.await.unwrap();
    let tries = tries.lock().unwrap();
    assert!(tries.len() >= 25, "{} tries in 60 s", tries.len());
    let gaps: Vec<Duration> = tries.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        gaps.iter()
            .all(|g| *g >= Duration::from_secs(2) && *g <= Duration::from_millis(2400)),
        "{gaps:?}"
    );
    assert!(gaps.iter().any(|g| *g != gaps[0]), "jittered: {gaps:?}");
}

#[test]
fn timings_under_which_a_leader_could_outlive_its_lease_are_refused_naming_the_setting() {
    let field = |t: ElectorTiming| t.validate().unwrap_err().field;
    assert!(ElectorTiming::default().validate().is_ok());
    assert!(ElectorTiming::default().validate_for_blob().is_ok());
    let t = ElectorTiming::default();
    assert_eq!(
        field(ElectorTiming {
            renew_deadline: t.lease,
            ..t.clone()
        }),
        "renew_deadline"
    );
    assert_eq!(
        field(ElectorTiming {
            stop_grace: Duration::from_secs(11),
            ..t.clone()
        }),
        "stop_grace"
    );
    assert_eq!(
        field(ElectorTiming {
            renew_interval: t.renew_deadline,
            ..t.clone()
        }),
        "renew_interval"
    );
    assert_eq!(
        field(ElectorTiming {
            call_timeout: t.renew_deadline,
            ..t.clone()
        }),
        "call_timeout"
    );
    assert_eq!(
        field(ElectorTiming {
            retry: Duration::ZERO,
            ..t.clone()
        }),
        "retry"
    );
    let blob = |lease: u64| {
        ElectorTiming {
            lease: Duration::from_millis(lease),
            renew_deadline: Duration::from_secs(10),
            renew_interval: Duration::from_secs(2),
            ..t.clone()
        }
        .validate_for_blob()
    };
    assert_eq!(blob(14_000).unwrap_err().field, "lease");
    assert_eq!(blob(61_000).unwrap_err().field, "lease");
    assert_eq!(blob(15_500).unwrap_err().field, "lease");
    assert!(blob(15_000).is_ok());
}

#[test]
fn a_failure_is_said_when_it_begins_or_changes_and_its_end_counts_the_tries() {
    let mut failing = elector::Failing::default();
    assert_eq!(failing.passed(), None, "nothing failed");
    assert!(failing.failed("refused"));
    assert!(!failing.failed("refused"));
    assert!(!failing.failed("refused"));
    assert!(failing.failed("certificate"), "a new cause is said");
    assert!(failing.failed("refused"), "and so is the old one, back");
    assert_eq!(failing.passed(), Some(5));
    assert_eq!(failing.passed(), None);
    assert!(failing.failed("refused"), "a failure after a pass is new");
}
