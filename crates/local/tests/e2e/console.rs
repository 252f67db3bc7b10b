//! The operators' console as an operator uses it after `orderly demo`, in a real
//! browser (`tests/browser/console.mjs`): the overview's charts have data, the Errors
//! page shows the causes of every Error order on one screen, a cause is retried with
//! two clicks after a confirmation that states its count, the store agrees that exactly
//! that cause's orders moved, under the operator's name, and any order is found by id;
//! an alert is acknowledged, and the other causes' orders are handled from the orders
//! list (two ticked and cancelled, all the rest matching state=Error retried after a
//! confirmation that counts them), as the store then agrees. The run leaves a
//! screenshot of each page in `target/screenshots/console` for review.

use std::time::Duration;

use orderly_core::ProcessState;
use orderly_core::history::HistoryKind;
use orderly_core::store::OrderFilter;
use orderly_core::triage::group_errors;

use crate::fixtures::{Db, Dialect};
use crate::procs::{Proc, free_port, wait_for};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_the_demo_an_operator_finds_every_cause_retries_one_in_two_clicks_and_finds_an_order()
{
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let script = root.join("tests/browser/console.mjs");
    assert!(
        root.join("tests/browser/node_modules/playwright-core")
            .exists(),
        "the browser test needs `npm ci --prefix tests/browser` (.ci/run does)"
    );
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        std::path::Path::new(&chromium).exists(),
        "the browser test needs Debian's chromium at {chromium} (apt-get install chromium; .ci/run does)"
    );
    // What a newcomer runs first: the demo, with its faults, on a file.
    let db = Db::new(Dialect::Sqlite).await;
    let demo = std::process::Command::new(crate::procs::bin("orderly"))
        .args(["demo", "--orders", "400", "--store", &db.url])
        .env_remove("ORDERLY_DATABASE_URL")
        .output()
        .expect("run orderly demo");
    assert!(
        demo.status.success(),
        "{}{}",
        String::from_utf8_lossy(&demo.stdout),
        String::from_utf8_lossy(&demo.stderr)
    );
    let store = db.backend().await.store;
    let rows = store
        .list(&OrderFilter {
            state: Some(ProcessState::Error),
            limit: 1_000,
            ..OrderFilter::default()
        })
        .await
        .unwrap()
        .orders;
    let groups = group_errors(&rows);
    assert!(
        !groups.is_empty(),
        "the demo's faults leave orders in Error"
    );
    let cause = &groups[0];
    let others: Vec<_> = groups[1..].iter().flat_map(|g| g.orders.clone()).collect();
    let target = cause.orders[0].clone();
    let customer = store
        .get(&target)
        .await
        .unwrap()
        .details
        .customer_id()
        .to_owned();
    // An alert about the system, as the leader raises one.
    store
        .raise(
            &orderly_core::conditions::Condition {
                kind: orderly_core::conditions::ConditionKind::PendingTooOld,
                subject: "orders".into(),
                detail: "order x waits for 6 minutes".into(),
            },
            "supervisor-1",
            &|_| Vec::new(),
        )
        .await
        .unwrap()
        .unwrap();

    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let _dashboard = Proc::start("orderly", &db.url, &["dashboard", "--listen", &listen]);
    let base = format!("http://{listen}");
    wait_for("the dashboard", Duration::from_secs(20), async || {
        crate::procs::get(&base).await.is_ok()
    })
    .await;
    let shots = root.join("target/screenshots/console");
    let mut node = std::process::Command::new("node");
    node.arg(&script)
        .arg(&base)
        .arg(&shots)
        .arg(&cause.key.pattern)
        .arg(cause.count().to_string())
        .arg(target.as_str())
        .arg(&customer)
        .arg(rows.len().to_string())
        .env("CHROMIUM", &chromium);
    let out = tokio::task::spawn_blocking(move || node.output().expect("node"))
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for page in [
        "overview",
        "errors",
        "retry-confirm",
        "retry-done",
        "orders",
        "order",
        "alerts",
        "overview-7d",
        "bulk-selected",
        "bulk-confirm",
    ] {
        assert!(
            shots.join(format!("{page}.png")).exists(),
            "no screenshot of {page}"
        );
    }

    // Exactly the cause's orders moved, each under the operator's name.
    for id in &cause.orders {
        let view = store.get(id).await.unwrap();
        assert_eq!(view.state.process_state, ProcessState::Pending, "{id}");
        let last = view.history.last().unwrap();
        assert!(
            matches!(
                last.kind,
                HistoryKind::Resubmitted | HistoryKind::RetriedAfresh
            ),
            "{id}: {last:?}"
        );
        assert_eq!(last.actor.as_str(), "operator:erin");
    }
    // The other causes' orders, from the orders list: two ticked and cancelled, the
    // rest (all matching state=Error) retried, each under the operator's name.
    let mut cancelled = 0;
    for id in &others {
        let view = store.get(id).await.unwrap();
        let last = view.history.last().unwrap();
        assert_eq!(last.actor.as_str(), "operator:erin", "{id}: {last:?}");
        match view.state.process_state {
            ProcessState::Cancelled => cancelled += 1,
            ProcessState::Pending => assert!(
                matches!(
                    last.kind,
                    HistoryKind::Resubmitted | HistoryKind::RetriedAfresh
                ),
                "{id}: {last:?}"
            ),
            other => panic!("{id} of another cause is {other} after the bulk actions"),
        }
    }
    assert_eq!(cancelled, 2, "the two ticked orders are cancelled");
}

