//! Hostile clients against the real binaries: a page on another site rebinding its name
//! to the dashboard's address, a cross-site form, a half-sent request held open
//! (slowloris), and more connections than a listener serves.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::fixtures::{Db, Dialect};
use crate::procs::{Proc, free_port, wait_for};

/// Opens a connection and sends the start of a request, never its end.
fn half_sent(port: u16) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        .unwrap();
    s
}

/// How long until the server closes `s` (reads nothing more), up to `limit`; `None`
/// if it still holds it then.
fn closed_within(s: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    s.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Some(started.elapsed()),
            // A 408 or similar before the close is fine: read on to the close.
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return Some(started.elapsed());
            }
            Err(_) => return None,
        }
    }
}

/// Fills the listener on `port` with `n` half-sent connections and shows it full: one
/// more is closed at once while the `n` are kept. The listener takes connections in
/// the order they were made, so the `n` have their places before the extra asks.
/// Returns the `n`, still held.
fn filled(port: u16, n: usize) -> Vec<TcpStream> {
    let mut held: Vec<TcpStream> = (0..n).map(|_| half_sent(port)).collect();
    let mut extra = half_sent(port);
    let cut = closed_within(&mut extra, Duration::from_secs(5))
        .expect("a connection past the cap is closed");
    assert!(cut < Duration::from_secs(2), "cut after {cut:?}");
    assert_eq!(
        closed_within(&mut held[0], Duration::from_millis(300)),
        None,
        "a connection within the cap is kept"
    );
    held
}

