//! The conformance suite of leader election: the [`Elector`] over a real lease (a blob
//! on Azurite, or the SQL lease row in SQLite and PostgreSQL) and a real state store,
//! in real time. Every case records the interval in which each leader task acted and
//! checks that no two ever overlap (invariant 6 in docs/architecture.md).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use orderly_core::leader::{
    Acquired, Elector, ElectorTiming, LeaderExit, LeaderFence, Leadership, Lease, LeaseError,
};
use orderly_core::store::{RecoveryPolicy, StateStore};
use orderly_core::{Epoch, Error, InstanceId};
use tokio_util::sync::CancellationToken;

use crate::store::StoreFactory;

/// The leadership the cases elect.
pub const NAME: &str = "supervisor";

/// Makes one instance's lease.
#[async_trait]
pub trait LeaseMaker: Send + Sync {
    /// `instance`'s lease, its terms kept in `store`.
    async fn lease(
        &self,
        store: Arc<dyn StateStore>,
        instance: &InstanceId,
        timing: &ElectorTiming,
    ) -> Arc<dyn Lease>;
}

/// What an elector case gets.
pub struct ElectorCtx {
    /// Stores on the real clock (the database's).
    pub factory: Box<dyn StoreFactory>,
    /// The lease under test.
    pub leases: Box<dyn LeaseMaker>,
    /// Timings short enough for a test, valid for the lease.
    pub timing: ElectorTiming,
}

/// Stamps out every elector case as a `#[tokio::test]`; `$fixture` is an async fn
/// returning a fresh [`ElectorCtx`].
#[macro_export]
macro_rules! elector_conformance {
    ($fixture:path) => {
        $crate::elector_conformance!(@cases $fixture;
            three_electors_over_many_terms_never_overlap,
            a_gracefully_stopped_leader_hands_over_within_3_s,
            a_leader_whose_lease_calls_hang_stops_at_its_renew_deadline_and_no_one_overlaps_it,
            a_stalled_leader_task_loses_the_lease_and_a_follower_leads,
            a_deposed_leaders_writes_are_refused,
        );
    };
    (@cases $fixture:path; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let ctx = $fixture().await;
                $crate::elector::$case(&ctx).await;
                ctx.factory.cleanup().await;
            }
        )*
    };
}

/// A lease whose calls can be made to hang (beyond any call timeout), as when the
/// lease service stops answering for one instance.
pub struct Hangable {
    inner: Arc<dyn Lease>,
    /// While set, every call hangs.
    pub hang: Arc<AtomicBool>,
}

