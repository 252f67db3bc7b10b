//! The operations endpoints of the real role binaries under load: `/healthz`,
//! `/readyz`, and `/metrics` with the named series; then SIGTERM during load: each
//! role exits cleanly, nothing is lost, nothing done twice.

use std::time::Duration;

use orderly_core::ProcessState;
use orderly_local::demo;

use crate::both;
use crate::fixtures::{Db, Dialect};
use crate::processes::{assert_invariants, count, start_sim};
use crate::procs::{Proc, free_port, wait_for};

async fn get(port: u16, path: &str) -> (u16, String) {
    match crate::procs::get(format!("http://127.0.0.1:{port}{path}")).await {
        Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
        Err(_) => (0, String::new()),
    }
}

/// The value of the first sample of `series` (name with labels, as rendered).
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Asserts each `(series, value)` in `metrics`.
/// `metrics` parses with the Prometheus client's text-format parser and follows the
/// naming conventions promtool checks (scripts/lint-metrics).
fn lint_metrics(metrics: &str) {
    use std::io::Write as _;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut lint = std::process::Command::new("python3")
        .arg(root.join("scripts/lint-metrics"))
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    lint.stdin
        .take()
        .unwrap()
        .write_all(metrics.as_bytes())
        .unwrap();
    let out = lint.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "/metrics fails the lint:\n{}\n{metrics}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn assert_samples(metrics: &str, expected: &[(&str, f64)]) {
    for (series, value) in expected {
        assert_eq!(
            sample(metrics, series),
            Some(*value),
            "{series} in\n{metrics}"
        );
    }
}

both!(
    every_role_serves_health_readiness_and_metrics_and_stops_cleanly_on_sigterm,
    ops_endpoints
);
async fn ops_endpoints(dialect: Dialect) {
    let (db, backend) = Db::with_queues(dialect, Duration::from_secs(5)).await;
    let store = backend.store.clone();
    let sim_port = free_port();
    let remote = format!("http://127.0.0.1:{sim_port}/actions");
    let _sim = start_sim(&db.url, sim_port, &["--latency-ms", "2"]);
    let ports: Vec<u16> = (0..5).map(|_| free_port()).collect();
    let listen = |i: usize| format!("127.0.0.1:{}", ports[i]);
    let (l0, l1, l2, l3, l4) = (listen(0), listen(1), listen(2), listen(3), listen(4));
    let _submitter = Proc::start("orderly-submitter", &db.url, &["--http-listen", &l0]);
    let mut scheduler = Proc::start("orderly-scheduler", &db.url, &["--http-listen", &l1]);
    let mut agent = Proc::start(
        "orderly-agent",
        &db.url,
        &["--http-listen", &l2, "--remote-url", &remote],
    );
    let _supervisor = Proc::start("orderly-supervisor", &db.url, &["--http-listen", &l3]);
    for &p in &ports[..4] {
        wait_for("/healthz", Duration::from_secs(30), async || {
            get(p, "/healthz").await.0 == 200
        })
        .await;
        let (status, body) = get(p, "/readyz").await;
        assert_eq!((status, body.as_str()), (200, "ready\n"));
    }
    let first = demo::sample_orders(100);
    let mut sent = demo::post(backend.transport.as_ref(), &first)
        .await
        .unwrap();
    wait_for(
        "100 orders processed",
        Duration::from_secs(60),
        async || count(&*store, ProcessState::Processed).await == 100,
    )
    .await;

    let (_, m) = get(ports[0], "/metrics").await;
    assert_samples(
        &m,
        &[(
            "orderly_orders_submitted_total{outcome=\"accepted\"}",
            100.0,
        )],
    );
    let (_, m) = get(ports[1], "/metrics").await;
    assert!(
        sample(&m, "orderly_orders_claimed_total").unwrap() >= 100.0,
        "{m}"
    );
    assert_samples(&m, &[("orderly_orders_processed_total", 100.0)]);
    assert!(m.contains("orderly_step_writes_seconds_bucket"), "{m}");
    lint_metrics(&m);
    // The store-wide gauges come from the leader only: a sum() over the fleet counts
    // each order once.
    for store_wide in [
        "orderly_orders{",
        "orderly_queue_messages{",
        "orderly_dead_letters{",
    ] {
        assert!(
            !m.contains(store_wide),
            "a scheduler exports {store_wide}: {m}"
        );
    }
    let (_, m) = get(ports[2], "/metrics").await;
    assert!(
        m.contains(
            "orderly_step_duration_seconds_bucket{action=\"charge-payment\",outcome=\"succeeded\""
        ),
        "{m}"
    );
    assert_samples(
        &m,
        &[("orderly_remote_calls_total{action=\"ship\"}", 100.0)],
    );
    let (_, m) = get(ports[3], "/metrics").await;
    assert_samples(
        &m,
        &[
            ("orderly_leader{leadership=\"supervisor\"}", 1.0),
            ("orderly_leadership_epoch{leadership=\"supervisor\"}", 1.0),
        ],
    );
    assert!(
        m.contains("orderly_is_leader{instance_id=\"supervisor@"),
        "{m}"
    );
    assert_samples(
        &m,
        &[
            ("orderly_store_up{role=\"supervisor\"}", 1.0),
            ("orderly_orders{state=\"Processed\"}", 100.0),
            ("orderly_dead_letters{queue=\"orders\"}", 0.0),
        ],
    );
    assert!(
        m.contains("orderly_queue_messages{queue=\"orders\",condition=\"ready\"}"),
        "{m}"
    );
    lint_metrics(&m);

    // SIGTERM while 200 more orders are in flight: both stop cleanly, and a new pair
    // finishes the work; nothing lost, nothing twice.
    let second = demo::sample_orders(300).split_off(100);
    sent.extend(
        demo::post(backend.transport.as_ref(), &second)
            .await
            .unwrap(),
    );
    wait_for(
        "the second batch under way",
        Duration::from_secs(30),
        async || count(&*store, ProcessState::Processed).await >= 130,
    )
    .await;
    scheduler.signal("TERM");
    agent.signal("TERM");
    assert!(
        scheduler.wait(Duration::from_secs(15)).success(),
        "the scheduler exits 0"
    );
    assert!(
        agent.wait(Duration::from_secs(15)).success(),
        "the agent exits 0"
    );
    assert_eq!(
        get(ports[1], "/healthz").await.0,
        0,
        "its endpoint is gone too"
    );
    let _scheduler = Proc::start("orderly-scheduler", &db.url, &["--http-listen", &l4]);
    let _agent = Proc::start("orderly-agent", &db.url, &["--remote-url", &remote]);
    wait_for("all 300 processed", Duration::from_secs(90), async || {
        count(&*store, ProcessState::Processed).await == 300
    })
    .await;
    assert_invariants(store.as_ref(), sim_port, &sent, Some(900)).await;
}

