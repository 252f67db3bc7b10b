//! The agent against a scripted remote service (a double of our own `RemoteService`
//! port) and a real SQL queue: retries, permanent failures, Retry-After, deadlines,
//! the circuit breaker.

#![allow(clippy::unwrap_used)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::Utc;
use orderly_agent::{
    Agent, AgentConfig, BreakerConfig, CallError, Handled, ProbeAnswer, RemoteCall, RemoteService,
};
use orderly_core::messages::{
    StepContext, StepKind, StepOutcome, StepReply, StepRequest, json_message,
};
use orderly_core::transport::{QueueName, QueueSettings, Transport};
use orderly_core::workflow::{NotFound, RetryPolicy, StatusProbe};
use orderly_core::{Epoch, Fence, InstanceId, OrderId, SystemClock, TimeSource};

/// Answers from a script; records the keys it was called with. Its status probe
/// answers from a second script and records the URLs it was asked at.
struct Scripted {
    script: Mutex<VecDeque<Result<String, CallError>>>,
    keys: Mutex<Vec<String>>,
    delay: Duration,
    probe_script: Mutex<VecDeque<ProbeAnswer>>,
    probed: Mutex<Vec<String>>,
}

impl Scripted {
    fn new(script: Vec<Result<String, CallError>>) -> Arc<Self> {
        Arc::new(Self {
            script: Mutex::new(script.into()),
            keys: Mutex::default(),
            delay: Duration::ZERO,
            probe_script: Mutex::default(),
            probed: Mutex::default(),
        })
    }

    fn with_probe(script: Vec<Result<String, CallError>>, probes: Vec<ProbeAnswer>) -> Arc<Self> {
        let me = Self::new(script);
        *me.probe_script.lock().unwrap() = probes.into();
        me
    }

    fn probed(&self) -> Vec<String> {
        self.probed.lock().unwrap().clone()
    }

    fn calls(&self) -> Vec<String> {
        self.keys.lock().unwrap().clone()
    }
}

#[async_trait]
impl RemoteService for Scripted {
    async fn call(&self, call: &RemoteCall, _timeout: Duration) -> Result<String, CallError> {
        self.keys.lock().unwrap().push(call.idempotency_key.clone());
        tokio::time::sleep(self.delay).await;
        self.script
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or_else(|| Err(transient("script ran out")))
    }

    async fn probe(&self, url: &str, _key: &str, _timeout: Duration) -> ProbeAnswer {
        self.probed.lock().unwrap().push(url.to_owned());
        self.probe_script
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or_else(|| ProbeAnswer::Unknown("probe script ran out".into()))
    }
}

fn transient(e: &str) -> CallError {
    CallError::Transient {
        error: e.into(),
        retry_after: None,
    }
}

struct Rig {
    transport: Arc<dyn Transport>,
    /// The same database, as the fleet's store of the services' health.
    services: Arc<dyn orderly_core::service::ServiceStore>,
    work: QueueName,
    replies: QueueName,
}

async fn rig() -> Rig {
    let store = Arc::new(
        orderly_sql::SqliteStore::open("sqlite::memory:", TimeSource::Database)
            .await
            .unwrap(),
    );
    let services: Arc<dyn orderly_core::service::ServiceStore> = store.clone();
    let transport: Arc<dyn Transport> = store;
    let work = QueueName::parse("agent.inventory").unwrap();
    let replies = QueueName::parse("replies").unwrap();
    for q in [&work, &replies] {
        transport
            .declare_queue(q, &QueueSettings::default())
            .await
            .unwrap();
    }
    Rig {
        transport,
        services,
        work,
        replies,
    }
}

fn agent(rig: &Rig, remote: Arc<dyn RemoteService>, breaker: BreakerConfig) -> Agent {
    let mut cfg = AgentConfig::new(InstanceId::generate("agent"), vec![rig.work.clone()]);
    cfg.breaker = breaker;
    Agent::new(rig.transport.clone(), remote, Arc::new(SystemClock), cfg)
}

