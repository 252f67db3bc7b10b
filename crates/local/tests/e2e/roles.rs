//! The four roles together in one process, over a real store and the SQL queues, with
//! the remote-service simulator on a real socket.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use orderly_agent::{Agent, AgentConfig, Endpoints, HttpRemote};
use orderly_core::history::HistoryKind;
use orderly_core::messages::{StepContext, StepKind, StepReply, StepRequest, json_message, queues};
use orderly_core::store::NewOrder;
use orderly_core::transport::{OutgoingMessage, QueueName, QueueSettings};
use orderly_core::workflow::RetryPolicy;
use orderly_core::{
    Actor, Epoch, Fence, InstanceId, OrderId, ProcessState, StepStatus, SystemClock,
};
use orderly_local::system::{System, SystemConfig};
use orderly_local::{demo, invariants};
use orderly_remote_sim::{Sim, SimConfig};
use tokio_util::sync::CancellationToken;

use crate::both;
use crate::fixtures::{Db, Dialect};

async fn run_to_the_end(
    system: &System,
    orders: &[NewOrder],
    limit: Duration,
) -> invariants::Report {
    let sent = demo::submit(system, orders).await.unwrap();
    let done = demo::wait_done(system, orders.len(), limit).await.unwrap();
    let report = invariants::report(system, &sent, &system.workflows, true)
        .await
        .unwrap();
    assert!(
        done,
        "not every order finished within {limit:?}: {:?}",
        report.by_state
    );
    report
}

both!(
    five_hundred_orders_without_faults_are_all_processed_each_step_once,
    five_hundred_orders_without_faults
);
async fn five_hundred_orders_without_faults(dialect: Dialect) {
    let db = Db::new(dialect).await;
    let system = System::start(db.backend().await, SystemConfig::new())
        .await
        .unwrap();
    let orders = demo::sample_orders(500);
    let report = run_to_the_end(&system, &orders, Duration::from_secs(120)).await;
    let sim = system.sim.clone().unwrap();
    system.stop(Duration::from_secs(5)).await;

    assert_eq!(report.violations, Vec::<String>::new());
    assert_eq!(
        report.count(ProcessState::Processed),
        500,
        "{:?}",
        report.by_state
    );
    assert_eq!(report.recoveries, 0);
    assert_eq!(
        report.step_retries, 0,
        "without faults every step runs once"
    );
    let effects = sim.effects();
    assert_eq!(effects.len(), 1500, "three effects per order, each once");
    // Every step of every order appears once in its history.
    let store = db.backend().await.store;
    for o in orders.iter().take(50) {
        let view = store.get(&o.order_id).await.unwrap();
        for kind in [HistoryKind::StepStarted, HistoryKind::StepSucceeded] {
            let steps: Vec<_> = view
                .history
                .iter()
                .filter(|e| e.kind == kind)
                .map(|e| e.step)
                .collect();
            assert_eq!(
                steps,
                [Some(0), Some(1), Some(2)],
                "{kind} of {}",
                o.order_id
            );
        }
        assert_eq!(view.history.last().unwrap().kind, HistoryKind::Completed);
    }
}

both!(
    transient_failures_and_hangs_end_every_order_processed_or_error_with_no_effect_twice,
    transient_failures_and_hangs
);
async fn transient_failures_and_hangs(dialect: Dialect) {
    let db = Db::new(dialect).await;
    let mut cfg = SystemConfig::new().quick();
    cfg.sim = Some(SimConfig {
        transient_rate: 0.20,
        hang_rate: 0.05,
        hang_for: Duration::from_secs(30),
        seed: 7,
        ..SimConfig::default()
    });
    let system = System::start(db.backend().await, cfg).await.unwrap();
    let orders = demo::sample_orders(300);
    let report = run_to_the_end(&system, &orders, Duration::from_secs(240)).await;
    let sim = system.sim.clone().unwrap();
    system.stop(Duration::from_secs(5)).await;

    assert_eq!(report.violations, Vec::<String>::new());
    let processed = report.count(ProcessState::Processed);
    let error = report.count(ProcessState::Error);
    assert_eq!(
        processed + error,
        300,
        "every order ends Processed or Error: {:?}",
        report.by_state
    );
    assert!(
        processed > 200,
        "most orders get through the faults: {processed}"
    );
    let stats = sim.stats();
    assert!(
        stats.transient > 0 && stats.hangs > 0,
        "faults were injected: {stats:?}"
    );
    assert!(
        report.recoveries > 0,
        "hangs made the supervisor recover orders"
    );
    // The ledger: one effect per order and action, whatever the retries.
    assert!(orderly_remote_sim::double_effects(&sim.effects()).is_empty());
    assert!(
        stats.replays > 0 || report.step_retries > 0,
        "retries happened: {stats:?}"
    );
}

