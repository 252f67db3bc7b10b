//! The Azure blob lease against Azurite (real, from npm; never a fake): the elector
//! conformance suite, and what only a real lease service shows: 409 for a second
//! holder, SharedKey signatures checked, creation of the container and blob, and the
//! service itself stopping (SIGSTOP) while a leader holds the lease.

// Test code: a failed unwrap is a failed test, with its message.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use orderly_azure::{BlobLease, BlobLocation};
use orderly_core::leader::{Acquired, ElectorTiming, Lease, LeaseError};
use orderly_core::store::StateStore;
use orderly_core::{InstanceId, TimeSource};
use orderly_sql::SqliteStore;
use orderly_testkit::azurite::Azurite;
use orderly_testkit::elector::{self, ElectorCtx, LeaseMaker, Recorder};
use orderly_testkit::store::StoreFactory;

struct Sqlite(PathBuf);

#[async_trait]
impl StoreFactory for Sqlite {
    async fn open(&self) -> Arc<dyn StateStore> {
        Arc::new(
            SqliteStore::open(
                &format!("sqlite://{}", self.0.display()),
                TimeSource::Database,
            )
            .await
            .unwrap(),
        )
    }
    async fn cleanup(&self) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", self.0.display()));
        }
    }
}

fn temp_db() -> Sqlite {
    Sqlite(std::env::temp_dir().join(format!("orderly-blob-{}.db", uuid::Uuid::new_v4().simple())))
}

/// Blob leases on one Azurite, each test its own container.
struct Blobs {
    azurite: Azurite,
    container: String,
}

impl Blobs {
    fn start() -> Self {
        Self {
            azurite: Azurite::start(),
            container: format!(
                "leases-{}",
                &uuid::Uuid::new_v4().simple().to_string()[..12]
            ),
        }
    }

    fn location(&self) -> BlobLocation {
        BlobLocation::from_connection_string(
            &self.azurite.connection_string(),
            &self.container,
            "supervisor-leader",
        )
        .unwrap()
    }

    fn lease(&self, timing: &ElectorTiming) -> BlobLease {
        BlobLease::new(&self.location(), timing.lease, timing.call_timeout).unwrap()
    }
}

struct Shared(Arc<Blobs>);

#[async_trait]
impl LeaseMaker for Shared {
    async fn lease(
        &self,
        _store: Arc<dyn StateStore>,
        _instance: &InstanceId,
        timing: &ElectorTiming,
    ) -> Arc<dyn Lease> {
        Arc::new(self.0.lease(timing))
    }
}

/// The shortest blob lease (15 s), renewed every second, a 10 s renew deadline.
fn timing() -> ElectorTiming {
    ElectorTiming {
        lease: Duration::from_secs(15),
        renew_interval: Duration::from_secs(1),
        renew_retry: Duration::from_millis(500),
        renew_deadline: Duration::from_secs(10),
        retry: Duration::from_millis(500),
        retry_jitter: 0.2,
        call_timeout: Duration::from_secs(1),
        stop_grace: Duration::from_secs(2),
        heartbeat_timeout: Duration::from_secs(2),
    }
}

fn ctx_on(blobs: Arc<Blobs>) -> ElectorCtx {
    ElectorCtx {
        factory: Box::new(temp_db()),
        leases: Box::new(Shared(blobs)),
        timing: timing(),
    }
}

async fn blob_elector() -> ElectorCtx {
    ctx_on(Arc::new(Blobs::start()))
}

mod blob_elector {
    orderly_testkit::elector_conformance!(crate::blob_elector);
}

#[tokio::test]
async fn the_lease_blob_is_created_and_a_second_instance_is_told_it_is_held() {
    let blobs = Blobs::start();
    let (a, b) = (blobs.lease(&timing()), blobs.lease(&timing()));
    assert_ne!(
        a.lease_id(),
        b.lease_id(),
        "every instance proposes its own id"
    );
    assert_eq!(a.try_acquire().await.unwrap(), Acquired::Yes(None));
    assert_eq!(b.try_acquire().await.unwrap(), Acquired::HeldByOther);
    assert_eq!(
        a.try_acquire().await.unwrap(),
        Acquired::Yes(None),
        "the same id acquires again"
    );
    a.renew().await.unwrap();
    assert!(matches!(b.renew().await, Err(LeaseError::Lost(_))));
    assert!(matches!(b.release().await, Err(LeaseError::Lost(_))));
    a.release().await.unwrap();
    assert_eq!(
        b.try_acquire().await.unwrap(),
        Acquired::Yes(None),
        "released: taken at once"
    );
    assert!(matches!(a.renew().await, Err(LeaseError::Lost(_))));
}

