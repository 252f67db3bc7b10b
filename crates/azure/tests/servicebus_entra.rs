//! Service Bus without a key: the transport authenticates with Entra ID tokens from
//! workload identity, end to end on this machine. The Entra ID STAND-IN
//! (tests/entra-standin) signs the pod's service account token as the cluster's OIDC
//! issuer would, and exchanges it at its token endpoint (HTTPS, a test CA) for an access
//! token; the Service Bus STAND-IN (tests/servicebus-standin) then takes only such
//! tokens (SAS refused, as on a namespace with local authentication off), checks their
//! signature, audience and expiry, and attaches a link only for an identity granted a
//! Service Bus data role. Neither stand-in defines orderly's behaviour: the same
//! conformance suite runs against the SQL queue.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use orderly_azure::{
    EntraIdentity, EntraSource, ServiceBusSettings, ServiceBusTransport, entra_credential_for,
};
use orderly_core::ManualClock;
use orderly_core::transport::{OutgoingMessage, QueueName, QueueSettings, Transport};
use orderly_testkit::entra::EntraStandin;
use orderly_testkit::servicebus_standin::{Standin, post};
use orderly_testkit::transport::{TransportCtx, TransportFactory};

mod common;
use common::StandinAdmin;

const SUBJECT: &str = "system:serviceaccount:orderly:orderly-agent";

/// A namespace that takes only Entra ID tokens, and a pod's workload identity.
struct Passwordless {
    standin: Arc<Standin>,
    entra: EntraStandin,
    client_id: String,
    oid: String,
    dir: PathBuf,
}