both!(
    a_permanent_failure_ends_in_error_with_an_alert_after_undoing_steps_in_reverse,
    permanent_failure_compensates
);
async fn permanent_failure_compensates(dialect: Dialect) {
    let db = Db::new(dialect).await;
    let mut cfg = SystemConfig::new();
    cfg.sim = Some(SimConfig {
        permanent_actions: vec!["ship".into()],
        ..SimConfig::default()
    });
    let system = System::start(db.backend().await, cfg).await.unwrap();
    let mut orders = demo::sample_orders(10);
    let alerts_queue = QueueName::parse("client-7").unwrap();
    system
        .backend
        .transport
        .declare_queue(&alerts_queue, &QueueSettings::default())
        .await
        .unwrap();
    orders[0].reply_to = Some("client-7".into());
    let report = run_to_the_end(&system, &orders, Duration::from_secs(60)).await;
    // Let the supervisors publish the alerts.
    let started = std::time::Instant::now();
    while !system
        .backend
        .store
        .unpublished_alerts(100)
        .await
        .unwrap()
        .is_empty()
        || system.backend.store.alerts(true, 100).await.unwrap().len() < 10
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "alerts not published"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let sim = system.sim.clone().unwrap();
    let store = system.backend.store.clone();
    let transport = system.backend.transport.clone();
    system.stop(Duration::from_secs(5)).await;

    assert_eq!(report.violations, Vec::<String>::new());
    assert_eq!(
        report.count(ProcessState::Error),
        10,
        "{:?}",
        report.by_state
    );
    let alerts = store.alerts(true, 100).await.unwrap();
    assert_eq!(alerts.len(), 10, "one alert per order");
    for a in &alerts {
        let error = a.last_error.as_deref().unwrap();
        assert!(
            error.contains("step ship failed") && error.contains("ship declined"),
            "{error}"
        );
        assert!(
            error.contains("undone: reserve-inventory, charge-payment"),
            "{error}"
        );
        assert_eq!(a.step.as_deref(), Some("ship"));
        assert!(a.published_at.is_some(), "published to the alerts queue");
    }
    // The alerts queue holds one message per alert, however many supervisors ran.
    let on_queue = transport
        .receive(
            &QueueName::parse(queues::ALERTS).unwrap(),
            100,
            Duration::from_millis(200),
        )
        .await
        .unwrap();
    assert_eq!(on_queue.len(), 10);
    // Compensations in reverse order: refund before release-inventory, in the store
    // and at the remote services.
    for o in &orders {
        let view = store.get(&o.order_id).await.unwrap();
        let undone: Vec<_> = view
            .history
            .iter()
            .filter(|e| e.kind == HistoryKind::StepCompensated)
            .map(|e| e.step)
            .collect();
        assert_eq!(undone, [Some(1), Some(0)], "order {}", o.order_id);
        let statuses: Vec<_> = view.steps.iter().map(|s| s.status).collect();
        assert_eq!(
            statuses,
            [
                StepStatus::Compensated,
                StepStatus::Compensated,
                StepStatus::Failed
            ]
        );
        let effects: Vec<_> = sim
            .effects()
            .into_iter()
            .filter(|e| e.order_id == o.order_id.as_str())
            .map(|e| e.action)
            .collect();
        assert_eq!(
            effects,
            [
                "reserve-inventory",
                "charge-payment",
                "refund",
                "release-inventory"
            ],
            "order {}",
            o.order_id
        );
    }
    // The client with a reply queue heard the whole story.
    let notices = transport
        .receive(&alerts_queue, 100, Duration::from_millis(200))
        .await
        .unwrap();
    let statuses: Vec<String> = notices
        .iter()
        .map(|m| {
            serde_json::from_slice::<serde_json::Value>(&m.body).unwrap()["status"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(
        statuses,
        ["received", "processing", "step_done", "step_done", "failed"]
    );
}

both!(
    an_operator_cancel_undoes_the_completed_steps_then_cancels,
    operator_cancel_compensates
);
async fn operator_cancel_compensates(dialect: Dialect) {
    let db = Db::new(dialect).await;
    let mut cfg = SystemConfig::new();
    cfg.workflow.compensate_on_error = false;
    cfg.sim = Some(SimConfig {
        permanent_actions: vec!["ship".into()],
        ..SimConfig::default()
    });
    let system = System::start(db.backend().await, cfg).await.unwrap();
    let mut orders = demo::sample_orders(3);
    let client = QueueName::parse("client-cancel").unwrap();
    system
        .backend
        .transport
        .declare_queue(&client, &QueueSettings::default())
        .await
        .unwrap();
    orders[0].reply_to = Some("client-cancel".into());
    let report = run_to_the_end(&system, &orders, Duration::from_secs(60)).await;
    assert_eq!(
        report.count(ProcessState::Error),
        3,
        "without compensation on error: {:?}",
        report.by_state
    );
    let store = system.backend.store.clone();
    for o in &orders {
        let row = store
            .request_cancel(
                &o.order_id,
                &Actor::operator("ops"),
                "customer changed their mind",
                &[],
            )
            .await
            .unwrap();
        assert_eq!(row.process_state, ProcessState::Pending);
        assert_eq!(row.finish_as, Some(ProcessState::Cancelled));
    }
    assert!(
        demo::wait_done(&system, 3, Duration::from_secs(60))
            .await
            .unwrap()
    );
    let sim = system.sim.clone().unwrap();
    for o in &orders {
        let view = store.get(&o.order_id).await.unwrap();
        assert_eq!(view.state.process_state, ProcessState::Cancelled);
        let effects: Vec<_> = sim
            .effects()
            .into_iter()
            .filter(|e| e.order_id == o.order_id.as_str())
            .map(|e| e.action)
            .collect();
        assert_eq!(
            effects,
            [
                "reserve-inventory",
                "charge-payment",
                "refund",
                "release-inventory"
            ]
        );
    }
    // The client that named a queue is told its order was cancelled.
    let statuses: Vec<String> = system
        .backend
        .transport
        .receive(&client, 100, Duration::from_millis(500))
        .await
        .unwrap()
        .iter()
        .map(|m| serde_json::from_slice::<orderly_core::messages::StatusNotice>(&m.body).unwrap())
        .map(|n| format!("{:?}", n.status))
        .collect();
    assert_eq!(
        statuses.last().map(String::as_str),
        Some("Cancelled"),
        "{statuses:?}"
    );
    system.stop(Duration::from_secs(5)).await;
}

both!(
    malformed_and_invalid_order_messages_are_dead_lettered_with_reasons,
    bad_orders_are_dead_lettered
);
async fn bad_orders_are_dead_lettered(dialect: Dialect) {
    let db = Db::new(dialect).await;
    let system = System::start(db.backend().await, SystemConfig::new())
        .await
        .unwrap();
    let orders_queue = QueueName::parse(queues::ORDERS).unwrap();
    let good = demo::sample_orders(2);
    let mut bad_quantity = serde_json::to_value(&good[0]).unwrap();
    bad_quantity["order_id"] = "bad-qty".into();
    bad_quantity["details"]["lines"][0]["quantity"] = 0.into();
    let mut bad_reply = serde_json::to_value(&good[0]).unwrap();
    bad_reply["order_id"] = "bad-reply".into();
    bad_reply["reply_to"] = "no-such-queue".into();
    let mut conflict = serde_json::to_value(&good[1]).unwrap();
    conflict["details"]["customer_id"] = "someone-else".into();
    let messages = vec![
        OutgoingMessage::new("m-garbage", b"{not json".to_vec()),
        OutgoingMessage::new("m-qty", serde_json::to_vec(&bad_quantity).unwrap()),
        OutgoingMessage::new("m-reply", serde_json::to_vec(&bad_reply).unwrap()),
        OutgoingMessage::new("m-big", vec![b' '; 70 * 1024]),
        json_message("m-good-0".into(), &good[0], None),
        json_message("m-good-1".into(), &good[1], None),
        json_message("m-good-0-again".into(), &good[0], None),
    ];
    system
        .backend
        .transport
        .send(&orders_queue, &messages)
        .await
        .unwrap();
    // The conflicting message must come after the order it conflicts with is in.
    let started = std::time::Instant::now();
    while system.backend.store.get(&good[1].order_id).await.is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "order not recorded"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    system
        .backend
        .transport
        .send(
            &orders_queue,
            &[OutgoingMessage::new(
                "m-conflict",
                serde_json::to_vec(&conflict).unwrap(),
            )],
        )
        .await
        .unwrap();
    assert!(
        demo::wait_done(&system, 2, Duration::from_secs(60))
            .await
            .unwrap()
    );
    let started = std::time::Instant::now();
    let dead = loop {
        let dead = system
            .backend
            .transport
            .dead_letters(&orders_queue, 100)
            .await
            .unwrap();
        if dead.len() >= 5 || started.elapsed() > Duration::from_secs(30) {
            break dead;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let by_id: HashMap<&str, (&str, &str)> = dead
        .iter()
        .map(|d| {
            (
                d.message.message_id.as_str(),
                (d.reason.as_str(), d.description.as_str()),
            )
        })
        .collect();
    let expect = |id: &str, reason: &str, names: &str| {
        let (r, d) = by_id
            .get(id)
            .unwrap_or_else(|| panic!("{id} not dead-lettered: {by_id:?}"));
        assert_eq!(*r, reason, "{id}: {d}");
        assert!(d.contains(names), "{id}: {d:?} should name {names:?}");
    };
    expect("m-garbage", "BodyUndecodable", "NewOrder");
    expect("m-qty", "BodyUndecodable", "lines[0].quantity");
    expect("m-reply", "InvalidOrder", "reply_to");
    expect("m-big", "PayloadTooLarge", "limit");
    expect("m-conflict", "OrderIdConflict", good[1].order_id.as_str());
    assert_eq!(
        dead.len(),
        5,
        "the good orders and the repeat are not dead letters"
    );
    let counts = system.backend.store.count_by_state().await.unwrap();
    let processed = counts
        .iter()
        .find(|(s, _)| *s == ProcessState::Processed)
        .unwrap()
        .1;
    assert_eq!(
        processed, 2,
        "the submitter kept going: the good orders were processed once"
    );
    system.stop(Duration::from_secs(5)).await;
}

both!(an_agent_never_replies_after_its_deadline, agent_deadlines);
async fn agent_deadlines(dialect: Dialect) {
    let db = Db::new(dialect).await;
    let backend = db.backend().await;
    let work = QueueName::parse("agent.test").unwrap();
    let replies = QueueName::parse("replies.test").unwrap();
    for q in [&work, &replies] {
        backend
            .transport
            .declare_queue(q, &QueueSettings::default())
            .await
            .unwrap();
    }
    // A slow service: every call takes 150 ms, a quarter fail transiently.
    let sim = Sim::new(SimConfig {
        latency: Duration::from_millis(150),
        transient_rate: 0.25,
        ..SimConfig::default()
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    tokio::spawn(sim.clone().serve(listener, shutdown.clone()));
    let remote = HttpRemote::new(
        Endpoints {
            base_url: format!("http://{addr}/actions"),
            overrides: HashMap::new(),
        },
        &orderly_tls::Trust::platform(),
    )
    .unwrap();
    let agent = Agent::new(
        backend.transport.clone(),
        Arc::new(remote),
        Arc::new(SystemClock),
        AgentConfig::new(InstanceId::generate("agent"), vec![work.clone()]),
    );
    tokio::spawn(agent.run(shutdown.clone()));
    // 60 requests with deadlines from 10 ms to 600 ms away: some can be met, some not.
    let details = demo::sample_orders(1).remove(0).details;
    let mut deadlines = HashMap::new();
    let mut messages = Vec::new();
    for i in 0..60i64 {
        let order_id = OrderId::parse(format!("o-{i}")).unwrap();
        let complete_by = Utc::now() + chrono::Duration::milliseconds(10 + i * 10);
        let req = StepRequest {
            fence: Fence {
                order_id: order_id.clone(),
                owner: InstanceId::generate("scheduler"),
                epoch: Epoch(1),
            },
            step_index: 0,
            step: "reserve-inventory".into(),
            action: "reserve-inventory".into(),
            kind: StepKind::Do,
            idempotency_key: format!("{order_id}/0/reserve-inventory"),
            compensates: None,
            complete_by,
            timeout_ms: 10_000,
            retry: RetryPolicy {
                max_attempts: 20,
                initial_backoff_ms: 10,
                max_backoff_ms: 50,
                multiplier: 2.0,
            },
            reply_to: replies.clone(),
            context: StepContext {
                workflow: None,
                details: details.clone(),
                notify_to: None,
                finish_as: None,
                generation: 0,
            },
            probe: None,
            uncertain: false,
        };
        deadlines.insert(order_id.clone(), complete_by);
        messages.push(json_message(req.message_id(), &req, None));
    }
    backend.transport.send(&work, &messages).await.unwrap();
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    let got = backend
        .transport
        .receive(&replies, 100, Duration::from_millis(100))
        .await
        .unwrap();
    shutdown.cancel();
    assert!(!got.is_empty(), "requests with room to spare were answered");
    assert!(
        got.len() < 60,
        "requests with no room were not answered: {}",
        got.len()
    );
    for m in &got {
        let reply: StepReply = serde_json::from_slice(&m.body).unwrap();
        let deadline = deadlines[&reply.fence.order_id];
        assert_eq!(reply.complete_by, deadline);
        assert!(
            reply.replied_at < deadline,
            "{} replied at {} after {deadline}",
            reply.fence.order_id,
            reply.replied_at
        );
        assert!(
            m.enqueued_at <= deadline,
            "{}: reply on the queue at {} after the deadline {deadline}",
            reply.fence.order_id,
            m.enqueued_at
        );
    }
    // Every request was taken off the work queue: answered or given up in silence.
    let left = backend
        .transport
        .receive(&work, 100, Duration::from_millis(100))
        .await
        .unwrap();
    assert!(left.is_empty(), "{} requests left behind", left.len());
}

both!(
    a_scheduler_restarted_with_its_instance_id_resumes_its_orders_without_a_timeout,
    restarted_scheduler_resumes
);
async fn restarted_scheduler_resumes(dialect: Dialect) {
    use orderly_scheduler::{Scheduler, SchedulerConfig};
    let db = Db::new(dialect).await;
    let backend = db.backend().await;
    let workflow = Arc::new(orderly_core::workflow::Workflow::default());
    orderly_local::system::declare_queues(&backend, &workflow, Duration::from_secs(30))
        .await
        .unwrap();
    let orders = demo::sample_orders(20);
    for o in &orders {
        backend
            .store
            .submit(o, &Actor::operator("t"), &[])
            .await
            .unwrap();
    }
    let id = InstanceId::parse("scheduler-0").unwrap();
    let make = || {
        Scheduler::new(
            backend.store.clone(),
            backend.transport.clone(),
            Arc::new(SystemClock),
            SchedulerConfig::new(
                id.clone(),
                Arc::new(orderly_core::workflow::Workflows::default()),
            ),
        )
    };
    // The first run claims everything and sends the first steps, then "crashes".
    let first = make().claim_once().await.unwrap();
    assert_eq!(first.claimed, 20);
    // The requests of the first run are lost with it (say, purged by an operator).
    let inventory = QueueName::parse("agent.inventory").unwrap();
    let old = backend
        .transport
        .receive(&inventory, 100, Duration::from_millis(200))
        .await
        .unwrap();
    assert_eq!(old.len(), 20);
    backend.transport.complete_messages(&old).await.unwrap();
    // The restart takes its orders back under a new epoch and sends the steps again.
    let second = make();
    let resumed = second.resume().await.unwrap();
    assert_eq!((resumed.claimed, resumed.requests), (20, 20));
    let sim = Sim::new(SimConfig::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    tokio::spawn(sim.clone().serve(listener, shutdown.clone()));
    let agent = Agent::new(
        backend.transport.clone(),
        Arc::new(
            HttpRemote::new(
                Endpoints {
                    base_url: format!("http://{addr}/actions"),
                    overrides: HashMap::new(),
                },
                &orderly_tls::Trust::platform(),
            )
            .unwrap(),
        ),
        Arc::new(SystemClock),
        AgentConfig::new(InstanceId::generate("agent"), workflow.queues()),
    );
    tokio::spawn(agent.run(shutdown.clone()));
    tokio::spawn(second.run(shutdown.clone()));
    assert!(
        demo::wait_done_on(backend.store.as_ref(), 20, Duration::from_secs(60))
            .await
            .unwrap()
    );
    shutdown.cancel();
    for o in &orders {
        let view = backend.store.get(&o.order_id).await.unwrap();
        assert_eq!(view.state.process_state, ProcessState::Processed);
        assert_eq!(view.state.failure_count, 0, "no timeout was needed");
        assert!(view.history.iter().any(|e| e.kind == HistoryKind::Resumed));
    }
    assert!(orderly_remote_sim::double_effects(&sim.effects()).is_empty());
}
