//! The transport conformance suite through the Service Bus adapter, on the wire: each
//! test starts its own Service Bus STAND-IN (tests/servicebus-standin, a small AMQP 1.0
//! broker for tests; no Service Bus emulator runs on our CI machines) on a loopback
//! address of its own, moves its clock with the test's manual clock, and declares
//! queues through its control endpoint. The same suite runs against the SQL queue.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use async_trait::async_trait;
use orderly_azure::{QueueAdmin, ServiceBusSettings, ServiceBusTransport};
use orderly_core::ManualClock;
use orderly_core::transport::{QueueName, QueueSettings, Transport, TransportError};
use orderly_testkit::transport::{TransportCtx, TransportFactory};

struct Standin {
    child: Child,
    host: String,
    control: u16,
}

impl Standin {
    fn start() -> Standin {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/servicebus-standin");
        assert!(
            dir.join("node_modules/rhea").exists(),
            "the Service Bus stand-in's dependencies are missing: run `npm ci --prefix tests/servicebus-standin` (.ci/run does)"
        );
        let r = uuid::Uuid::new_v4().into_bytes();
        let host = format!("127.{}.{}.{}", 20 + r[0] % 200, r[1], 1 + r[2] % 250);
        let mut child = Command::new("node")
            .arg(dir.join("standin.js"))
            .env("STANDIN_HOST", &host)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("Node.js is needed for the Service Bus stand-in (the machine's `node`)");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let started: serde_json::Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("the stand-in did not start ({e}): {line:?}"));
        Standin {
            child,
            host,
            control: started["control"].as_u64().unwrap() as u16,
        }
    }

    fn connection_string(&self) -> String {
        format!(
            "Endpoint=sb://{};SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=c3RhbmQtaW4tb25seQ==",
            self.host
        )
    }
}

impl Drop for Standin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A blocking HTTP/1.0 POST to the stand-in's control endpoint.
fn post(port: u16, path: &str, body: &str) -> Result<(), String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    write!(s, "POST {path} HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len())
        .map_err(|e| e.to_string())?;
    let mut response = String::new();
    s.read_to_string(&mut response).map_err(|e| e.to_string())?;
    if response.starts_with("HTTP/1.1 200") || response.starts_with("HTTP/1.0 200") {
        Ok(())
    } else {
        Err(response)
    }
}

struct StandinAdmin(u16);

#[async_trait]
impl QueueAdmin for StandinAdmin {
    async fn declare(
        &self,
        queue: &QueueName,
        settings: &QueueSettings,
    ) -> Result<(), TransportError> {
        let body = serde_json::json!({
            "lock_ms": settings.lock_duration.as_millis() as u64,
            "max_delivery_count": settings.max_delivery_count,
            "dedup_ms": settings.duplicate_detection_window.as_millis() as u64,
        })
        .to_string();
        post(self.0, &format!("/queues/{}", queue.as_str()), &body)
            .map_err(|e| TransportError::Unavailable(e.into()))
    }
}

struct ServiceBusFactory {
    standin: Arc<Standin>,
    clock: ManualClock,
}

#[async_trait]
impl TransportFactory for ServiceBusFactory {
    async fn open(&self) -> Arc<dyn Transport> {
        let mut settings = ServiceBusSettings::new(self.standin.connection_string());
        settings.unsecured = true;
        settings.try_timeout = std::time::Duration::from_secs(5);
        let admin = Arc::new(StandinAdmin(self.standin.control));
        Arc::new(
            ServiceBusTransport::connect(&settings, admin, Arc::new(self.clock.clone()))
                .await
                .expect("connect to the stand-in"),
        )
    }
}

async fn servicebus() -> TransportCtx {
    let standin = Arc::new(Standin::start());
    let clock = ManualClock::starting_now();
    let port = standin.control;
    clock.on_change(move |t| {
        // The client writes settlements after `complete` has returned; let those in
        // flight reach the stand-in before its clock jumps and expires their locks.
        std::thread::sleep(std::time::Duration::from_millis(50));
        post(
            port,
            "/clock",
            &format!("{{\"now_ms\":{}}}", t.timestamp_millis()),
        )
        .expect("set the stand-in's clock")
    });
    TransportCtx {
        clock: clock.clone(),
        factory: Box::new(ServiceBusFactory { standin, clock }),
    }
}

mod servicebus_transport {
    orderly_testkit::transport_conformance!(crate::servicebus);
}