fn request(rig: &Rig, order: &str, deadline_in: Duration, attempts: u32) -> StepRequest {
    let order_id = OrderId::parse(order).unwrap();
    StepRequest {
        fence: Fence {
            order_id: order_id.clone(),
            owner: InstanceId::generate("scheduler"),
            epoch: Epoch(3),
        },
        step_index: 0,
        step: "reserve-inventory".into(),
        action: "reserve-inventory".into(),
        kind: StepKind::Do,
        idempotency_key: format!("{order_id}/0/reserve-inventory"),
        compensates: None,
        complete_by: Utc::now() + chrono::Duration::from_std(deadline_in).unwrap(),
        timeout_ms: 60_000,
        retry: RetryPolicy {
            max_attempts: attempts,
            initial_backoff_ms: 1,
            max_backoff_ms: 5,
            multiplier: 2.0,
        },
        reply_to: rig.replies.clone(),
        context: StepContext {
            workflow: None,
            details: orderly_testkit::builders::details(1),
            notify_to: None,
            finish_as: None,
            generation: 0,
        },
        probe: None,
        uncertain: false,
    }
}

/// Sends `req`, receives it as the agent would, and handles it.
async fn handle(rig: &Rig, agent: &Agent, req: StepRequest) -> Handled {
    rig.transport
        .send(&rig.work, &[json_message(req.message_id(), &req, None)])
        .await
        .unwrap();
    let mut got = rig
        .transport
        .receive(&rig.work, 1, Duration::from_secs(1))
        .await
        .unwrap();
    let msg = got.remove(0);
    agent.handle(req, msg).await
}

async fn replies(rig: &Rig) -> Vec<StepReply> {
    rig.transport
        .receive(&rig.replies, 100, Duration::from_millis(50))
        .await
        .unwrap()
        .iter()
        .map(|m| serde_json::from_slice(&m.body).unwrap())
        .collect()
}

#[tokio::test]
async fn transient_failures_are_retried_with_the_same_key_until_one_succeeds() {
    let rig = rig().await;
    let remote = Scripted::new(vec![
        Err(transient("503")),
        Err(transient("reset")),
        Ok("reserved".into()),
    ]);
    let a = agent(&rig, remote.clone(), BreakerConfig::default());
    let handled = handle(&rig, &a, request(&rig, "o-1", Duration::from_secs(10), 5)).await;
    assert_eq!(
        handled,
        Handled::Replied(StepOutcome::Succeeded {
            detail: "reserved".into()
        })
    );
    let keys = remote.calls();
    assert_eq!(keys.len(), 3);
    assert!(
        keys.iter().all(|k| k == "o-1/0/reserve-inventory"),
        "{keys:?}"
    );
    let r = replies(&rig).await;
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].attempts, 3);
    assert_eq!(r[0].fence.epoch, Epoch(3), "the fence is echoed");
    assert!(r[0].replied_at < r[0].complete_by);
    assert!(
        rig.transport
            .receive(&rig.work, 1, Duration::ZERO)
            .await
            .unwrap()
            .is_empty(),
        "the request is settled"
    );
}

#[tokio::test]
async fn a_permanent_failure_is_replied_at_once_without_retrying() {
    let rig = rig().await;
    let remote = Scripted::new(vec![Err(CallError::Permanent(
        "HTTP 422: card declined".into(),
    ))]);
    let a = agent(&rig, remote.clone(), BreakerConfig::default());
    let handled = handle(&rig, &a, request(&rig, "o-2", Duration::from_secs(10), 5)).await;
    assert_eq!(
        handled,
        Handled::Replied(StepOutcome::Failed {
            error: "HTTP 422: card declined".into()
        })
    );
    assert_eq!(remote.calls().len(), 1);
    assert_eq!(replies(&rig).await.len(), 1);
}

