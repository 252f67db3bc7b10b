//! Passwordless, as deployed on Azure with workload identity: the role binaries reach
//! Service Bus and PostgreSQL with Entra ID tokens and no key or password anywhere,
//! against the Entra ID stand-in (tests/entra-standin: the cluster's OIDC issuer and
//! the token endpoint), the Service Bus stand-in in its Entra mode, and the PostgreSQL
//! stand-in (a proxy in front of the real test server that takes only tokens).

use std::time::Duration;

use orderly_core::ProcessState;
use orderly_testkit::entra::{EntraStandin, PostgresEntra};

use crate::fixtures::{Db, Dialect};
use crate::newcomer::{orderly, posted_ids};
use crate::processes::{assert_invariants, count, start_sim};
use crate::procs::{Proc, free_port, wait_for};
use crate::servicebus::standin_with_queues;

const SUBJECT: &str = "system:serviceaccount:orderly:orderly";

/// An identity federated with the pod's service account, and the environment workload
/// identity gives the pod (`AZURE_*`, the token file), plus the stand-in's CA.
struct Pod {
    oid: String,
    dir: std::path::PathBuf,
    env: Vec<(&'static str, String)>,
}

impl Pod {
    fn new(entra: &EntraStandin) -> Pod {
        let client_id = uuid::Uuid::new_v4().to_string();
        let oid = uuid::Uuid::new_v4().to_string();
        entra.identity(&client_id, &oid, SUBJECT);
        let dir =
            std::env::temp_dir().join(format!("orderly-wi-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let token = entra.service_account_token_file(SUBJECT, &dir, "token");
        let env = vec![
            ("AZURE_CLIENT_ID", client_id),
            ("AZURE_TENANT_ID", entra.tenant.clone()),
            (
                "AZURE_FEDERATED_TOKEN_FILE",
                token.to_str().unwrap().to_owned(),
            ),
            ("AZURE_AUTHORITY_HOST", entra.authority_host()),
            (
                "ORDERLY_CA_FILE",
                entra.ca_file().to_str().unwrap().to_owned(),
            ),
        ];
        Pod { oid, dir, env }
    }

    /// The pod's environment with `more`.
    fn env<'a>(&'a self, more: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
        let mut env: Vec<(&str, &str)> = self.env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        env.extend_from_slice(more);
        env
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Service Bus: the namespace takes only Entra ID tokens (SAS refused), and every role
/// and `orderly post` get theirs from the pod's environment. The identity holds only
/// what provisioning grants: Data Sender and Data Receiver on the namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_roles_run_passwordless_on_service_bus_with_workload_identity() {
    let standin = standin_with_queues();
    standin
        .declare(
            "client-sb",
            Duration::from_secs(30),
            10,
            Duration::from_secs(600),
        )
        .unwrap();
    let entra = EntraStandin::start();
    standin.require_entra(&entra.jwk()).unwrap();
    let pod = Pod::new(&entra);
    for role in [
        "Azure Service Bus Data Sender",
        "Azure Service Bus Data Receiver",
    ] {
        standin.grant(&pod.oid, role, None).unwrap();
    }
    let env = pod.env(&[
        ("ORDERLY_TRANSPORT", "servicebus"),
        ("ORDERLY_SERVICEBUS_NAMESPACE", standin.host.as_str()),
        ("ORDERLY_SERVICEBUS_UNSECURED", "true"),
    ]);
    let (db, backend) = Db::with_queues(Dialect::Sqlite, Duration::from_secs(5)).await;
    let store = backend.store.clone();
    let sim_port = free_port();
    let remote = format!("http://127.0.0.1:{sim_port}/actions");
    let _sim = start_sim(&db.url, sim_port, &["--latency-ms", "2"]);
    let _submitter = Proc::start_with("orderly-submitter", &db.url, &[], &env);
    let _scheduler = Proc::start_with("orderly-scheduler", &db.url, &[], &env);
    let agent = Proc::start_with("orderly-agent", &db.url, &["--remote-url", &remote], &env);
    let _supervisor = Proc::start_with("orderly-supervisor", &db.url, &[], &env);

    let post_env: Vec<(&str, &str)> = env
        .iter()
        .copied()
        .filter(|(k, _)| *k != "ORDERLY_TRANSPORT")
        .collect();
    let (ok, stdout, stderr) = orderly(
        &db.url,
        &[
            "post",
            "--transport",
            "servicebus",
            "--sample",
            "20",
            "--reply-to",
            "client-sb",
            "--wait",
            "--timeout-secs",
            "90",
        ],
        &post_env,
    );
    assert!(
        ok,
        "orderly post, passwordless, failed:\n{stdout}\n{stderr}\nagent:\n{}",
        agent.output()
    );
    assert!(
        stdout.contains("completed 20, failed or cancelled 0"),
        "{stdout}"
    );
    let sent: std::collections::HashMap<_, _> = posted_ids(&stdout)
        .into_iter()
        .map(|id| (id, chrono::Utc::now()))
        .collect();
    assert_eq!(sent.len(), 20);
    wait_for(
        "20 orders processed, passwordless",
        Duration::from_secs(60),
        async || count(&*store, ProcessState::Processed).await == 20,
    )
    .await;
    assert_invariants(store.as_ref(), sim_port, &sent, Some(60)).await;
    let stats = standin.auth_stats().unwrap();
    assert!(
        stats.contains("\"refused\":0"),
        "a token was refused: {stats}"
    );
    assert!(
        stats.contains("\"unauthorized\":0"),
        "a link was refused: {stats}"
    );
    assert!(
        !stats.contains("\"put\":0"),
        "no Entra ID token was put: {stats}"
    );
    assert!(
        entra.issued() >= 5,
        "each process gets its own token: {}",
        entra.stats()
    );
}

/// PostgreSQL: a role started with `ORDERLY_DATABASE_CREDENTIAL` and a URL that names
/// only the role mapped to the identity signs in with a token, runs the migrations on a
/// new database and is ready; without the setting the server refuses the password-less
/// URL, and `orderly migrate` says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_signs_in_to_postgresql_with_workload_identity() {
    let entra = EntraStandin::start();
    let pod = Pod::new(&entra);
    let base = crate::fixtures::postgres_url();
    let admin = sqlx::PgPool::connect(&base).await.unwrap();
    let name = format!("orderly_wi_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&admin)
        .await
        .unwrap();
    let rest = base.split_once("://").unwrap().1;
    let (userinfo, hostport) = rest.split_once('@').unwrap_or(("postgres", rest));
    let proxy = PostgresEntra::start(
        &entra,
        hostport.split('/').next().unwrap(),
        userinfo.split(':').next().unwrap(),
    );
    proxy.principal("orderly-roles", &pod.oid);
    let url = format!("postgres://orderly-roles@127.0.0.1:{}/{name}", proxy.port);
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let env = pod.env(&[("ORDERLY_DATABASE_CREDENTIAL", "workload-identity")]);
    let role = Proc::start_with("orderly-submitter", &url, &["--http-listen", &listen], &env);
    wait_for(
        "the submitter ready, passwordless",
        Duration::from_secs(60),
        async || {
            crate::procs::get(format!("http://{listen}/readyz"))
                .await
                .is_ok_and(|r| r.status() == 200)
        },
    )
    .await;
    assert!(proxy.stats().contains("\"refused\":0"), "{}", proxy.stats());
    let direct = format!("{}/{name}", base.rsplit_once('/').unwrap().0);
    let migrated: i64 = sqlx::query_scalar("SELECT count(*) FROM order_state")
        .fetch_one(&sqlx::PgPool::connect(&direct).await.unwrap())
        .await
        .unwrap();
    assert_eq!(
        migrated, 0,
        "the migrations ran through the token's session"
    );
    drop(role);

    // An operator's command takes the same setting; without it the URL has no
    // password, and the server refuses.
    let (ok, stdout, stderr) = orderly(&url, &["migrate"], &env);
    assert!(ok, "orderly migrate, passwordless:\n{stdout}\n{stderr}");
    let (ok, stdout, stderr) = orderly(&url, &["post", "--sample", "3"], &env);
    assert!(
        ok,
        "orderly post on the SQL queue, passwordless:\n{stdout}\n{stderr}"
    );
    assert_eq!(posted_ids(&stdout).len(), 3, "{stdout}");
    let (ok, stdout, stderr) = orderly(&url, &["migrate"], &pod.env(&[]));
    assert!(!ok, "{stdout}");
    assert!(
        stderr.contains("password authentication failed"),
        "{stderr}"
    );
}