impl Passwordless {
    /// Both stand-ins, an identity federated with the pod's service account, and its
    /// token file; no role granted yet.
    fn start() -> Self {
        let standin = Arc::new(Standin::start());
        let entra = EntraStandin::start();
        standin.require_entra(&entra.jwk()).unwrap();
        let client_id = uuid::Uuid::new_v4().to_string();
        let oid = uuid::Uuid::new_v4().to_string();
        entra.identity(&client_id, &oid, SUBJECT);
        let dir = std::env::temp_dir().join(format!("orderly-entra-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        entra.service_account_token_file(SUBJECT, &dir, "token");
        Self {
            standin,
            entra,
            client_id,
            oid,
            dir,
        }
    }

    /// The transport's settings, as a role builds them from the pod's environment.
    fn settings(&self) -> ServiceBusSettings {
        let identity = EntraIdentity {
            tenant_id: Some(self.entra.tenant.clone()),
            client_id: Some(self.client_id.clone()),
            token_file: Some(self.dir.join("token")),
            authority_host: Some(self.entra.authority_host()),
        };
        let trust = orderly_tls::Trust::with_ca_file(&self.entra.ca_file()).unwrap();
        let source = EntraSource::WorkloadIdentity;
        let credential = entra_credential_for(source, &identity, &trust).unwrap();
        let mut settings = ServiceBusSettings::entra(
            &self.standin.host,
            credential,
            source.describe(&identity),
            "ORDERLY_SERVICEBUS_NAMESPACE",
        )
        .unwrap();
        settings.unsecured = true;
        settings.try_timeout = Duration::from_secs(5);
        settings
    }

    async fn transport(&self, clock: &ManualClock) -> Arc<ServiceBusTransport> {
        Arc::new(
            ServiceBusTransport::connect(
                &self.settings(),
                Arc::new(StandinAdmin(self.standin.control)),
                Arc::new(clock.clone()),
            )
            .await
            .expect("connect to the stand-in"),
        )
    }

    fn grant(&self, role: &str, queue: Option<&str>) {
        self.standin.grant(&self.oid, role, queue).unwrap();
    }

    fn auth_stat(&self, name: &str) -> u64 {
        let stats = self.standin.auth_stats().unwrap();
        stats
            .split(&format!("\"{name}\":"))
            .nth(1)
            .and_then(|rest| rest.split([',', '}']).next())
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {stats}"))
    }
}

impl Drop for Passwordless {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

struct EntraFactory {
    namespace: Arc<Passwordless>,
    clock: ManualClock,
}

#[async_trait]
impl TransportFactory for EntraFactory {
    async fn open(&self) -> Arc<dyn Transport> {
        self.namespace.transport(&self.clock).await
    }
}

/// The conformance suite's fixture: a namespace where the identity is Data Owner.
async fn servicebus_entra() -> TransportCtx {
    let namespace = Passwordless::start();
    namespace.grant("Azure Service Bus Data Owner", None);
    let clock = ManualClock::starting_now();
    let port = namespace.standin.control;
    clock.on_change(move |t| {
        // As in the suite over a connection string: settlements in flight land first.
        std::thread::sleep(Duration::from_millis(50));
        post(
            port,
            "/clock",
            &format!("{{\"now_ms\":{}}}", t.timestamp_millis()),
        )
        .expect("set the stand-in's clock")
    });
    TransportCtx {
        clock: clock.clone(),
        factory: Box::new(EntraFactory {
            namespace: Arc::new(namespace),
            clock,
        }),
    }
}

mod passwordless_transport {
    orderly_testkit::transport_conformance!(crate::servicebus_entra);
}

async fn declared(namespace: &Passwordless, t: &ServiceBusTransport, name: &str) -> QueueName {
    let _ = namespace;
    let q = QueueName::parse(name).unwrap();
    t.declare_queue(&q, &QueueSettings::default())
        .await
        .unwrap();
    q
}

/// A role the identity lacks is named in the error, with the queue; granted later (a
/// role assignment takes minutes to apply), the same transport goes on without a
/// restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_missing_role_is_named_and_its_grant_takes_effect_without_a_restart() {
    let namespace = Passwordless::start();
    namespace.grant("Azure Service Bus Data Receiver", Some("orders"));
    let clock = ManualClock::starting_now();
    let t = namespace.transport(&clock).await;
    let q = declared(&namespace, &t, "orders").await;
    let e = t
        .send(&q, &[OutgoingMessage::new("m-1", "one")])
        .await
        .unwrap_err();
    assert!(e.is_retryable(), "a role may be granted later: {e}");
    let text = e.to_string();
    assert!(text.contains("access refused"), "{text}");
    assert!(
        text.contains("\"Azure Service Bus Data Sender\" on queue orders"),
        "{text}"
    );
    assert!(namespace.auth_stat("unauthorized") >= 1);

    namespace.grant("Azure Service Bus Data Sender", Some("orders"));
    let mut sent = None;
    for _ in 0..50 {
        match t.send(&q, &[OutgoingMessage::new("m-1", "one")]).await {
            Ok(outcome) => {
                sent = Some(outcome);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    assert_eq!(sent.expect("sent once the role is granted").accepted, 1);
    let got = t.receive(&q, 10, Duration::from_secs(5)).await.unwrap();
    assert_eq!(got.len(), 1, "received with Data Receiver");
    t.complete(&got[0]).await.unwrap();
}

/// A token exchange Entra ID refuses (the pod's service account is not the one the
/// identity is federated with) fails the call with Entra ID's code and the credential's
/// name; a connection string is refused by a namespace that takes only Entra ID.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_token_exchange_names_the_credential_and_entras_code() {
    let namespace = Passwordless::start();
    namespace.grant("Azure Service Bus Data Owner", None);
    // The pod runs as another service account than the federated one.
    namespace.entra.service_account_token_file(
        "system:serviceaccount:orderly:default",
        &namespace.dir,
        "token",
    );
    let clock = ManualClock::starting_now();
    let t = namespace.transport(&clock).await;
    let q = declared(&namespace, &t, "orders").await;
    let e = t
        .send(&q, &[OutgoingMessage::new("m-1", "one")])
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("AADSTS70021"), "{e}");
    assert!(
        e.contains(&format!(
            "workload identity (client id {})",
            namespace.client_id
        )),
        "{e}"
    );
    assert!(e.contains("system:serviceaccount:orderly:default"), "{e}");

    let mut sas = ServiceBusSettings::new(namespace.standin.connection_string());
    sas.unsecured = true;
    sas.try_timeout = Duration::from_secs(5);
    let with_key = ServiceBusTransport::connect(
        &sas,
        Arc::new(StandinAdmin(namespace.standin.control)),
        Arc::new(clock.clone()),
    )
    .await
    .unwrap();
    let e = with_key
        .send(&q, &[OutgoingMessage::new("m-2", "two")])
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("Local authentication methods (SAS) are disabled"),
        "{e}"
    );
}

/// Short-lived tokens (6 s) are renewed on the links before they expire, so traffic
/// goes on across several lifetimes with no link closed for an expired token; while
/// Entra ID is down, the links' tokens do expire and calls fail; once it is back, the
/// transport recovers on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tokens_are_renewed_before_they_expire_and_an_outage_of_entra_id_heals() {
    let namespace = Passwordless::start();
    namespace.grant("Azure Service Bus Data Owner", None);
    namespace.entra.set_lifetime(6);
    let clock = ManualClock::starting_now();
    let t = namespace.transport(&clock).await;
    let q = declared(&namespace, &t, "orders").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(14);
    let mut n = 0;
    while tokio::time::Instant::now() < deadline {
        n += 1;
        let id = format!("m-{n}");
        t.send(&q, &[OutgoingMessage::new(id.clone(), "x")])
            .await
            .unwrap_or_else(|e| panic!("send {n}: {e}"));
        let got = t.receive(&q, 1, Duration::from_secs(5)).await.unwrap();
        assert_eq!(got.len(), 1, "message {n}");
        assert_eq!(got[0].message_id, id);
        t.complete(&got[0]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        namespace.auth_stat("expired"),
        0,
        "a link's token expired before its renewal"
    );
    let issued = namespace.entra.issued();
    assert!(
        issued >= 4,
        "tokens issued over 14 s of 6 s tokens: {issued}"
    );
    assert!(namespace.auth_stat("put") >= 4);

    // Entra ID down: the renewals fail, the links' tokens run out and are closed.
    namespace.entra.set_down(true);
    let wait = tokio::time::Instant::now() + Duration::from_secs(15);
    while namespace.auth_stat("expired") == 0 {
        assert!(
            tokio::time::Instant::now() < wait,
            "no link closed for an expired token"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    namespace.entra.set_down(false);
    let mut healed = false;
    for _ in 0..100 {
        if t.send(&q, &[OutgoingMessage::new("after", "x")])
            .await
            .is_ok()
        {
            healed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        healed,
        "the transport did not recover after Entra ID came back"
    );
    let got = t.receive(&q, 1, Duration::from_secs(5)).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].message_id, "after");
}