#[tokio::test]
async fn retry_after_is_honoured_before_the_next_try() {
    let rig = rig().await;
    let remote = Scripted::new(vec![
        Err(CallError::Transient {
            error: "429".into(),
            retry_after: Some(Duration::from_millis(400)),
        }),
        Ok("ok".into()),
    ]);
    let a = agent(&rig, remote.clone(), BreakerConfig::default());
    let started = Instant::now();
    let handled = handle(&rig, &a, request(&rig, "o-3", Duration::from_secs(10), 5)).await;
    assert!(matches!(
        handled,
        Handled::Replied(StepOutcome::Succeeded { .. })
    ));
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_retry_after_beyond_the_deadline_ends_in_silence() {
    let rig = rig().await;
    let remote = Scripted::new(vec![
        Err(CallError::Transient {
            error: "429".into(),
            retry_after: Some(Duration::from_secs(60)),
        }),
        Ok("ok".into()),
    ]);
    let a = agent(&rig, remote.clone(), BreakerConfig::default());
    let handled = handle(
        &rig,
        &a,
        request(&rig, "o-4", Duration::from_millis(500), 5),
    )
    .await;
    assert!(matches!(handled, Handled::Silent(_)), "{handled:?}");
    assert_eq!(remote.calls().len(), 1);
    assert!(
        replies(&rig).await.is_empty(),
        "nothing is sent after giving up"
    );
}

#[tokio::test]
async fn a_call_still_running_at_the_deadline_is_abandoned_and_nothing_is_sent() {
    let rig = rig().await;
    let remote = Arc::new(Scripted {
        script: Mutex::new(vec![Ok("late".into())].into()),
        keys: Mutex::default(),
        delay: Duration::from_secs(5),
        probe_script: Mutex::default(),
        probed: Mutex::default(),
    });
    let a = agent(&rig, remote.clone(), BreakerConfig::default());
    let started = Instant::now();
    let handled = handle(
        &rig,
        &a,
        request(&rig, "o-5", Duration::from_millis(300), 5),
    )
    .await;
    assert!(matches!(handled, Handled::Silent(_)), "{handled:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the call was cut at the deadline"
    );
    assert!(replies(&rig).await.is_empty());
}

#[tokio::test]
async fn when_the_tries_run_out_the_agent_stays_silent_for_the_supervisor() {
    let rig = rig().await;
    let remote = Scripted::new(vec![]);
    let a = agent(&rig, remote.clone(), BreakerConfig::default());
    let handled = handle(&rig, &a, request(&rig, "o-6", Duration::from_secs(10), 3)).await;
    assert!(
        matches!(handled, Handled::Silent(ref why) if why.contains("3 calls")),
        "{handled:?}"
    );
    assert_eq!(remote.calls().len(), 3);
    assert!(replies(&rig).await.is_empty());
}

#[tokio::test]
async fn an_open_breaker_stops_calls_to_a_service_that_keeps_failing() {
    let rig = rig().await;
    let remote = Scripted::new(vec![]);
    let a = agent(
        &rig,
        remote.clone(),
        BreakerConfig {
            failure_threshold: 2,
            open_for: Duration::from_secs(30),
        },
    );
    // Two failures open the breaker; the rest of this request and the whole next one
    // make no call: each is given back to the queue at once (not held until its
    // deadline with a permit and the message's lock).
    let started = Instant::now();
    let first = handle(
        &rig,
        &a,
        request(&rig, "o-7", Duration::from_millis(400), 10),
    )
    .await;
    let second = handle(
        &rig,
        &a,
        request(&rig, "o-8", Duration::from_millis(400), 10),
    )
    .await;
    assert!(matches!(first, Handled::Deferred(_)), "{first:?}");
    assert!(
        matches!(second, Handled::Deferred(ref why) if why.contains("after 0 calls")),
        "{second:?}"
    );
    assert_eq!(remote.calls().len(), 2, "{:?}", remote.calls());
    assert!(
        started.elapsed() < Duration::from_millis(400),
        "not held until the deadline"
    );
    // Both are back on the queue, visible at once.
    let back = rig
        .transport
        .receive(&rig.work, 10, Duration::from_millis(100))
        .await
        .unwrap();
    assert_eq!(back.len(), 2);
    assert!(replies(&rig).await.is_empty());
}

/// Answers at once for every action but those of one service, which is down: every
/// call hangs for 15 s, then fails transiently.
struct OneServiceDown {
    down: &'static str,
    calls: Mutex<Vec<String>>,
}

#[async_trait]
impl RemoteService for OneServiceDown {
    async fn call(&self, call: &RemoteCall, _timeout: Duration) -> Result<String, CallError> {
        self.calls.lock().unwrap().push(call.action.clone());
        if call.action == self.down {
            tokio::time::sleep(Duration::from_secs(15)).await;
            return Err(transient("connection refused"));
        }
        Ok("done".into())
    }
}

/// One service down must not slow the others: each queue has its own room and its own
/// breaker, and the dead service's requests are given back instead of held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_service_down_leaves_the_others_their_throughput() {
    let rig = rig().await;
    let queues: Vec<QueueName> = ["agent.inventory", "agent.payment", "agent.shipping"]
        .iter()
        .map(|q| QueueName::parse(*q).unwrap())
        .collect();
    for q in &queues {
        rig.transport
            .declare_queue(q, &QueueSettings::default())
            .await
            .unwrap();
    }
    let remote = Arc::new(OneServiceDown {
        down: "ship",
        calls: Mutex::default(),
    });
    let mut cfg = AgentConfig::new(InstanceId::generate("agent"), queues.clone());
    cfg.concurrency = 4;
    cfg.idle_wait = Duration::from_millis(20);
    cfg.breaker = BreakerConfig {
        failure_threshold: 3,
        open_for: Duration::from_secs(60),
    };
    let agent = Agent::new(
        rig.transport.clone(),
        remote.clone(),
        Arc::new(SystemClock),
        cfg,
    );
    // 40 requests per service, each with a 30 s deadline and many tries.
    for (q, action) in queues
        .iter()
        .zip(["reserve-inventory", "charge-payment", "ship"])
    {
        let msgs: Vec<_> = (0..40)
            .map(|i| {
                let mut r = request(&rig, &format!("{action}-{i}"), Duration::from_secs(30), 50);
                r.step = action.into();
                r.action = action.into();
                json_message(r.message_id(), &r, None)
            })
            .collect();
        rig.transport.send(q, &msgs).await.unwrap();
    }
    let shutdown = tokio_util::sync::CancellationToken::new();
    let started = Instant::now();
    let running = tokio::spawn(agent.run(shutdown.clone()));
    let mut answered = Vec::new();
    while answered.len() < 80 && started.elapsed() < Duration::from_secs(20) {
        answered.extend(replies(&rig).await);
    }
    let took = started.elapsed();
    shutdown.cancel();
    let _ = running.await;
    let actions: Vec<&str> = answered.iter().map(|r| r.action.as_str()).collect();
    assert_eq!(
        actions.len(),
        80,
        "inventory and payment all answered: {actions:?}"
    );
    assert!(
        actions.iter().all(|a| *a != "ship"),
        "the dead service answered nothing"
    );
    eprintln!(
        "80 requests of the two live services answered in {} ms",
        took.as_millis()
    );
    // Behind the dead service's hanging calls (15 s) they would take that long at least.
    assert!(took < Duration::from_secs(5), "{took:?}");
    let ship_calls = remote
        .calls
        .lock()
        .unwrap()
        .iter()
        .filter(|a| *a == "ship")
        .count();
    assert!(
        ship_calls <= 4,
        "at most its own room of calls hang: {ship_calls}"
    );
    // The dead service's requests are all still on their queue, none lost.
    let ship = rig
        .transport
        .receive(&queues[2], 100, Duration::from_millis(200))
        .await
        .unwrap();
    assert_eq!(ship.len(), 40);
}

