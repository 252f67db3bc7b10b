//! A PostgreSQL server of the test's own, from the machine's PostgreSQL installation
//! (`initdb` and `postgres` of the newest version under `/usr/lib/postgresql`, or on
//! `PATH`): a fresh cluster on a free port that accepts TCP connections over TLS only
//! (`hostssl`; plain connections are rejected), with a server certificate the test's
//! CA signed. Stopped and removed on drop.
//!
//! Run as root (as CI does), the cluster belongs to the `postgres` user, as the server
//! refuses to run as root.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::tls::ServerCert;

/// A running private PostgreSQL server.
pub struct PrivatePostgres {
    child: Child,
    dir: PathBuf,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

fn bin_dir() -> PathBuf {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, b)| b).unwrap_or_else(|| {
        // Elsewhere, initdb on PATH.
        PathBuf::new()
    })
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// `program args` as the cluster's owner: `postgres` when we are root.
fn as_owner(program: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn chown_to_postgres(path: &Path) {
    if !is_root() {
        return;
    }
    let ok = Command::new("chown")
        .args(["-R", "postgres:postgres"])
        .arg(path)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "chown -R postgres {}", path.display());
}

impl PrivatePostgres {
    /// Starts a TLS-only server with `cert` (for 127.0.0.1 / localhost), trust auth
    /// for the user `postgres`. Panics, saying what is missing, when PostgreSQL is not
    /// installed: the TLS tests never skip.
    pub fn start_tls(cert: &ServerCert) -> Self {
        let bin = bin_dir();
        let initdb = bin.join("initdb");
        let postgres = bin.join("postgres");
        let dir = std::env::temp_dir().join(format!(
            "orderly-pg-tls-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        let data = dir.join("data");
        std::fs::create_dir_all(&dir).expect("the cluster's directory");
        // The server reads its certificate and key as the cluster's owner; the key
        // must be private to it.
        std::fs::copy(&cert.cert, dir.join("server.crt")).expect("copy the certificate");
        std::fs::copy(&cert.key, dir.join("server.key")).expect("copy the key");
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(
                dir.join("server.key"),
                std::fs::Permissions::from_mode(0o600),
            )
            .expect("chmod the key");
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
                .expect("chmod the directory");
        }
        chown_to_postgres(&dir);
        let out = as_owner(&initdb)
            .args(["-D"])
            .arg(&data)
            .args(["-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8"])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "PostgreSQL's initdb ({}) is needed for the TLS tests: {e}. Install PostgreSQL (.ci/run does).",
                    initdb.display()
                )
            });
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // TCP over TLS only; a plain connection is rejected by the server.
        std::fs::write(
            data.join("pg_hba.conf"),
            "local all all trust\nhostssl all all 127.0.0.1/32 trust\nhostnossl all all 127.0.0.1/32 reject\n",
        )
        .expect("pg_hba.conf");
        chown_to_postgres(&data.join("pg_hba.conf"));
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let child = as_owner(&postgres)
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string(), "-k"])
            .arg(&dir)
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "ssl=on",
                "-c",
                "fsync=off",
            ])
            .arg("-c")
            .arg(format!(
                "ssl_cert_file={}",
                dir.join("server.crt").display()
            ))
            .arg("-c")
            .arg(format!("ssl_key_file={}", dir.join("server.key").display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", postgres.display()));
        let mut server = Self { child, dir, port };
        let t = Instant::now();
        loop {
            let ready = Command::new(bin.join("pg_isready"))
                .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-q"])
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                break;
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("the private PostgreSQL exited at start-up ({status}); its log is above");
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "the private PostgreSQL did not accept connections within 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    /// A URL for its `postgres` database with `params` (e.g.
    /// `sslmode=verify-full&sslrootcert=...`), as `host` (`127.0.0.1` or `localhost`).
    pub fn url(&self, host: &str, params: &str) -> String {
        format!("postgres://postgres@{host}:{}/postgres?{params}", self.port)
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        // SIGINT to the postmaster (not to `runuser` before it): a fast shutdown.
        let postmaster = std::fs::read_to_string(self.dir.join("data/postmaster.pid"))
            .ok()
            .and_then(|t| t.lines().next().map(str::to_owned))
            .unwrap_or_else(|| self.child.id().to_string());
        let _ = Command::new("kill").args(["-INT", &postmaster]).status();
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
