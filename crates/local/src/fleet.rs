//! The roles as they are deployed: each role binary its own process on one store (one
//! submitter, two schedulers, two agents, one supervisor) and the remote services'
//! simulator, so that wake-ups, claims and replies cross processes as they do between
//! containers. `orderly-local bench --processes` measures it beside the in-process
//! system.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use orderly_remote_sim::Effect;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The role binaries started, in order, and how many of each.
const ROLES: [(&str, usize); 4] = [
    ("orderly-submitter", 1),
    ("orderly-scheduler", 2),
    ("orderly-agent", 2),
    ("orderly-supervisor", 1),
];

/// The processes of one deployment, stopped (SIGTERM, then killed) when dropped.
pub struct Fleet {
    children: Vec<(String, Child)>,
    sim: std::net::SocketAddr,
    logs: PathBuf,
}

/// A binary beside this one (`cargo build --release` builds them all into one folder).
fn beside(name: &str) -> anyhow::Result<PathBuf> {
    let here = std::env::current_exe().context("cannot find this binary's folder")?;
    let path = here.with_file_name(name);
    if !path.is_file() {
        bail!(
            "{name} is not beside {}: build the roles first (cargo build --release)",
            here.display()
        );
    }
    Ok(path)
}

/// A loopback address no one listens on now.
fn free_addr() -> anyhow::Result<std::net::SocketAddr> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?)
}

impl Fleet {
    /// Starts the simulator and the roles on the store at `url`, the agents serving
    /// `queues`; returns once the simulator answers and every role is still running
    /// after a moment to start.
    pub async fn start(url: &str, queues: &[String]) -> anyhow::Result<Self> {
        let sim = free_addr()?;
        let logs = std::env::temp_dir().join(format!("orderly-fleet-{}", std::process::id()));
        std::fs::create_dir_all(&logs)
            .with_context(|| format!("cannot create {}", logs.display()))?;
        let mut fleet = Self {
            children: Vec::new(),
            sim,
            logs,
        };
        fleet.spawn(
            "orderly-remote-sim",
            0,
            &["--listen", &sim.to_string()],
            url,
        )?;
        fleet.wait_for_sim().await?;
        let remote = format!("http://{sim}/actions");
        let queues = queues.join(",");
        for (role, count) in ROLES {
            for n in 0..count {
                let args: Vec<&str> = match role {
                    "orderly-agent" => vec!["--queues", &queues, "--remote-url", &remote],
                    _ => Vec::new(),
                };
                fleet.spawn(role, n, &args, url)?;
            }
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        fleet.check_running()?;
        Ok(fleet)
    }

    fn spawn(&mut self, role: &str, n: usize, args: &[&str], url: &str) -> anyhow::Result<()> {
        let name = format!("{role}-{n}");
        let log = std::fs::File::create(self.logs.join(format!("{name}.log")))?;
        let child = Command::new(beside(role)?)
            .args(args)
            .env("ORDERLY_DATABASE_URL", url)
            .env("ORDERLY_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {role}"))?;
        self.children.push((name, child));
        Ok(())
    }

    /// Fails naming the first process that stopped, and where its log is.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        for (name, child) in &mut self.children {
            if let Some(status) = child.try_wait()? {
                bail!(
                    "{name} stopped ({status}); its log is {}",
                    self.logs.join(format!("{name}.log")).display()
                );
            }
        }
        Ok(())
    }

    /// Every process's id (the simulator's included), for their CPU time.
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(|(_, c)| c.id()).collect()
    }

    async fn wait_for_sim(&self) -> anyhow::Result<()> {
        for _ in 0..100 {
            if self.get("/healthz").await.is_ok() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("the simulator did not answer at {}", self.sim)
    }

    /// The body of `GET path` on the simulator (HTTP/1.0: it closes when done).
    async fn get(&self, path: &str) -> anyhow::Result<Vec<u8>> {
        let mut s = tokio::net::TcpStream::connect(self.sim).await?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", self.sim).as_bytes())
            .await?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await?;
        let split = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .context("no end of headers")?;
        if !raw.starts_with(b"HTTP/1.1 200") && !raw.starts_with(b"HTTP/1.0 200") {
            bail!("{path}: {}", String::from_utf8_lossy(&raw[..split]));
        }
        Ok(raw[split + 4..].to_vec())
    }

    /// The effects the simulated services applied, for the invariant checker.
    pub async fn ledger(&self) -> anyhow::Result<Vec<Effect>> {
        let body = self.get("/ledger").await?;
        serde_json::from_slice(&body).context("the simulator's ledger does not decode")
    }

    /// Stops every process: SIGTERM, then up to 10 s to finish, then killed.
    pub fn stop(mut self) {
        self.stop_all();
    }

    fn stop_all(&mut self) {
        for (_, child) in &self.children {
            // SIGTERM, not a kill: a role hands back what it holds and drains.
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        for (_, child) in &mut self.children {
            while std::time::Instant::now() < deadline {
                if matches!(child.try_wait(), Ok(Some(_))) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        self.children.clear();
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.stop_all();
    }
}
