//! A new user's journeys, walked as they walk them: the role binaries started one by
//! one in the README's order on a brand-new database (nothing declared beforehand),
//! orders posted as a client posts them (`orderly post`, and `POST /orders` on the
//! submitter's HTTP intake), and the HTTP intake's answers to good, repeated and bad
//! posts.

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use orderly_core::store::StateStore;
use orderly_core::{OrderId, ProcessState, TimeSource};
use serde_json::{Value, json};

use crate::both;
use crate::fixtures::{Db, Dialect};
use crate::processes::{assert_invariants, count, start_sim};
use crate::procs::{Proc, bin, free_port, wait_for};

/// Runs `orderly ARGS` to its end; (exit success, stdout, stderr).
pub(crate) fn orderly(db: &str, args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let out = Command::new(bin("orderly"))
        .args(args)
        .env("ORDERLY_DATABASE_URL", db)
        .envs(env.iter().copied())
        .output()
        .expect("run orderly");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The order ids `orderly post` printed (one per line, indented).
pub(crate) fn posted_ids(stdout: &str) -> Vec<OrderId> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("  "))
        .filter_map(|id| OrderId::parse(id.trim()).ok())
        .collect()
}

/// A sample order as JSON, for HTTP clients.
pub(crate) fn order_json(id: Option<&str>, customer: &str) -> Value {
    let mut v = json!({
        "details": {
            "customer_id": customer,
            "currency": "EUR",
            "lines": [{"sku": "MOUSE-02", "quantity": 1, "unit_price_minor": 1999}]
        }
    });
    if let Some(id) = id {
        v["order_id"] = json!(id);
    }
    v
}

/// Waits until the submitter's intake answers on `port`.
pub(crate) async fn wait_listening(port: u16) {
    wait_for(
        "the submitter's HTTP endpoint",
        Duration::from_secs(30),
        async || {
            crate::procs::get(format!("http://127.0.0.1:{port}/healthz"))
                .await
                .is_ok()
        },
    )
    .await;
}

both!(
    the_roles_started_one_by_one_on_a_new_database_process_posted_orders,
    one_by_one
);
async fn one_by_one(dialect: Dialect) {
    // A brand-new database: no migrations run, no queue declared by anyone but the roles.
    let db = Db::new(dialect).await;
    let sim_port = free_port();
    let remote = format!("http://127.0.0.1:{sim_port}/actions");
    let intake_port = free_port();
    let intake = format!("127.0.0.1:{intake_port}");
    // The README's order: simulator, submitter, scheduler, agent, supervisor.
    let _sim = start_sim(&db.url, sim_port, &[]);
    let submitter = Proc::start(
        "orderly-submitter",
        &db.url,
        &["--http-listen", &intake, "--http-intake", "--intake-open"],
    );
    let scheduler = Proc::start("orderly-scheduler", &db.url, &[]);
    let agent = Proc::start("orderly-agent", &db.url, &["--remote-url", &remote]);
    let supervisor = Proc::start(
        "orderly-supervisor",
        &db.url,
        &["--interval-ms", "1000", "--max-failures", "5"],
    );

    // A client posts through the queue and follows its orders to the end.
    let (ok, stdout, stderr) = orderly(
        &db.url,
        &["post", "--sample", "5", "--wait", "--timeout-secs", "90"],
        &[],
    );
    assert!(ok, "orderly post --wait failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("completed 5, failed or cancelled 0"),
        "{stdout}"
    );
    for word in [
        "received",
        "processing",
        "step_done reserve-inventory",
        "completed",
    ] {
        assert!(stdout.contains(word), "no {word:?} notice in:\n{stdout}");
    }
    let mut ids = posted_ids(&stdout);
    assert_eq!(ids.len(), 5, "{stdout}");

    // And one over HTTP.
    wait_listening(intake_port).await;
    let http = crate::procs::http();
    let answer = http
        .post(format!("http://{intake}/orders"))
        .json(&order_json(Some("http-order-1"), "customer-http"))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 202);
    ids.push(OrderId::parse("http-order-1").unwrap());

    let backend = db.backend().await;
    let store: &dyn StateStore = backend.store.as_ref();
    wait_for("6 orders processed", Duration::from_secs(90), async || {
        count(store, ProcessState::Processed).await == 6
    })
    .await;
    let view: Value = http
        .get(format!("http://{intake}/orders/http-order-1"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(view["process_state"], "Processed", "{view}");
    assert_eq!(view["steps"].as_array().map(Vec::len), Some(3), "{view}");

    let sent: HashMap<_, _> = ids.into_iter().map(|id| (id, chrono::Utc::now())).collect();
    assert_invariants(store, sim_port, &sent, Some(18)).await;
    // The roles made the queues they need, and said so.
    let declared: Vec<String> = backend
        .inspector
        .depths()
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.queue.as_str().to_owned())
        .collect();
    for q in [
        "orders",
        "replies",
        "alerts",
        "agent.inventory",
        "agent.payment",
        "agent.shipping",
    ] {
        assert!(
            declared.iter().any(|d| d == q),
            "queue {q} not declared: {declared:?}"
        );
    }
    // Whichever started first created each (the client `orderly post` too: it may
    // post before any role ran); the roles say so in their logs.
    let logs: String = [&submitter, &scheduler, &agent, &supervisor]
        .iter()
        .map(|p| p.output())
        .collect();
    assert!(
        logs.lines()
            .any(|l| l.contains("queue created") && l.contains("agent.shipping")),
        "{logs}"
    );
}

