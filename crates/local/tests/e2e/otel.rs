//! OpenTelemetry export (feature `otel`): the real role binaries export their spans
//! over OTLP/HTTP to a real receiver, and one order's spans form one trace across the
//! submitter, the scheduler and the agent, continued through the messages' properties,
//! over the SQL queue and over Service Bus (the stand-in, through the outbox).
//!
//! Run with `cargo nextest run -p orderly-local --features otel --test e2e -E 'test(/^otel::/)'`.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use orderly_core::ProcessState;
use orderly_core::messages::{json_message, queues};
use orderly_core::transport::QueueName;
use orderly_local::demo;
use orderly_testkit::otlp::{ExportedSpan, OtlpReceiver};

use crate::fixtures::{Db, Dialect};
use crate::processes::{assert_invariants, count, start_sim};
use crate::procs::{Proc, bin, free_port, wait_for};

const ORDERS: usize = 6;
const STEPS: usize = 3;

/// The roles of one run, all exporting to `endpoint` (a dead port for the outage case).
struct Roles(Vec<Proc>);

impl Roles {
    /// `extra`: more environment for every role (the transport).
    fn start(db: &str, remote: &str, endpoint: &str, extra: &[(&str, &str)]) -> Self {
        // Spans leave on the batch processor's schedule (1 h here) or at shutdown: what
        // arrives was sent by the shutdown flush.
        let env = |id: &'static str| {
            let mut env = vec![
                ("ORDERLY_OTEL_ENDPOINT", endpoint.to_owned()),
                ("ORDERLY_INSTANCE_ID", id.to_owned()),
                ("OTEL_BSP_SCHEDULE_DELAY", "3600000".to_owned()),
            ];
            env.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
            env
        };
        let start = |name: &str, args: &[&str], id: &'static str| {
            let env = env(id);
            let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
            Proc::start_with(name, db, args, &env)
        };
        Roles(vec![
            start("orderly-submitter", &[], "submitter-1"),
            start("orderly-scheduler", &[], "scheduler-1"),
            start("orderly-agent", &["--remote-url", remote], "agent-1"),
            start(
                "orderly-supervisor",
                &["--interval-ms", "200"],
                "supervisor-1",
            ),
        ])
    }

    /// SIGTERM to all; each must exit cleanly within `limit`.
    fn stop(mut self, limit: Duration) {
        for p in &self.0 {
            p.signal("TERM");
        }
        for p in &mut self.0 {
            let status = p.wait(limit);
            assert!(status.success(), "exit status {status}:\n{}", p.output());
        }
    }
}

/// Posts the orders, each with the trace context of a client span (trace id, span id).
async fn post_traced(
    transport: &dyn orderly_core::transport::Transport,
) -> (
    HashMap<orderly_core::OrderId, chrono::DateTime<chrono::Utc>>,
    HashMap<String, (String, String)>,
) {
    let orders = demo::sample_orders(ORDERS);
    let mut client = HashMap::new();
    let messages: Vec<_> = orders
        .iter()
        .enumerate()
        .map(|(i, o)| {
            let trace = format!("{:032x}", 0x00c0_ffee_0000_u128 + i as u128);
            let span = format!("{:016x}", 0xbeef_0000_u64 + i as u64);
            let mut m = json_message(format!("submit:{}", o.order_id), o, None);
            m.properties
                .insert("traceparent".into(), format!("00-{trace}-{span}-01"));
            client.insert(o.order_id.to_string(), (trace, span));
            m
        })
        .collect();
    transport
        .send(&QueueName::parse(queues::ORDERS).unwrap(), &messages)
        .await
        .unwrap();
    let now = chrono::Utc::now();
    let sent = orders.iter().map(|o| (o.order_id.clone(), now)).collect();
    (sent, client)
}

fn named<'a>(spans: &'a [ExportedSpan], service: &str, name: &str) -> Vec<&'a ExportedSpan> {
    spans
        .iter()
        .filter(|s| s.service() == service && s.name == name)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otel_one_order_is_one_trace_across_the_role_processes() {
    one_trace_per_order(false).await;
}

