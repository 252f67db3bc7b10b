//! Real processes of our binaries for the end-to-end tests, the operators' CLI tests
//! and the failover bench (included by each with `#[path]`): start, signal, kill, read
//! their logs.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use orderly_testkit::azurite::Azurite;

/// Every binary the workspace builds and the image holds: the operators' tool, the
/// local runner, each role and the remote-service simulator.
pub(crate) const BINARIES: [&str; 7] = [
    "orderly",
    "orderly-local",
    "orderly-submitter",
    "orderly-scheduler",
    "orderly-agent",
    "orderly-supervisor",
    "orderly-remote-sim",
];

/// A binary of ours (`orderly`, `orderly-local`, each role's), from the target
/// directory this test was built in. The first call in a process builds the workspace's
/// binaries (`cargo build --workspace --bins`, a no-op when they are up to date), so a
/// test never runs a binary older than its sources.
pub(crate) fn bin(name: &str) -> PathBuf {
    static BUILT: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    if let Err(e) = BUILT.get_or_init(build_binaries) {
        panic!("cannot build the binaries: {e}");
    }
    // A test runs from the profile's `deps/` directory; the binaries are beside it.
    let exe = std::env::current_exe().expect("the test's own path");
    let dir = exe
        .parent()
        .and_then(std::path::Path::parent)
        .expect("a test binary in target/<profile>/deps");
    let path = dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(path.exists(), "no binary {}", path.display());
    path
}

/// `cargo build --workspace --bins` with the features of this build (OpenTelemetry
/// export when the tests have it), into the same target directory.
fn build_binaries() -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .args(["build", "--locked", "--quiet", "--workspace", "--bins"])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    // Without the variables cargo and the test runner set for this test process: build
    // scripts watch some (ring's, CARGO_MANIFEST_DIR), and a build that saw them would
    // not be the one `cargo build` from a shell made, so each would rebuild the other's.
    let keep = |name: &str| {
        ["CARGO_HOME", "CARGO_TARGET_DIR", "CARGO_INCREMENTAL"].contains(&name)
            || [
                "CARGO_BUILD_",
                "CARGO_NET_",
                "CARGO_HTTP_",
                "CARGO_REGISTRIES_",
                "CARGO_PROFILE_",
                "CARGO_TERM_",
            ]
            .iter()
            .any(|p| name.starts_with(p))
    };
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if (name.starts_with("CARGO") && !keep(&name))
            || name.starts_with("NEXTEST")
            || name == "OUT_DIR"
        {
            build.env_remove(name.as_ref());
        }
    }
    if cfg!(feature = "otel") {
        build.args(["--features", "orderly-runtime/otel"]);
    }
    let out = build.output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// A child process, killed (SIGKILL) when dropped.
pub(crate) struct Proc {
    child: Child,
    name: String,
    log: PathBuf,
}

impl Proc {
    pub(crate) fn start(name: &str, db: &str, args: &[&str]) -> Self {
        Self::start_with(name, db, args, &[])
    }

    /// [`Proc::start`] with extra environment variables.
    pub(crate) fn start_with(name: &str, db: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        let log = std::env::temp_dir().join(format!(
            "orderly-e2e-{name}-{}.log",
            uuid::Uuid::new_v4().simple()
        ));
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(bin(name))
            .args(args)
            .env("ORDERLY_DATABASE_URL", db)
            .env("ORDERLY_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        Proc {
            child,
            name: name.to_owned(),
            log,
        }
    }

    /// Sends `signal` (`STOP`, `CONT`, `TERM`, ...).
    pub(crate) fn signal(&self, signal: &str) {
        let ok = Command::new("kill")
            .args([format!("-{signal}"), self.child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -{signal} {}", self.name);
    }

    /// Waits until it exits by itself (after SIGTERM); its exit status.
    pub(crate) fn wait(&mut self, limit: Duration) -> std::process::ExitStatus {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                started.elapsed() < limit,
                "{} did not exit within {limit:?}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Everything it logged so far.
    pub(crate) fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL: no clean-up of any kind.
    pub(crate) fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !std::thread::panicking() {
            let _ = std::fs::remove_file(&self.log);
        } else {
            eprintln!(
                "--- {} ({}) ---\n{}",
                self.name,
                self.log.display(),
                self.tail()
            );
        }
    }
}

/// A loopback port free now and not handed out before by this process. The system
/// may give a port just released to the very next bind, so two calls in a row could
/// return the same port (seen: a test's submitter and scheduler were given one port,
/// and the second to start could not listen on it).
pub(crate) fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if GIVEN.lock().unwrap_or_else(|p| p.into_inner()).insert(port) {
            return port;
        }
    }
}