impl Hangable {
    async fn gate(&self) {
        while self.hang.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[async_trait]
impl Lease for Hangable {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    async fn try_acquire(&self) -> Result<Acquired, LeaseError> {
        self.gate().await;
        self.inner.try_acquire().await
    }
    async fn renew(&self) -> Result<(), LeaseError> {
        self.gate().await;
        self.inner.renew().await
    }
    async fn release(&self) -> Result<(), LeaseError> {
        self.gate().await;
        self.inner.release().await
    }
}

/// One leader task's time in office.
#[derive(Debug, Clone)]
pub struct Interval {
    /// Which elector.
    pub who: usize,
    /// Its term.
    pub fence: LeaderFence,
    /// When the task started.
    pub start: Instant,
    /// When it ended.
    pub end: Option<Instant>,
}

/// The intervals of every leader task of a case, in a watch so a case can wait for one.
#[derive(Clone)]
pub struct Recorder(Arc<tokio::sync::watch::Sender<Vec<Interval>>>);

impl Default for Recorder {
    fn default() -> Self {
        Self(Arc::new(tokio::sync::watch::channel(Vec::new()).0))
    }
}

/// How a recorded leader task behaves.
#[derive(Clone, Copy)]
pub struct Behaviour {
    /// Ends its term by itself after this long.
    pub hold: Option<Duration>,
    /// Stops beating its heartbeat after this long.
    pub beat_for: Option<Duration>,
}

impl Recorder {
    /// Waits (no polling) until elector `who`'s task has started a term; panics after
    /// `within`.
    pub async fn wait_term(&self, who: usize, within: Duration, what: &str) {
        let mut intervals = self.0.subscribe();
        let found = tokio::time::timeout(
            within,
            intervals.wait_for(|v| v.iter().any(|i| i.who == who)),
        )
        .await;
        assert!(
            found.is_ok(),
            "{what}: elector {who} did not lead within {within:?}"
        );
    }

    /// A leader task for elector `who` that records its interval.
    pub fn task(
        &self,
        who: usize,
        behaviour: Behaviour,
    ) -> impl FnMut(Leadership) -> std::pin::Pin<Box<dyn Future<Output = LeaderExit> + Send>>
    + Send
    + 'static {
        let rec = self.clone();
        move |l: Leadership| {
            let rec = rec.clone();
            Box::pin(async move {
                let start = Instant::now();
                let idx = {
                    let mut idx = 0;
                    rec.0.send_modify(|v| {
                        v.push(Interval {
                            who,
                            fence: l.fence.clone(),
                            start,
                            end: None,
                        });
                        idx = v.len() - 1;
                    });
                    idx
                };
                let exit = loop {
                    if l.cancelled.is_cancelled() {
                        break LeaderExit::Cancelled;
                    }
                    if behaviour.hold.is_some_and(|h| start.elapsed() >= h) {
                        break LeaderExit::Failed("term over (test)".into());
                    }
                    if behaviour.beat_for.is_none_or(|b| start.elapsed() < b) {
                        l.heartbeat.beat();
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                };
                rec.0.send_modify(|v| v[idx].end = Some(Instant::now()));
                exit
            })
        }
    }

    /// Every interval so far, by start.
    pub fn intervals(&self) -> Vec<Interval> {
        let mut v = self.0.borrow().clone();
        v.sort_by_key(|i| i.start);
        v
    }

    /// Panics if two intervals overlap or a later term has a smaller epoch.
    pub fn assert_no_overlap(&self) {
        let v = self.intervals();
        for w in v.windows(2) {
            let end = w[0]
                .end
                .unwrap_or_else(|| panic!("{:?} still acting when {:?} started", w[0], w[1]));
            assert!(
                end <= w[1].start,
                "overlap: elector {} (epoch {}) acted until {:?} after elector {} (epoch {}) started",
                w[0].who,
                w[0].fence.epoch,
                end - w[1].start,
                w[1].who,
                w[1].fence.epoch
            );
            assert!(
                w[1].fence.epoch > w[0].fence.epoch,
                "epochs only grow: {v:?}"
            );
        }
    }
}

/// An elector of the case; the stuck hook panics the test rather than exiting.
pub struct Member {
    /// The elector.
    pub elector: Arc<Elector>,
    /// Its instance.
    pub instance: InstanceId,
    /// Makes its lease calls hang.
    pub hang: Arc<AtomicBool>,
    /// Stops it.
    pub shutdown: CancellationToken,
    /// Its run.
    pub run: Option<tokio::task::JoinHandle<()>>,
    /// Set when its stuck hook ran.
    pub stuck: Arc<AtomicBool>,
}

/// Starts elector `who` running `behaviour`'s task.
pub async fn member(ctx: &ElectorCtx, rec: &Recorder, who: usize, behaviour: Behaviour) -> Member {
    let store = ctx.factory.open().await;
    let instance = InstanceId::parse(format!("supervisor-{who}@test")).unwrap();
    let hang = Arc::new(AtomicBool::new(false));
    let lease = Arc::new(Hangable {
        inner: ctx
            .leases
            .lease(store.clone(), &instance, &ctx.timing)
            .await,
        hang: hang.clone(),
    });
    let stuck = Arc::new(AtomicBool::new(false));
    let elector = Arc::new(
        Elector::new(NAME, instance.clone(), lease, store, ctx.timing.clone())
            .unwrap()
            .on_stuck({
                let stuck = stuck.clone();
                Arc::new(move |_| stuck.store(true, Ordering::SeqCst))
            }),
    );
    let shutdown = CancellationToken::new();
    let run = {
        let (e, s, task) = (elector.clone(), shutdown.clone(), rec.task(who, behaviour));
        tokio::spawn(async move { e.run(task, s).await })
    };
    Member {
        elector,
        instance,
        hang,
        shutdown,
        run: Some(run),
        stuck,
    }
}

impl Member {
    /// Stops it and waits until it has.
    pub async fn stop(&mut self) {
        self.shutdown.cancel();
        if let Some(run) = self.run.take() {
            run.await.unwrap();
        }
    }

    /// Whether it leads now.
    pub fn leads(&self) -> bool {
        self.elector.status().borrow().is_leader
    }
}

async fn wait_for_leader(members: &[Member], within: Duration) -> usize {
    let t = Instant::now();
    loop {
        if let Some(i) = members.iter().position(Member::leads) {
            return i;
        }
        assert!(t.elapsed() < within, "no leader within {within:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

const STEADY: Behaviour = Behaviour {
    hold: None,
    beat_for: None,
};

/// Three electors whose leaders give up their terms after a while: over many terms,
/// the recorded intervals never overlap and epochs only grow.
pub async fn three_electors_over_many_terms_never_overlap(ctx: &ElectorCtx) {
    let rec = Recorder::default();
    let mut members = Vec::new();
    for who in 0..3 {
        let hold = Duration::from_millis(300 + 200 * who as u64);
        members.push(
            member(
                ctx,
                &rec,
                who,
                Behaviour {
                    hold: Some(hold),
                    beat_for: None,
                },
            )
            .await,
        );
    }
    let t = Instant::now();
    while rec.intervals().len() < 8 {
        assert!(
            t.elapsed() < Duration::from_secs(90),
            "only {} terms in 90 s",
            rec.intervals().len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for m in &mut members {
        m.stop().await;
    }
    rec.assert_no_overlap();
    let leaders: std::collections::HashSet<usize> = rec.intervals().iter().map(|i| i.who).collect();
    assert!(
        leaders.len() >= 2,
        "leadership moved between electors: {leaders:?}"
    );
    assert!(members.iter().all(|m| !m.stuck.load(Ordering::SeqCst)));
}

/// A leader shut down gracefully releases its lease: a follower leads within 3 s.
pub async fn a_gracefully_stopped_leader_hands_over_within_3_s(ctx: &ElectorCtx) {
    let rec = Recorder::default();
    let mut members = Vec::new();
    for who in 0..2 {
        members.push(member(ctx, &rec, who, STEADY).await);
    }
    let first = wait_for_leader(&members, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stopped = Instant::now();
    members[first].stop().await;
    let next = wait_for_leader(&members, Duration::from_secs(3)).await;
    assert_ne!(next, first);
    let took = stopped.elapsed();
    assert!(took < Duration::from_secs(3), "handover took {took:?}");
    for m in &mut members {
        m.stop().await;
    }
    rec.assert_no_overlap();
}

/// The leader's lease calls hang (the service stops answering it): it stops acting at
/// its renew deadline, before its lease can expire, and the follower leads only after
/// the lease expired: no overlap.
pub async fn a_leader_whose_lease_calls_hang_stops_at_its_renew_deadline_and_no_one_overlaps_it(
    ctx: &ElectorCtx,
) {
    let rec = Recorder::default();
    let mut members = vec![member(ctx, &rec, 0, STEADY).await];
    wait_for_leader(&members, Duration::from_secs(10)).await;
    members.push(member(ctx, &rec, 1, STEADY).await);
    tokio::time::sleep(ctx.timing.renew_interval + Duration::from_millis(300)).await;
    let mut status = members[0].elector.status();
    let renewed = status.borrow().last_renewal.unwrap();
    members[0].hang.store(true, Ordering::SeqCst);
    status.wait_for(|s| !s.is_leader).await.unwrap();
    let stopped_after = chrono::Utc::now() - renewed;
    let deadline = chrono::Duration::from_std(ctx.timing.renew_deadline).unwrap();
    assert!(
        stopped_after <= deadline + chrono::Duration::milliseconds(500),
        "stopped {stopped_after} after the last renewal; deadline {deadline}"
    );
    // The follower takes over once the lease expired.
    rec.wait_term(
        1,
        ctx.timing.lease + ctx.timing.retry * 3 + Duration::from_secs(2),
        "takeover after the lease expired",
    )
    .await;
    members[0].hang.store(false, Ordering::SeqCst);
    for m in &mut members {
        m.stop().await;
    }
    rec.assert_no_overlap();
    let v = rec.intervals();
    assert_eq!(v.iter().map(|i| i.who).collect::<Vec<_>>(), vec![0, 1]);
    assert!(!members[0].stuck.load(Ordering::SeqCst));
}

/// A leader task that stops beating its heartbeat (but obeys cancellation) is wedged:
/// the lease is not renewed for it, it is cancelled, the lease given up, and the
/// follower leads.
pub async fn a_stalled_leader_task_loses_the_lease_and_a_follower_leads(ctx: &ElectorCtx) {
    let rec = Recorder::default();
    let wedged = Behaviour {
        hold: None,
        beat_for: Some(Duration::from_millis(200)),
    };
    let mut members = vec![member(ctx, &rec, 0, wedged).await];
    wait_for_leader(&members, Duration::from_secs(10)).await;
    members.push(member(ctx, &rec, 1, STEADY).await);
    // Stall noticed at the first renewal after the heartbeat timeout, then the
    // release and the follower's next try; generous slack for a loaded machine.
    let limit = ctx.timing.heartbeat_timeout
        + ctx.timing.renew_interval
        + ctx.timing.call_timeout * 2
        + ctx.timing.retry * 3
        + Duration::from_secs(2);
    rec.wait_term(1, limit, "the follower after the stall")
        .await;
    for m in &mut members {
        m.stop().await;
    }
    rec.assert_no_overlap();
    let v = rec.intervals();
    assert_eq!(v[0].who, 0);
    assert_eq!(v[1].who, 1);
}

/// A leader that lost its term (its calls hung past the deadline, another took over)
/// cannot write with its old term: the store refuses it.
pub async fn a_deposed_leaders_writes_are_refused(ctx: &ElectorCtx) {
    let rec = Recorder::default();
    let mut members = vec![member(ctx, &rec, 0, STEADY).await];
    // The elector says it leads a moment before its leader task records the term.
    rec.wait_term(0, Duration::from_secs(10), "the first leader")
        .await;
    let old = rec.intervals()[0].fence.clone();
    let store = ctx.factory.open().await;
    store
        .recover_expired(&old, &RecoveryPolicy::default(), 10)
        .await
        .expect("the leader writes under its term");
    members.push(member(ctx, &rec, 1, STEADY).await);
    members[0].hang.store(true, Ordering::SeqCst);
    rec.wait_term(
        1,
        ctx.timing.lease + ctx.timing.retry * 3 + Duration::from_secs(2),
        "takeover after the lease expired",
    )
    .await;
    let new = rec.intervals()[1].fence.clone();
    assert!(new.epoch > old.epoch);
    let refused = store
        .recover_expired(&old, &RecoveryPolicy::default(), 10)
        .await;
    assert!(
        matches!(&refused, Err(Error::Deposed { epoch, .. }) if *epoch == old.epoch),
        "{refused:?}"
    );
    assert!(matches!(
        store.mark_alerts_published(&old, &[1], &[]).await,
        Err(Error::Deposed { .. })
    ));
    store
        .recover_expired(&new, &RecoveryPolicy::default(), 10)
        .await
        .expect("the new leader writes");
    members[0].hang.store(false, Ordering::SeqCst);
    for m in &mut members {
        m.stop().await;
    }
    rec.assert_no_overlap();
    assert!(old.epoch >= Epoch(1));
}
