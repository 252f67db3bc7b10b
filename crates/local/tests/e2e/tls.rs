//! The roles as deployed against a managed PostgreSQL that requires TLS: every role
//! binary, built with default features, on a server of the test's own that accepts
//! TLS connections only, verified with `sslmode=verify-full` against a CA the test
//! made and the roles were told to trust (`ORDERLY_CA_FILE`). An order posted by a
//! client goes through the queue to Processed; the server's own view says every
//! connection was encrypted.

use orderly_testkit::private_postgres::PrivatePostgres;
use orderly_testkit::tls::TestCa;
use sqlx::Row;

use crate::newcomer::orderly;
use crate::processes::start_sim;
use crate::procs::{Proc, free_port};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_role_reaches_a_tls_only_postgresql_verified_against_its_ca() {
    let ca = TestCa::new("postgres-e2e");
    let cert = ca.server_cert("postgres", &["localhost", "127.0.0.1"]);
    let pg = PrivatePostgres::start_tls(&cert);
    let url = pg.url("localhost", "sslmode=verify-full");
    let ca_file = ca.ca_file().display().to_string();
    let trust = [("ORDERLY_CA_FILE", ca_file.as_str())];

    // What stands between a role and the store is TLS: plain is rejected by the
    // server, and a server certificate from a CA nobody named is refused.
    let (ok, _, err) = orderly(&pg.url("localhost", "sslmode=disable"), &["migrate"], &[]);
    assert!(
        !ok && err.contains("no encryption"),
        "plain connection: {err}"
    );
    let (ok, _, err) = orderly(&url, &["migrate"], &[]);
    assert!(
        !ok && err.to_lowercase().contains("certificate"),
        "untrusted CA: {err}"
    );
    // verify-full checks the name too: the certificate is not for 127.0.0.2.
    let (ok, _, err) = orderly(
        &pg.url("127.0.0.2", "sslmode=verify-full"),
        &["migrate"],
        &trust,
    );
    assert!(!ok, "a certificate for another name was accepted: {err}");

    // A URL that chooses no sslmode, on this machine: plain is refused by this server,
    // so the store takes TLS (prefer) rather than failing.
    let (ok, out, err) = orderly(
        &pg.url("localhost", "application_name=orderly"),
        &["migrate"],
        &[],
    );
    assert!(ok, "no sslmode, TLS-only server on localhost: {out}\n{err}");

    let (ok, out, err) = orderly(&url, &["migrate"], &trust);
    assert!(ok, "orderly migrate over verify-full: {out}\n{err}");

    let sim_port = free_port();
    let remote = format!("http://127.0.0.1:{sim_port}/actions");
    let _sim = start_sim(&url, sim_port, &[]);
    let roles = [
        Proc::start_with("orderly-submitter", &url, &[], &trust),
        Proc::start_with("orderly-scheduler", &url, &[], &trust),
        Proc::start_with("orderly-agent", &url, &["--remote-url", &remote], &trust),
        Proc::start_with(
            "orderly-supervisor",
            &url,
            &["--interval-ms", "500"],
            &trust,
        ),
    ];
    let (ok, stdout, stderr) = orderly(
        &url,
        &["post", "--sample", "3", "--wait", "--timeout-secs", "90"],
        &trust,
    );
    assert!(
        ok && stdout.contains("completed 3, failed or cancelled 0"),
        "orderly post --wait:\n{stdout}\n{stderr}\n{}",
        roles
            .iter()
            .map(Proc::output)
            .collect::<Vec<_>>()
            .join("\n")
    );

    // The server's view: every client connection of the roles is encrypted.
    let admin = format!("{}&sslrootcert={}", url, ca_file);
    let pool = sqlx::PgPool::connect(&admin).await.unwrap();
    let rows = sqlx::query(
        "SELECT a.application_name, s.ssl FROM pg_stat_activity a \
         JOIN pg_stat_ssl s ON s.pid = a.pid WHERE a.backend_type = 'client backend' \
         AND a.pid <> pg_backend_pid()",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let (tls, plain): (Vec<_>, Vec<_>) = rows
        .iter()
        .map(|r| (r.get::<String, _>(0), r.get::<bool, _>(1)))
        .partition(|(_, ssl)| *ssl);
    assert!(plain.is_empty(), "plain connections: {plain:?}");
    assert!(
        tls.iter().filter(|(app, _)| app == "orderly").count() >= 4,
        "the roles' TLS connections: {tls:?}"
    );
    pool.close().await;
    // The roles go (SIGKILL, on drop) before the server they use.
    drop(roles);
}
