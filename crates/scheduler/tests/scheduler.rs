//! The scheduler's loop, one pass at a time, against an in-memory SQLite store and its
//! SQL queue; the test plays the agents, reading each request and answering it.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use orderly_core::history::HistoryKind;
use orderly_core::messages::{StepKind, StepOutcome, StepRequest, json_message};
use orderly_core::store::StateStore;
use orderly_core::transport::{QueueName, Transport};
use orderly_core::workflow::{Workflow, Workflows};
use orderly_core::{InstanceId, OrderId, ProcessState, StepStatus, SystemClock, TimeSource};
use orderly_scheduler::{Pass, Scheduler, SchedulerConfig};

struct Rig {
    store: Arc<dyn StateStore>,
    transport: Arc<dyn Transport>,
}

async fn rig() -> Rig {
    rig_on(Arc::new(
        orderly_sql::SqliteStore::open("sqlite::memory:", TimeSource::Database)
            .await
            .unwrap(),
    ))
    .await
}

/// [`rig`] on `store`.
async fn rig_on(store: Arc<orderly_sql::SqliteStore>) -> Rig {
    let transport: Arc<dyn Transport> = store.clone();
    // As the roles create them on the SQL transport: no duplicate detection on these.
    for q in [
        "replies",
        "agent.inventory",
        "agent.payment",
        "agent.shipping",
    ] {
        let q = QueueName::parse(q).unwrap();
        transport
            .declare_queue(&q, &orderly_core::messages::queues::settings(&q))
            .await
            .unwrap();
    }
    Rig { store, transport }
}

fn scheduler(rig: &Rig, name: &str, workflows: Vec<Workflow>) -> Scheduler {
    let cfg = SchedulerConfig::new(
        InstanceId::parse(name).unwrap(),
        Arc::new(Workflows::new(workflows).unwrap()),
    );
    Scheduler::new(
        rig.store.clone(),
        rig.transport.clone(),
        Arc::new(SystemClock),
        cfg,
    )
}

async fn submit(rig: &Rig, id: &str) -> OrderId {
    let order = orderly_testkit::builders::order_with_id(id, 1);
    rig.store
        .submit(&order, &orderly_testkit::builders::submitter(), &[])
        .await
        .unwrap();
    order.order_id
}

/// The one request waiting on `queue` (taken off it).
async fn request(rig: &Rig, queue: &str) -> StepRequest {
    let mut got = all_requests(rig, queue).await;
    assert_eq!(got.len(), 1, "one request on {queue}");
    got.remove(0)
}

/// Answers `req` as an agent would.
async fn answer(rig: &Rig, req: &StepRequest, outcome: StepOutcome) {
    let reply = req.reply(
        outcome,
        InstanceId::parse("agent-test").unwrap(),
        chrono::Utc::now(),
        1,
    );
    let id = format!("reply:{}:{}", req.idempotency_key, req.fence.epoch);
    rig.transport
        .send(
            &QueueName::parse("replies").unwrap(),
            &[json_message(id, &reply, Some(req.fence.order_id.as_str()))],
        )
        .await
        .unwrap();
}

fn ok(detail: &str) -> StepOutcome {
    StepOutcome::Succeeded {
        detail: detail.into(),
    }
}

async fn replies(s: &Scheduler) -> Pass {
    s.replies_once(Duration::from_millis(100)).await.unwrap()
}

/// Sends `req`'s reply again after it was recorded: the copy is dropped and changes
/// nothing (no write, no request, no completion).
async fn copy_is_dropped(rig: &Rig, s: &Scheduler, req: &StepRequest, outcome: StepOutcome) {
    answer(rig, req, outcome).await;
    let pass = replies(s).await;
    assert_eq!(
        (pass.applied, pass.dropped, pass.requests, pass.completed),
        (0, 1, 0, 0),
        "{pass:?}"
    );
}

#[tokio::test]
async fn an_order_is_driven_by_its_replies_step_by_step_and_completed_by_the_last() {
    let rig = rig().await;
    let flow = Workflow::default();
    let s = scheduler(&rig, "scheduler-a", vec![flow.clone()]);
    let id = submit(&rig, "o-1").await;
    let pass = s.claim_once().await.unwrap();
    assert_eq!((pass.claimed, pass.requests), (1, 1));
    let mut req = request(&rig, "agent.inventory").await;
    assert_eq!(req.context.workflow, Some(flow.reference()));
    assert_eq!(req.idempotency_key, "o-1/0/reserve-inventory");
    for (next, step) in [
        ("agent.payment", "charge-payment"),
        ("agent.shipping", "ship"),
    ] {
        answer(&rig, &req, ok("done")).await;
        let pass = replies(&s).await;
        assert_eq!((pass.applied, pass.requests), (1, 1), "{pass:?}");
        req = request(&rig, next).await;
        assert_eq!(req.step, step);
    }
    answer(&rig, &req, ok("shipped")).await;
    let pass = replies(&s).await;
    assert_eq!((pass.applied, pass.completed), (1, 1), "{pass:?}");
    let view = rig.store.get(&id).await.unwrap();
    assert_eq!(view.state.process_state, ProcessState::Processed);
    assert!(view.steps.iter().all(|s| s.status == StepStatus::Succeeded));
    assert_eq!(view.steps.len(), 3);
}

