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
    let remote = HttpRemote::new(
        Endpoints {
            base_url: format!("http://{addr}/actions"),
            overrides: Default::default(),
        },
        &orderly_tls::Trust::platform(),
    )
    .unwrap();
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
    server.await.unwrap().unwrap();
}