both!(
    the_http_intake_creates_exactly_the_distinct_orders_of_a_burst_with_repeats,
    http_burst
);
async fn http_burst(dialect: Dialect) {
    let db = Db::new(dialect).await;
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let _submitter = Proc::start(
        "orderly-submitter",
        &db.url,
        &["--http-listen", &listen, "--http-intake", "--intake-open"],
    );
    wait_listening(port).await;
    let http = crate::procs::http_builder()
        .pool_max_idle_per_host(16)
        .build()
        .unwrap();
    // 1,000 posts: 900 distinct orders, and 100 repeats of some of them, interleaved.
    let mut posts: Vec<String> = (0..900).map(|i| format!("burst-{i}")).collect();
    for i in 0..100 {
        posts.insert(i * 9 + 5, format!("burst-{}", i * 7));
    }
    assert_eq!(posts.len(), 1000);
    let statuses = futures_statuses(&http, &listen, posts).await;
    let refused: Vec<_> = statuses
        .iter()
        .filter(|s| !matches!(s, 200 | 202))
        .collect();
    assert!(refused.is_empty(), "refused posts: {refused:?}");

    let backend = db.backend().await;
    let store: &dyn StateStore = backend.store.as_ref();
    // The submitter has taken every message off the orders queue (none waiting, none
    // held): whatever it recorded is recorded. Repeats were absorbed, not recorded twice.
    wait_for(
        "the orders queue drained",
        Duration::from_secs(60),
        async || {
            backend
                .inspector
                .depths()
                .await
                .unwrap()
                .iter()
                .filter(|d| d.queue.as_str() == "orders")
                .all(|d| d.ready == 0 && d.locked == 0 && d.scheduled == 0)
        },
    )
    .await;
    let total: i64 = store
        .count_by_state()
        .await
        .unwrap()
        .iter()
        .map(|(_, n)| n)
        .sum();
    assert_eq!(total, 900, "exactly the distinct orders");
    for d in backend.inspector.depths().await.unwrap() {
        assert_eq!(d.dead_lettered, 0, "nothing dead-lettered on {}", d.queue);
    }

    // A repeat of an accepted order: 200, nothing new.
    let again = http
        .post(format!("http://{listen}/orders"))
        .json(&order_json(Some("burst-3"), "customer-1"))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 200);
    // The same id with other details: 409.
    let conflict = http
        .post(format!("http://{listen}/orders"))
        .json(&order_json(Some("burst-3"), "someone-else"))
        .send()
        .await
        .unwrap();
    assert_eq!(conflict.status(), 409);
    // The id as Idempotency-Key.
    let keyed = http
        .post(format!("http://{listen}/orders"))
        .header("Idempotency-Key", "keyed-1")
        .json(&order_json(None, "customer-1"))
        .send()
        .await
        .unwrap();
    assert_eq!(keyed.status(), 202);
    let body: Value = keyed.json().await.unwrap();
    assert_eq!(body["order_id"], "keyed-1");

    // Bad input: 400 naming the field, 413 for a body over the limit.
    let bad = |v: Value| {
        let http = http.clone();
        let listen = listen.clone();
        async move {
            let r = http
                .post(format!("http://{listen}/orders"))
                .json(&v)
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let mut wrong_currency = order_json(Some("bad-1"), "c");
    wrong_currency["details"]["currency"] = json!("euro");
    let (status, text) = bad(wrong_currency).await;
    assert_eq!(status, 400);
    assert!(text.contains("currency"), "{text}");
    let (status, text) = bad(order_json(None, "c")).await;
    assert_eq!(status, 400);
    assert!(text.contains("order_id"), "{text}");
    let mut zero = order_json(Some("bad-2"), "c");
    zero["details"]["lines"][0]["quantity"] = json!(0);
    let (status, text) = bad(zero).await;
    assert_eq!(status, 400);
    assert!(text.contains("quantity"), "{text}");
    let mut bad_reply = order_json(Some("bad-3"), "c");
    bad_reply["reply_to"] = json!("no spaces");
    let (status, text) = bad(bad_reply).await;
    assert_eq!(status, 400);
    assert!(text.contains("reply_to"), "{text}");
    let mut huge = order_json(Some("bad-4"), "c");
    huge["padding"] = json!("x".repeat(70 * 1024));
    let (status, _) = bad(huge).await;
    assert_eq!(status, 413);
    let missing = http
        .get(format!("http://{listen}/orders/no-such-order"))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    wait_for(
        "the keyed order recorded",
        Duration::from_secs(30),
        async || count(store, ProcessState::Pending).await == 901,
    )
    .await;
}

/// Posts each id's order over HTTP, 16 at a time; the status of each answer.
async fn futures_statuses(http: &reqwest::Client, listen: &str, ids: Vec<String>) -> Vec<u16> {
    let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(16));
    let mut tasks = Vec::with_capacity(ids.len());
    for id in ids {
        let http = http.clone();
        let url = format!("http://{listen}/orders");
        let permit = sem.clone().acquire_owned().await.unwrap();
        tasks.push(tokio::spawn(async move {
            let r = http
                .post(url)
                .json(&order_json(Some(&id), "customer-1"))
                .send()
                .await
                .unwrap();
            drop(permit);
            r.status().as_u16()
        }));
    }
    let mut statuses = Vec::with_capacity(tasks.len());
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    statuses
}