fn probed_request(rig: &Rig, order: &str, uncertain: bool, not_found: NotFound) -> StepRequest {
    let mut req = request(rig, order, Duration::from_secs(10), 5);
    req.probe = Some(StatusProbe {
        url: "http://inventory/status/{key}?order={order_id}".into(),
        not_found,
    });
    req.uncertain = uncertain;
    req
}

fn succeeded(detail: &str) -> Handled {
    Handled::Replied(StepOutcome::Succeeded {
        detail: detail.into(),
    })
}

#[tokio::test]
async fn an_uncertain_step_is_asked_about_first_and_not_called_when_it_took_effect() {
    let rig = rig().await;
    let remote = Scripted::with_probe(vec![], vec![ProbeAnswer::Applied("reserved".into())]);
    let a = agent(&rig, remote.clone(), BreakerConfig::default());
    let handled = handle(
        &rig,
        &a,
        probed_request(&rig, "o-1", true, NotFound::NotApplied),
    )
    .await;
    assert_eq!(
        handled,
        succeeded("status probe: applied before, not called again: reserved")
    );
    assert!(remote.calls().is_empty(), "not called again");
    assert_eq!(
        remote.probed(),
        ["http://inventory/status/o-1%2F0%2Freserve-inventory?order=o-1"],
        "asked once, the key and order id encoded into the template"
    );
    let r = replies(&rig).await;
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].attempts, 0, "no call made");
}