#[tokio::test]
async fn a_reply_delivered_twice_is_applied_once_whether_its_copies_come_together_or_apart() {
    // `replies` detects no duplicates: a second copy of a reply (an agent whose lock ran
    // out while it worked replied, and so did the agent that took the request after it)
    // reaches the scheduler, and the store's guard on the step the order is at drops it.
    let rig = rig().await;
    let s = scheduler(&rig, "scheduler-a", vec![Workflow::default()]);
    let id = submit(&rig, "o-1").await;
    s.claim_once().await.unwrap();
    // Both copies in one batch.
    let req = request(&rig, "agent.inventory").await;
    answer(&rig, &req, ok("reserved")).await;
    answer(&rig, &req, ok("reserved")).await;
    let pass = replies(&s).await;
    assert_eq!(
        (pass.applied, pass.dropped, pass.requests),
        (1, 1, 1),
        "{pass:?}"
    );
    // The second copy after the first was recorded and the next step requested.
    let req = request(&rig, "agent.payment").await;
    answer(&rig, &req, ok("charged")).await;
    assert_eq!(replies(&s).await.applied, 1);
    copy_is_dropped(&rig, &s, &req, ok("charged")).await;
    // The last step's copy after the order completed.
    let req = request(&rig, "agent.shipping").await;
    answer(&rig, &req, ok("shipped")).await;
    assert_eq!(replies(&s).await.completed, 1);
    copy_is_dropped(&rig, &s, &req, ok("shipped")).await;
    // One request per step went out, each step was recorded done once, nothing is left.
    for q in [
        "agent.inventory",
        "agent.payment",
        "agent.shipping",
        "replies",
    ] {
        let left = rig
            .transport
            .receive(&QueueName::parse(q).unwrap(), 100, Duration::ZERO)
            .await
            .unwrap();
        assert!(left.is_empty(), "{q} is empty: {left:?}");
    }
    let view = rig.store.get(&id).await.unwrap();
    assert_eq!(view.state.process_state, ProcessState::Processed);
    assert_eq!(view.steps.len(), 3);
    assert_eq!(
        view.history_count(HistoryKind::StepSucceeded),
        3,
        "{:?}",
        view.history
    );
}

#[tokio::test]
async fn a_permanent_failure_undoes_the_completed_steps_then_ends_in_error() {
    let rig = rig().await;
    let s = scheduler(&rig, "scheduler-a", vec![Workflow::default()]);
    let id = submit(&rig, "o-2").await;
    s.claim_once().await.unwrap();
    let reserve = request(&rig, "agent.inventory").await;
    answer(&rig, &reserve, ok("reserved")).await;
    replies(&s).await;
    let charge = request(&rig, "agent.payment").await;
    answer(
        &rig,
        &charge,
        StepOutcome::Failed {
            error: "card declined".into(),
        },
    )
    .await;
    replies(&s).await;
    let undo = request(&rig, "agent.inventory").await;
    assert_eq!(
        (undo.kind, undo.action.as_str()),
        (StepKind::Compensate, "release-inventory")
    );
    answer(&rig, &undo, ok("released")).await;
    let pass = replies(&s).await;
    assert_eq!(pass.failed, 1, "{pass:?}");
    let view = rig.store.get(&id).await.unwrap();
    assert_eq!(view.state.process_state, ProcessState::Error);
    let error = view.state.last_error.unwrap();
    assert!(
        error.contains("card declined") && error.contains("undone: reserve-inventory"),
        "{error}"
    );
}

#[tokio::test]
async fn a_reply_for_a_step_its_workflow_does_not_have_is_dead_lettered() {
    let rig = rig().await;
    let s = scheduler(&rig, "scheduler-a", vec![Workflow::default()]);
    submit(&rig, "o-3").await;
    s.claim_once().await.unwrap();
    let mut req = request(&rig, "agent.inventory").await;
    req.step = "teleport".into();
    req.action = "teleport".into();
    answer(&rig, &req, ok("?")).await;
    let pass = replies(&s).await;
    assert_eq!(pass.rejected, 1, "{pass:?}");
    let dead = rig
        .transport
        .dead_letters(&QueueName::parse("replies").unwrap(), 10)
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].reason, "UnknownStep");
}

#[tokio::test]
async fn a_reply_of_a_version_it_has_not_loaded_is_given_back_then_its_order_handed_back() {
    let rig = rig().await;
    let v1 = Workflow::default();
    let mut v2 = Workflow::default();
    v2.steps[0].timeout_ms += 1;
    let a = scheduler(&rig, "scheduler-a", vec![v1.clone()]);
    let b = scheduler(&rig, "scheduler-b", vec![v2]);
    let id = submit(&rig, "o-4").await;
    a.claim_once().await.unwrap();
    let req = request(&rig, "agent.inventory").await;
    answer(&rig, &req, ok("reserved")).await;
    // B runs v2 only: it gives the reply back for a scheduler that runs v1...
    for _ in 0..2 {
        let pass = replies(&b).await;
        assert_eq!((pass.foreign, pass.applied), (1, 0), "{pass:?}");
        let row = rig.store.get(&id).await.unwrap().state;
        assert_eq!(row.process_state, ProcessState::Processing);
    }
    // ...and after a few rounds hands the order back, nothing counted against it.
    let pass = replies(&b).await;
    assert_eq!(pass.foreign, 1, "{pass:?}");
    let view = rig.store.get(&id).await.unwrap();
    assert_eq!(view.state.process_state, ProcessState::Pending);
    assert_eq!(view.state.failure_count, 0);
    assert_eq!(
        view.state.workflow_version.as_deref(),
        Some(v1.version().as_str())
    );
    let released = view
        .history
        .iter()
        .rfind(|e| e.kind == HistoryKind::Released)
        .unwrap();
    assert!(
        released
            .reason
            .as_deref()
            .unwrap()
            .contains("neither stored nor loaded"),
        "{released:?}"
    );
    // B will not claim it; A does, and re-sends the step under the same key.
    assert_eq!(b.claim_once().await.unwrap().claimed, 0);
    assert_eq!(
        b.report_unserved().await.unwrap(),
        vec![(v1.reference().to_string(), 1)]
    );
    assert_eq!(a.claim_once().await.unwrap().claimed, 1);
    let again = request(&rig, "agent.inventory").await;
    assert_eq!(again.idempotency_key, req.idempotency_key);
}

