//! Azurite, Microsoft's Azure Storage emulator, from the npm package pinned in
//! `tests/azurite` (`npm ci --prefix tests/azurite`; `.ci/run` does it): one blob
//! service per test, on a free port, with in-memory storage.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running Azurite blob service; stopped when dropped.
pub struct Azurite {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
    scheme: &'static str,
}

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

impl Azurite {
    /// Starts one and waits until it accepts connections. Panics, saying how to fix
    /// it, when the npm package is not installed: the blob lease tests never skip.
    pub fn start() -> Self {
        Self::start_with("http", &[])
    }

    /// Starts one serving HTTPS only, with `cert` (a certificate for 127.0.0.1 from a
    /// [`crate::tls::TestCa`]): a client reaches it only over TLS, and only if it
    /// trusts that CA.
    pub fn start_https(cert: &crate::tls::ServerCert) -> Self {
        let (c, k) = (
            cert.cert.display().to_string(),
            cert.key.display().to_string(),
        );
        Self::start_with("https", &["--cert", &c, "--key", &k])
    }

    /// A new test CA named `ca_name` and an Azurite serving HTTPS with a certificate
    /// for 127.0.0.1 / localhost that it signed (see [`Azurite::start_https`]).
    pub fn start_https_with_new_ca(ca_name: &str) -> (crate::tls::TestCa, Self) {
        let ca = crate::tls::TestCa::new(ca_name);
        let cert = ca.server_cert("azurite", &["127.0.0.1", "localhost"]);
        let azurite = Self::start_https(&cert);
        (ca, azurite)
    }

    fn start_with(scheme: &'static str, extra: &[&str]) -> Self {
        let dir = repo_root().join("tests/azurite");
        let bin = dir.join("node_modules/.bin/azurite-blob");
        assert!(
            bin.exists(),
            "Azurite is required by the blob lease tests and is not installed: \
             run `npm ci --prefix tests/azurite` (.ci/run does)"
        );
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let child = Command::new(&bin)
            .args([
                "--blobHost",
                "127.0.0.1",
                "--blobPort",
                &port.to_string(),
                "--inMemoryPersistence",
                "--skipApiVersionCheck",
                "--disableTelemetry",
                "--loose",
                "--silent",
            ])
            .args(extra)
            // Its debug log and extent files, if any, go to a scratch directory.
            .current_dir(std::env::temp_dir())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start Azurite ({}): {e}", bin.display()));
        let mut azurite = Self {
            child,
            port,
            scheme,
        };
        let t = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = azurite.child.try_wait() {
                panic!("Azurite exited at start-up ({status}); its error is above");
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "Azurite did not listen on port {port} within 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        azurite
    }

    /// The connection string of its development account.
    pub fn connection_string(&self) -> String {
        format!(
            "UseDevelopmentStorage=true;DevelopmentStorageProxyUri={}://127.0.0.1:{}",
            self.scheme, self.port
        )
    }

    /// Its process id (to SIGSTOP it: every call then hangs).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (e.g. `STOP`, `CONT`) to it.
    pub fn signal(&self, signal: &str) {
        let ok = Command::new("kill")
            .args([format!("-{signal}"), self.pid().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -{signal} Azurite");
    }
}

impl Drop for Azurite {
    fn drop(&mut self) {
        self.signal_quietly();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Azurite {
    fn signal_quietly(&self) {
        let _ = Command::new("kill")
            .args(["-CONT".to_string(), self.pid().to_string()])
            .status();
    }
}