#[tokio::test]
async fn what_the_probe_said_decides_the_call_and_goes_into_the_answer() {
    // Not applied: called.
    let rig = rig().await;
    let remote = Scripted::with_probe(vec![Ok("reserved".into())], vec![ProbeAnswer::NotFound]);
    let a = agent(&rig, remote.clone(), BreakerConfig::default());
    let handled = handle(
        &rig,
        &a,
        probed_request(&rig, "o-1", true, NotFound::NotApplied),
    )
    .await;
    assert_eq!(
        handled,
        succeeded("status probe: not applied; called: reserved")
    );
    assert_eq!(remote.calls().len(), 1);
    // A 404 from a service that forgets: no telling, called under the same key.
    let remote = Scripted::with_probe(vec![Ok("reserved".into())], vec![ProbeAnswer::NotFound]);
    let a = agent(&rig, remote.clone(), BreakerConfig::default());
    let Handled::Replied(StepOutcome::Succeeded { detail }) = handle(
        &rig,
        &a,
        probed_request(&rig, "o-2", true, NotFound::Unknown),
    )
    .await
    else {
        panic!("not a success");
    };
    assert!(detail.starts_with("status probe: unknown (404"), "{detail}");
    assert!(
        detail.ends_with("called under the same key: reserved"),
        "{detail}"
    );
    assert_eq!(remote.calls(), ["o-2/0/reserve-inventory"]);
    // The probe down: called under the same key, and a permanent failure says so too.
    let remote = Scripted::with_probe(
        vec![Err(CallError::Permanent("HTTP 422: out of stock".into()))],
        vec![ProbeAnswer::Unknown("no answer: connection refused".into())],
    );
    let a = agent(&rig, remote.clone(), BreakerConfig::default());
    assert_eq!(
        handle(&rig, &a, probed_request(&rig, "o-3", true, NotFound::NotApplied)).await,
        Handled::Replied(StepOutcome::Failed {
            error: "status probe: unknown (no answer: connection refused); called under the same key: HTTP 422: out of stock".into()
        })
    );
}

#[tokio::test]
async fn a_call_without_a_clear_answer_makes_the_next_try_ask_first() {
    let rig = rig().await;
    // A certain step is called at once; its call ends without an answer, so before the
    // next try the probe is asked, and it finds the effect.
    let remote = Scripted::with_probe(
        vec![Err(transient("timed out"))],
        vec![ProbeAnswer::Applied("reserved".into())],
    );
    let a = agent(&rig, remote.clone(), BreakerConfig::default());
    let handled = handle(
        &rig,
        &a,
        probed_request(&rig, "o-1", false, NotFound::NotApplied),
    )
    .await;
    assert_eq!(
        handled,
        succeeded("status probe: applied before, not called again: reserved")
    );
    assert_eq!(remote.calls().len(), 1, "called once, not twice");
    assert_eq!(remote.probed().len(), 1);
    // A certain step that succeeds is never asked about.
    let remote = Scripted::with_probe(vec![Ok("reserved".into())], vec![]);
    let a = agent(&rig, remote.clone(), BreakerConfig::default());
    assert_eq!(
        handle(
            &rig,
            &a,
            probed_request(&rig, "o-2", false, NotFound::NotApplied)
        )
        .await,
        succeeded("reserved")
    );
    assert!(remote.probed().is_empty());
    // Without a probe an uncertain step is called under the same key, as always.
    let remote = Scripted::with_probe(vec![Ok("reserved".into())], vec![]);
    let a = agent(&rig, remote.clone(), BreakerConfig::default());
    let mut req = request(&rig, "o-3", Duration::from_secs(10), 5);
    req.uncertain = true;
    assert_eq!(handle(&rig, &a, req).await, succeeded("reserved"));
    assert!(remote.probed().is_empty());
}

