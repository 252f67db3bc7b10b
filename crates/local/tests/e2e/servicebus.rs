//! The production shape's messaging: the four role binaries with
//! `ORDERLY_TRANSPORT=servicebus`, against the Service Bus STAND-IN (no Service Bus
//! emulator runs on these machines; the stand-in passes the same transport
//! conformance suite as our SQL queue). State changes go to the store's outbox and the
//! relays publish them; orders arrive on Service Bus's `orders` queue.

use std::sync::Arc;
use std::time::Duration;

use orderly_azure::{Provisioned, ServiceBusSettings, ServiceBusTransport};
use orderly_core::messages::queues;
use orderly_core::transport::QueueSettings;
use orderly_core::workflow::Workflow;
use orderly_core::{ProcessState, SystemClock};
use orderly_local::demo;
use orderly_testkit::servicebus_standin::Standin;

use crate::fixtures::{Db, Dialect};
use crate::newcomer::{orderly, posted_ids, wait_listening};
use crate::processes::{assert_invariants, count, start_sim};
use crate::procs::{Proc, free_port, wait_for};

/// The stand-in, with every queue the default workflow uses declared.
pub(crate) fn standin_with_queues() -> Standin {
    let standin = Standin::start();
    declare_all(&standin);
    standin
}

/// Declares every queue the default workflow uses (again, after a restart).
pub(crate) fn declare_all(standin: &Standin) {
    let defaults = QueueSettings::default();
    let mut names: Vec<String> = [queues::ORDERS, queues::REPLIES, queues::ALERTS]
        .map(String::from)
        .to_vec();
    names.extend(
        Workflow::default()
            .queues()
            .iter()
            .map(|q| q.as_str().to_owned()),
    );
    for q in &names {
        standin
            .declare(
                q,
                defaults.lock_duration,
                defaults.max_delivery_count,
                defaults.duplicate_detection_window,
            )
            .unwrap();
    }
}