pub(crate) async fn wait_for(what: &str, limit: Duration, mut done: impl AsyncFnMut() -> bool) {
    let started = Instant::now();
    while !done().await {
        assert!(
            started.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Which elector the supervisors run, and its timings (flag, value).
pub(crate) struct Election {
    /// The blob lease's Azurite; `None` for the SQL lease.
    pub(crate) azurite: Option<Azurite>,
    timing: Vec<(&'static str, u64)>,
    env: Vec<(&'static str, String)>,
}

impl Election {
    /// The SQL lease for tests: 3 s lease, renewed every 500 ms, 2 s renew deadline.
    pub(crate) fn sql() -> Self {
        Self {
            azurite: None,
            timing: vec![
                ("--lease-ms", 3000),
                ("--renew-interval-ms", 500),
                ("--renew-retry-ms", 250),
                ("--renew-deadline-ms", 2000),
                ("--lease-call-timeout-ms", 500),
                ("--leader-stop-grace-ms", 500),
                ("--leader-heartbeat-timeout-ms", 1500),
                ("--acquire-retry-ms", 500),
            ],
            env: Vec::new(),
        }
    }

    /// The blob lease for tests: the shortest lease (15 s), renewed every second, a
    /// 10 s renew deadline.
    pub(crate) fn blob(azurite: Azurite) -> Self {
        Self {
            azurite: Some(azurite),
            timing: vec![
                ("--lease-ms", 15000),
                ("--renew-interval-ms", 1000),
                ("--renew-retry-ms", 500),
                ("--renew-deadline-ms", 10000),
                ("--lease-call-timeout-ms", 1000),
                ("--leader-stop-grace-ms", 2000),
                ("--leader-heartbeat-timeout-ms", 5000),
                ("--acquire-retry-ms", 500),
            ],
            env: Vec::new(),
        }
    }

    /// The defaults of a production deployment, but for a 15 s lease (the shortest a
    /// blob allows) and so a 10 s renew deadline: renew every 5 s (2 s after a
    /// failure), acquire retry 2 s + up to 20 %, 3 s per call.
    pub(crate) fn production(azurite: Option<Azurite>) -> Self {
        Self {
            azurite,
            timing: vec![("--lease-ms", 15000), ("--renew-deadline-ms", 10000)],
            env: Vec::new(),
        }
    }

    /// Sets an environment variable of every supervisor it starts.
    pub(crate) fn with_env(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.env.push((name, value.into()));
        self
    }

    /// Replaces (or adds) one timing flag.
    pub(crate) fn with(mut self, flag: &'static str, ms: u64) -> Self {
        self.timing.retain(|(f, _)| *f != flag);
        self.timing.push((flag, ms));
        self
    }

    fn ms(&self, flag: &str, default: u64) -> Duration {
        Duration::from_millis(
            self.timing
                .iter()
                .find(|(f, _)| *f == flag)
                .map_or(default, |(_, v)| *v),
        )
    }

    pub(crate) fn lease(&self) -> Duration {
        self.ms("--lease-ms", 30_000)
    }

    pub(crate) fn retry(&self) -> Duration {
        self.ms("--acquire-retry-ms", 2_000)
    }

    pub(crate) fn args(&self, id: &str) -> Vec<String> {
        let mut args: Vec<String> = [
            "--log-json",
            "--instance-id",
            id,
            "--interval-ms",
            "200",
            "--backoff-base-ms",
            "200",
            "--backoff-max-ms",
            "1000",
            "--elector",
            if self.azurite.is_some() {
                "blob"
            } else {
                "sql"
            },
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        for (flag, ms) in &self.timing {
            args.push(flag.to_string());
            args.push(ms.to_string());
        }
        if let Some(azurite) = &self.azurite {
            args.push("--lease-storage-connection-string".into());
            args.push(azurite.connection_string());
        }
        args
    }

    pub(crate) fn start(&self, db: &str, id: &str) -> Proc {
        let args = self.args(id);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let env: Vec<(&str, &str)> = self.env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Proc::start_with("orderly-supervisor", db, &args, &env)
    }
}

/// A leadership change a supervisor logged.
#[derive(Debug, Clone)]
pub(crate) struct Change {
    pub(crate) acquired: bool,
    pub(crate) epoch: i64,
    pub(crate) reason: Option<String>,
}

/// Every leadership change `p` logged so far.
pub(crate) fn changes(p: &Proc) -> Vec<Change> {
    p.output()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| {
            let f = v.get("fields")?;
            let message = f.get("message")?.as_str()?;
            let acquired = match message {
                "LEADER: leadership acquired" => true,
                "LEADER: leadership ended" => false,
                _ => return None,
            };
            Some(Change {
                acquired,
                epoch: f.get("epoch")?.as_str()?.parse().ok()?,
                reason: f.get("reason").and_then(|r| r.as_str()).map(str::to_string),
            })
        })
        .collect()
}

/// Waits until `p` has logged `n` changes; the time it was seen and the last one.
pub(crate) async fn wait_change(p: &Proc, n: usize, limit: Duration) -> (Instant, Change) {
    let started = Instant::now();
    loop {
        let c = changes(p);
        if c.len() >= n {
            return (Instant::now(), c[n - 1].clone());
        }
        assert!(
            started.elapsed() < limit,
            "no leadership change #{n} within {limit:?}; output:\n{}",
            p.output()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// An HTTP client builder for the tests: reqwest on orderly's one TLS stack, whose
/// crypto provider (ring) must be installed before any client is built.
pub(crate) fn http_builder() -> reqwest::ClientBuilder {
    orderly_tls::install_provider();
    reqwest::Client::builder()
}

/// An HTTP client for the tests (see [`http_builder`]).
pub(crate) fn http() -> reqwest::Client {
    http_builder().build().expect("an HTTP client")
}

/// `GET url` with a fresh client, as `reqwest::get` does.
pub(crate) async fn get(url: impl reqwest::IntoUrl) -> reqwest::Result<reqwest::Response> {
    http().get(url).send().await
}

/// The CSRF token a dashboard page set in its `orderly_csrf` cookie.
pub(crate) fn csrf_cookie(page: &reqwest::Response) -> String {
    page.headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|c| c.strip_prefix("orderly_csrf="))
        .and_then(|c| c.split(';').next())
        .expect("a CSRF cookie")
        .to_owned()
}

/// `orderly dashboard` on a free loopback port over `db`, with `env`, once it
/// answers; and its base URL.
pub(crate) async fn start_dashboard(db: &str, env: &[(&str, &str)]) -> (Proc, String) {
    let listen = format!("127.0.0.1:{}", free_port());
    let p = Proc::start_with("orderly", db, &["dashboard", "--listen", &listen], env);
    let base = format!("http://{listen}");
    wait_for("the dashboard", Duration::from_secs(20), async || {
        get(format!("{base}/healthz")).await.is_ok()
    })
    .await;
    (p, base)
}

/// Runs `orderly ARGS` over `db` as an operator does, to the end: whether it
/// succeeded, and what it printed (stdout, then stderr).
pub(crate) fn orderly(db: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new(bin("orderly"))
        .args(args)
        .env("ORDERLY_DATABASE_URL", db)
        .output()
        .expect("run orderly");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Fixes the cause of the simulator's permanent refusals (on `port`), as an operator
/// fixes a service before retrying.
pub(crate) async fn repair_sim(port: u16) {
    let done = http()
        .put(format!("http://127.0.0.1:{port}/faults/repair"))
        .send()
        .await
        .expect("the simulator answers");
    assert!(done.status().is_success(), "{}", done.status());
}

#[allow(unused_imports)]
pub(crate) use orderly_testkit::partition::Partition;
