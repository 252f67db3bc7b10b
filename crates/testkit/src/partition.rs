//! A network partition a test can cut and heal: a TCP forwarder in front of a service.

use std::time::Duration;

/// A TCP forwarder between one process and a service, which a test can cut as a
/// network partition does: from the cut on, no byte gets through either way (nothing
/// is closed or reset; calls hang until their own time-outs), and new connections are
/// accepted and left hanging; healed, new connections go through again.
pub struct Partition {
    /// The port to give the process instead of the service's.
    pub port: u16,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Partition {
    /// Forwards a free local port to 127.0.0.1:`upstream`.
    pub async fn to(upstream: u16) -> Self {
        use std::sync::atomic::Ordering;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = cut.clone();
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let cut = flag.clone();
                tokio::spawn(async move {
                    // Held, unanswered, while cut.
                    while cut.load(Ordering::SeqCst) {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    let Ok(outbound) =
                        tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                    else {
                        return;
                    };
                    let (ri, wi) = inbound.into_split();
                    let (ro, wo) = outbound.into_split();
                    let there = tokio::spawn(pump(ri, wo, cut.clone()));
                    pump(ro, wi, cut).await;
                    let _ = there.await;
                });
            }
        });
        Self { port, cut, task }
    }

    /// Stops every byte from now on.
    pub fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Lets new connections through again (those open across the cut stay dead, as
    /// after a real partition their peers have given up on them).
    pub fn heal(&self) {
        self.cut.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies `from` to `to` until either ends; once `cut`, reads are swallowed (held
/// open, never forwarded) for the life of the connection.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    let mut dead = false;
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        dead |= cut.load(std::sync::atomic::Ordering::SeqCst);
        if !dead && to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