#[tokio::test]
async fn a_probe_that_finds_the_effect_closes_a_half_open_breaker() {
    let rig = rig().await;
    let remote = Scripted::with_probe(
        vec![Err(transient("503")), Ok("reserved".into())],
        vec![ProbeAnswer::Applied("reserved".into())],
    );
    let a = agent(
        &rig,
        remote.clone(),
        BreakerConfig {
            failure_threshold: 1,
            open_for: Duration::from_millis(50),
        },
    );
    // One failure opens the breaker.
    let mut first = probed_request(&rig, "o-1", false, NotFound::NotApplied);
    first.retry.max_attempts = 1;
    assert!(matches!(handle(&rig, &a, first).await, Handled::Silent(_)));
    tokio::time::sleep(Duration::from_millis(80)).await;
    // The one try a half-open breaker lets through is a status probe: it answers.
    assert_eq!(
        handle(
            &rig,
            &a,
            probed_request(&rig, "o-2", true, NotFound::NotApplied)
        )
        .await,
        succeeded("status probe: applied before, not called again: reserved")
    );
    // So the breaker is closed, not left waiting for a call that never came.
    assert_eq!(
        handle(
            &rig,
            &a,
            probed_request(&rig, "o-3", false, NotFound::NotApplied)
        )
        .await,
        succeeded("reserved")
    );
}

/// An agent taking part in the fleet's view of its services.
fn fleet_agent(
    rig: &Rig,
    remote: Arc<dyn RemoteService>,
    threshold: u32,
    fleet: orderly_agent::FleetConfig,
) -> (Agent, Arc<orderly_core::service::ServiceView>) {
    let view = Arc::new(orderly_core::service::ServiceView::new(
        rig.services.clone(),
    ));
    let agent = agent(
        rig,
        remote,
        BreakerConfig {
            failure_threshold: threshold,
            open_for: Duration::from_secs(60),
        },
    )
    .with_services(view.clone(), fleet);
    (agent, view)
}

async fn health(rig: &Rig) -> Option<orderly_core::service::ServiceHealth> {
    rig.services
        .services()
        .await
        .unwrap()
        .into_iter()
        .find(|h| h.service == "agent.inventory")
}

/// Three failures in a row open the breaker: the agent reports the service down to
/// the fleet (one outage, its error kept) and answers the request `Deferred`, so its
/// order waits for the service instead of running into its deadline.
#[tokio::test]
async fn a_breaker_that_opens_reports_the_service_down_and_defers_the_request() {
    let rig = rig().await;
    let remote = Scripted::new(vec![
        Err(transient("HTTP 503")),
        Err(transient("HTTP 503")),
        Err(transient("HTTP 503")),
    ]);
    let (agent, _) = fleet_agent(
        &rig,
        remote.clone(),
        3,
        orderly_agent::FleetConfig::default(),
    );
    let handled = handle(
        &rig,
        &agent,
        request(&rig, "o-1", Duration::from_secs(30), 8),
    )
    .await;
    assert!(matches!(handled, Handled::Deferred(_)), "{handled:?}");
    assert_eq!(remote.calls().len(), 3, "no call once the breaker opened");
    let h = health(&rig).await.expect("reported");
    assert_eq!(h.state, orderly_core::service::ServiceState::Down);
    assert_eq!((h.outage, h.last_error.as_deref()), (1, Some("HTTP 503")));
    let got = replies(&rig).await;
    assert_eq!(got.len(), 1);
    assert!(
        matches!(&got[0].outcome, StepOutcome::Deferred { service, .. } if service == "agent.inventory"),
        "{:?}",
        got[0].outcome
    );
}