/// `orderly up` serves the same endpoints beside its dashboard, for all the roles it
/// runs in its one process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orderly_up_serves_metrics_beside_its_dashboard() {
    let (db, backend) = Db::with_queues(Dialect::Sqlite, Duration::from_secs(5)).await;
    let store = backend.store.clone();
    let port = free_port();
    let mut up = Proc::start(
        "orderly",
        &db.url,
        &["up", "--dashboard", &format!("127.0.0.1:{port}")],
    );
    wait_for("/readyz", Duration::from_secs(30), async || {
        get(port, "/readyz").await.0 == 200
    })
    .await;
    let orders = demo::sample_orders(30);
    demo::post(backend.transport.as_ref(), &orders)
        .await
        .unwrap();
    wait_for("30 orders processed", Duration::from_secs(60), async || {
        count(&*store, ProcessState::Processed).await == 30
    })
    .await;
    let (status, m) = get(port, "/metrics").await;
    assert_eq!(status, 200);
    assert_samples(
        &m,
        &[
            ("orderly_orders_submitted_total{outcome=\"accepted\"}", 30.0),
            ("orderly_orders_processed_total", 30.0),
            ("orderly_orders{state=\"Processed\"}", 30.0),
            ("orderly_remote_calls_total{action=\"ship\"}", 30.0),
            ("orderly_leader{leadership=\"supervisor\"}", 1.0),
            ("orderly_store_up{role=\"embedded\"}", 1.0),
        ],
    );
    assert!(
        m.contains("orderly_is_leader{instance_id=\"supervisor@"),
        "{m}"
    );
    assert!(
        m.contains("orderly_step_duration_seconds_bucket{action=\"reserve-inventory\""),
        "{m}"
    );
    lint_metrics(&m);
    // The dashboard's overview shows the throughput from the store.
    let (status, page) = get(port, "/").await;
    assert_eq!(status, 200);
    for figure in [
        "id=\"finished-1h-Processed\">30<",
        "id=\"finished-5m-Processed\">30<",
        "id=\"finished-1h-Error\">0<",
        "id=\"rate-5m\">6.0<",
    ] {
        assert!(page.contains(figure), "{figure} in\n{page}");
    }
    up.signal("TERM");
    assert!(up.wait(Duration::from_secs(20)).success(), "it exits 0");
}