/// Over plain HTTP, as the browser would post its forms: the supervisors' panel tells
/// "no supervisor running" (stopped cleanly, or lost) from "leader lost" and names the
/// leader; the dead letters are requeued or discarded with the page's CSRF token (and
/// refused without it); the live figures come as JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_console_tells_who_leads_and_requeues_or_discards_dead_letters() {
    use orderly_core::transport::{OutgoingMessage, QueueName};
    let (db, backend) = Db::with_queues(Dialect::Sqlite, Duration::from_secs(5)).await;
    let store = backend.store.clone();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let _dashboard = Proc::start("orderly", &db.url, &["dashboard", "--listen", &listen]);
    let base = format!("http://{listen}");
    let http = crate::procs::http_builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    wait_for("the dashboard", Duration::from_secs(20), async || {
        http.get(&base).send().await.is_ok()
    })
    .await;
    let leader = async || {
        let v: serde_json::Value = http
            .get(format!("{base}/api/overview"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v["leader"].as_str().unwrap().to_owned()
    };
    assert!(leader().await.contains("No supervisor running"));
    store.heartbeat("supervisor", "s-1", false).await.unwrap();
    assert!(leader().await.contains("Leader lost"), "{}", leader().await);
    store.heartbeat("supervisor", "s-1", true).await.unwrap();
    assert!(leader().await.contains("Leader: s-1"), "{}", leader().await);
    store.leave("supervisor", "s-1").await.unwrap();
    assert!(
        leader().await.contains("stopped cleanly"),
        "{}",
        leader().await
    );
    // One seen an hour ago that never said it stopped: lost.
    let past = orderly_core::ManualClock::new(chrono::Utc::now() - chrono::Duration::hours(1));
    let then = orderly_sql::connect(
        &db.url,
        orderly_core::TimeSource::Clock(std::sync::Arc::new(past)),
    )
    .await
    .unwrap();
    then.store
        .heartbeat("supervisor", "s-2", true)
        .await
        .unwrap();
    assert!(
        leader().await.contains("lost without stopping") && leader().await.contains("s-2"),
        "{}",
        leader().await
    );

    // Two dead letters on the orders queue.
    let orders = QueueName::parse("orders").unwrap();
    for id in ["bad-1", "bad-2"] {
        backend
            .transport
            .send(
                &orders,
                &[OutgoingMessage::new(id, b"not an order".to_vec())],
            )
            .await
            .unwrap();
        let got = backend
            .transport
            .receive(&orders, 1, Duration::ZERO)
            .await
            .unwrap();
        backend
            .transport
            .dead_letter(&got[0], "BodyUndecodable", "test")
            .await
            .unwrap();
    }
    let page = http
        .get(format!("{base}/dead-letters?queue=orders"))
        .send()
        .await
        .unwrap();
    let csrf = crate::procs::csrf_cookie(&page);
    let html = page.text().await.unwrap();
    assert!(
        html.contains("bad-1") && html.contains("Requeue all 2") && html.contains("Discard all 2"),
        "{html}"
    );
    let post = |path: &'static str, fields: Vec<(&'static str, String)>| {
        let (http, base, csrf) = (http.clone(), base.clone(), csrf.clone());
        async move {
            http.post(format!("{base}{path}"))
                .header("cookie", format!("orderly_csrf={csrf}"))
                .form(&fields)
                .send()
                .await
                .unwrap()
                .status()
        }
    };
    let forged = http
        .post(format!("{base}/dead-letters/discard"))
        .form(&[("csrf", "forged"), ("queue", "orders")])
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), 403);
    assert_eq!(
        backend
            .inspector
            .depths()
            .await
            .unwrap()
            .iter()
            .find(|d| d.queue == orders)
            .unwrap()
            .dead_lettered,
        2,
        "a forged form discards nothing"
    );
    let status = post(
        "/dead-letters/discard",
        vec![
            ("csrf", csrf.clone()),
            ("queue", "orders".into()),
            ("message_id", "bad-1".into()),
            ("operator", "erin".into()),
        ],
    )
    .await;
    assert_eq!(status, 303);
    let letters = backend.transport.dead_letters(&orders, 10).await.unwrap();
    assert_eq!(
        letters
            .iter()
            .map(|d| d.message.message_id.as_str())
            .collect::<Vec<_>>(),
        vec!["bad-2"]
    );
    let status = post(
        "/dead-letters/requeue",
        vec![
            ("csrf", csrf.clone()),
            ("queue", "orders".into()),
            ("operator", "erin".into()),
        ],
    )
    .await;
    assert_eq!(status, 303);
    assert!(
        backend
            .transport
            .dead_letters(&orders, 10)
            .await
            .unwrap()
            .is_empty()
    );
    let back = backend
        .transport
        .receive(&orders, 10, Duration::from_millis(200))
        .await
        .unwrap();
    assert_eq!(
        back.iter()
            .map(|m| m.message_id.as_str())
            .collect::<Vec<_>>(),
        vec!["bad-2"],
        "the requeued one is back on its queue"
    );
}