/// The fleet sees payment down: the order's inventory step is sent and recorded, but
/// no payment request goes out; the order waits (Pending, held, uncounted) at its
/// payment step. A claim finds nothing while it waits. Once the probe is due this
/// scheduler lets it through; once payment is reported up the order is claimed and
/// sent on, its payment step marked uncertain (it may have been sent before).
#[tokio::test]
async fn an_order_whose_next_service_is_down_waits_instead_of_being_sent_to_it() {
    use orderly_core::service::{OutagePolicy, ServiceState, ServiceView, is_held};
    let rig = rig().await;
    let view = Arc::new(ServiceView::new(rig.store.clone()));
    let s = scheduler(&rig, "scheduler-a", vec![Workflow::default()]).with_services(view.clone());
    let id = submit(&rig, "o-1").await;
    assert_eq!(s.claim_once().await.unwrap().requests, 1);
    let inventory = request(&rig, "agent.inventory").await;
    let policy = OutagePolicy {
        probe_after: Duration::from_millis(300),
        ..OutagePolicy::default()
    };
    rig.store
        .report_failure(
            "agent.payment",
            "HTTP 503",
            &InstanceId::parse("agent-1").unwrap(),
            &policy,
        )
        .await
        .unwrap();
    s.watch_services().await.unwrap();
    answer(&rig, &inventory, ok("reserved")).await;
    let pass = replies(&s).await;
    assert_eq!(
        (pass.applied, pass.requests, pass.parked),
        (1, 0, 1),
        "{pass:?}"
    );
    let payment = QueueName::parse("agent.payment").unwrap();
    assert!(
        rig.transport
            .receive(&payment, 10, Duration::from_millis(50))
            .await
            .unwrap()
            .is_empty(),
        "nothing is sent to a service that is down"
    );
    let view_of = rig.store.get(&id).await.unwrap();
    assert_eq!(view_of.state.process_state, ProcessState::Pending);
    assert_eq!(view_of.state.current_step, 1);
    assert_eq!(view_of.state.failure_count, 0);
    assert!(is_held(view_of.state.next_attempt_at));
    assert_eq!(view_of.steps[0].status, StepStatus::Succeeded);
    let waiting = view_of.history.last().unwrap();
    assert_eq!(waiting.kind, HistoryKind::Waiting);
    assert!(
        waiting
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("agent.payment down since") && r.contains("HTTP 503")),
        "{waiting:?}"
    );
    assert_eq!(s.claim_once().await.unwrap().claimed, 0);

    // The probe falls due: this scheduler lets the waiting order through, and it is
    // sent to payment as the probe.
    tokio::time::sleep(Duration::from_millis(350)).await;
    s.watch_services().await.unwrap();
    assert_eq!(
        view.get("agent.payment").unwrap().state,
        ServiceState::Down,
        "the view is read before the probe is let through"
    );
    s.watch_services().await.unwrap();
    assert_eq!(
        view.get("agent.payment").unwrap().state,
        ServiceState::Probing
    );
    let pass = s.claim_once().await.unwrap();
    assert_eq!((pass.claimed, pass.requests), (1, 1), "{pass:?}");
    let probe = request(&rig, "agent.payment").await;
    assert_eq!(probe.step, "charge-payment");

    // Back up: the next order goes straight through.
    rig.store
        .report_success("agent.payment", "agent-1")
        .await
        .unwrap();
    s.watch_services().await.unwrap();
    answer(&rig, &probe, ok("charged")).await;
    let pass = replies(&s).await;
    assert_eq!(
        (pass.applied, pass.requests, pass.parked),
        (1, 1, 0),
        "{pass:?}"
    );
    request(&rig, "agent.shipping").await;
}

/// An agent's `Deferred` reply parks the order at the step it was asked, uncounted.
#[tokio::test]
async fn a_deferred_reply_parks_the_order_at_its_step_without_counting_a_failure() {
    let rig = rig().await;
    let s = scheduler(&rig, "scheduler-a", vec![Workflow::default()]);
    let id = submit(&rig, "o-1").await;
    s.claim_once().await.unwrap();
    let req = request(&rig, "agent.inventory").await;
    let deferred = StepOutcome::Deferred {
        service: "agent.inventory".into(),
        reason: "agent.inventory down since 10:32:05 UTC (fleet view); not called".into(),
    };
    answer(&rig, &req, deferred).await;
    let pass = replies(&s).await;
    assert_eq!(
        (pass.parked, pass.applied, pass.dropped),
        (1, 0, 0),
        "{pass:?}"
    );
    let view = rig.store.get(&id).await.unwrap();
    assert_eq!(
        (
            view.state.process_state,
            view.state.failure_count,
            view.state.current_step
        ),
        (ProcessState::Pending, 0, 0)
    );
    assert_eq!(view.state.waiting_on.as_deref(), Some("agent.inventory"));
    // No row says the service is down (this scheduler never heard): claimable at once.
    assert!(!orderly_core::service::is_held(view.state.next_attempt_at));
    // Claimed again (a new epoch), its step is sent again.
    assert_eq!(s.claim_once().await.unwrap().requests, 1);
    let again = request(&rig, "agent.inventory").await;
    assert_eq!(again.step_index, 0);
}

