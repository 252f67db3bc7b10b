//! Conformance cases for the fleet's view of remote services: outages reported once,
//! orders parked uncounted while their service is down, one probe let through, the
//! waiting orders resumed at a bounded rate, each outage announced once.

use std::time::Duration;

use orderly_core::history::HistoryKind;
use orderly_core::service::{OutagePolicy, Park, Parked, ServiceState, held, is_held};
use orderly_core::step::StepStatus;
use orderly_core::store::{
    ClaimRequest, ClaimedOrder, RecoveryOutcome, StateStore, StepUpdate, StepWrite,
};
use orderly_core::{Clock, Error, InstanceId, ProcessState};

use super::{Ctx, MINUTE, leader, owner, policy, row, submit_n};

const PAYMENT: &str = "payment";

fn agent(n: usize) -> InstanceId {
    InstanceId::parse(format!("agent-{n}")).expect("valid instance id")
}

fn outage_policy() -> OutagePolicy {
    OutagePolicy {
        probe_after: Duration::from_secs(5),
        probe_max: Duration::from_secs(60),
        resume_per_second: 100,
    }
}

async fn claim_all(store: &dyn StateStore, who: &InstanceId, limit: u32) -> Vec<ClaimedOrder> {
    store
        .claim(&ClaimRequest {
            workflows: Default::default(),
            owner: who.clone(),
            limit,
            timeout: MINUTE,
        })
        .await
        .expect("claim")
}

fn park(order: &ClaimedOrder) -> Park {
    Park {
        fence: order.fence.clone(),
        expect_step: Some(order.current_step),
        service: PAYMENT.into(),
        reason: "waiting: payment down".into(),
    }
}

/// `n` orders, each submitted a millisecond after the one before (oldest first).
async fn submit_spaced(ctx: &Ctx, store: &dyn StateStore, n: u64) -> Vec<orderly_core::OrderId> {
    let mut ids = Vec::new();
    for i in 0..n {
        let order = crate::builders::order(i);
        store
            .submit(&order, &crate::builders::submitter(), &[])
            .await
            .expect("submit");
        ids.push(order.order_id);
        ctx.clock.advance(Duration::from_millis(1));
    }
    ids
}

async fn down(store: &dyn StateStore) {
    store
        .report_failure(
            PAYMENT,
            "503 Service Unavailable",
            &agent(1),
            &outage_policy(),
        )
        .await
        .expect("report");
}

async fn health(store: &dyn StateStore) -> orderly_core::service::ServiceHealth {
    store
        .services()
        .await
        .expect("services")
        .into_iter()
        .find(|h| h.service == PAYMENT)
        .expect("a payment row")
}

/// Eight agents report one outage at once: it begins once, and its first probe is
/// due `probe_after` later on the store's clock.
pub async fn an_outage_begins_once_however_many_agents_report_it(ctx: &Ctx) {
    let mut tasks = Vec::new();
    for n in 0..8 {
        let store = ctx.store().await;
        tasks.push(tokio::spawn(async move {
            store
                .report_failure(PAYMENT, &format!("error {n}"), &agent(n), &outage_policy())
                .await
                .expect("report")
                .began
        }));
    }
    let mut began = 0;
    for t in tasks {
        began += usize::from(t.await.expect("task"));
    }
    assert_eq!(began, 1);
    let store = ctx.store().await;
    let h = health(&*store).await;
    assert_eq!(h.state, ServiceState::Down);
    assert_eq!(h.outage, 1);
    assert_eq!(h.down_since, Some(ctx.clock.now()));
    assert_eq!(
        h.retry_at,
        Some(ctx.clock.now() + chrono::Duration::seconds(5))
    );
    assert!(h.last_error.is_some_and(|e| e.starts_with("error ")));
    // A bad name is refused naming it.
    let err = store
        .report_failure("no spaces allowed", "x", &agent(1), &outage_policy())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("service"), "{err}");
}