#[tokio::test]
async fn requests_signed_with_a_wrong_key_are_refused_as_misconfiguration() {
    let blobs = Blobs::start();
    let cs = format!(
        "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={};BlobEndpoint=http://127.0.0.1:{}/devstoreaccount1",
        "d3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXk=", blobs.azurite.port
    );
    let location = BlobLocation::from_connection_string(&cs, &blobs.container, "leader").unwrap();
    let lease = BlobLease::new(&location, Duration::from_secs(15), Duration::from_secs(2)).unwrap();
    let err = lease.try_acquire().await.unwrap_err();
    assert!(
        matches!(&err, LeaseError::Misconfigured(why) if why.contains("403")),
        "{err:?}"
    );
    // The right key, given the same way, works: the signature is what was checked.
    let cs = cs.replace(
        "d3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXk=",
        "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==",
    );
    let location = BlobLocation::from_connection_string(&cs, &blobs.container, "leader").unwrap();
    let lease = BlobLease::new(&location, Duration::from_secs(15), Duration::from_secs(2)).unwrap();
    assert_eq!(lease.try_acquire().await.unwrap(), Acquired::Yes(None));
}

/// Azurite itself stops answering (SIGSTOP) while a leader holds the lease: renewals
/// time out, the leader stops acting at its renew deadline; once Azurite is back the
/// follower leads only after the lease expired. No overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_cut_off_from_azurite_stops_at_its_renew_deadline_and_no_one_overlaps_it() {
    let blobs = Arc::new(Blobs::start());
    let ctx = ctx_on(blobs.clone());
    let rec = Recorder::default();
    let steady = elector::Behaviour {
        hold: None,
        beat_for: None,
    };
    let mut a = elector::member(&ctx, &rec, 0, steady).await;
    let mut status = a.elector.status();
    status.wait_for(|s| s.is_leader).await.unwrap();
    let mut b = elector::member(&ctx, &rec, 1, steady).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let renewed = status.borrow().last_renewal.unwrap();
    blobs.azurite.signal("STOP");
    let stopped_at = Instant::now();
    status.wait_for(|s| !s.is_leader).await.unwrap();
    let acted_after_renewal = chrono::Utc::now() - renewed;
    assert!(
        acted_after_renewal <= chrono::Duration::milliseconds(10_500),
        "the leader stopped {acted_after_renewal} after its last renewal (deadline 10 s)"
    );
    assert!(!b.leads());
    // Hold Azurite past the lease, as a long outage would.
    tokio::time::sleep(Duration::from_secs(16).saturating_sub(stopped_at.elapsed())).await;
    blobs.azurite.signal("CONT");
    let t = Instant::now();
    while !b.leads() && !a.leads() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "no leader after Azurite came back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.stop().await;
    b.stop().await;
    rec.assert_no_overlap();
    assert!(rec.intervals().len() >= 2);
    ctx.factory.cleanup().await;
}

/// The blob lease as it meets Azure: over HTTPS only, the endpoint verified. Against
/// Azurite serving HTTPS with a certificate of the test's own CA, a lease told to
/// trust that CA is acquired, renewed, refused to a second holder, released and taken
/// over, and the deposed holder's renewal is refused; a lease trusting only the
/// platform's roots gets no answer at all, and says it is the certificate.
#[tokio::test]
async fn the_lease_works_over_https_against_an_endpoint_it_trusts_and_only_then() {
    let (ca, azurite) = Azurite::start_https_with_new_ca("blob-lease");
    let cs = azurite.connection_string();
    assert!(cs.contains("https://127.0.0.1:"), "{cs}");
    let container = format!(
        "leases-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let at = |trust: orderly_tls::Trust| {
        let location = BlobLocation::from_connection_string(&cs, &container, "leader")
            .unwrap()
            .with_trust(trust);
        BlobLease::new(&location, Duration::from_secs(15), Duration::from_secs(3)).unwrap()
    };

    let untrusting = at(orderly_tls::Trust::platform());
    let err = untrusting.try_acquire().await.unwrap_err();
    assert!(
        matches!(&err, LeaseError::Unavailable(why) if why.contains("invalid peer certificate: UnknownIssuer")),
        "{err:?}"
    );

    let trust = orderly_tls::Trust::with_ca_file(&ca.ca_file()).unwrap();
    let a = at(trust.clone());
    let b = at(trust);
    assert_eq!(a.try_acquire().await.unwrap(), Acquired::Yes(None));
    assert_eq!(b.try_acquire().await.unwrap(), Acquired::HeldByOther);
    a.renew().await.unwrap();
    a.release().await.unwrap();
    assert_eq!(b.try_acquire().await.unwrap(), Acquired::Yes(None));
    let deposed = a.renew().await.unwrap_err();
    assert!(matches!(deposed, LeaseError::Lost(_)), "{deposed:?}");
    // Still nothing for the lease that does not trust the endpoint.
    assert!(untrusting.try_acquire().await.is_err());
}