/// The same over Service Bus (the stand-in): the context goes through the store's
/// outbox into the messages' application properties and back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otel_one_order_is_one_trace_over_service_bus() {
    one_trace_per_order(true).await;
}

async fn one_trace_per_order(over_service_bus: bool) {
    let receiver = OtlpReceiver::start().await.unwrap();
    let (db, backend) = Db::with_queues(Dialect::Sqlite, Duration::from_secs(5)).await;
    let store = backend.store.clone();
    let port = free_port();
    let remote = format!("http://127.0.0.1:{port}/actions");
    let _sim = start_sim(&db.url, port, &[]);
    let standin = over_service_bus.then(crate::servicebus::standin_with_queues);
    let connection = standin.as_ref().map(|s| s.connection_string());
    let extra: Vec<(&str, &str)> = match &connection {
        Some(c) => crate::servicebus::role_env(c).to_vec(),
        None => Vec::new(),
    };
    let roles = Roles::start(&db.url, &remote, receiver.endpoint(), &extra);
    let (sent, client) = match &connection {
        Some(c) => post_traced(&crate::servicebus::client(c).await).await,
        None => post_traced(backend.transport.as_ref()).await,
    };
    wait_for(
        "every order Processed",
        Duration::from_secs(90),
        async || count(store.as_ref(), ProcessState::Processed).await == ORDERS,
    )
    .await;
    assert_invariants(store.as_ref(), port, &sent, Some(ORDERS * STEPS)).await;
    assert_eq!(
        receiver.exports(),
        0,
        "nothing exported before the shutdown"
    );
    roles.stop(Duration::from_secs(20));

    let spans = receiver.spans();
    assert_eq!(receiver.rejected(), Vec::<String>::new());
    // Every role exported, under its own service name and instance id.
    for (service, instance) in [
        ("orderly-submitter", "submitter-1"),
        ("orderly-scheduler", "scheduler-1"),
        ("orderly-agent", "agent-1"),
        ("orderly-supervisor", "supervisor-1"),
    ] {
        let mine: Vec<_> = spans.iter().filter(|s| s.service() == service).collect();
        assert!(!mine.is_empty(), "no spans from {service}");
        for s in mine {
            assert_eq!(
                s.resource.get("service.instance.id").map(String::as_str),
                Some(instance)
            );
            assert_eq!(
                s.resource.get("service.namespace").map(String::as_str),
                Some("orderly")
            );
        }
    }
    let by_id: HashMap<&str, &ExportedSpan> =
        spans.iter().map(|s| (s.span_id.as_str(), s)).collect();
    let effects = crate::processes::ledger(port).await;
    for (order_id, (client_trace, client_span)) in &client {
        let of_order = |service: &str, name: &str| -> Vec<&ExportedSpan> {
            named(&spans, service, name)
                .into_iter()
                .filter(|s| s.attr("order_id") == Some(order_id.as_str()))
                .collect()
        };
        // The submitter continues the client's trace.
        let submit = of_order("orderly-submitter", "submit");
        assert_eq!(submit.len(), 1, "{order_id}: submit spans");
        assert_eq!(&submit[0].trace_id, client_trace);
        assert_eq!(&submit[0].parent_span_id, client_span);
        assert_eq!(submit[0].attr("instance_id"), Some("submitter-1"));
        // The claim starts the order's processing trace ...
        let dispatch = of_order("orderly-scheduler", "dispatch");
        assert_eq!(dispatch.len(), 1, "{order_id}: dispatch spans");
        let dispatch = dispatch[0];
        assert_eq!(dispatch.parent_span_id, "", "dispatch is a root");
        assert_eq!(dispatch.attr("instance_id"), Some("scheduler-1"));
        assert_eq!(dispatch.attr("step"), Some("reserve-inventory"));
        // ... and every step in the agent and every reply in the scheduler is in it,
        // each the child of the span whose message caused it.
        let steps = of_order("orderly-agent", "step");
        let replies = of_order("orderly-scheduler", "reply");
        assert_eq!(steps.len(), STEPS, "{order_id}: agent step spans");
        assert_eq!(replies.len(), STEPS, "{order_id}: reply spans");
        for s in steps.iter().chain(&replies) {
            assert_eq!(
                s.trace_id,
                dispatch.trace_id,
                "{order_id}: {} {:?}",
                s.name,
                s.attr("step")
            );
            assert!(s.attr("step").is_some_and(|x| !x.is_empty()));
        }
        for step in &steps {
            assert_eq!(step.attr("instance_id"), Some("agent-1"));
            let parent = by_id[step.parent_span_id.as_str()];
            assert_eq!(parent.service(), "orderly-scheduler");
            assert!(
                matches!(parent.name.as_str(), "dispatch" | "reply"),
                "a step's parent is {}",
                parent.name
            );
        }
        for reply in &replies {
            let parent = by_id[reply.parent_span_id.as_str()];
            assert_eq!(
                (parent.service(), parent.name.as_str()),
                ("orderly-agent", "step")
            );
            assert_eq!(parent.attr("step"), reply.attr("step"));
        }
        let names: BTreeSet<_> = steps.iter().filter_map(|s| s.attr("step")).collect();
        assert_eq!(names.len(), STEPS, "{order_id}: one span per step");
        // The agent's call to the remote service carries the step's context, so that
        // service's own spans would join the order's trace.
        let applied: Vec<_> = effects.iter().filter(|e| e.order_id == *order_id).collect();
        assert_eq!(applied.len(), STEPS, "{order_id}: effects");
        for effect in applied {
            let traceparent = effect.traceparent.as_deref().unwrap_or_else(|| {
                panic!(
                    "{order_id}: the {} call carried no traceparent",
                    effect.action
                )
            });
            let parts: Vec<&str> = traceparent.split('-').collect();
            assert_eq!(parts.len(), 4, "{traceparent}");
            assert_eq!(parts[1], dispatch.trace_id, "{order_id}: {traceparent}");
            let caller = by_id[parts[2]];
            assert_eq!(
                (
                    caller.service(),
                    caller.name.as_str(),
                    caller.attr("action")
                ),
                ("orderly-agent", "step", Some(effect.action.as_str())),
                "{order_id}: {traceparent}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otel_a_collector_that_is_down_does_not_hold_up_orders_or_shutdown() {
    let dead = format!("http://127.0.0.1:{}", free_port());
    let (db, backend) = Db::with_queues(Dialect::Sqlite, Duration::from_secs(5)).await;
    let store = backend.store.clone();
    let port = free_port();
    let remote = format!("http://127.0.0.1:{port}/actions");
    let _sim = start_sim(&db.url, port, &[]);
    let roles = Roles::start(&db.url, &remote, &dead, &[]);
    let sent = demo::post(backend.transport.as_ref(), &demo::sample_orders(ORDERS))
        .await
        .unwrap();
    wait_for(
        "every order Processed",
        Duration::from_secs(60),
        async || count(store.as_ref(), ProcessState::Processed).await == ORDERS,
    )
    .await;
    assert_invariants(store.as_ref(), port, &sent, Some(ORDERS * STEPS)).await;
    // The flush at shutdown fails (connection refused) and is bounded.
    roles.stop(Duration::from_secs(20));
}

#[test]
fn otel_an_invalid_endpoint_stops_start_up_naming_the_setting() {
    for bad in ["collector:4318", "ftp://collector:4318"] {
        let out = std::process::Command::new(bin("orderly-scheduler"))
            .args(["--check-config", "--otel-endpoint", bad])
            .env("ORDERLY_DATABASE_URL", "sqlite://unused.db")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad}: accepted");
        assert!(
            err.contains("--otel-endpoint / ORDERLY_OTEL_ENDPOINT"),
            "{bad}: {err}"
        );
    }
    let out = std::process::Command::new(bin("orderly-agent"))
        .args(["--check-config", "--otel-filter", "info,[bad"])
        .env("ORDERLY_DATABASE_URL", "sqlite://unused.db")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("--otel-filter / ORDERLY_OTEL_FILTER"), "{err}");
}