both!(
    a_scheduler_stopped_with_sigterm_hands_its_orders_back_at_once,
    scheduler_hands_back
);
async fn scheduler_hands_back(dialect: Dialect) {
    use orderly_core::history::HistoryKind;
    let (db, backend) = Db::with_queues(dialect, Duration::from_secs(5)).await;
    let store = backend.store.clone();
    let orders = demo::sample_orders(20);
    let sent = demo::post(backend.transport.as_ref(), &orders)
        .await
        .unwrap();
    let _submitter = Proc::start("orderly-submitter", &db.url, &[]);
    // No agent yet: the scheduler claims the orders and waits on their first step.
    let mut a = Proc::start(
        "orderly-scheduler",
        &db.url,
        &["--instance-id", "scheduler-a", "--shutdown-grace-ms", "500"],
    );
    wait_for(
        "scheduler-a holding all 20",
        Duration::from_secs(30),
        async || {
            store
                .count_owned(&orderly_core::InstanceId::parse("scheduler-a").unwrap())
                .await
                .unwrap()
                == 20
        },
    )
    .await;
    a.signal("TERM");
    assert!(a.wait(Duration::from_secs(10)).success(), "it exits 0");
    assert_eq!(
        count(&*store, ProcessState::Pending).await,
        20,
        "all handed back at once, no deadline waited"
    );
    for o in &orders {
        let view = store.get(&o.order_id).await.unwrap();
        let last = view.history.last().unwrap();
        assert_eq!(
            (last.kind, last.actor.as_str()),
            (HistoryKind::Released, "scheduler-a")
        );
        assert_eq!(view.state.failure_count, 0, "a hand-back is not a failure");
    }
    let sim_port = free_port();
    let remote = format!("http://127.0.0.1:{sim_port}/actions");
    let _sim = start_sim(&db.url, sim_port, &[]);
    let _b = Proc::start(
        "orderly-scheduler",
        &db.url,
        &["--instance-id", "scheduler-b"],
    );
    let _agent = Proc::start("orderly-agent", &db.url, &["--remote-url", &remote]);
    wait_for(
        "all 20 processed by b",
        Duration::from_secs(60),
        async || count(&*store, ProcessState::Processed).await == 20,
    )
    .await;
    assert_invariants(store.as_ref(), sim_port, &sent, Some(60)).await;
}

/// `/readyz` reads no table: on a store of 100,000 finished orders it answers at once,
/// and it still answers while another session holds every table of the store locked
/// (a count, or any read of a table, would wait for the lock and fail the probe).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_reads_no_table_even_on_a_large_store() {
    let (db, _backend) = Db::with_queues(Dialect::Postgres, Duration::from_secs(5)).await;
    let options: sqlx::postgres::PgConnectOptions = db.url.parse().unwrap();
    let pool = sqlx::PgPool::connect_with(options).await.unwrap();
    for seed in [
        "INSERT INTO orders (order_id, details, created_at) \
         SELECT 'seed-' || i, '{}', now() - interval '1 hour' FROM generate_series(1, 100000) i",
        "INSERT INTO order_state (order_id, process_state, next_attempt_at, created_at, updated_at) \
         SELECT 'seed-' || i, 'Processed', now(), now() - interval '1 hour', now() FROM generate_series(1, 100000) i",
        "ANALYZE",
    ] {
        sqlx::query(seed).execute(&pool).await.unwrap();
    }
    let port = free_port();
    let _scheduler = Proc::start(
        "orderly-scheduler",
        &db.url,
        &["--http-listen", &format!("127.0.0.1:{port}")],
    );
    let client = crate::procs::http();
    let url = format!("http://127.0.0.1:{port}/readyz");
    wait_for("/readyz", Duration::from_secs(30), async || {
        client
            .get(&url)
            .send()
            .await
            .is_ok_and(|r| r.status() == 200)
    })
    .await;
    let mut took = Vec::new();
    for _ in 0..21 {
        let started = std::time::Instant::now();
        let r = client.get(&url).send().await.unwrap();
        took.push(started.elapsed());
        assert_eq!(r.status(), 200);
    }
    took.sort();
    let median = took[took.len() / 2];
    eprintln!(
        "/readyz on 100,000 finished orders: median {median:?}, max {:?}",
        took[took.len() - 1]
    );
    assert!(median < Duration::from_millis(50), "median {median:?}");

    // Every table of the store locked by another session: the probe still answers.
    let mut tx = pool.begin().await.unwrap();
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT quote_ident(tablename) FROM pg_tables WHERE schemaname = current_schema()",
    )
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    assert!(tables.len() > 10, "{tables:?}");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "LOCK TABLE {} IN ACCESS EXCLUSIVE MODE",
        tables.join(", ")
    )))
    .execute(&mut *tx)
    .await
    .unwrap();
    let r = client.get(&url).send().await.unwrap();
    let status = r.status();
    let body = r.text().await.unwrap();
    assert_eq!((status.as_u16(), body.as_str()), (200, "ready\n"));
    tx.rollback().await.unwrap();
    pool.close().await;
}