/// While the fleet sees the service down and no probe is due, a request is answered
/// `Deferred` at once: the service is not called.
#[tokio::test]
async fn a_request_for_a_service_the_fleet_sees_down_is_deferred_without_a_call() {
    let rig = rig().await;
    rig.services
        .report_failure(
            "agent.inventory",
            "HTTP 503",
            &InstanceId::parse("agent-other").unwrap(),
            &orderly_core::service::OutagePolicy::default(),
        )
        .await
        .unwrap();
    let remote = Scripted::new(vec![Ok("reserved".into())]);
    let (agent, view) = fleet_agent(
        &rig,
        remote.clone(),
        5,
        orderly_agent::FleetConfig::default(),
    );
    view.refresh().await.unwrap();
    let handled = handle(
        &rig,
        &agent,
        request(&rig, "o-1", Duration::from_secs(30), 8),
    )
    .await;
    assert!(
        matches!(&handled, Handled::Deferred(why) if why.contains("agent.inventory down since")),
        "{handled:?}"
    );
    assert!(remote.calls().is_empty());
    let got = replies(&rig).await;
    assert!(matches!(got[0].outcome, StepOutcome::Deferred { .. }));
    assert_eq!(got[0].attempts, 0);
}

/// Once the probe is due the request is called; the service's answer reports it up,
/// and the orders waiting for it resume.
#[tokio::test]
async fn an_answer_from_a_service_the_fleet_sees_down_reports_it_up() {
    let rig = rig().await;
    let policy = orderly_core::service::OutagePolicy {
        probe_after: Duration::from_millis(20),
        ..orderly_core::service::OutagePolicy::default()
    };
    rig.services
        .report_failure(
            "agent.inventory",
            "HTTP 503",
            &InstanceId::parse("agent-other").unwrap(),
            &policy,
        )
        .await
        .unwrap();
    let remote = Scripted::new(vec![Ok("reserved".into())]);
    let (agent, view) = fleet_agent(
        &rig,
        remote.clone(),
        5,
        orderly_agent::FleetConfig::default(),
    );
    view.refresh().await.unwrap();
    tokio::time::sleep(Duration::from_millis(40)).await;
    let handled = handle(
        &rig,
        &agent,
        request(&rig, "o-1", Duration::from_secs(30), 8),
    )
    .await;
    assert!(
        matches!(handled, Handled::Replied(StepOutcome::Succeeded { .. })),
        "{handled:?}"
    );
    let started = Instant::now();
    loop {
        if health(&rig).await.unwrap().state == orderly_core::service::ServiceState::Up {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "reported up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A queue left out of backpressure keeps the old behaviour: its breaker is this
/// agent's own (nothing reported), and a request it cannot call is given back to its
/// queue, not answered.
#[tokio::test]
async fn a_service_left_out_of_backpressure_keeps_its_breaker_to_itself() {
    let rig = rig().await;
    let remote = Scripted::new(vec![Err(transient("HTTP 503")), Err(transient("HTTP 503"))]);
    let fleet = orderly_agent::FleetConfig {
        excluded: [rig.work.clone()].into(),
        ..orderly_agent::FleetConfig::default()
    };
    let (agent, _) = fleet_agent(&rig, remote, 2, fleet);
    let handled = handle(
        &rig,
        &agent,
        request(&rig, "o-1", Duration::from_secs(30), 8),
    )
    .await;
    assert!(matches!(handled, Handled::Deferred(_)), "{handled:?}");
    assert!(health(&rig).await.is_none(), "nothing reported");
    assert!(replies(&rig).await.is_empty(), "given back, not answered");
}

/// A request no scheduler sends is dead-lettered with why, and the remote service is
/// never called: an action that would change the remote URL, a budget that would
/// overflow the clock (it panicked the agent before), a key with control characters.
#[tokio::test]
async fn a_forged_request_is_dead_lettered_and_the_service_never_called() {
    let rig = rig().await;
    let remote = Scripted::new(vec![Ok("should not be called".into()); 3]);
    let a = agent(&rig, remote.clone(), BreakerConfig::default());
    let mut bad_action = request(&rig, "o-f1", Duration::from_secs(10), 3);
    bad_action.action = "../admin?drop=all".into();
    let mut huge_budget = request(&rig, "o-f2", Duration::from_secs(10), 3);
    huge_budget.timeout_ms = u64::MAX;
    let mut bad_key = request(&rig, "o-f3", Duration::from_secs(10), 3);
    bad_key.idempotency_key = "k\r\nX-Injected: 1".into();
    for (req, field) in [
        (bad_action, "action"),
        (huge_budget, "timeout_ms"),
        (bad_key, "idempotency_key"),
    ] {
        match handle(&rig, &a, req).await {
            Handled::Refused(why) => assert!(why.contains(field), "{why}"),
            other => panic!("{field}: {other:?}"),
        }
    }
    assert_eq!(
        remote.calls(),
        Vec::<String>::new(),
        "the service was called"
    );
    assert!(
        replies(&rig).await.is_empty(),
        "no reply to a forged request"
    );
    let dead = rig.transport.dead_letters(&rig.work, 10).await.unwrap();
    assert_eq!(dead.len(), 3);
    assert!(
        dead.iter().all(|d| d.reason == "InvalidRequest"),
        "{dead:?}"
    );
}

/// An agent acts only on what the stored workflow says a scheduler sends: a request
/// with a probe of the sender's choosing (a server-side request forgery with a readable
/// answer), another action, another budget, another order's key, another queue, or a
/// version nobody stored is dead-lettered with the reason, and nothing is called or
/// fetched; the request as the workflow says is worked on.
#[tokio::test]
async fn a_request_that_is_not_what_its_stored_workflow_says_is_dead_lettered_untouched() {
    use orderly_core::store::SchedulerStore;
    use orderly_core::workflow::Workflow;
    let r = rig().await;
    let store: Arc<dyn SchedulerStore> = Arc::new(
        orderly_sql::SqliteStore::open("sqlite::memory:", TimeSource::Database)
            .await
            .unwrap(),
    );
    let base = request(&r, "o-trust", Duration::from_secs(30), 3);
    let mut flow = Workflow::default();
    flow.steps[0].timeout_ms = base.timeout_ms;
    flow.steps[0].retry = base.retry.clone();
    store
        .record_workflows(&[Arc::new(flow.clone())], "scheduler-test")
        .await
        .unwrap();
    let pinned = |mut req: StepRequest| {
        req.context.workflow = Some(flow.reference());
        req
    };
    let remote = Scripted::with_probe(vec![Ok("reserved".into())], Vec::new());
    let agent = agent(&r, remote.clone(), BreakerConfig::default())
        .with_catalogue(Arc::new(orderly_agent::Catalogue::new(store)));

    let forged: Vec<(&str, StepRequest)> = vec![
        ("probe", {
            let mut q = pinned(base.clone());
            q.probe = Some(StatusProbe {
                url: "http://169.254.169.254/metadata/{key}".into(),
                not_found: NotFound::NotApplied,
            });
            q.uncertain = true;
            q
        }),
        ("action", {
            let mut q = pinned(base.clone());
            q.action = "release-inventory".into();
            q
        }),
        ("timeout_ms", {
            let mut q = pinned(base.clone());
            q.timeout_ms = 86_400_000;
            q
        }),
        ("idempotency_key", {
            let mut q = pinned(base.clone());
            q.idempotency_key = "another-order/0/reserve-inventory".into();
            q
        }),
        ("step", {
            let mut q = pinned(base.clone());
            q.step_index = 1;
            q
        }),
        ("is not stored", {
            let mut q = base.clone();
            q.context.workflow =
                Some(orderly_core::workflow::WorkflowRef::parse("order@0123456789ab").unwrap());
            q
        }),
    ];
    for (n, (what, mut req)) in forged.into_iter().enumerate() {
        // Each its own message (a queue drops a repeated message id).
        req.fence.epoch = Epoch(10 + n as i64);
        match handle(&r, &agent, req).await {
            Handled::Refused(why) => assert!(why.contains(what), "{what}: {why}"),
            other => panic!("{what}: {other:?}"),
        }
    }
    assert!(remote.keys.lock().unwrap().is_empty(), "nothing was called");
    assert!(
        remote.probed.lock().unwrap().is_empty(),
        "nothing was fetched"
    );
    let dead = r.transport.dead_letters(&r.work, 10).await.unwrap();
    assert_eq!(dead.len(), 6);
    assert!(
        dead.iter().all(|d| d.reason == "InvalidRequest"),
        "{dead:?}"
    );
    // As the workflow says, it is worked on.
    match handle(&r, &agent, pinned(base.clone())).await {
        Handled::Replied(_) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(remote.keys.lock().unwrap().len(), 1);
}
