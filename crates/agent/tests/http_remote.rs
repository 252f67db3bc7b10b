//! The HTTP client against the remote-service simulator, over real TCP.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use orderly_agent::{Endpoints, HttpRemote, RemoteCall, RemoteService};
use orderly_core::OrderId;
use orderly_core::messages::StepKind;
use orderly_remote_sim::{Sim, SimConfig};
use tokio_util::sync::CancellationToken;

/// Calls in flight at once in each burst: more than any small cap on idle
/// connections would keep.
const AT_ONCE: usize = 150;

/// The HTTP client for a remote service at `base_url`, some actions elsewhere.
fn remote_at(base_url: String, overrides: std::collections::HashMap<String, String>) -> HttpRemote {
    HttpRemote::new(
        Endpoints {
            base_url,
            overrides,
        },
        &orderly_tls::Trust::platform(),
    )
    .unwrap()
}

fn call(order: usize, round: usize) -> RemoteCall {
    RemoteCall {
        order_id: OrderId::parse(format!("o-{order}")).unwrap(),
        step: "reserve".into(),
        action: "reserve".into(),
        kind: StepKind::Do,
        idempotency_key: format!("o-{order}:reserve:{round}"),
        compensates: None,
        details: orderly_testkit::builders::details(order as u64),
    }
}

/// Bursts of calls reuse the connections the first burst opened: the client keeps
/// every connection it had in use, so the next burst makes no handshakes (before, all
/// but 64 were closed after each burst and opened again for the next).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bursts_of_calls_reuse_the_connections_of_the_first() {
    // Each call takes a while, so a burst's calls are in flight together.
    let sim = Sim::new(SimConfig {
        latency: Duration::from_millis(300),
        ..SimConfig::default()
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(sim.clone().serve(listener, shutdown.clone()));
    let remote = remote_at(format!("http://{addr}/actions"), Default::default());
    for round in 0..3 {
        let mut burst = tokio::task::JoinSet::new();
        for order in 0..AT_ONCE {
            let remote = remote.clone();
            burst.spawn(async move {
                remote
                    .call(&call(order, round), Duration::from_secs(10))
                    .await
            });
        }
        while let Some(answer) = burst.join_next().await {
            answer.unwrap().unwrap();
        }
        // A connection goes back to the pool a moment after its answer is read.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stats = sim.stats();
    assert_eq!(stats.calls, 3 * AT_ONCE as u64);
    // A few calls of a burst may still open their own if their connection was not
    // back in time; a capped pool reopens all but its cap in each later burst.
    assert!(
        stats.connections <= (AT_ONCE + AT_ONCE / 4) as u64,
        "{} connections for 3 bursts of {AT_ONCE} calls: the later bursts opened their own",
        stats.connections
    );
    shutdown.cancel();
    server.await.unwrap();
}

/// A service that answers 200 and then streams its body for ever.
async fn endless_answer() -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\n")
                    .await;
                let chunk = vec![b'x'; 64 * 1024];
                while s.write_all(&chunk).await.is_ok() {}
            });
        }
    });
    addr
}

/// An answer is read only up to its first 2,000 bytes: a service streaming without
/// end is answered within the call's time, its text cut, not read for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_is_read_only_up_to_its_cap() {
    let addr = endless_answer().await;
    let remote = remote_at(format!("http://{addr}/actions"), Default::default());
    let started = std::time::Instant::now();
    let text = remote
        .call(&call(1, 0), Duration::from_secs(20))
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(text.len(), 2_000);
    let probe = remote
        .probe(
            &format!("http://{addr}/status/k"),
            "k",
            Duration::from_secs(20),
        )
        .await;
    assert!(
        matches!(&probe, orderly_agent::ProbeAnswer::Applied(t) if t.len() == 2_000),
        "{probe:?}"
    );
}

/// A remote URL's key (an Azure Functions `?code=`, a password) is never in an error:
/// not in the call's error (stored in the step's detail and the service's health, sent
/// to the dashboard and the webhook), nor in the client's `Debug`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_urls_key_never_shows_in_an_error() {
    // A port nobody listens on.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let secret = "s3cr3t-code-value";
    let mut overrides = std::collections::HashMap::new();
    overrides.insert(
        "reserve".to_owned(),
        format!("http://user:{secret}@127.0.0.1:{port}/api/reserve?code={secret}"),
    );
    let remote = remote_at(
        format!("http://127.0.0.1:{port}/actions?code={secret}"),
        overrides,
    );
    let e = remote
        .call(&call(1, 0), Duration::from_secs(5))
        .await
        .unwrap_err();
    let text = format!("{e:?} {e}");
    assert!(!text.contains(secret), "{text}");
    assert!(
        text.contains(&format!("127.0.0.1:{port}/api/reserve")),
        "{text}"
    );
    let probe = remote
        .probe(
            &format!("http://127.0.0.1:{port}/status/k?code={secret}"),
            "k",
            Duration::from_secs(5),
        )
        .await;
    assert!(!format!("{probe:?}").contains(secret), "{probe:?}");
    assert!(!format!("{remote:?}").contains(secret), "{remote:?}");
}

/// A service that answers every request with `307` to `to` (which keeps the method and
/// body, so a follower would resend the call there), and counts what it was sent.
async fn redirecting_to(to: String) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let to = to.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 8192];
                let _ = s.read(&mut buf).await;
                let head = format!(
                    "HTTP/1.1 307 Temporary Redirect\r\nlocation: {to}\r\ncontent-length: 0\r\n\r\n"
                );
                let _ = s.write_all(head.as_bytes()).await;
            });
        }
    });
    addr
}

/// A host that counts the requests it is sent and answers each `200`.
async fn counting_host() -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let counted = counted.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 8192];
                if s.read(&mut buf).await.unwrap_or(0) > 0 {
                    counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nstolen")
                    .await;
            });
        }
    });
    (addr, seen)
}

/// A redirect is a failed call with its reason, never followed: the call's body and
/// Idempotency-Key go nowhere else, and the other host's answer never becomes the
/// step's detail (followed, as reqwest does by default, the call succeeded with the
/// other host's "stolen").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_is_a_failed_call_and_is_not_followed() {
    let (elsewhere, seen) = counting_host().await;
    let secret = "k3y-in-the-location";
    let addr = redirecting_to(format!("http://{elsewhere}/steal?code={secret}")).await;
    let remote = remote_at(format!("http://{addr}/actions"), Default::default());
    let e = remote
        .call(&call(1, 0), Duration::from_secs(5))
        .await
        .unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(e, orderly_agent::CallError::Permanent(_)),
        "a redirect does not go away by retrying: {e:?}"
    );
    assert!(text.contains("307"), "{text}");
    assert!(
        text.contains(&format!("redirected to http://{elsewhere}/steal")),
        "{text}"
    );
    assert!(!text.contains(secret), "{text}");
    let probe = remote
        .probe(
            &format!("http://{addr}/status/k"),
            "k",
            Duration::from_secs(5),
        )
        .await;
    assert!(
        matches!(&probe, orderly_agent::ProbeAnswer::Unknown(t) if t.contains("redirect")),
        "{probe:?}"
    );
    assert_eq!(
        seen.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "nothing reached the other host"
    );
}