/// While its service is down an order is parked: Pending, unlocked, its failure count
/// untouched, held (not claimable however long it waits), with a `Waiting` entry.
/// Once the service is reported up, the waiting orders become claimable again oldest
/// first at the resume rate, marked as having waited.
pub async fn a_parked_order_waits_uncounted_until_its_service_is_back(ctx: &Ctx) {
    let store = ctx.store().await;
    let ids = submit_spaced(ctx, &*store, 25).await;
    let a = owner("a");
    let claimed = claim_all(&*store, &a, 25).await;
    assert_eq!(claimed.len(), 25);
    down(&*store).await;
    let parks: Vec<Park> = claimed.iter().map(park).collect();
    let parked = store.park_many(&parks).await.unwrap();
    assert!(
        parked.iter().all(|p| matches!(p, Ok(Parked::Held))),
        "{parked:?}"
    );
    for id in &ids {
        let r = row(&*store, id).await;
        assert_eq!(r.process_state, ProcessState::Pending);
        assert_eq!((r.locked_by, r.complete_by), (None, None));
        assert_eq!(r.failure_count, 0, "waiting is not a failure");
        assert_eq!(r.waiting_on.as_deref(), Some(PAYMENT));
        assert!(is_held(r.next_attempt_at));
    }
    let view = store.get(&ids[0]).await.unwrap();
    let last = view.history.last().unwrap();
    assert_eq!(last.kind, HistoryKind::Waiting);
    assert_eq!(
        (last.from_state, last.to_state),
        (Some(ProcessState::Processing), ProcessState::Pending)
    );
    // Parking again under the same (now stale) fence is refused and changes nothing.
    let again = store.park_many(&parks[..1]).await.unwrap();
    assert!(matches!(again[0], Err(Error::Fenced { .. })), "{again:?}");
    assert_eq!(health(&*store).await.waiting, 25);
    // Held however long it waits.
    ctx.clock.advance(Duration::from_secs(86_400));
    assert!(claim_all(&*store, &a, 100).await.is_empty());

    let back = store
        .report_success(PAYMENT, "agent-2")
        .await
        .unwrap()
        .expect("it was down");
    assert_eq!(back.health.state, ServiceState::Up);
    assert_eq!(back.resumed, 25);
    assert_eq!(
        back.last_at,
        Some(ctx.clock.now() + chrono::Duration::milliseconds(200)),
        "25 orders at 100/s: three tenths of a second"
    );
    assert!(
        store
            .report_success(PAYMENT, "agent-2")
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(health(&*store).await.waiting, 0);
    // Oldest first, ten per tenth of a second.
    let first = claim_all(&*store, &a, 100).await;
    assert_eq!(first.len(), 10);
    let mut first_ids: Vec<_> = first.iter().map(|c| c.fence.order_id.clone()).collect();
    first_ids.sort();
    let mut oldest: Vec<_> = ids[..10].to_vec();
    oldest.sort();
    assert_eq!(first_ids, oldest);
    assert!(
        first
            .iter()
            .all(|c| c.waiting_on.as_deref() == Some(PAYMENT))
    );
    ctx.clock.advance(Duration::from_millis(200));
    assert_eq!(claim_all(&*store, &a, 100).await.len(), 15);
    let view = store.get(&ids[0]).await.unwrap();
    assert!(
        view.history.iter().any(|h| h.kind == HistoryKind::WaitEnded
            && h.reason.as_deref().is_some_and(|r| r.contains("up again"))),
        "{:?}",
        view.history
    );
    // Moving past the waited step ends the mark.
    let c = &first[0];
    let key = |i: i32| orderly_core::step::idempotency_key(&c.fence.order_id, 0, i, "s");
    let write = StepWrite {
        complete: false,
        fence: c.fence.clone(),
        expect_step: Some(0),
        updates: vec![
            StepUpdate {
                index: 0,
                name: "s".into(),
                status: StepStatus::Succeeded,
                detail: None,
                idempotency_key: key(0),
                irreversible: false,
            },
            StepUpdate {
                index: 1,
                name: "s".into(),
                status: StepStatus::Started,
                detail: None,
                idempotency_key: key(1),
                irreversible: false,
            },
        ],
        sends: Vec::new(),
    };
    store
        .record_steps(&[write])
        .await
        .unwrap()
        .pop()
        .unwrap()
        .unwrap();
    assert_eq!(row(&*store, &c.fence.order_id).await.waiting_on, None);
}

/// Parked against a service that is up (the scheduler's view was stale): the order is
/// claimable at once, still uncounted.
pub async fn parking_for_a_service_that_is_up_releases_the_order_at_once(ctx: &Ctx) {
    let store = ctx.store().await;
    let ids = submit_n(&*store, 1).await;
    let a = owner("a");
    let claimed = claim_all(&*store, &a, 1).await;
    let parked = store.park_many(&[park(&claimed[0])]).await.unwrap();
    assert!(matches!(parked[0], Ok(Parked::Released)), "{parked:?}");
    let r = row(&*store, &ids[0]).await;
    assert_eq!(
        (r.process_state, r.failure_count),
        (ProcessState::Pending, 0)
    );
    assert!(!is_held(r.next_attempt_at));
    let again = claim_all(&*store, &a, 1).await;
    assert_eq!(again.len(), 1);
    // A park at another step than the order's is refused as stale, changing nothing.
    let mut wrong = park(&again[0]);
    wrong.expect_step = Some(3);
    let refused = store.park_many(&[wrong]).await.unwrap();
    assert!(
        matches!(refused[0], Err(Error::StaleStep { .. })),
        "{refused:?}"
    );
    assert_eq!(
        row(&*store, &ids[0]).await.process_state,
        ProcessState::Processing
    );
}

/// Once the probe is due, of several schedulers racing to let it through one wins: the
/// service is Probing and only its oldest waiting order is claimable. A failed probe
/// makes it Down again with the wait doubled; an expiry of the probe order while the
/// service is not up parks it again, uncounted.
pub async fn one_of_many_racing_schedulers_lets_the_probe_through(ctx: &Ctx) {
    let store = ctx.store().await;
    let ids = submit_spaced(ctx, &*store, 3).await;
    let a = owner("a");
    let claimed = claim_all(&*store, &a, 3).await;
    down(&*store).await;
    let parks: Vec<Park> = claimed.iter().map(park).collect();
    store.park_many(&parks).await.unwrap();
    // Not due yet.
    assert_eq!(
        store.release_probe(PAYMENT, "scheduler-a").await.unwrap(),
        None
    );
    ctx.clock.advance(Duration::from_secs(5));
    let mut tasks = Vec::new();
    for n in 0..6 {
        let store = ctx.store().await;
        tasks.push(tokio::spawn(async move {
            store
                .release_probe(PAYMENT, &format!("scheduler-{n}"))
                .await
                .expect("release")
        }));
    }
    let mut released = Vec::new();
    for t in tasks {
        if let Some(probe) = t.await.expect("task") {
            released.push(probe);
        }
    }
    assert_eq!(
        released,
        vec![Some(ids[0].clone())],
        "one probe, the oldest order"
    );
    assert_eq!(health(&*store).await.state, ServiceState::Probing);
    let probe = claim_all(&*store, &a, 10).await;
    assert_eq!(probe.len(), 1);
    assert_eq!(probe[0].fence.order_id, ids[0]);
    assert_eq!(probe[0].waiting_on.as_deref(), Some(PAYMENT));

    // Its deadline passes while the service is still not up: parked again, uncounted.
    ctx.clock.advance(MINUTE + Duration::from_secs(1));
    let lead = leader(&*store, 1).await;
    let recovered = store
        .recover_expired(&lead, &policy(3, 1), 10)
        .await
        .unwrap();
    assert_eq!(
        recovered,
        vec![RecoveryOutcome::Waiting {
            order_id: ids[0].clone(),
            service: PAYMENT.into()
        }]
    );
    let r = row(&*store, &ids[0]).await;
    assert_eq!(
        (r.process_state, r.failure_count),
        (ProcessState::Pending, 0)
    );
    assert_eq!(r.next_attempt_at, held());

    // The probe's failure: Down again, next probe after twice the wait.
    let again = store
        .report_failure(PAYMENT, "still 503", &agent(2), &outage_policy())
        .await
        .unwrap();
    assert!(!again.began);
    assert_eq!(again.health.state, ServiceState::Down);
    assert_eq!(again.health.outage, 1);
    assert_eq!(
        again.health.retry_at,
        Some(ctx.clock.now() + chrono::Duration::seconds(10))
    );
    ctx.clock.advance(Duration::from_secs(9));
    assert_eq!(
        store.release_probe(PAYMENT, "scheduler-a").await.unwrap(),
        None
    );
    ctx.clock.advance(Duration::from_secs(1));
    assert!(
        store
            .release_probe(PAYMENT, "scheduler-a")
            .await
            .unwrap()
            .is_some()
    );
    // Nothing resumes while it is not up.
    assert_eq!(
        store.resume_waiting(PAYMENT, "scheduler-a").await.unwrap(),
        0
    );
}

/// Each outage's start and end are published once, by the current leader only.
pub async fn each_outage_is_announced_once_by_the_leader(ctx: &Ctx) {
    let store = ctx.store().await;
    down(&*store).await;
    let old = leader(&*store, 1).await;
    let lead = leader(&*store, 2).await;
    assert!(matches!(
        store
            .mark_outage_published(&old, PAYMENT, 1, false, &[])
            .await,
        Err(Error::Deposed { .. })
    ));
    assert!(
        store
            .mark_outage_published(&lead, PAYMENT, 1, false, &[])
            .await
            .unwrap()
    );
    assert!(
        !store
            .mark_outage_published(&lead, PAYMENT, 1, false, &[])
            .await
            .unwrap()
    );
    let h = health(&*store).await;
    assert_eq!((h.alerted, h.resolved), (1, 0));
    store.report_success(PAYMENT, "agent-1").await.unwrap();
    assert!(
        store
            .mark_outage_published(&lead, PAYMENT, 1, true, &[])
            .await
            .unwrap()
    );
    assert!(
        !store
            .mark_outage_published(&lead, PAYMENT, 1, true, &[])
            .await
            .unwrap()
    );
    // The next outage is a new one.
    down(&*store).await;
    let h = health(&*store).await;
    assert_eq!((h.outage, h.alerted, h.resolved), (2, 1, 1));
}
