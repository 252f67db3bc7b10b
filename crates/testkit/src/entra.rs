//! The Entra ID STAND-IN of `tests/entra-standin` (Node.js built-ins only): Entra ID's
//! token endpoint over HTTPS with a certificate of a test CA, and the OIDC issuer of a
//! Kubernetes cluster that signs service account tokens, so that workload identity is
//! tested end to end on this machine: the client reads the token file, exchanges it at
//! the token endpoint, and presents the access token to a service stand-in that checks
//! it with [`EntraStandin::jwk`].

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::servicebus_standin::post_for_body;
use crate::tls::TestCa;

/// A running Entra ID stand-in; stopped when dropped (its CA's files with it).
pub struct EntraStandin {
    child: Child,
    ca: TestCa,
    /// Its HTTPS port on 127.0.0.1.
    pub port: u16,
    /// Its control port on 127.0.0.1.
    pub control: u16,
    /// The tenant it answers for.
    pub tenant: String,
}

/// The scope of a Service Bus token.
pub const SERVICEBUS_SCOPE: &str = "https://servicebus.azure.net/.default";

impl EntraStandin {
    /// Starts one with a certificate for 127.0.0.1 signed by a new test CA.
    pub fn start() -> EntraStandin {
        let ca = TestCa::new("entra-standin");
        let cert = ca.server_cert("entra", &["127.0.0.1", "localhost"]);
        let script =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/entra-standin/entra.js");
        let mut child = Command::new("node")
            .arg(&script)
            .env("STANDIN_TLS_CERT", &cert.cert)
            .env("STANDIN_TLS_KEY", &cert.key)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("Node.js is needed for the Entra ID stand-in (the machine's `node`)");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped stdout"))
            .read_line(&mut line)
            .expect("the stand-in's first line");
        let field = |name: &str| -> String {
            line.split(&format!("\"{name}\":"))
                .nth(1)
                .map(|rest| {
                    rest.trim_start()
                        .trim_start_matches('"')
                        .split(['"', ',', '}'])
                        .next()
                        .unwrap_or_default()
                        .to_owned()
                })
                .unwrap_or_else(|| panic!("the Entra ID stand-in did not start: {line:?}"))
        };
        EntraStandin {
            port: field("port").parse().expect("its port"),
            control: field("control").parse().expect("its control port"),
            tenant: field("tenant"),
            child,
            ca,
        }
    }

    /// The authority host a client is pointed at (`AZURE_AUTHORITY_HOST`).
    pub fn authority_host(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// The CA file that signed its certificate (`ORDERLY_CA_FILE`).
    pub fn ca_file(&self) -> PathBuf {
        self.ca.ca_file()
    }

    /// Registers an identity (`client_id`, object id `oid`) federated with the cluster's
    /// service account `subject` (`system:serviceaccount:<namespace>:<name>`).
    pub fn identity(&self, client_id: &str, oid: &str, subject: &str) {
        self.post(
            "/identities",
            &format!(r#"{{"client_id":"{client_id}","oid":"{oid}","subject":"{subject}"}}"#),
        );
    }

    /// A service account token for `subject`, as the cluster's issuer signs it into a
    /// pod, written to `dir/<name>` (the pod's `AZURE_FEDERATED_TOKEN_FILE`).
    pub fn service_account_token_file(&self, subject: &str, dir: &Path, name: &str) -> PathBuf {
        let answer = self.post(
            "/service-account-token",
            &format!(r#"{{"subject":"{subject}"}}"#),
        );
        let token = answer
            .split("\"token\":\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .unwrap_or_else(|| panic!("no token in {answer}"));
        let path = dir.join(name);
        std::fs::write(&path, token).expect("the token file");
        path
    }

    /// Access tokens issued from now on last `seconds`.
    pub fn set_lifetime(&self, seconds: u64) {
        self.post("/lifetime", &format!(r#"{{"seconds":{seconds}}}"#));
    }

    /// While `on`, the token endpoint answers 503.
    pub fn set_down(&self, on: bool) {
        self.post("/down", &format!(r#"{{"on":{on}}}"#));
    }

    /// `{"requests", "issued", "refused", "last_error"}` so far.
    pub fn stats(&self) -> String {
        self.post("/stats", "{}")
    }

    /// Access tokens issued so far.
    pub fn issued(&self) -> u64 {
        let stats = self.stats();
        stats
            .split("\"issued\":")
            .nth(1)
            .and_then(|rest| rest.split([',', '}']).next())
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no count in {stats}"))
    }

    /// The public key its access tokens are signed with (a JWK, as JSON).
    pub fn jwk(&self) -> String {
        self.post("/jwk", "{}")
    }

    fn post(&self, path: &str, body: &str) -> String {
        post_for_body(self.control, path, body)
            .unwrap_or_else(|e| panic!("Entra ID stand-in {path}: {e}"))
    }
}

impl Drop for EntraStandin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The Azure Database for PostgreSQL stand-in of `tests/entra-standin/postgres.js`: a
/// proxy in front of a real PostgreSQL that takes only Entra ID access tokens (of
/// [`EntraStandin`]) as passwords, for roles mapped to identities; stopped when dropped.
pub struct PostgresEntra {
    child: Child,
    /// Its PostgreSQL port on 127.0.0.1.
    pub port: u16,
    /// Its control port on 127.0.0.1.
    pub control: u16,
}

/// The scope of a PostgreSQL token.
pub const POSTGRES_SCOPE: &str = "https://ossrdbms-aad.database.windows.net/.default";

impl PostgresEntra {
    /// Starts one in front of `upstream` (`host:port`, reached as `upstream_user`
    /// without a password), checking tokens with `entra`'s key.
    pub fn start(entra: &EntraStandin, upstream: &str, upstream_user: &str) -> PostgresEntra {
        let script =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/entra-standin/postgres.js");
        let mut child = Command::new("node")
            .arg(&script)
            .env("STANDIN_UPSTREAM", upstream)
            .env("STANDIN_UPSTREAM_USER", upstream_user)
            .env("STANDIN_JWK", entra.jwk())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("Node.js is needed for the PostgreSQL Entra ID stand-in");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped stdout"))
            .read_line(&mut line)
            .expect("the stand-in's first line");
        let number = |name: &str| -> u16 {
            line.split(&format!("\"{name}\":"))
                .nth(1)
                .and_then(|rest| rest.split([',', '}']).next())
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or_else(|| panic!("the PostgreSQL stand-in did not start: {line:?}"))
        };
        PostgresEntra {
            port: number("port"),
            control: number("control"),
            child,
        }
    }

    /// Maps the PostgreSQL role `user` to the identity whose object id is `oid`.
    pub fn principal(&self, user: &str, oid: &str) {
        post_for_body(
            self.control,
            "/principals",
            &format!(r#"{{"user":"{user}","oid":"{oid}"}}"#),
        )
        .unwrap_or_else(|e| panic!("PostgreSQL stand-in /principals: {e}"));
    }

    /// `{"accepted", "refused", "last_refusal", "expires"}` so far.
    pub fn stats(&self) -> String {
        post_for_body(self.control, "/stats", "{}")
            .unwrap_or_else(|e| panic!("PostgreSQL stand-in /stats: {e}"))
    }
}

impl Drop for PostgresEntra {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