/// Every PostgreSQL session orderly opens is bounded (lock wait 30 s, idle in a
/// transaction 60 s, a statement 5 min) unless the URL says otherwise; and bounded, a
/// row held by a wedged session fails the operator's call after the lock timeout
/// instead of hanging it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_sessions_are_bounded_so_a_wedged_lock_holder_hangs_nothing() {
    use sqlx::Connection as _;
    let (db, _backend) = Db::with_queues(Dialect::Postgres, Duration::from_secs(5)).await;
    let show = async |url: &str| -> Vec<String> {
        let options = orderly_sql::postgres::options(url).unwrap();
        let mut conn = sqlx::PgConnection::connect_with(&options).await.unwrap();
        let mut out = Vec::new();
        for setting in [
            "lock_timeout",
            "idle_in_transaction_session_timeout",
            "statement_timeout",
        ] {
            let v: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SHOW {setting}")))
                .fetch_one(&mut conn)
                .await
                .unwrap();
            out.push(v);
        }
        out
    };
    assert_eq!(show(&db.url).await, ["30s", "1min", "5min"]);
    // The URL wins (it already carries options: the test's search_path).
    assert!(db.url.contains("options="), "{}", db.url);
    let short = format!("{}%20-c%20lock_timeout%3D1s", db.url);
    assert_eq!(show(&short).await, ["1s", "1min", "5min"]);

    let store = orderly_sql::connect(&short, orderly_core::TimeSource::Database)
        .await
        .unwrap()
        .store;
    let order = orderly_testkit::builders::order(1);
    store
        .submit(&order, &orderly_testkit::builders::submitter(), &[])
        .await
        .unwrap();
    // A session that took the order's row and went quiet.
    let options = orderly_sql::postgres::options(&db.url).unwrap();
    let mut wedged = sqlx::PgConnection::connect_with(&options).await.unwrap();
    let mut tx = wedged.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM order_state WHERE order_id = $1 FOR UPDATE")
        .bind(order.order_id.as_str())
        .execute(&mut *tx)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let cancel = store
        .request_cancel(
            &order.order_id,
            &orderly_core::Actor::operator("test"),
            "cancel while another session holds the row",
            &[],
        )
        .await;
    assert!(cancel.is_err(), "{cancel:?}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "it waited {:?}",
        started.elapsed()
    );
    tx.rollback().await.unwrap();
    // Released, the same call goes through.
    store
        .request_cancel(
            &order.order_id,
            &orderly_core::Actor::operator("test"),
            "cancel once the row is free",
            &[],
        )
        .await
        .unwrap();
}

/// `/readyz` is open to anyone who reaches the port: when the store goes away it says
/// which dependency is not ready, not the store's error (which names hosts, users or,
/// here, the database). Before, it answered the error text itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_names_what_is_not_ready_without_its_error() {
    let base = crate::fixtures::postgres_url();
    let admin = sqlx::PgPool::connect(&base).await.unwrap();
    let name = format!("orderly_ready_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&admin)
        .await
        .unwrap();
    let url = {
        let (server, _) = base.rsplit_once('/').unwrap();
        format!("{server}/{name}")
    };
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let role = Proc::start("orderly-submitter", &url, &["--http-listen", &listen]);
    wait_for("ready", Duration::from_secs(30), async || {
        get(port, "/readyz").await.0 == 200
    })
    .await;
    // The database goes away under the running role.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE {name} WITH (FORCE)"
    )))
    .execute(&admin)
    .await
    .unwrap();
    wait_for("not ready", Duration::from_secs(30), async || {
        get(port, "/readyz").await.0 == 503
    })
    .await;
    let (_, body) = get(port, "/readyz").await;
    assert!(body.starts_with("not ready: the state store"), "{body}");
    assert!(
        !body.contains(&name),
        "the store's error is not shown: {body}"
    );
    drop(role);
    admin.close().await;
}