/// Every request waiting on `queue` (taken off it).
async fn all_requests(rig: &Rig, queue: &str) -> Vec<StepRequest> {
    let queue = QueueName::parse(queue).unwrap();
    let got = rig
        .transport
        .receive(&queue, 100, Duration::from_millis(100))
        .await
        .unwrap();
    let mut requests = Vec::new();
    for m in &got {
        rig.transport.complete(m).await.unwrap();
        requests.push(serde_json::from_slice(&m.body).unwrap());
    }
    requests
}

#[tokio::test]
async fn a_scheduler_never_holds_more_than_its_maximum_and_claims_again_as_orders_finish() {
    let rig = rig().await;
    let mut cfg = SchedulerConfig::new(
        InstanceId::parse("scheduler-a").unwrap(),
        Arc::new(Workflows::new(vec![Workflow::default()]).unwrap()),
    );
    cfg.claim_batch = 2;
    cfg.max_in_flight = 3;
    let owner = cfg.instance.clone();
    let s = Scheduler::new(
        rig.store.clone(),
        rig.transport.clone(),
        Arc::new(SystemClock),
        cfg,
    );
    for i in 0..7 {
        submit(&rig, &format!("o-max-{i}")).await;
    }
    let held = || async { rig.store.count_owned(&owner).await.unwrap() };
    // A batch, then what room is left, then nothing while it holds its maximum.
    assert_eq!(s.claim_once().await.unwrap().claimed, 2);
    assert_eq!(s.claim_once().await.unwrap().claimed, 1);
    for _ in 0..3 {
        assert_eq!(s.claim_once().await.unwrap().claimed, 0);
        assert_eq!(held().await, 3);
    }
    // Two of the three finish (each step answered); the third stays at its first step.
    let mut first = all_requests(&rig, "agent.inventory").await;
    assert_eq!(first.len(), 3);
    let waiting = first.pop().unwrap();
    let mut reqs = first;
    for next in ["agent.payment", "agent.shipping", ""] {
        for req in &reqs {
            answer(&rig, req, ok("done")).await;
        }
        replies(&s).await;
        if !next.is_empty() {
            reqs = all_requests(&rig, next).await;
            assert_eq!(reqs.len(), 2, "{next}");
        }
    }
    assert_eq!(held().await, 1);
    // Room for two again, whatever the scheduler had counted before.
    assert_eq!(s.claim_once().await.unwrap().claimed, 2);
    assert_eq!(s.claim_once().await.unwrap().claimed, 0);
    assert_eq!(held().await, 3);
    answer(&rig, &waiting, ok("done")).await;
    replies(&s).await;
    assert_eq!(held().await, 3, "one step done, the order still held");
}

