//! Alerts to a webhook, against a real HTTP server (axum) and a real store (SQLite):
//! a flaky webhook gets every alert, retried under one idempotency key; a webhook that
//! never answers does not hold up the sweep that publishes the alerts.

#![allow(clippy::unwrap_used, missing_docs)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use orderly_core::store::{ClaimRequest, StateStore};
use orderly_core::transport::{QueueName, QueueSettings};
use orderly_core::{Actor, InstanceId, TimeSource};
use orderly_supervisor::{AlertWebhook, Supervisor, SupervisorConfig, WebhookConfig};
use tokio_util::sync::CancellationToken;

/// What the webhook saw: attempts per idempotency key, and bodies accepted.
#[derive(Clone, Default)]
struct Seen {
    attempts: Arc<Mutex<HashMap<String, u32>>>,
    accepted: Arc<Mutex<Vec<serde_json::Value>>>,
}

/// A webhook that answers 503 to the first `fail_first` attempts of each alert, then
/// 200; with `hang`, it never answers at all.
async fn webhook(fail_first: u32, hang: bool) -> (reqwest::Url, Seen) {
    let seen = Seen::default();
    let s = seen.clone();
    let app = axum::Router::new().route(
        "/hook",
        post(
            move |headers: HeaderMap, body: axum::Json<serde_json::Value>| {
                let s = s.clone();
                async move {
                    if hang {
                        std::future::pending::<()>().await;
                    }
                    let key = headers["idempotency-key"].to_str().unwrap().to_string();
                    let n = {
                        let mut a = s.attempts.lock().unwrap();
                        let n = a.entry(key).or_default();
                        *n += 1;
                        *n
                    };
                    if n <= fail_first {
                        return StatusCode::SERVICE_UNAVAILABLE;
                    }
                    s.accepted.lock().unwrap().push(body.0);
                    StatusCode::OK
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/hook").parse().unwrap(), seen)
}

/// A store with `n` orders in Error, and a supervisor leading it.
async fn errors(n: usize) -> (Arc<dyn StateStore>, std::path::PathBuf) {
    let path = std::env::temp_dir().join(format!("orderly-hook-{}.db", uuid_like()));
    let b = orderly_sql::connect(
        &format!("sqlite://{}", path.display()),
        TimeSource::Database,
    )
    .await
    .unwrap();
    b.transport
        .declare_queue(
            &QueueName::parse("alerts").unwrap(),
            &QueueSettings::default(),
        )
        .await
        .unwrap();
    for i in 0..n {
        let order = orderly_core::store::NewOrder {
            workflow: None,
            order_id: orderly_core::OrderId::parse(format!("order-{i}")).unwrap(),
            details: serde_json::from_value(serde_json::json!({
                "customer_id": "c-1",
                "currency": "EUR",
                "lines": [{"sku": "sku-1", "quantity": 1, "unit_price_minor": 100}]
            }))
            .unwrap(),
            reply_to: None,
        };
        b.store
            .submit(&order, &Actor::operator("t"), &[])
            .await
            .unwrap();
    }
    let owner = InstanceId::parse("scheduler-1").unwrap();
    let claimed = b
        .store
        .claim(&ClaimRequest {
            workflows: Default::default(),
            owner,
            limit: n as u32,
            timeout: Duration::from_secs(60),
        })
        .await
        .unwrap();
    for c in &claimed {
        b.store.fail(&c.fence, "card declined", &[]).await.unwrap();
    }
    (b.store, path)
}

fn uuid_like() -> String {
    format!("{:x}", rand::random::<u128>())
}

fn fast(url: reqwest::Url) -> WebhookConfig {
    WebhookConfig {
        timeout: Duration::from_millis(500),
        backoff_base: Duration::from_millis(20),
        backoff_max: Duration::from_millis(100),
        ..WebhookConfig::new(url)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flaky_webhook_gets_every_alert_once_after_retries_under_one_key() {
    let (url, seen) = webhook(2, false).await;
    let (store, path) = errors(5).await;
    let shutdown = CancellationToken::new();
    let (hook, task) = AlertWebhook::start(fast(url), shutdown.clone()).unwrap();
    let id = InstanceId::parse("supervisor-1").unwrap();
    let sup = Supervisor::new(store.clone(), SupervisorConfig::new(id.clone()))
        .unwrap()
        .with_webhook(hook);
    let term = store.begin_term("supervisor", &id).await.unwrap();
    let sweep = sup.run_once(&term).await.unwrap();
    assert_eq!(sweep.alerts, 5);
    let t = std::time::Instant::now();
    while seen.accepted.lock().unwrap().len() < 5 {
        assert!(t.elapsed() < Duration::from_secs(10), "not all delivered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let accepted = seen.accepted.lock().unwrap().clone();
    let mut orders: Vec<&str> = accepted
        .iter()
        .map(|b| {
            assert_eq!(b["kind"], "orderly.alert");
            assert_eq!(b["alert"]["last_error"], "card declined");
            b["alert"]["order_id"].as_str().unwrap()
        })
        .collect();
    orders.sort_unstable();
    assert_eq!(
        orders,
        ["order-0", "order-1", "order-2", "order-3", "order-4"]
    );
    let attempts = seen.attempts.lock().unwrap().clone();
    assert_eq!(attempts.len(), 5, "one key per alert: {attempts:?}");
    assert!(
        attempts.values().all(|n| *n == 3),
        "two 503s, then accepted: {attempts:?}"
    );
    // A second sweep publishes nothing new: nothing is sent twice.
    assert_eq!(sup.run_once(&term).await.unwrap().alerts, 0);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(seen.accepted.lock().unwrap().len(), 5);
    shutdown.cancel();
    task.await.unwrap();
    let _ = std::fs::remove_file(path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_that_never_answers_does_not_hold_up_the_sweep() {
    let (url, seen) = webhook(0, true).await;
    let (store, path) = errors(20).await;
    let shutdown = CancellationToken::new();
    let cfg = WebhookConfig {
        // Far longer than the sweep may take: if the sweep waited for it, it would show.
        timeout: Duration::from_secs(60),
        ..WebhookConfig::new(url)
    };
    let (hook, task) = AlertWebhook::start(cfg, shutdown.clone()).unwrap();
    let id = InstanceId::parse("supervisor-1").unwrap();
    let sup = Supervisor::new(store.clone(), SupervisorConfig::new(id.clone()))
        .unwrap()
        .with_webhook(hook);
    let term = store.begin_term("supervisor", &id).await.unwrap();
    let sweep = tokio::time::timeout(Duration::from_secs(20), sup.run_once(&term))
        .await
        .expect("the sweep does not wait for the webhook")
        .unwrap();
    assert_eq!(sweep.alerts, 20);
    assert!(store.unpublished_alerts(100).await.unwrap().is_empty());
    assert!(
        seen.accepted.lock().unwrap().is_empty(),
        "the webhook is still hanging"
    );
    shutdown.cancel();
    task.await.unwrap();
    let _ = std::fs::remove_file(path);
}

/// A webhook that redirects (307, which keeps the method and body) is not followed:
/// the alerts and their keys reach no other host, and each is tried once (a redirect
/// does not go away by retrying). Followed, as reqwest does by default, every alert
/// was delivered to the other host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirecting_webhook_is_not_followed() {
    let (elsewhere, seen_elsewhere) = webhook(0, false).await;
    let redirects = Arc::new(Mutex::new(0u32));
    let counted = redirects.clone();
    let to = elsewhere.to_string();
    let app = axum::Router::new().route(
        "/hook",
        post(move || {
            let counted = counted.clone();
            let to = to.clone();
            async move {
                *counted.lock().unwrap() += 1;
                (
                    StatusCode::TEMPORARY_REDIRECT,
                    [(axum::http::header::LOCATION, to)],
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let (store, path) = errors(5).await;
    let shutdown = CancellationToken::new();
    let url: reqwest::Url = format!("http://{addr}/hook").parse().unwrap();
    let (hook, task) = AlertWebhook::start(fast(url), shutdown.clone()).unwrap();
    let id = InstanceId::parse("supervisor-1").unwrap();
    let sup = Supervisor::new(store.clone(), SupervisorConfig::new(id.clone()))
        .unwrap()
        .with_webhook(hook);
    let term = store.begin_term("supervisor", &id).await.unwrap();
    assert_eq!(sup.run_once(&term).await.unwrap().alerts, 5);
    let t = std::time::Instant::now();
    while *redirects.lock().unwrap() < 5 {
        assert!(t.elapsed() < Duration::from_secs(10), "not all tried");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Room for retries or followed redirects to show, were there any.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(*redirects.lock().unwrap(), 5, "each alert tried once");
    assert!(
        seen_elsewhere.attempts.lock().unwrap().is_empty(),
        "nothing reached the other host"
    );
    shutdown.cancel();
    task.await.unwrap();
    let _ = std::fs::remove_file(path);
}
