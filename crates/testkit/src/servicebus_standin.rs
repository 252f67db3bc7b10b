//! The Service Bus STAND-IN of `tests/servicebus-standin` (a small AMQP 1.0 broker on
//! Node.js and rhea, written for our tests because no Service Bus emulator runs on our
//! machines): one per test, on a loopback address of its own (the client always dials
//! port 5672), with an HTTP control endpoint to declare queues and move its clock.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running stand-in; stopped when dropped.
pub struct Standin {
    child: Child,
    /// The loopback address its AMQP port 5672 listens on.
    pub host: String,
    /// Its control port on 127.0.0.1.
    pub control: u16,
}

impl Standin {
    /// Starts one. Panics, saying how to fix it, when its npm dependencies are missing:
    /// the Service Bus tests never skip.
    pub fn start() -> Standin {
        let r = uuid::Uuid::new_v4().into_bytes();
        let host = format!("127.{}.{}.{}", 20 + r[0] % 200, r[1], 1 + r[2] % 250);
        Self::start_on(host, 0)
    }

    /// Stops it and starts a new one on the same addresses, as a broker restart does:
    /// every connection is cut and every queue and message is gone (declare them again).
    pub fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let fresh = Self::start_on(self.host.clone(), self.control);
        // Take over its process; the old handle's Drop then has nothing left to stop.
        *self = fresh;
    }

    /// Stops it (a broker down: connections refused) until [`Standin::restart`].
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Cuts every AMQP connection at once, without a close frame (a network blip).
    pub fn drop_connections(&self) -> Result<(), String> {
        post(self.control, "/drop-connections", "{}")
    }

    /// From now on, attaches to `entity` are never answered.
    pub fn hang_attach(&self, entity: &str) -> Result<(), String> {
        post(self.control, &format!("/hang-attach/{entity}"), "{}")
    }

    /// The next `times` attaches of links to `entity` (not to its `$management` node)
    /// are answered only after `late` (real time), as a slow broker
    /// does: after a client with a shorter try-timeout gave up on them.
    pub fn late_attach(&self, entity: &str, late: Duration, times: u32) -> Result<(), String> {
        post(
            self.control,
            &format!("/late-attach/{entity}"),
            &format!("{{\"ms\":{},\"times\":{times}}}", late.as_millis()),
        )
    }

    /// How many late attaches ([`Standin::late_attach`]) have been answered so far.
    pub fn late_attaches_answered(&self) -> Result<u64, String> {
        let body = post_for_body(self.control, "/late-attach-stats", "{}")?;
        // `{"answered":N}`
        body.trim()
            .strip_prefix("{\"answered\":")
            .and_then(|rest| rest.strip_suffix('}'))
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| format!("no count in {body}"))
    }

    /// While `on`, lock renewals are never answered.
    pub fn hang_renew(&self, on: bool) -> Result<(), String> {
        post(self.control, "/hang-renew", &format!("{{\"on\":{on}}}"))
    }

    /// [`Standin::start`], also listening for AMQPS on port 5671 with a certificate
    /// for its own address signed by a new test CA (returned with it).
    pub fn start_tls() -> (crate::tls::TestCa, Standin) {
        let r = uuid::Uuid::new_v4().into_bytes();
        let host = format!("127.{}.{}.{}", 20 + r[0] % 200, r[1], 1 + r[2] % 250);
        let ca = crate::tls::TestCa::new("servicebus-standin");
        let cert = ca.server_cert("standin", &[&host]);
        let standin = Self::spawn(host, 0, Some(&cert));
        (ca, standin)
    }

    /// The TLS handshakes attempted on its AMQPS port, those that succeeded, and the
    /// last failure as Node reports it, as JSON: `{"handshakes", "secured", "last_error"}`.
    pub fn tls_stats(&self) -> Result<String, String> {
        post_for_body(self.control, "/tls-stats", "{}")
    }

    fn start_on(host: String, control_port: u16) -> Standin {
        Self::spawn(host, control_port, None)
    }

    fn spawn(host: String, control_port: u16, tls: Option<&crate::tls::ServerCert>) -> Standin {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/servicebus-standin");
        assert!(
            dir.join("node_modules/rhea").exists(),
            "the Service Bus stand-in's dependencies are missing: run `npm ci --prefix tests/servicebus-standin` (scripts/test does)"
        );
        let mut node = Command::new("node");
        if let Some(cert) = tls {
            node.env("STANDIN_TLS_CERT", &cert.cert)
                .env("STANDIN_TLS_KEY", &cert.key);
        }
        let mut child = node
            .arg(dir.join("standin.js"))
            .env("STANDIN_HOST", &host)
            .env("STANDIN_CONTROL_PORT", control_port.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("Node.js is needed for the Service Bus stand-in (the machine's `node`)");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped stdout"))
            .read_line(&mut line)
            .expect("the stand-in's first line");
        let control = line
            .split("\"control\":")
            .nth(1)
            .and_then(|rest| {
                rest.trim_start()
                    .split(|c: char| !c.is_ascii_digit())
                    .next()
            })
            .and_then(|port| port.parse().ok())
            .unwrap_or_else(|| panic!("the stand-in did not start: {line:?}"));
        Standin {
            child,
            host,
            control,
        }
    }

    /// A connection string for it (the key is a dummy: the stand-in checks none).
    pub fn connection_string(&self) -> String {
        format!(
            "Endpoint=sb://{};SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=c3RhbmQtaW4tb25seQ==",
            self.host
        )
    }

    /// Creates `queue` (as infrastructure does for Service Bus).
    pub fn declare(
        &self,
        queue: &str,
        lock: Duration,
        max_delivery_count: u32,
        duplicate_detection: Duration,
    ) -> Result<(), String> {
        let body = format!(
            "{{\"lock_ms\":{},\"max_delivery_count\":{max_delivery_count},\"dedup_ms\":{}}}",
            lock.as_millis(),
            duplicate_detection.as_millis()
        );
        post(self.control, &format!("/queues/{queue}"), &body)
    }

    /// From now on, only Entra ID access tokens signed by `jwk` (the Entra ID stand-in's
    /// key) authorize links; SAS tokens are refused.
    pub fn require_entra(&self, jwk: &str) -> Result<(), String> {
        post(self.control, "/entra", &format!("{{\"jwk\":{jwk}}}"))
    }

    /// Grants the identity `oid` a Service Bus data role (`Azure Service Bus Data
    /// Owner`, `Sender` or `Receiver`) on `queue`, or on the namespace when `None`.
    pub fn grant(&self, oid: &str, role: &str, queue: Option<&str>) -> Result<(), String> {
        let queue = queue.map_or("null".to_owned(), |q| format!("\"{q}\""));
        post(
            self.control,
            "/grant",
            &format!("{{\"oid\":\"{oid}\",\"role\":\"{role}\",\"queue\":{queue}}}"),
        )
    }

    /// `{"put", "refused", "unauthorized", "expired", "last_refusal"}`: tokens put and
    /// refused, links and requests refused for want of a role, links closed because
    /// their token expired.
    pub fn auth_stats(&self) -> Result<String, String> {
        post_for_body(self.control, "/auth-stats", "{}")
    }

    /// Sets its clock (milliseconds since the epoch).
    pub fn set_clock_ms(&self, now_ms: i64) -> Result<(), String> {
        post(self.control, "/clock", &format!("{{\"now_ms\":{now_ms}}}"))
    }
}

impl Drop for Standin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A blocking HTTP/1.0 POST to a stand-in's control endpoint on `port`.
pub fn post(port: u16, path: &str, body: &str) -> Result<(), String> {
    post_for_body(port, path, body).map(|_| ())
}

/// [`post`], returning the answer's body.
pub fn post_for_body(port: u16, path: &str, body: &str) -> Result<String, String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    write!(
        s,
        "POST {path} HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .map_err(|e| e.to_string())?;
    let mut response = String::new();
    s.read_to_string(&mut response).map_err(|e| e.to_string())?;
    if response.starts_with("HTTP/1.1 200") || response.starts_with("HTTP/1.0 200") {
        Ok(response
            .split_once("\r\n\r\n")
            .map(|(_, body)| body.to_owned())
            .unwrap_or_default())
    } else {
        Err(response)
    }
}