/// A claim that took fewer orders than it asked for took everything claimable when it
/// looked: the loop waits for the next order made claimable instead of taking the
/// write turn again at once to find nothing (on SQLite, one wasted write per claim).
#[tokio::test]
async fn a_claim_that_took_everything_waits_for_the_next_order_instead_of_claiming_again() {
    let sqlite = Arc::new(
        orderly_sql::SqliteStore::open("sqlite::memory:", TimeSource::Database)
            .await
            .unwrap(),
    );
    let rig = rig_on(sqlite.clone()).await;
    let mut cfg = SchedulerConfig::new(
        InstanceId::parse("scheduler-a").unwrap(),
        Arc::new(Workflows::new(vec![Workflow::default()]).unwrap()),
    );
    // No fallback poll during the test: only a submit wakes the loop.
    cfg.claim_poll = Duration::from_secs(600);
    // Its orders are never answered here: no waiting for them when it stops.
    cfg.shutdown_grace = Duration::ZERO;
    let s = Scheduler::new(
        rig.store.clone(),
        rig.transport.clone(),
        Arc::new(SystemClock),
        cfg,
    );
    let writes = || sqlite.stats().snapshot().writes;
    let processing = || async {
        rig.store
            .count_by_state()
            .await
            .unwrap()
            .into_iter()
            .find(|(state, _)| *state == ProcessState::Processing)
            .map_or(0, |(_, n)| n)
    };
    let settled = |expected: i64| async move {
        for _ in 0..500 {
            if processing().await == expected {
                // Long enough for a claim loop that claims again at once to do so.
                tokio::time::sleep(Duration::from_millis(200)).await;
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the scheduler did not claim {expected} orders");
    };
    let shutdown = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(s.run(shutdown.clone()));
    // Started: it resumed its orders (none) and claimed nothing; now it waits.
    settled(0).await;
    for round in 1..=2_i64 {
        let before = writes();
        let batch: Vec<orderly_core::store::Submission> = (0..3)
            .map(|i| orderly_core::store::Submission {
                order: orderly_testkit::builders::order_with_id(&format!("o-{round}-{i}"), 1),
                sends: Vec::new(),
            })
            .collect();
        rig.store
            .submit_many(&batch, &orderly_testkit::builders::submitter())
            .await
            .unwrap();
        settled(3 * round).await;
        assert_eq!(
            writes() - before,
            2,
            "round {round}: the submit and one claim, no claim of nothing after it"
        );
    }
    shutdown.cancel();
    running.await.unwrap();
}

/// Plays an order of the default workflow up to the request for `upto` (its third
/// step is ship, which cannot be undone), answering every earlier step.
async fn run_until(rig: &Rig, s: &Scheduler, id: &str, upto: &str) -> (OrderId, StepRequest) {
    let id = submit(rig, id).await;
    s.claim_once().await.unwrap();
    let mut req = request(rig, "agent.inventory").await;
    for next in ["agent.payment", "agent.shipping"] {
        if req.step == upto {
            break;
        }
        answer(rig, &req, ok("done")).await;
        replies(s).await;
        req = request(rig, next).await;
    }
    assert_eq!(req.step, upto);
    (id, req)
}

fn operator() -> orderly_core::Actor {
    orderly_core::Actor::operator("olga")
}

/// A cancel asked for while ship, which cannot be undone, may be taking effect is
/// refused at once, naming ship (releasing stock and refunding a shipped order would
/// leave it half undone); the order runs on to Processed.
#[tokio::test]
async fn a_cancel_once_ship_is_under_way_is_refused_and_the_order_runs_to_its_end() {
    let rig = rig().await;
    let s = scheduler(&rig, "scheduler-a", vec![Workflow::default()]);
    let (id, ship) = run_until(&rig, &s, "o-6", "ship").await;
    match rig
        .store
        .request_cancel(&id, &operator(), "customer changed mind", &[])
        .await
    {
        Err(orderly_core::Error::PastReturn { steps, .. }) => assert_eq!(steps, "ship"),
        other => panic!("refused, naming ship: {other:?}"),
    }
    answer(&rig, &ship, ok("shipped")).await;
    assert_eq!(replies(&s).await.completed, 1);
    assert_eq!(
        rig.store.get(&id).await.unwrap().state.process_state,
        ProcessState::Processed
    );
}

/// When the store could not tell (a cancel that raced ship's start, or a ship row
/// written by a version that did not mark it), the scheduler that claims the order to
/// undo it finds ship may have taken effect and undoes nothing: the order ends in Error
/// saying why, for repair by hand. The operator's retry then carries on from ship under
/// the same key, and the order ends Processed.
#[tokio::test]
async fn an_order_undone_past_the_point_of_no_return_ends_in_error_and_a_retry_finishes_it() {
    let sqlite = Arc::new(
        orderly_sql::SqliteStore::open("sqlite::memory:", TimeSource::Database)
            .await
            .unwrap(),
    );
    let rig = rig_on(sqlite.clone()).await;
    let s = scheduler(&rig, "scheduler-a", vec![Workflow::default()]);
    let (id, ship) = run_until(&rig, &s, "o-7", "ship").await;
    // As a row of a version before the marker.
    sqlx::query("UPDATE order_steps SET irreversible = 0")
        .execute(sqlite.pool())
        .await
        .unwrap();
    let asked = rig
        .store
        .request_cancel(&id, &operator(), "customer changed mind", &[])
        .await
        .unwrap();
    assert_eq!(
        (asked.process_state, asked.finish_as),
        (ProcessState::Pending, Some(ProcessState::Cancelled))
    );
    let pass = s.claim_once().await.unwrap();
    assert_eq!((pass.failed, pass.requests), (1, 0), "{pass:?}");
    for q in ["agent.inventory", "agent.payment", "agent.shipping"] {
        assert!(
            all_requests(&rig, q).await.is_empty(),
            "nothing sent to {q}"
        );
    }
    let view = rig.store.get(&id).await.unwrap();
    assert_eq!(view.state.process_state, ProcessState::Error);
    let error = view.state.last_error.clone().unwrap();
    assert!(
        error.starts_with(
            "cancel asked for, but ship may have taken effect and cannot be undone: \
             nothing undone; needs repair by hand"
        ),
        "{error}"
    );
    let done: Vec<_> = view
        .steps
        .iter()
        .map(|s| (s.name.as_str(), s.status))
        .collect();
    assert_eq!(
        done,
        [
            ("reserve-inventory", StepStatus::Succeeded),
            ("charge-payment", StepStatus::Succeeded),
            ("ship", StepStatus::Started),
        ]
    );
    // The late reply of the fenced-out ship request changes nothing.
    answer(&rig, &ship, ok("shipped")).await;
    assert_eq!(replies(&s).await.applied, 0);
    // Retried: ship again, under its key, and done.
    rig.store
        .resubmit(&id, &operator(), "shipment confirmed", &[])
        .await
        .unwrap();
    s.claim_once().await.unwrap();
    let again = request(&rig, "agent.shipping").await;
    assert_eq!(again.idempotency_key, ship.idempotency_key);
    answer(&rig, &again, ok("shipped")).await;
    assert_eq!(replies(&s).await.completed, 1);
    assert_eq!(
        rig.store.get(&id).await.unwrap().state.process_state,
        ProcessState::Processed
    );
}

/// Before ship is sent, a cancel undoes what was done, latest first, and ends
/// Cancelled.
#[tokio::test]
async fn a_cancel_before_the_point_of_no_return_undoes_the_steps_done_and_ends_cancelled() {
    let rig = rig().await;
    let s = scheduler(&rig, "scheduler-a", vec![Workflow::default()]);
    let (id, _charge) = run_until(&rig, &s, "o-8", "charge-payment").await;
    rig.store
        .request_cancel(&id, &operator(), "customer changed mind", &[])
        .await
        .unwrap();
    s.claim_once().await.unwrap();
    for (queue, action) in [
        ("agent.payment", "refund"),
        ("agent.inventory", "release-inventory"),
    ] {
        let undo = request(&rig, queue).await;
        assert_eq!(
            (undo.kind, undo.action.as_str()),
            (StepKind::Compensate, action)
        );
        answer(&rig, &undo, ok("undone")).await;
        replies(&s).await;
    }
    let view = rig.store.get(&id).await.unwrap();
    assert_eq!(view.state.process_state, ProcessState::Cancelled);
    assert!(all_requests(&rig, "agent.shipping").await.is_empty());
}

/// A workflow whose middle step cannot be undone: the last step failing for good
/// undoes nothing (the first step's release would leave the order half undone) and
/// says so; a step marked `undo_needed = false` in the same place lets the undoing
/// go ahead past it.
#[tokio::test]
async fn a_failure_after_a_step_that_cannot_be_undone_is_left_for_repair_by_hand() {
    for undo_needed in [true, false] {
        let rig = rig().await;
        let mut flow = Workflow::default();
        // reserve-inventory, ship (no compensation), charge-payment (refund).
        flow.steps.swap(1, 2);
        flow.steps[1].undo_needed = undo_needed;
        flow.validate().unwrap();
        let s = scheduler(&rig, "scheduler-a", vec![flow]);
        let id = submit(&rig, "o-9").await;
        s.claim_once().await.unwrap();
        let reserve = request(&rig, "agent.inventory").await;
        answer(&rig, &reserve, ok("reserved")).await;
        replies(&s).await;
        let ship = request(&rig, "agent.shipping").await;
        answer(&rig, &ship, ok("shipped")).await;
        replies(&s).await;
        let charge = request(&rig, "agent.payment").await;
        let declined = StepOutcome::Failed {
            error: "card declined".into(),
        };
        answer(&rig, &charge, declined).await;
        let pass = replies(&s).await;
        let releases = all_requests(&rig, "agent.inventory").await;
        let view = rig.store.get(&id).await.unwrap();
        if undo_needed {
            assert_eq!((pass.failed, releases.len()), (1, 0), "{pass:?}");
            assert_eq!(view.state.process_state, ProcessState::Error);
            let error = view.state.last_error.unwrap();
            assert!(
                error.contains("step charge-payment failed: card declined")
                    && error.contains("ship may have taken effect")
                    && error.contains("by hand"),
                "{error}"
            );
        } else {
            assert_eq!(
                releases.len(),
                1,
                "ship needs no undoing: the stock is released"
            );
            answer(&rig, &releases[0], ok("released")).await;
            assert_eq!(replies(&s).await.failed, 1);
            let error = rig.store.get(&id).await.unwrap().state.last_error.unwrap();
            assert!(error.contains("undone: reserve-inventory"), "{error}");
        }
    }
}

/// A scheduler runs an order pinned to a version it has no file for once that version
/// is stored: the scheduler that loaded it stored it when it started.
#[tokio::test]
async fn a_scheduler_runs_a_stored_version_it_has_no_file_for() {
    let rig = rig().await;
    let v1 = Workflow::default();
    let mut v2 = Workflow::default();
    v2.steps[0].timeout_ms += 1;
    let a = scheduler(&rig, "scheduler-a", vec![v1.clone()]);
    let b = scheduler(&rig, "scheduler-b", vec![v2.clone()]);
    let id = submit(&rig, "o-5").await;
    a.claim_once().await.unwrap();
    let req = request(&rig, "agent.inventory").await;
    answer(&rig, &req, ok("reserved")).await;
    // A stores v1 (it has nothing else to take on); B stores v2 and takes v1 on.
    assert_eq!(a.store_and_adopt_workflows().await.unwrap(), Vec::new());
    assert_eq!(
        b.store_and_adopt_workflows().await.unwrap(),
        vec![v1.reference()]
    );
    assert_eq!(
        b.adopt_stored_workflows().await.unwrap(),
        Vec::new(),
        "once"
    );
    let pass = replies(&b).await;
    assert_eq!((pass.foreign, pass.applied), (0, 1), "{pass:?}");
    let next = request(&rig, "agent.payment").await;
    assert_eq!(next.step, "charge-payment");
    let row = rig.store.get(&id).await.unwrap().state;
    assert_eq!(row.workflow_version.as_deref(), Some(v1.version().as_str()));
    let stored: Vec<String> = rig
        .store
        .stored_workflows()
        .await
        .unwrap()
        .iter()
        .map(|s| format!("{} {}", s.reference, s.first_seen_by))
        .collect();
    assert_eq!(stored.len(), 2, "{stored:?}");
    assert!(
        stored.contains(&format!("{} scheduler-a", v1.reference())),
        "{stored:?}"
    );
    assert!(
        stored.contains(&format!("{} scheduler-b", v2.reference())),
        "{stored:?}"
    );
}

/// A scheduler's store that cannot use the writes of one order: a batch holding one
/// fails whole (as a statement over an unreadable row does), and the order's write
/// alone is refused; everything else is the real SQLite store's.
struct Unreadable {
    inner: Arc<orderly_sql::SqliteStore>,
    order: OrderId,
}

impl Unreadable {
    fn refusal(&self) -> orderly_core::Error {
        orderly_core::Error::Corrupt(format!("step row of {} unreadable", self.order))
    }
}

mod unreadable_impl {
    use super::*;
    use orderly_core::store::{
        BatchOutcome, ClaimRequest, ClaimedOrder, Completion, SchedulerStore, StepUpdate,
        StepWrite, StoredWorkflow, WorkflowCount,
    };
    use orderly_core::{Fence, Result, StepRecord};

    #[async_trait::async_trait]
    impl SchedulerStore for Unreadable {
        async fn claim(&self, request: &ClaimRequest) -> Result<Vec<ClaimedOrder>> {
            self.inner.claim(request).await
        }
        async fn claim_and_start(
            &self,
            request: &ClaimRequest,
            plan: &(dyn for<'c> Fn(&'c ClaimedOrder) -> Option<StepWrite> + Send + Sync),
        ) -> Result<Vec<(ClaimedOrder, bool)>> {
            self.inner.claim_and_start(request, plan).await
        }
        async fn record_step(
            &self,
            fence: &Fence,
            step: &StepUpdate,
            sends: &[orderly_core::transport::Envelope],
        ) -> Result<StepRecord> {
            self.inner.record_step(fence, step, sends).await
        }
        async fn extend(
            &self,
            fence: &Fence,
            by: Duration,
        ) -> Result<chrono::DateTime<chrono::Utc>> {
            self.inner.extend(fence, by).await
        }
        async fn complete_many(&self, completions: &[Completion]) -> Result<BatchOutcome> {
            self.inner.complete_many(completions).await
        }
        async fn finish_undone(&self, fence: &Fence, error: &str) -> Result<Option<i32>> {
            self.inner.finish_undone(fence, error).await
        }
        async fn fail(
            &self,
            fence: &Fence,
            error: &str,
            sends: &[orderly_core::transport::Envelope],
        ) -> Result<()> {
            self.inner.fail(fence, error, sends).await
        }
        async fn release(&self, fence: &Fence, reason: &str) -> Result<()> {
            self.inner.release(fence, reason).await
        }
        async fn park_many(
            &self,
            parks: &[orderly_core::service::Park],
        ) -> Result<Vec<Result<orderly_core::service::Parked>>> {
            self.inner.park_many(parks).await
        }
        async fn record_steps(&self, writes: &[StepWrite]) -> Result<Vec<Result<()>>> {
            let ours = |w: &StepWrite| w.fence.order_id == self.order;
            match writes {
                [w] if ours(w) => Ok(vec![Err(self.refusal())]),
                _ if writes.iter().any(ours) => Err(self.refusal()),
                _ => self.inner.record_steps(writes).await,
            }
        }
        async fn resume_owned(&self, owner: &InstanceId) -> Result<Vec<ClaimedOrder>> {
            self.inner.resume_owned(owner).await
        }
        async fn begin_compensation(
            &self,
            fence: &Fence,
            finish_as: ProcessState,
            reason: &str,
            sends: &[orderly_core::transport::Envelope],
        ) -> Result<()> {
            self.inner
                .begin_compensation(fence, finish_as, reason, sends)
                .await
        }
        async fn finish_cancelled(
            &self,
            fence: &Fence,
            reason: &str,
            sends: &[orderly_core::transport::Envelope],
        ) -> Result<()> {
            self.inner.finish_cancelled(fence, reason, sends).await
        }
        async fn steps(&self, order_id: &OrderId) -> Result<Vec<StepRecord>> {
            self.inner.steps(order_id).await
        }
        async fn workflows_in_flight(&self) -> Result<Vec<WorkflowCount>> {
            self.inner.workflows_in_flight().await
        }
        async fn record_workflows(&self, workflows: &[Arc<Workflow>], by: &str) -> Result<usize> {
            self.inner.record_workflows(workflows, by).await
        }
        async fn stored_workflows(&self) -> Result<Vec<StoredWorkflow>> {
            self.inner.stored_workflows().await
        }
        async fn message_key(
            &self,
            fresh: orderly_core::signing::MessageKey,
            by: &str,
        ) -> Result<orderly_core::signing::MessageKey> {
            self.inner.message_key(fresh, by).await
        }
        async fn count_owned(&self, owner: &InstanceId) -> Result<i64> {
            self.inner.count_owned(owner).await
        }
        async fn owned(&self, owner: &InstanceId) -> Result<Vec<Fence>> {
            self.inner.owned(owner).await
        }
    }
}

/// A reply whose write the store cannot use (its order's data unreadable) is
/// dead-lettered with the store's reason, not dropped in silence and not retried for
/// ever, and does not take the other replies of its batch down with it: theirs are
/// recorded. The same holds for a failure reply, whose write goes alone.
#[tokio::test]
async fn a_reply_the_store_cannot_use_is_dead_lettered_with_the_reason_and_the_rest_go_on() {
    let sqlite = Arc::new(
        orderly_sql::SqliteStore::open("sqlite::memory:", TimeSource::Database)
            .await
            .unwrap(),
    );
    let rig = rig_on(sqlite.clone()).await;
    let poisoned = OrderId::parse("o-unreadable").unwrap();
    let cfg = SchedulerConfig::new(
        InstanceId::parse("scheduler-a").unwrap(),
        Arc::new(Workflows::new(vec![Workflow::default()]).unwrap()),
    );
    let s = Scheduler::new(
        Arc::new(Unreadable {
            inner: sqlite.clone(),
            order: poisoned.clone(),
        }),
        rig.transport.clone(),
        Arc::new(SystemClock),
        cfg,
    );
    let replies_q = QueueName::parse("replies").unwrap();
    for id in ["o-unreadable", "o-fine", "o-failing"] {
        submit(&rig, id).await;
    }
    s.claim_once().await.unwrap();
    let reqs = all_requests(&rig, "agent.inventory").await;
    assert_eq!(reqs.len(), 3);
    for req in reqs
        .iter()
        .filter(|r| r.fence.order_id.as_str() != "o-failing")
    {
        answer(&rig, req, ok("reserved")).await;
    }
    let pass = replies(&s).await;
    assert_eq!(
        (pass.applied, pass.rejected, pass.dropped),
        (1, 1, 0),
        "{pass:?}"
    );
    let dead = rig.transport.dead_letters(&replies_q, 10).await.unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].reason, "Corrupt");
    assert!(
        dead[0].description.contains("o-unreadable") && dead[0].description.contains("unreadable"),
        "{}",
        dead[0].description
    );
    // The other order went on to its next step; the poisoned one waits at its step
    // for its deadline (the supervisor's), its reply kept in the dead letters.
    assert_eq!(all_requests(&rig, "agent.payment").await.len(), 1);
    let fine = rig
        .store
        .get(&OrderId::parse("o-fine").unwrap())
        .await
        .unwrap();
    assert_eq!(fine.state.current_step, 1);
    let stuck = rig.store.get(&poisoned).await.unwrap();
    assert_eq!(
        (stuck.state.process_state, stuck.state.current_step),
        (ProcessState::Processing, 0)
    );
    // Nothing is left to come back: the replies queue is empty.
    assert!(replies(&s).await == Pass::default());

    // A failure reply, whose write goes alone, of a third order: applied (it is not
    // the poisoned one); and the poisoned order's failure reply is dead-lettered too.
    let failing = reqs
        .iter()
        .find(|r| r.fence.order_id.as_str() == "o-failing")
        .unwrap();
    let poisoned_req = reqs.iter().find(|r| r.fence.order_id == poisoned).unwrap();
    for req in [failing, poisoned_req] {
        answer(
            &rig,
            req,
            StepOutcome::Failed {
                error: "out of stock".into(),
            },
        )
        .await;
    }
    let pass = replies(&s).await;
    assert_eq!(pass.rejected, 1, "{pass:?}");
    let dead = rig.transport.dead_letters(&replies_q, 10).await.unwrap();
    assert_eq!(dead.len(), 2, "{dead:?}");
    let failed = rig
        .store
        .get(&OrderId::parse("o-failing").unwrap())
        .await
        .unwrap();
    assert_eq!(
        failed.state.process_state,
        ProcessState::Error,
        "{failed:?}"
    );
}