/// The environment that puts a role on the stand-in's Service Bus.
pub(crate) fn role_env(connection: &str) -> [(&'static str, &str); 3] {
    [
        ("ORDERLY_TRANSPORT", "servicebus"),
        ("ORDERLY_SERVICEBUS_CONNECTION", connection),
        ("ORDERLY_SERVICEBUS_UNSECURED", "true"),
    ]
}

/// A client of the stand-in's Service Bus, as a user posting orders has.
pub(crate) async fn client(connection: &str) -> ServiceBusTransport {
    let mut settings = ServiceBusSettings::new(connection.to_owned());
    settings.unsecured = true;
    ServiceBusTransport::connect(&settings, Arc::new(Provisioned), Arc::new(SystemClock))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_roles_process_orders_over_service_bus_through_the_outbox() {
    let standin = standin_with_queues();
    let (db, backend) = Db::with_queues(Dialect::Sqlite, Duration::from_secs(5)).await;
    let store = backend.store.clone();
    let connection = standin.connection_string();
    let env = role_env(&connection);
    let sim_port = free_port();
    let remote = format!("http://127.0.0.1:{sim_port}/actions");
    let _sim = start_sim(&db.url, sim_port, &["--latency-ms", "2"]);
    let ops = free_port();
    let listen = format!("127.0.0.1:{ops}");
    let intake_port = free_port();
    let intake = format!("127.0.0.1:{intake_port}");
    let _submitter = Proc::start_with(
        "orderly-submitter",
        &db.url,
        &["--http-listen", &intake, "--http-intake", "--intake-open"],
        &env,
    );
    let _scheduler = Proc::start_with(
        "orderly-scheduler",
        &db.url,
        &["--http-listen", &listen],
        &env,
    );
    let _agent = Proc::start_with("orderly-agent", &db.url, &["--remote-url", &remote], &env);
    let _supervisor = Proc::start_with("orderly-supervisor", &db.url, &[], &env);

    let client = client(&connection).await;
    let orders = demo::sample_orders(40);
    let sent = demo::post(&client, &orders).await.unwrap();
    wait_for(
        "40 orders processed over Service Bus",
        Duration::from_secs(90),
        async || count(&*store, ProcessState::Processed).await == 40,
    )
    .await;
    // A client posts with `orderly post` (the client library) on Service Bus and
    // follows its orders on a reply queue of its own; another posts over HTTP.
    standin
        .declare(
            "client-sb",
            Duration::from_secs(30),
            10,
            Duration::from_secs(600),
        )
        .unwrap();
    let (ok, stdout, stderr) = orderly(
        &db.url,
        &[
            "post",
            "--transport",
            "servicebus",
            "--sample",
            "3",
            "--reply-to",
            "client-sb",
            "--wait",
            "--timeout-secs",
            "90",
        ],
        &env[1..],
    );
    assert!(
        ok,
        "orderly post on Service Bus failed:\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("completed 3, failed or cancelled 0"),
        "{stdout}"
    );
    let mut sent = sent;
    for id in posted_ids(&stdout) {
        sent.insert(id, chrono::Utc::now());
    }
    wait_listening(intake_port).await;
    for id in ["sb-http-1", "sb-http-2"] {
        let r = crate::procs::http()
            .post(format!("http://{intake}/orders"))
            .json(&serde_json::json!({
                "order_id": id,
                "details": {"customer_id": "c-http", "currency": "EUR",
                    "lines": [{"sku": "DOCK-04", "quantity": 1, "unit_price_minor": 4999}]}
            }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
        sent.insert(
            orderly_core::OrderId::parse(id).unwrap(),
            chrono::Utc::now(),
        );
    }
    assert_eq!(sent.len(), 45);
    wait_for(
        "45 orders processed over Service Bus",
        Duration::from_secs(90),
        async || count(&*store, ProcessState::Processed).await == 45,
    )
    .await;
    assert_invariants(store.as_ref(), sim_port, &sent, Some(135)).await;

    // Every message went through the outbox and out; none took the SQL queue.
    let outbox = orderly_sql::connect_outbox(&db.url, orderly_core::TimeSource::Database)
        .await
        .unwrap()
        .outbox;
    wait_for("the outbox drained", Duration::from_secs(10), async || {
        outbox.outbox_backlog().await.unwrap() == 0
    })
    .await;
    for d in backend.inspector.depths().await.unwrap() {
        assert_eq!(
            (d.ready, d.locked, d.dead_lettered),
            (0, 0, 0),
            "nothing on the SQL queue {}",
            d.queue
        );
    }
    // The scheduler's readiness covers Service Bus; its metrics the relay.
    let ready = crate::procs::get(format!("http://{listen}/readyz"))
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    let metrics = crate::procs::get(format!("http://{listen}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("orderly_outbox_relayed_total"),
        "{metrics}"
    );
    assert!(
        metrics.contains("orderly_store_up{role=\"scheduler\"} 1"),
        "{metrics}"
    );
}

/// On Service Bus queues are infrastructure: a role whose queue is missing stops at
/// start-up naming the queue and how to provision it, instead of looping on errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_whose_service_bus_queue_is_missing_stops_naming_it() {
    let standin = Standin::start();
    let db = Db::new(Dialect::Sqlite).await;
    let connection = standin.connection_string();
    let env = role_env(&connection);
    let mut submitter = Proc::start_with("orderly-submitter", &db.url, &[], &env);
    let status = submitter.wait(Duration::from_secs(30));
    assert!(!status.success());
    let out = submitter.output();
    assert!(
        out.contains("Service Bus queue orders does not exist")
            && out.contains("az servicebus queue create"),
        "{out}"
    );
    assert!(
        !out.contains("c3RhbmQtaW4tb25seQ"),
        "the key is never printed"
    );
}

/// Service Bus closes connections in production (idle detach, upgrades, blips): the
/// four roles ride out the broker dropping every connection and then restarting, and
/// process the orders posted after it, without being restarted themselves; each says
/// so in its log and counts it in its metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_roles_ride_out_a_broker_restart_and_keep_processing() {
    let mut standin = standin_with_queues();
    let (db, backend) = Db::with_queues(Dialect::Sqlite, Duration::from_secs(5)).await;
    let store = backend.store.clone();
    let connection = standin.connection_string();
    let env = role_env(&connection);
    let sim_port = free_port();
    let remote = format!("http://127.0.0.1:{sim_port}/actions");
    let _sim = start_sim(&db.url, sim_port, &["--latency-ms", "2"]);
    let ops = free_port();
    let listen = format!("127.0.0.1:{ops}");
    let submitter = Proc::start_with("orderly-submitter", &db.url, &[], &env);
    let scheduler = Proc::start_with(
        "orderly-scheduler",
        &db.url,
        &["--http-listen", &listen, "--processing-timeout-ms", "20000"],
        &env,
    );
    let agent = Proc::start_with("orderly-agent", &db.url, &["--remote-url", &remote], &env);
    let supervisor = Proc::start_with("orderly-supervisor", &db.url, &[], &env);

    let client = client(&connection).await;
    let first = demo::sample_orders(20);
    let mut sent = demo::post(&client, &first).await.unwrap();
    wait_for("20 orders processed", Duration::from_secs(90), async || {
        count(&*store, ProcessState::Processed).await == 20
    })
    .await;

    // The roles are idle; the broker drops every connection, then restarts (its queues
    // come back empty, as a restarted emulator's do: declared again).
    standin.drop_connections().unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    standin.restart();
    declare_all(&standin);

    let second = demo::sample_orders(20);
    let started = std::time::Instant::now();
    loop {
        // The client reconnects too; a post that fails is posted again (absorbed).
        match demo::post(&client, &second).await {
            Ok(at) => {
                sent.extend(at);
                break;
            }
            Err(e) => {
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "cannot post: {e:#}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    wait_for(
        "the 20 orders posted after the restart processed",
        Duration::from_secs(120),
        async || count(&*store, ProcessState::Processed).await == 40,
    )
    .await;
    assert_invariants(store.as_ref(), sim_port, &sent, Some(120)).await;
    // The roles that receive found their connection gone and rebuilt it (an idle
    // supervisor finds out when it next publishes, or when /readyz asks).
    let _ = &supervisor;
    for (name, p) in [
        ("submitter", &submitter),
        ("scheduler", &scheduler),
        ("agent", &agent),
    ] {
        let log = p.output();
        assert!(
            log.contains("Service Bus connection lost, reconnecting")
                && log.contains("Service Bus connection re-established"),
            "{name} did not log its reconnect:\n{log}"
        );
    }
    let metrics = crate::procs::get(format!("http://{listen}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let reconnects = metrics
        .lines()
        .find(|l| l.starts_with("orderly_servicebus_reconnects_total"))
        .unwrap_or_else(|| panic!("no reconnect counter in:\n{metrics}"));
    assert!(!reconnects.ends_with(" 0"), "{reconnects}");
    assert!(
        metrics.contains("orderly_servicebus_connected 1"),
        "{metrics}"
    );
}

/// An operator's queue commands on Service Bus (the stand-in), as on the SQL queue:
/// `orderly queues` counts messages and dead letters (by peeking, and says so),
/// `dead-letters` lists them with why, `discard` removes one, `requeue` puts one back
/// (under a new id, with its body) and then all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_queue_commands_work_on_service_bus() {
    use orderly_core::transport::{OutgoingMessage, QueueName, Transport};
    let standin = standin_with_queues();
    let connection = standin.connection_string();
    let env = role_env(&connection);
    let db = Db::new(Dialect::Sqlite).await;
    let sb = client(&connection).await;
    let orders = QueueName::parse(queues::ORDERS).unwrap();
    for id in ["bad-1", "bad-2", "bad-3"] {
        sb.send(
            &orders,
            &[OutgoingMessage::new(
                id,
                format!("not an order: {id}").into_bytes(),
            )],
        )
        .await
        .unwrap();
    }
    // Sent is not yet delivered: wait (bounded) for the three.
    let got = orderly_testkit::transport::receive_n(&sb, &orders, 3).await;
    for m in &got {
        sb.dead_letter(m, "BodyUndecodable", "expected an order")
            .await
            .unwrap();
    }
    let run = |args: &[&str]| {
        let (ok, out, err) = orderly(&db.url, args, &env);
        assert!(ok, "orderly {args:?}: {out}{err}");
        out
    };
    let out = run(&["queues"]);
    let line = out
        .lines()
        .find(|l| l.starts_with("orders "))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(line.trim_end().ends_with(" 3"), "three dead letters: {out}");
    assert!(out.contains("counted by peeking"), "{out}");
    let out = run(&["dead-letters", "orders"]);
    for id in ["bad-1", "bad-2", "bad-3"] {
        assert!(out.contains(id), "{out}");
    }
    assert!(out.contains("BodyUndecodable"), "{out}");
    assert!(run(&["discard", "orders", "bad-1"]).contains("discarded 1 message(s) on orders"));
    assert!(run(&["requeue", "orders", "bad-2"]).contains("requeued 1 message(s) on orders"));
    let back = orderly_testkit::transport::receive_n(&sb, &orders, 1).await;
    assert!(
        back[0].message_id.starts_with("bad-2~requeued-"),
        "{back:?}"
    );
    assert_eq!(back[0].body, b"not an order: bad-2");
    sb.complete(&back[0]).await.unwrap();
    assert!(run(&["requeue", "orders", "--all", "--yes"]).contains("requeued 1 message(s)"));
    let out = run(&["dead-letters", "orders"]);
    assert!(!out.contains("bad-"), "none left: {out}");
    let (ok, _, err) = orderly(&db.url, &["discard", "orders", "bad-9"], &env);
    assert!(
        !ok && err.contains("no such dead letter on orders"),
        "{err}"
    );
}

/// One message the broker would refuse (over `ORDERLY_SERVICEBUS_MAX_MESSAGE_BYTES`:
/// here an order of 100 long lines, whose step request carries its details) goes in
/// the relay's batch with the others' requests. Only it is set aside as an outbox
/// dead letter, with the setting named; the others are published and their orders
/// complete. Before, the batch was refused whole and every row in it was retried and
/// then set aside with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_over_size_message_is_set_aside_alone_and_its_batch_goes_out() {
    let standin = standin_with_queues();
    let (db, backend) = Db::with_queues(Dialect::Sqlite, Duration::from_secs(5)).await;
    let store = backend.store.clone();
    let connection = standin.connection_string();
    let mut env = role_env(&connection).to_vec();
    env.push(("ORDERLY_SERVICEBUS_MAX_MESSAGE_BYTES", "8192"));
    let sim_port = free_port();
    let remote = format!("http://127.0.0.1:{sim_port}/actions");
    let _sim = start_sim(&db.url, sim_port, &["--latency-ms", "2"]);
    // The orders wait in the queue until the scheduler starts, so its first claim
    // takes them together and the relay leases their requests as one batch.
    let mut orders = demo::sample_orders(20);
    let mut big = demo::sample_orders(1).remove(0);
    let lines: Vec<orderly_core::order::OrderLine> = (0..orderly_core::order::MAX_LINES)
        .map(|i| orderly_core::order::OrderLine {
            sku: format!("SKU-{i:03}-{}", "X".repeat(40)),
            quantity: 1,
            unit_price_minor: 100,
        })
        .collect();
    big.details = orderly_core::order::OrderDetails::new(
        "c-big",
        orderly_core::order::Currency::parse("EUR").unwrap(),
        lines,
    )
    .unwrap();
    let big_id = big.order_id.clone();
    orders.insert(10, big);
    let client = client(&connection).await;
    demo::post(&client, &orders).await.unwrap();
    let _submitter = Proc::start_with("orderly-submitter", &db.url, &[], &env);
    wait_for("21 orders recorded", Duration::from_secs(60), async || {
        count(&*store, ProcessState::Pending).await == 21
    })
    .await;
    let _scheduler = Proc::start_with("orderly-scheduler", &db.url, &[], &env);
    let _agent = Proc::start_with("orderly-agent", &db.url, &["--remote-url", &remote], &env);
    wait_for(
        "the 20 other orders processed",
        Duration::from_secs(90),
        async || count(&*store, ProcessState::Processed).await == 20,
    )
    .await;
    let (ok, out) = crate::procs::orderly(&db.url, &["outbox", "--json"]);
    assert!(ok, "{out}");
    let outbox: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let dead = outbox["dead_letters"].as_array().unwrap();
    assert_eq!(dead.len(), 1, "{outbox:#}");
    assert_eq!(dead[0]["queue"], "agent.inventory", "{outbox:#}");
    assert!(
        dead[0]["message_id"]
            .as_str()
            .unwrap()
            .contains(big_id.as_str()),
        "{outbox:#}"
    );
    assert_eq!(dead[0]["attempts"], 1, "set aside at once: {outbox:#}");
    let reason = dead[0]["reason"].as_str().unwrap();
    assert!(
        reason.contains("ORDERLY_SERVICEBUS_MAX_MESSAGE_BYTES") && reason.contains("8192"),
        "{reason}"
    );
    let view = store.get(&big_id).await.unwrap();
    assert_eq!(view.state.process_state, ProcessState::Processing);
}
