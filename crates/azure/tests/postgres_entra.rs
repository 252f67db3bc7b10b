//! PostgreSQL without a password: the store signs in with Entra ID tokens from workload
//! identity, as Azure Database for PostgreSQL takes them, end to end on this machine.
//! The Entra ID STAND-IN (tests/entra-standin/entra.js) issues the tokens; the
//! PostgreSQL STAND-IN (tests/entra-standin/postgres.js), a proxy in front of the real
//! test server, takes only such a token as the password of a role mapped to the
//! identity, and passes the session through. The store runs on the real server.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use orderly_azure::{EntraIdentity, EntraPassword, EntraSource, entra_credential_for};
use orderly_core::credentials::PasswordSource;
use orderly_core::{ProcessState, TimeSource};
use orderly_testkit::builders::{order_with_id, submitter};
use orderly_testkit::entra::{EntraStandin, PostgresEntra};

const SUBJECT: &str = "system:serviceaccount:orderly:orderly";
const ROLE: &str = "orderly-roles";

fn server_url() -> String {
    std::env::var("ORDERLY_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// Entra ID, the proxy in front of a new database of the test server, an identity
/// federated with the pod's service account, and the role mapped to it.
struct Passwordless {
    entra: EntraStandin,
    proxy: PostgresEntra,
    database: String,
    client_id: String,
    dir: PathBuf,
}

impl Passwordless {
    async fn start() -> Self {
        let entra = EntraStandin::start();
        let server = server_url();
        let admin = sqlx::PgPool::connect(&server).await.unwrap();
        let database = format!("orderly_entra_{}", uuid::Uuid::new_v4().simple());
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {database}")))
            .execute(&admin)
            .await
            .unwrap();
        admin.close().await;
        let rest = server.split_once("://").unwrap().1;
        let (userinfo, hostport) = rest.split_once('@').unwrap_or(("postgres", rest));
        let hostport = hostport.split('/').next().unwrap();
        let user = userinfo.split(':').next().unwrap();
        let proxy = PostgresEntra::start(&entra, hostport, user);
        let client_id = uuid::Uuid::new_v4().to_string();
        let oid = uuid::Uuid::new_v4().to_string();
        entra.identity(&client_id, &oid, SUBJECT);
        proxy.principal(ROLE, &oid);
        let dir = std::env::temp_dir().join(format!("orderly-pg-entra-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        entra.service_account_token_file(SUBJECT, &dir, "token");
        Self {
            entra,
            proxy,
            database,
            client_id,
            dir,
        }
    }

    /// The URL a deployment gives: the role's name, no password.
    fn url(&self) -> String {
        format!(
            "postgres://{ROLE}@127.0.0.1:{}/{}",
            self.proxy.port, self.database
        )
    }

    fn password(&self) -> Arc<dyn PasswordSource> {
        let identity = EntraIdentity {
            tenant_id: Some(self.entra.tenant.clone()),
            client_id: Some(self.client_id.clone()),
            token_file: Some(self.dir.join("token")),
            authority_host: Some(self.entra.authority_host()),
        };
        let trust = orderly_tls::Trust::with_ca_file(&self.entra.ca_file()).unwrap();
        let source = EntraSource::WorkloadIdentity;
        let credential = entra_credential_for(source, &identity, &trust).unwrap();
        Arc::new(EntraPassword::new(credential, source.describe(&identity)))
    }

    fn stat(&self, name: &str) -> u64 {
        let stats = self.proxy.stats();
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

/// The store opens (migrations included) and works with a token for a password; the
/// URL holds none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_signs_in_with_an_entra_id_token() {
    let db = Passwordless::start().await;
    // Without the token, the role has no password: refused.
    let refused = orderly_sql::connect(&db.url(), TimeSource::Database)
        .await
        .expect_err("no password, no session");
    assert!(
        refused
            .to_string()
            .contains("password authentication failed"),
        "{refused}"
    );
    let backend = orderly_sql::connect_with(&db.url(), TimeSource::Database, Some(db.password()))
        .await
        .unwrap();
    let order = order_with_id("entra-1", 1);
    backend
        .store
        .submit(&order, &submitter(), &[])
        .await
        .unwrap();
    let view = backend.store.get(&order.order_id).await.unwrap();
    assert_eq!(view.state.process_state, ProcessState::Pending);
    assert!(db.stat("accepted") >= 1);
    // SQLite takes no such password, and says which setting.
    let e = orderly_sql::connect_with("sqlite::memory:", TimeSource::Database, Some(db.password()))
        .await
        .expect_err("refused for SQLite")
        .to_string();
    assert!(e.contains("ORDERLY_DATABASE_CREDENTIAL"), "{e}");
}

/// Tokens of 6 s: after the first one expired, new connections open with a renewed
/// one (the proxy refuses an expired token), while the store goes on working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_connections_open_with_a_renewed_token() {
    let db = Passwordless::start().await;
    db.entra.set_lifetime(6);
    let store =
        orderly_sql::PgStore::open_with(&db.url(), TimeSource::Database, Some(db.password()))
            .await
            .unwrap();
    tokio::time::sleep(Duration::from_secs(8)).await;
    // More connections at once than the pool holds now: new ones must open.
    let pool = store.pool().clone();
    let open = pool.size() as usize;
    let mut held = Vec::new();
    for _ in 0..open + 2 {
        held.push(
            tokio::time::timeout(Duration::from_secs(10), pool.acquire())
                .await
                .expect("a connection within 10 s")
                .unwrap_or_else(|e| {
                    panic!(
                        "a new connection after the first token expired: {e}; {}",
                        db.proxy.stats()
                    )
                }),
        );
    }
    assert!(pool.size() as usize > open, "no new connection was opened");
    assert_eq!(db.stat("refused"), 0, "{}", db.proxy.stats());
    drop(held);
    let issued = db.entra.issued();
    assert!(issued >= 2, "the token was never renewed: {issued} issued");
}

/// An identity the server does not know (no role mapped to it) is refused with the
/// server's words, and the error says where the password came from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_token_names_the_role_and_an_exchange_refused_names_entra_ids_code() {
    let db = Passwordless::start().await;
    let url = db.url().replace(ROLE, "someone-else");
    let e = orderly_sql::connect_with(&url, TimeSource::Database, Some(db.password()))
        .await
        .expect_err("refused")
        .to_string();
    assert!(
        e.contains("password authentication failed for user \"someone-else\""),
        "{e}"
    );
    // The pod runs as a service account the identity is not federated with.
    db.entra
        .service_account_token_file("system:serviceaccount:orderly:default", &db.dir, "token");
    let e = orderly_sql::connect_with(&db.url(), TimeSource::Database, Some(db.password()))
        .await
        .expect_err("no token")
        .to_string();
    assert!(e.contains("AADSTS70021"), "{e}");
    assert!(e.contains("ORDERLY_DATABASE_CREDENTIAL"), "{e}");
    assert!(
        e.contains(&format!("workload identity (client id {})", db.client_id)),
        "{e}"
    );
}