/// A host clock `0` ahead of the real one (a host whose wall clock drifted).
#[derive(Debug)]
struct Ahead(chrono::Duration);

impl orderly_core::Clock for Ahead {
    fn now(&self) -> chrono::DateTime<chrono::Utc> {
        chrono::Utc::now() + self.0
    }
}

/// A scheduler on a host whose clock is 10 minutes ahead of the database's: on its
/// own clock every reply is past its deadline and dropped (the order would wait for
/// the supervisor and fail in the end); on the store's time, which the role measures,
/// the reply is in time and the order goes on.
#[tokio::test]
async fn a_scheduler_whose_host_clock_is_minutes_ahead_reads_deadlines_on_the_stores_time() {
    let rig = rig().await;
    let ahead: Arc<dyn orderly_core::Clock> = Arc::new(Ahead(chrono::Duration::minutes(10)));
    let cfg = |name: &str| {
        SchedulerConfig::new(
            InstanceId::parse(name).unwrap(),
            Arc::new(Workflows::new(vec![Workflow::default()]).unwrap()),
        )
    };
    let naive = Scheduler::new(
        rig.store.clone(),
        rig.transport.clone(),
        ahead.clone(),
        cfg("scheduler-naive"),
    );
    let first = submit(&rig, "o-skew-1").await;
    naive.claim_once().await.unwrap();
    let req = request(&rig, "agent.inventory").await;
    answer(&rig, &req, ok("reserved")).await;
    let pass = replies(&naive).await;
    assert_eq!((pass.applied, pass.dropped), (0, 1), "{pass:?}");
    assert_eq!(rig.store.get(&first).await.unwrap().state.current_step, 0);

    let shutdown = tokio_util::sync::CancellationToken::new();
    let store: Arc<dyn orderly_core::store::OperatorStore> = rig.store.clone();
    let clock = orderly_runtime::clock::on_store_time_from(ahead, store, &shutdown).await;
    let off = clock.offset() + chrono::Duration::minutes(10);
    assert!(
        off.num_milliseconds().abs() < 1_000,
        "measured {:?}",
        clock.offset()
    );
    let s = Scheduler::new(
        rig.store.clone(),
        rig.transport.clone(),
        clock,
        cfg("scheduler-a"),
    );
    let second = submit(&rig, "o-skew-2").await;
    s.claim_once().await.unwrap();
    let req = request(&rig, "agent.inventory").await;
    assert_eq!(req.fence.order_id, second);
    answer(&rig, &req, ok("reserved")).await;
    let pass = replies(&s).await;
    assert_eq!(
        (pass.applied, pass.dropped, pass.requests),
        (1, 0, 1),
        "{pass:?}"
    );
    assert_eq!(rig.store.get(&second).await.unwrap().state.current_step, 1);
    shutdown.cancel();
}