/// `orderly dashboard` with `env`, and its port.
async fn dashboard(db: &str, env: &[(&str, &str)]) -> (Proc, u16) {
    let (p, base) = crate::procs::start_dashboard(db, env).await;
    let port = base.rsplit(':').next().unwrap().parse().unwrap();
    (p, port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_refuses_a_rebound_host_and_a_cross_site_form() {
    let db = Db::new(Dialect::Sqlite).await;
    let (_dash, port) = dashboard(&db.url, &[]).await;
    let base = format!("http://127.0.0.1:{port}");
    let http = crate::procs::http_builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    // What a browser sends after `rebind.example` was rebound to 127.0.0.1.
    let rebound = http
        .get(format!("{base}/"))
        .header("host", format!("rebind.example:{port}"))
        .send()
        .await
        .unwrap();
    assert_eq!(rebound.status(), 421);
    let body = rebound.text().await.unwrap();
    assert!(
        !body.contains("csrf") && body.contains("ORDERLY_DASHBOARD_PUBLIC_URL"),
        "{body}"
    );
    // The same page by address or by localhost is served.
    for host in [format!("127.0.0.1:{port}"), format!("localhost:{port}")] {
        let ok = http
            .get(format!("{base}/"))
            .header("host", &host)
            .send()
            .await
            .unwrap();
        assert_eq!(ok.status(), 200, "{host}");
    }
    // A form posted from another site, with a valid CSRF pair, is refused.
    let page = http.get(format!("{base}/alerts")).send().await.unwrap();
    let csrf = crate::procs::csrf_cookie(&page);
    let post = |extra: (&'static str, String)| {
        let (http, base, csrf) = (http.clone(), base.clone(), csrf.clone());
        async move {
            http.post(format!("{base}/dead-letters/discard"))
                .header("cookie", format!("orderly_csrf={csrf}"))
                .header(extra.0, extra.1)
                .form(&[
                    ("csrf", csrf.as_str()),
                    ("queue", "orders"),
                    ("operator", "erin"),
                ])
                .send()
                .await
                .unwrap()
                .status()
        }
    };
    assert_eq!(post(("origin", "http://rebind.example".into())).await, 403);
    assert_eq!(post(("sec-fetch-site", "cross-site".into())).await, 403);
    // From the dashboard's own page it goes through (303 back to the list).
    assert_eq!(post(("origin", base.clone())).await, 303);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_requests_and_extra_connections_do_not_hold_a_listener() {
    let db = Db::new(Dialect::Sqlite).await;
    // The dashboard: a half-sent request is cut after the header timeout.
    let (_dash, port) = dashboard(&db.url, &[("ORDERLY_HTTP_HEADER_TIMEOUT", "500ms")]).await;
    let mut slow = half_sent(port);
    let cut = closed_within(&mut slow, Duration::from_secs(10))
        .expect("a half-sent request is not held for 10 s");
    assert!(cut < Duration::from_secs(5), "cut after {cut:?}");

    // A role's operations endpoint, the same.
    let ops = free_port();
    let listen = format!("127.0.0.1:{ops}");
    let _supervisor = Proc::start_with(
        "orderly-supervisor",
        &db.url,
        &["--http-listen", &listen],
        &[("ORDERLY_HTTP_HEADER_TIMEOUT", "500ms")],
    );
    wait_for(
        "the supervisor's endpoint",
        Duration::from_secs(20),
        async || {
            crate::procs::get(format!("http://{listen}/healthz"))
                .await
                .is_ok()
        },
    )
    .await;
    let mut slow = half_sent(ops);
    let cut = closed_within(&mut slow, Duration::from_secs(10))
        .expect("the operations endpoint holds no half-sent request for 10 s");
    assert!(cut < Duration::from_secs(5), "cut after {cut:?}");

    // The remote-service simulator too (before, it served with no bound at all).
    let sim = free_port();
    let _sim = Proc::start_with(
        "orderly-remote-sim",
        &db.url,
        &["--listen", &format!("127.0.0.1:{sim}")],
        &[("ORDERLY_HTTP_HEADER_TIMEOUT", "500ms")],
    );
    wait_for("the simulator", Duration::from_secs(20), async || {
        TcpStream::connect(("127.0.0.1", sim)).is_ok()
    })
    .await;
    let mut slow = half_sent(sim);
    let cut = closed_within(&mut slow, Duration::from_secs(10))
        .expect("the simulator holds no half-sent request for 10 s");
    assert!(cut < Duration::from_secs(5), "cut after {cut:?}");

    // A connection past the cap is closed at once; the ones it holds are not; once
    // they go, connections are served again.
    let (_capped, port) = dashboard(
        &db.url,
        &[
            ("ORDERLY_HTTP_MAX_CONNECTIONS", "2"),
            ("ORDERLY_HTTP_HEADER_TIMEOUT", "30s"),
        ],
    )
    .await;
    // Let the readiness poll's own connection close.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held = filled(port, 2);
    drop(held);
    let served = async || {
        crate::procs::get(format!("http://127.0.0.1:{port}/healthz"))
            .await
            .is_ok_and(|r| r.status().is_success())
    };
    wait_for(
        "a connection to be served again",
        Duration::from_secs(10),
        served,
    )
    .await;
}

/// A client that pipelines requests and never reads the answers is cut once the
/// answers stop moving (the write timeout), and one address cannot take more than its
/// share of a listener's connections: here a role's operations endpoint, where the
/// orchestrator's probes come. Before, the pipelining client held its connection for
/// as long as it liked, and one address could take every slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_is_cut_and_one_address_cannot_take_every_slot() {
    let db = Db::new(Dialect::Sqlite).await;
    let ops = free_port();
    let listen = format!("127.0.0.1:{ops}");
    let _supervisor = Proc::start_with(
        "orderly-supervisor",
        &db.url,
        &["--http-listen", &listen],
        &[
            ("ORDERLY_HTTP_WRITE_TIMEOUT", "500ms"),
            ("ORDERLY_HTTP_HEADER_TIMEOUT", "30s"),
            ("ORDERLY_HTTP_MAX_CONNECTIONS_PER_CLIENT", "4"),
        ],
    );
    // Each read on a connection of its own, closed by the server when answered (a
    // pooled connection left open would count against this address's share).
    let metrics = async || {
        let mut s = TcpStream::connect(("127.0.0.1", ops)).ok()?;
        s.write_all(
            format!("GET /metrics HTTP/1.1\r\nHost: {listen}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .ok()?;
        let mut answer = String::new();
        s.read_to_string(&mut answer).ok()?;
        answer.starts_with("HTTP/1.1 200").then_some(answer)
    };
    wait_for(
        "the supervisor's endpoint",
        Duration::from_secs(20),
        async || metrics().await.is_some(),
    )
    .await;
    // Requests in one go, and not a byte of the answers read: answers far beyond what
    // the sockets' buffers hold (tens of MB), so the server's writes stop. /healthz,
    // whose answer costs nothing to make (a /metrics answer reads the store, and a
    // loaded machine then took longer to fill the buffers than the wait below). The
    // requests are written from a thread of their own: once the server stops reading
    // them the writes block, and once it cuts the connection they fail.
    let greedy = TcpStream::connect(("127.0.0.1", ops)).unwrap();
    let mut writer = greedy.try_clone().unwrap();
    let request = format!("GET /healthz HTTP/1.1\r\nHost: {listen}\r\n\r\n");
    std::thread::spawn(move || {
        let burst = request.repeat(1_000);
        for _ in 0..300 {
            if writer.write_all(burst.as_bytes()).is_err() {
                return;
            }
        }
    });
    let mut greedy = greedy;
    let cut = |text: &str| {
        text.lines()
            .filter(|l| l.starts_with("orderly_http_connections_cut_total"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    wait_for(
        "the client that reads nothing cut",
        Duration::from_secs(30),
        async || metrics().await.is_some_and(|t| cut(&t) >= 1.0),
    )
    .await;
    let ended = closed_within(&mut greedy, Duration::from_secs(10));
    assert!(ended.is_some(), "the server closed the connection");

    // Four connections from this address are held; a fifth is closed at once, and so
    // the address gets nothing more until one of its own goes.
    let mut held = filled(ops, 4);
    held.pop();
    wait_for("served again", Duration::from_secs(10), async || {
        metrics().await.is_some()
    })
    .await;
}

/// With --probe-listen the orchestrator's probes have connections of their own: while
/// clients hold every connection of a role's operations listener, /healthz and /readyz
/// still answer on the probe port (which serves nothing else), so the pod is not
/// restarted for it. Before, the probes shared that listener's connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probes_answer_on_their_own_listener_while_the_operations_one_is_full() {
    let db = Db::new(Dialect::Sqlite).await;
    let (ops, probes) = (free_port(), free_port());
    let listen = format!("127.0.0.1:{ops}");
    let probe_listen = format!("127.0.0.1:{probes}");
    let _supervisor = Proc::start_with(
        "orderly-supervisor",
        &db.url,
        &["--http-listen", &listen, "--probe-listen", &probe_listen],
        &[
            ("ORDERLY_HTTP_HEADER_TIMEOUT", "30s"),
            ("ORDERLY_HTTP_MAX_CONNECTIONS", "2"),
        ],
    );
    let status = |port: u16, path: &'static str| async move {
        crate::procs::get(format!("http://127.0.0.1:{port}{path}"))
            .await
            .ok()
            .map(|r| r.status().as_u16())
    };
    wait_for("the probe listener", Duration::from_secs(20), async || {
        status(probes, "/readyz").await == Some(200)
    })
    .await;
    assert_eq!(status(probes, "/healthz").await, Some(200));
    assert_eq!(status(probes, "/metrics").await, Some(404), "probes only");
    // Every connection of the operations listener held by half-sent requests.
    let mut held = filled(ops, 2);
    assert_eq!(status(probes, "/healthz").await, Some(200));
    assert_eq!(status(probes, "/readyz").await, Some(200));
    assert_eq!(
        closed_within(&mut held[0], Duration::from_millis(200)),
        None,
        "still held"
    );

    // Without --http-listen, or on its very address, it stops at start-up naming both.
    for args in [
        vec!["--probe-listen", "127.0.0.1:0", "--check-config"],
        vec![
            "--http-listen",
            listen.as_str(),
            "--probe-listen",
            listen.as_str(),
            "--check-config",
        ],
    ] {
        let mut p = Proc::start("orderly-supervisor", &db.url, &args);
        assert!(!p.wait(Duration::from_secs(20)).success());
        let out = p.output();
        assert!(
            out.contains("--probe-listen / ORDERLY_PROBE_LISTEN")
                && out.contains("--http-listen / ORDERLY_HTTP_LISTEN"),
            "{out}"
        );
    }
}

/// With operators configured, each signs in with their own token (or through the
/// trusted proxy) and acts under their own name: a form naming someone else is refused
/// (the audit trail cannot be forged), a `read` operator changes nothing, and a request
/// without a token is not let in, even on loopback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_act_under_their_own_names_and_a_reader_changes_nothing() {
    use orderly_core::ProcessState;
    use orderly_core::history::HistoryKind;
    let db = Db::new(Dialect::Sqlite).await;
    let backend = db.backend().await;
    let store = backend.store.clone();
    let orders = orderly_local::demo::sample_orders(3);
    for o in &orders {
        store
            .submit(o, &orderly_testkit::builders::submitter(), &[])
            .await
            .unwrap();
    }
    let (alice, bob) = ("alice-token-0123456789", "bob-token-0123456789ab");
    let file = std::env::temp_dir().join(format!(
        "orderly-operators-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::write(
        &file,
        format!("alice operate {alice}\nbob read {bob}\ncarol operate -\n"),
    )
    .unwrap();
    let (_dash, port) = dashboard(
        &db.url,
        &[
            ("ORDERLY_DASHBOARD_OPERATORS_FILE", file.to_str().unwrap()),
            ("ORDERLY_DASHBOARD_TRUSTED_PROXY", "127.0.0.1"),
            ("ORDERLY_DASHBOARD_PROXY_HEADER", "X-Forwarded-User"),
        ],
    )
    .await;
    let base = format!("http://127.0.0.1:{port}");
    let http = crate::procs::http_builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    assert_eq!(http.get(&base).send().await.unwrap().status(), 401);
    // Signing in with ?token= keeps it in a cookie and drops it from the address.
    let signed = http
        .get(format!("{base}/alerts?token={alice}"))
        .send()
        .await
        .unwrap();
    assert_eq!(signed.status(), 303);
    assert_eq!(signed.headers()["location"], "/alerts");
    assert!(
        signed.headers()["set-cookie"]
            .to_str()
            .unwrap()
            .contains("HttpOnly")
    );

    let cancel = |who: (&'static str, String), order: usize, operator: &'static str| {
        let (http, base, id) = (http.clone(), base.clone(), orders[order].order_id.clone());
        async move {
            let page = http
                .get(format!("{base}/orders/{id}"))
                .header(who.0, who.1.clone())
                .send()
                .await
                .unwrap();
            assert_eq!(page.status(), 200);
            let csrf = crate::procs::csrf_cookie(&page);
            let html = page.text().await.unwrap();
            http.post(format!("{base}/orders/{id}/cancel"))
                .header(who.0, who.1)
                .header("cookie", format!("orderly_csrf={csrf}"))
                .form(&[
                    ("csrf", csrf.as_str()),
                    ("operator", operator),
                    ("reason", "test"),
                ])
                .send()
                .await
                .map(|r| (r.status(), html))
                .unwrap()
        }
    };
    let bearer = |t: &str| ("authorization", format!("Bearer {t}"));
    // Alice's page names her; her form naming mallory is refused, nothing changes.
    let (status, html) = cancel(bearer(alice), 0, "mallory").await;
    assert!(
        html.contains("value=\"alice\""),
        "the form carries her name"
    );
    assert_eq!(status, 403);
    let state = |i: usize| {
        let (store, id) = (store.clone(), orders[i].order_id.clone());
        async move { store.get(&id).await.unwrap() }
    };
    assert_eq!(state(0).await.state.process_state, ProcessState::Pending);
    let (status, _) = cancel(bearer(alice), 0, "alice").await;
    assert_eq!(status, 303);
    let view = state(0).await;
    assert_eq!(view.state.process_state, ProcessState::Cancelled);
    let by = view
        .history
        .iter()
        .find(|e| e.kind == HistoryKind::Cancelled)
        .unwrap();
    assert_eq!(by.actor.as_str(), "operator:alice");
    // Bob reads; his action is refused.
    let (status, _) = cancel(bearer(bob), 1, "bob").await;
    assert_eq!(status, 403);
    assert_eq!(state(1).await.state.process_state, ProcessState::Pending);
    // Carol, through the proxy (its address is trusted), acts under her name.
    let (status, _) = cancel(("x-forwarded-user", "carol".into()), 2, "carol").await;
    assert_eq!(status, 303);
    let view = state(2).await;
    assert!(
        view.history
            .iter()
            .any(|e| e.kind == HistoryKind::Cancelled && e.actor.as_str() == "operator:carol"),
        "{:?}",
        view.history
    );
    // A proxy header naming no valid name lets nobody in.
    let odd = http
        .get(&base)
        .header("x-forwarded-user", "<script>")
        .send()
        .await
        .unwrap();
    assert_eq!(odd.status(), 401);
    // Only the configured header names anyone: a client's own X-Forwarded-Email (which
    // this proxy neither sets nor strips) beside it, or alone, names nobody; nor does
    // a second value of the header, a list, or a name that is not ASCII (before, these
    // let the client in, and a name that did not fit a header acted under the name
    // typed in the form).
    let proxied = |headers: Vec<(&'static str, reqwest::header::HeaderValue)>| {
        let (http, base) = (http.clone(), base.clone());
        async move {
            let mut r = http.get(&base);
            for (name, value) in headers {
                r = r.header(name, value);
            }
            r.send().await.unwrap().status().as_u16()
        }
    };
    let value = |v: &[u8]| reqwest::header::HeaderValue::from_bytes(v).unwrap();
    assert_eq!(
        proxied(vec![("x-forwarded-email", value(b"carol"))]).await,
        401
    );
    assert_eq!(
        proxied(vec![
            ("x-forwarded-user", value(b"mallory")),
            ("x-forwarded-user", value(b"carol")),
        ])
        .await,
        401
    );
    assert_eq!(
        proxied(vec![("x-forwarded-user", value(b"mallory, carol"))]).await,
        401
    );
    assert_eq!(
        proxied(vec![("x-forwarded-user", value("jos\u{e9}".as_bytes()))]).await,
        401
    );
    assert_eq!(
        proxied(vec![("x-forwarded-user", value(b"carol"))]).await,
        200
    );
    let _ = std::fs::remove_file(&file);

    // A trusted proxy without its header, or a header without a proxy, stops start-up
    // naming both settings.
    for env in [
        [("ORDERLY_DASHBOARD_TRUSTED_PROXY", "127.0.0.1")],
        [("ORDERLY_DASHBOARD_PROXY_HEADER", "X-Forwarded-User")],
    ] {
        let listen = format!("127.0.0.1:{}", free_port());
        let mut p = Proc::start_with(
            "orderly",
            &db.url,
            &["dashboard", "--listen", &listen],
            &env,
        );
        assert!(!p.wait(Duration::from_secs(20)).success());
        let out = p.output();
        assert!(
            out.contains("--trusted-proxy / ORDERLY_DASHBOARD_TRUSTED_PROXY")
                && out.contains("--proxy-header / ORDERLY_DASHBOARD_PROXY_HEADER"),
            "{out}"
        );
    }
}

/// Secrets planted where users put them (a remote service's URL with an Azure
/// Functions `?code=` and a password, the alert webhook's key, the dashboard's token)
/// never show: not in any role's `--help`, log, the services' health an operator reads,
/// nor the steps' details, while the remote service is unreachable and failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planted_secrets_never_show_in_help_logs_or_stored_errors() {
    let code = "code-0f9e8d7c6b5a";
    let password = "pw-1a2b3c4d5e6f";
    let hook_key = "hook-9a8b7c6d5e4f";
    let token = "dash-5f4e3d2c1b0a";
    let secrets = [code, password, hook_key, token];
    let closed = free_port();
    let remote = format!("http://user:{password}@127.0.0.1:{closed}/api/actions?code={code}");
    let hook = format!("http://127.0.0.1:{closed}/hook?key={hook_key}");
    let env = [
        ("ORDERLY_REMOTE_URL", remote.as_str()),
        ("ORDERLY_ALERT_WEBHOOK_URL", hook.as_str()),
        ("ORDERLY_DASHBOARD_TOKEN", token),
    ];
    let clean = |what: &str, text: &str| {
        for s in secrets {
            assert!(!text.contains(s), "{what} shows a secret:\n{text}");
        }
    };
    for (bin, args) in [
        ("orderly-agent", vec!["--help"]),
        ("orderly-supervisor", vec!["--help"]),
        ("orderly", vec!["dashboard", "--help"]),
    ] {
        let out = std::process::Command::new(crate::procs::bin(bin))
            .args(&args)
            .envs(env)
            .output()
            .unwrap();
        assert!(out.status.success());
        clean(
            &format!("{bin} --help"),
            &String::from_utf8_lossy(&out.stdout),
        );
    }

    let (db, backend) = Db::with_queues(Dialect::Sqlite, Duration::from_secs(5)).await;
    let store = backend.store.clone();
    let _submitter = Proc::start("orderly-submitter", &db.url, &[]);
    let scheduler = Proc::start("orderly-scheduler", &db.url, &[]);
    let agent = Proc::start_with("orderly-agent", &db.url, &["--breaker-failures", "2"], &env);
    let supervisor = Proc::start_with(
        "orderly-supervisor",
        &db.url,
        &["--interval-ms", "200"],
        &env,
    );
    let orders = orderly_local::demo::sample_orders(4);
    orderly_local::demo::post(backend.transport.as_ref(), &orders)
        .await
        .unwrap();
    wait_for(
        "the unreachable service to be reported down, with its error",
        Duration::from_secs(60),
        async || {
            store
                .services()
                .await
                .unwrap()
                .iter()
                .any(|h| h.last_error.is_some())
        },
    )
    .await;
    for h in store.services().await.unwrap() {
        let e = h.last_error.clone().unwrap_or_default();
        clean("the services' health", &e);
        if !e.is_empty() {
            assert!(
                e.contains(&format!("127.0.0.1:{closed}/api/actions")),
                "{e}"
            );
        }
    }
    for o in &orders {
        let view = store.get(&o.order_id).await.unwrap();
        clean("an order", &format!("{:?} {:?}", view.state, view.steps));
        clean("its history", &format!("{:?}", view.history));
    }
    for (what, p) in [
        ("agent", &agent),
        ("supervisor", &supervisor),
        ("scheduler", &scheduler),
    ] {
        clean(&format!("the {what}'s log"), &p.output());
    }
}

/// A role listening off loopback serves /metrics only to whoever presents its metrics
/// token (401 otherwise), while the orchestrator's probes stay open; without a token,
/// or with one too short to be a secret, it refuses to start and names the setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_off_loopback_need_the_metrics_token_and_probes_stay_open() {
    let db = Db::new(Dialect::Sqlite).await;
    for (token, why) in [(None, "no token"), (Some("short"), "a short token")] {
        let mut c = std::process::Command::new(crate::procs::bin("orderly-scheduler"));
        c.args(["--http-listen", "0.0.0.0:0", "--check-config"])
            .env("ORDERLY_DATABASE_URL", &db.url)
            .env_remove("ORDERLY_METRICS_TOKEN");
        if let Some(t) = token {
            c.env("ORDERLY_METRICS_TOKEN", t);
        }
        let out = c.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{why}: {stderr}");
        assert!(stderr.contains("ORDERLY_METRICS_TOKEN"), "{why}: {stderr}");
        assert!(
            !stderr.contains("short"),
            "the value is never shown: {stderr}"
        );
    }

    let port = free_port();
    let token = "metrics-token-of-the-test-0123";
    let _scheduler = Proc::start_with(
        "orderly-scheduler",
        &db.url,
        &["--http-listen", &format!("0.0.0.0:{port}")],
        &[("ORDERLY_METRICS_TOKEN", token)],
    );
    let base = format!("http://127.0.0.1:{port}");
    wait_for(
        "the scheduler's endpoint",
        Duration::from_secs(20),
        async || crate::procs::get(format!("{base}/healthz")).await.is_ok(),
    )
    .await;
    let http = crate::procs::http();
    for probe in ["/healthz", "/readyz"] {
        let r = http.get(format!("{base}{probe}")).send().await.unwrap();
        assert_eq!(r.status(), 200, "{probe} needs no token");
    }
    let none = http.get(format!("{base}/metrics")).send().await.unwrap();
    assert_eq!(none.status(), 401);
    let wrong = http
        .get(format!("{base}/metrics"))
        .bearer_auth("metrics-token-of-the-test-0124")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    let right = http
        .get(format!("{base}/metrics"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(right.status(), 200);
    assert!(
        right.text().await.unwrap().contains("orderly_"),
        "Prometheus text"
    );
}

/// A web page the operator opens cannot post orders to the submitter's loopback intake
/// (no token there): a "simple" cross-site post (`text/plain`, no preflight) is refused
/// 415, a post with another site's `Origin` 403, and a request addressed to a rebound
/// name 421, reads included; none of them becomes an order, while a client's JSON post
/// does. Before, the text/plain post and the rebound one were accepted (202).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_web_page_cannot_post_orders_to_the_loopback_intake() {
    let db = Db::new(Dialect::Sqlite).await;
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let _submitter = Proc::start(
        "orderly-submitter",
        &db.url,
        &["--http-listen", &listen, "--http-intake", "--intake-open"],
    );
    crate::newcomer::wait_listening(port).await;
    let http = crate::procs::http();
    let base = format!("http://{listen}");
    let order = |id: &str| crate::newcomer::order_json(Some(id), "c-forged").to_string();
    let post = |id: &'static str, headers: Vec<(&'static str, String)>| {
        let (http, base, body) = (http.clone(), base.clone(), order(id));
        async move {
            let mut r = http.post(format!("{base}/orders")).body(body);
            for (name, value) in headers {
                r = r.header(name, value);
            }
            let answer = r.send().await.unwrap();
            (answer.status().as_u16(), answer.text().await.unwrap())
        }
    };
    let json = || ("content-type", "application/json".to_owned());
    // A form or fetch of another site, as a browser sends it without asking first.
    let (status, text) = post(
        "forged-1",
        vec![
            ("content-type", "text/plain;charset=UTF-8".into()),
            ("origin", "null".into()),
        ],
    )
    .await;
    assert_eq!(status, 403, "{text}");
    let (status, text) = post(
        "forged-2",
        vec![("content-type", "text/plain;charset=UTF-8".into())],
    )
    .await;
    assert_eq!(status, 415, "{text}");
    assert!(text.contains("application/json"), "{text}");
    let (status, _) = post(
        "forged-3",
        vec![json(), ("origin", "http://evil.example".into())],
    )
    .await;
    assert_eq!(status, 403);
    let (status, text) = post(
        "forged-4",
        vec![json(), ("host", format!("rebind.example:{port}"))],
    )
    .await;
    assert_eq!(status, 421, "{text}");
    let read = http
        .get(format!("{base}/orders/anything"))
        .header("host", format!("rebind.example:{port}"))
        .send()
        .await
        .unwrap();
    assert_eq!(read.status(), 421);
    // A client's post, by address or by localhost, with or without its own origin.
    let (status, text) = post("client-1", vec![json()]).await;
    assert_eq!(status, 202, "{text}");
    let (status, text) = post(
        "client-2",
        vec![
            json(),
            ("host", format!("localhost:{port}")),
            ("origin", format!("http://localhost:{port}")),
        ],
    )
    .await;
    assert_eq!(status, 202, "{text}");
    wait_for(
        "the client's orders recorded",
        Duration::from_secs(30),
        async || {
            let mut found = 0;
            for id in ["client-1", "client-2"] {
                if http
                    .get(format!("{base}/orders/{id}"))
                    .send()
                    .await
                    .is_ok_and(|r| r.status() == 200)
                {
                    found += 1;
                }
            }
            found == 2
        },
    )
    .await;
    for id in ["forged-1", "forged-2", "forged-3", "forged-4"] {
        let r = http
            .get(format!("{base}/orders/{id}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "{id} became an order");
    }
}

/// Whoever may send to the queues, but not read the store, forges a step request and
/// a reply against the real scheduler and agent binaries. The forged request (another
/// order's details under a copied signature, or unsigned) would have the agent call a
/// real service; the forged reply (its context sending the order's notices to another
/// queue) would record a step nobody took and redirect the order's notices. Both are
/// dead-lettered with the reason, the service is called for the genuine request only,
/// and the order completes as sent. Before the requests and replies were signed, the
/// forged reply was recorded and its notice sent to the attacker's queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_step_requests_and_replies_are_refused_by_the_real_roles() {
    use orderly_core::messages::{StepOutcome, StepRequest, json_message};
    use orderly_core::step::StepStatus;
    use orderly_core::transport::{QueueName, QueueSettings};
    use orderly_core::{InstanceId, ProcessState};
    use orderly_remote_sim::{Sim, SimConfig};

    let (db, backend) = Db::with_queues(Dialect::Sqlite, Duration::from_secs(30)).await;
    let queue = |name: &str| QueueName::parse(name).unwrap();
    let (inventory, replies, mallory) =
        (queue("agent.inventory"), queue("replies"), queue("mallory"));
    // The attacker's own queue, where the forged context would send the notices.
    backend
        .transport
        .declare_queue(&mallory, &QueueSettings::default())
        .await
        .unwrap();
    let sim = Sim::new(SimConfig::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sim_url = format!("http://{}/actions", listener.local_addr().unwrap());
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn(sim.clone().serve(listener, stop.clone()));

    // Only the scheduler runs: the order's first request waits in the agent's queue.
    let scheduler = Proc::start("orderly-scheduler", &db.url, &[]);
    let order = orderly_local::demo::sample_orders(1).remove(0);
    let id = order.order_id.clone();
    backend
        .store
        .submit(&order, &orderly_core::Actor::operator("t"), &[])
        .await
        .unwrap();
    let mut genuine = Vec::new();
    wait_for("the first request", Duration::from_secs(30), async || {
        genuine = backend
            .transport
            .receive(&inventory, 1, Duration::from_millis(100))
            .await
            .unwrap();
        !genuine.is_empty()
    })
    .await;
    let genuine = genuine.remove(0);
    let request: StepRequest = serde_json::from_slice(&genuine.body).unwrap();
    assert_eq!(request.fence.order_id, id);

    // A request for another order, under the genuine request's signature; and the
    // genuine request again, without one.
    let mut other = request.clone();
    other.fence.order_id = orderly_core::OrderId::parse("someone-elses-order").unwrap();
    let mut copied = json_message("forged-request-1".into(), &other, None);
    copied.properties = genuine.properties.clone();
    let unsigned = json_message("forged-request-2".into(), &request, None);
    backend
        .transport
        .send(&inventory, &[copied, unsigned])
        .await
        .unwrap();
    // A reply to the order's first step, its context sending notices elsewhere.
    let mut reply = request.reply(
        StepOutcome::Succeeded {
            detail: "forged".into(),
        },
        InstanceId::generate("agent"),
        chrono::Utc::now(),
        1,
    );
    reply.context.notify_to = Some(mallory.as_str().to_owned());
    let forged_reply = json_message(reply.message_id(), &reply, Some(id.as_str()));
    backend
        .transport
        .send(&replies, &[forged_reply])
        .await
        .unwrap();
    wait_for(
        "the forged reply dead-lettered",
        Duration::from_secs(30),
        async || {
            !backend
                .transport
                .dead_letters(&replies, 10)
                .await
                .unwrap()
                .is_empty()
        },
    )
    .await;
    let refused = backend.transport.dead_letters(&replies, 10).await.unwrap();
    assert_eq!(refused.len(), 1);
    assert_eq!(
        refused[0].reason, "BadSignature",
        "{}",
        refused[0].description
    );
    assert!(
        refused[0].description.contains("unsigned"),
        "{}",
        refused[0].description
    );
    let view = backend.store.get(&id).await.unwrap();
    assert_eq!(
        view.steps[0].status,
        StepStatus::Started,
        "no step recorded"
    );
    // The genuine request goes back for the agent.
    backend.transport.abandon(&genuine).await.unwrap();

    let agent = Proc::start_with(
        "orderly-agent",
        &db.url,
        &[],
        &[("ORDERLY_REMOTE_URL", sim_url.as_str())],
    );
    assert!(
        orderly_local::demo::wait_done_on(backend.store.as_ref(), 1, Duration::from_secs(60))
            .await
            .unwrap(),
        "the genuine order completes"
    );
    wait_for(
        "both forged requests dead-lettered",
        Duration::from_secs(30),
        async || {
            backend
                .transport
                .dead_letters(&inventory, 10)
                .await
                .unwrap()
                .len()
                >= 2
        },
    )
    .await;
    let mut refused = backend
        .transport
        .dead_letters(&inventory, 10)
        .await
        .unwrap();
    refused.sort_by(|a, b| a.message.message_id.cmp(&b.message.message_id));
    assert_eq!(refused.len(), 2);
    for (dead, why) in refused.iter().zip(["bad signature", "unsigned"]) {
        assert_eq!(dead.reason, "BadSignature", "{}", dead.description);
        assert!(dead.description.contains(why), "{}", dead.description);
    }
    let view = backend.store.get(&id).await.unwrap();
    assert_eq!(view.state.process_state, ProcessState::Processed);
    assert!(
        view.steps
            .iter()
            .all(|s| s.detail.as_deref() != Some("forged")),
        "{:?}",
        view.steps
    );
    // The service was called for the genuine order's three steps only.
    assert_eq!(sim.stats().calls, 3, "{:?}", sim.effects());
    assert!(
        sim.effects().iter().all(|e| e.order_id == id.as_str()),
        "{:?}",
        sim.effects()
    );
    let redirected = backend
        .transport
        .receive(&mallory, 10, Duration::from_millis(200))
        .await
        .unwrap();
    assert!(
        redirected.is_empty(),
        "a notice reached the attacker's queue"
    );
    drop((agent, scheduler));
    stop.cancel();
}

/// The dashboard's shared token may come from a file (a mounted secret), as the other
/// secrets do: the dashboard then asks for it; given both ways, start-up stops naming
/// the two settings and never the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_token_may_come_from_a_mounted_file() {
    let db = Db::new(Dialect::Sqlite).await;
    let secret = "dashboard-token-from-a-file-0123";
    let file = std::env::temp_dir().join(format!(
        "orderly-dashboard-token-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::write(&file, format!("{secret}\n")).unwrap();
    let path = file.to_str().unwrap();
    let (_dash, port) = dashboard(&db.url, &[("ORDERLY_DASHBOARD_TOKEN_FILE", path)]).await;
    let http = crate::procs::http_builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    assert_eq!(http.get(&base).send().await.unwrap().status(), 401);
    let signed = http
        .get(format!("{base}/?token={secret}"))
        .send()
        .await
        .unwrap();
    assert_eq!(signed.status(), 303);

    let listen = format!("127.0.0.1:{}", free_port());
    let mut both = Proc::start_with(
        "orderly",
        &db.url,
        &["dashboard", "--listen", &listen],
        &[
            ("ORDERLY_DASHBOARD_TOKEN_FILE", path),
            ("ORDERLY_DASHBOARD_TOKEN", "another-token-0123456789"),
        ],
    );
    assert!(!both.wait(Duration::from_secs(20)).success());
    let out = both.output();
    assert!(
        out.contains("--token / ORDERLY_DASHBOARD_TOKEN")
            && out.contains("--token-file / ORDERLY_DASHBOARD_TOKEN_FILE"),
        "{out}"
    );
    assert!(
        !out.contains(secret) && !out.contains("another-token"),
        "{out}"
    );
    let _ = std::fs::remove_file(&file);
}
