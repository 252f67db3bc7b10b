//! A real OTLP/HTTP trace receiver for tests (feature `otel`): it listens on a free
//! loopback port, accepts `POST /v1/traces` in protobuf as a collector does, decodes
//! every export with the OpenTelemetry protocol's own message types, and keeps the
//! spans with their resource, so a test can ask what a process exported.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use prost::Message as _;
use tokio_util::sync::CancellationToken;

/// One span as a collector received it.
#[derive(Debug, Clone)]
pub struct ExportedSpan {
    /// The exporting process's resource (`service.name`, `service.instance.id`, ...).
    pub resource: BTreeMap<String, String>,
    /// The span's name.
    pub name: String,
    /// Hex trace id.
    pub trace_id: String,
    /// Hex span id.
    pub span_id: String,
    /// Hex parent span id; empty for a root span.
    pub parent_span_id: String,
    /// The span's attributes, as text.
    pub attributes: BTreeMap<String, String>,
}

impl ExportedSpan {
    /// The exporting service's name.
    pub fn service(&self) -> &str {
        self.resource.get("service.name").map_or("", String::as_str)
    }

    /// One attribute.
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

#[derive(Default)]
struct Received {
    spans: Vec<ExportedSpan>,
    exports: usize,
    rejected: Vec<String>,
}

/// The receiver; stops listening when dropped.
pub struct OtlpReceiver {
    endpoint: String,
    received: Arc<Mutex<Received>>,
    stop: CancellationToken,
}

impl OtlpReceiver {
    /// Listens on a free loopback port.
    pub async fn start() -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let endpoint = format!("http://{}", listener.local_addr()?);
        let received = Arc::new(Mutex::new(Received::default()));
        let stop = CancellationToken::new();
        let app = axum::Router::new()
            .route("/v1/traces", axum::routing::post(export))
            .with_state(received.clone());
        let until = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(until.cancelled_owned())
                .await;
        });
        Ok(Self {
            endpoint,
            received,
            stop,
        })
    }

    /// The base URL to give an exporter (`http://127.0.0.1:PORT`; traces go to
    /// `/v1/traces` under it).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ExportedSpan> {
        self.lock().spans.clone()
    }

    /// Export requests accepted so far.
    pub fn exports(&self) -> usize {
        self.lock().exports
    }

    /// Requests refused (not protobuf, undecodable), with why.
    pub fn rejected(&self) -> Vec<String> {
        self.lock().rejected.clone()
    }

    /// Waits until `done` holds for the spans received, or `limit` passes; returns
    /// the spans either way.
    pub async fn wait_until(
        &self,
        limit: Duration,
        done: impl Fn(&[ExportedSpan]) -> bool,
    ) -> Vec<ExportedSpan> {
        let started = Instant::now();
        loop {
            let spans = self.spans();
            if done(&spans) || started.elapsed() >= limit {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Received> {
        self.received.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn export(
    State(received): State<Arc<Mutex<Received>>>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, [(header::HeaderName, &'static str); 1], Vec<u8>) {
    let protobuf = [(header::CONTENT_TYPE, "application/x-protobuf")];
    let mut r = received.lock().unwrap_or_else(|p| p.into_inner());
    let kind = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if kind != "application/x-protobuf" {
        r.rejected.push(format!("content-type {kind:?}"));
        return (StatusCode::UNSUPPORTED_MEDIA_TYPE, protobuf, Vec::new());
    }
    let request = match ExportTraceServiceRequest::decode(body) {
        Ok(request) => request,
        Err(e) => {
            r.rejected.push(format!("undecodable: {e}"));
            return (StatusCode::BAD_REQUEST, protobuf, Vec::new());
        }
    };
    r.exports += 1;
    for rs in request.resource_spans {
        let resource = attributes(rs.resource.map(|x| x.attributes).unwrap_or_default());
        for ss in rs.scope_spans {
            for span in ss.spans {
                r.spans.push(ExportedSpan {
                    resource: resource.clone(),
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    attributes: attributes(span.attributes),
                });
            }
        }
    }
    // An empty ExportTraceServiceResponse: everything accepted.
    (StatusCode::OK, protobuf, Vec::new())
}

fn attributes(kvs: Vec<KeyValue>) -> BTreeMap<String, String> {
    kvs.into_iter()
        .map(|kv| (kv.key, kv.value.map(text).unwrap_or_default()))
        .collect()
}

fn text(v: AnyValue) -> String {
    match v.value {
        Some(any_value::Value::StringValue(s)) => s,
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