/// The intake's token: required off loopback (start-up refused, naming the setting),
/// checked on every request when set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_intake_needs_its_token() {
    let db = Db::new(Dialect::Sqlite).await;
    let (ok, _, stderr) = {
        let out = Command::new(bin("orderly-submitter"))
            .args([
                "--http-listen",
                "0.0.0.0:0",
                "--http-intake",
                "--check-config",
            ])
            .env("ORDERLY_DATABASE_URL", &db.url)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    assert!(!ok);
    assert!(stderr.contains("ORDERLY_INTAKE_TOKEN"), "{stderr}");
    // A short token is refused too, naming the setting and never echoing it.
    let out = Command::new(bin("orderly-submitter"))
        .args([
            "--http-listen",
            "0.0.0.0:0",
            "--http-intake",
            "--check-config",
        ])
        .env("ORDERLY_DATABASE_URL", &db.url)
        .env("ORDERLY_INTAKE_TOKEN", "short-9")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("ORDERLY_INTAKE_TOKEN")
            && stderr.contains("at least 16")
            && !stderr.contains("short-9"),
        "{stderr}"
    );
    // The token may come from a file (a mounted secret), read and trimmed; off
    // loopback it then satisfies the requirement. Not both at once.
    let file = std::env::temp_dir().join(format!(
        "orderly-intake-token-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::write(&file, "from-a-mounted-secret-file\n").unwrap();
    let with_file = |value: Option<&str>| {
        let mut c = Command::new(bin("orderly-submitter"));
        c.args([
            "--http-listen",
            "0.0.0.0:0",
            "--http-intake",
            "--check-config",
        ])
        .env("ORDERLY_DATABASE_URL", &db.url)
        .env("ORDERLY_INTAKE_TOKEN_FILE", &file)
        // Off loopback /metrics needs its own token.
        .env("ORDERLY_METRICS_TOKEN", "a-metrics-token-of-some-length");
        if let Some(v) = value {
            c.env("ORDERLY_INTAKE_TOKEN", v);
        }
        c.output().unwrap()
    };
    let out = with_file(None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = with_file(Some("also-given-as-a-value"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("not both"),
        "{stderr}"
    );
    let _ = std::fs::remove_file(&file);
    // On loopback too, an intake without a token starts only when told so; told so
    // off loopback, or with a token as well, it does not.
    let on = |listen: &str, env: &[(&str, &str)]| {
        let out = Command::new(bin("orderly-submitter"))
            .args(["--http-listen", listen, "--http-intake", "--check-config"])
            .env("ORDERLY_DATABASE_URL", &db.url)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, stderr) = on("127.0.0.1:0", &[]);
    assert!(
        !ok && stderr.contains("--intake-open / ORDERLY_INTAKE_OPEN")
            && stderr.contains("ORDERLY_INTAKE_TOKEN"),
        "{stderr}"
    );
    let (ok, stderr) = on("127.0.0.1:0", &[("ORDERLY_INTAKE_OPEN", "true")]);
    assert!(ok, "{stderr}");
    let (ok, stderr) = on(
        "0.0.0.0:0",
        &[
            ("ORDERLY_INTAKE_OPEN", "true"),
            ("ORDERLY_METRICS_TOKEN", "a-metrics-token-of-some-length"),
        ],
    );
    assert!(!ok && stderr.contains("not loopback"), "{stderr}");
    let (ok, stderr) = on(
        "127.0.0.1:0",
        &[
            ("ORDERLY_INTAKE_OPEN", "true"),
            ("ORDERLY_INTAKE_TOKEN", "s3cret-intake-token"),
        ],
    );
    assert!(!ok && stderr.contains("not both"), "{stderr}");

    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let _submitter = Proc::start_with(
        "orderly-submitter",
        &db.url,
        &["--http-listen", &listen, "--http-intake"],
        &[("ORDERLY_INTAKE_TOKEN", "s3cret-intake-token")],
    );
    wait_listening(port).await;
    let http = crate::procs::http();
    let url = format!("http://{listen}/orders");
    let none = http
        .post(&url)
        .json(&order_json(Some("t-1"), "c"))
        .send()
        .await
        .unwrap();
    assert_eq!(none.status(), 401);
    let wrong = http
        .post(&url)
        .bearer_auth("guess")
        .json(&order_json(Some("t-1"), "c"))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    let right = http
        .post(&url)
        .bearer_auth("s3cret-intake-token")
        .json(&order_json(Some("t-1"), "c"))
        .send()
        .await
        .unwrap();
    assert_eq!(right.status(), 202);
    let read = http.get(format!("{url}/t-1")).send().await.unwrap();
    assert_eq!(read.status(), 401, "reading needs the token too");
}

/// With ORDERLY_REPLY_TO_PREFIX set, the real submitter takes over HTTP only orders
/// whose reply queue is a client's (400 naming `reply_to` and the prefix otherwise);
/// a prefix that would admit orderly's own queues stops start-up, naming the setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_submitter_takes_only_client_reply_queues_when_a_prefix_is_set() {
    let db = Db::new(Dialect::Sqlite).await;
    let out = Command::new(bin("orderly-submitter"))
        .arg("--check-config")
        .env("ORDERLY_DATABASE_URL", &db.url)
        .env("ORDERLY_REPLY_TO_PREFIX", "agent")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("ORDERLY_REPLY_TO_PREFIX"), "{stderr}");

    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let _submitter = Proc::start_with(
        "orderly-submitter",
        &db.url,
        &["--http-listen", &listen, "--http-intake", "--intake-open"],
        &[("ORDERLY_REPLY_TO_PREFIX", "client-")],
    );
    wait_listening(port).await;
    let http = crate::procs::http();
    let post = |v: Value| {
        let http = http.clone();
        let url = format!("http://{listen}/orders");
        async move {
            let r = http.post(url).json(&v).send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let mut stray = order_json(Some("p-1"), "c");
    stray["reply_to"] = json!("billing-events");
    let (status, text) = post(stray).await;
    assert_eq!(status, 400, "{text}");
    assert!(
        text.contains("reply_to") && text.contains("client-"),
        "{text}"
    );
    let (status, text) = post(order_json(Some("p-2"), "c")).await;
    assert_eq!(status, 202, "no reply queue at all is fine: {text}");
}

/// `orderly migrate` declares the queues on a new database, so the roles and clients
/// find them; on the store's own clock nothing else is needed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_declares_the_queues() {
    let db = Db::new(Dialect::Sqlite).await;
    let (ok, stdout, stderr) = orderly(&db.url, &["migrate"], &[]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("agent.shipping"), "{stdout}");
    let backend = orderly_sql::connect(&db.url, TimeSource::Database)
        .await
        .unwrap();
    let names: Vec<String> = backend
        .inspector
        .depths()
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.queue.as_str().to_owned())
        .collect();
    assert_eq!(names.len(), 6, "{names:?}");
}

/// `orderly outbox` shows what the outbox holds back, and `--requeue` puts the
/// undeliverable back: walked on a store whose outbox has a message for a queue the
/// target does not have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orderly_outbox_lists_undeliverable_messages_and_requeues_them() {
    use orderly_core::transport::{Envelope, OutgoingMessage, QueueName};
    let db = Db::new(Dialect::Sqlite).await;
    let outbox = orderly_sql::connect_outbox(&db.url, TimeSource::Database)
        .await
        .unwrap();
    let order = orderly_cli::sample::order(1);
    outbox
        .store
        .submit(
            &order,
            &orderly_core::Actor::operator("t"),
            &[Envelope {
                queue: QueueName::parse("client-gone").unwrap(),
                message: OutgoingMessage::new("st-1", b"{}".to_vec()),
            }],
        )
        .await
        .unwrap();
    // The target: the SQL queue of another database, without that queue. Its files
    // live as long as the test (dropping the `Db` removes them under open connections).
    let target_db = Db::new(Dialect::Sqlite).await;
    let target = target_db.backend().await;
    let relay = orderly_core::InstanceId::parse("relay-t").unwrap();
    let outcome = outbox
        .outbox
        .relay_once(&relay, target.transport.as_ref(), 10)
        .await
        .unwrap();
    assert_eq!(outcome.dead, 1);
    let (ok, stdout, stderr) = orderly(&db.url, &["outbox"], &[]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("not deliverable: 1")
            && stdout.contains("client-gone")
            && stdout.contains("QueueNotFound"),
        "{stdout}"
    );
    let (ok, stdout, _) = orderly(&db.url, &["outbox", "--json"], &[]);
    assert!(ok);
    let v: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["dead_letters"].as_array().map(Vec::len), Some(1));
    let (ok, stdout, _) = orderly(&db.url, &["outbox", "--requeue"], &[]);
    assert!(
        ok && stdout.contains("1 outbox message(s) put back"),
        "{stdout}"
    );
    assert_eq!(outbox.outbox.outbox_backlog().await.unwrap(), 1);
}
