//! Calling a remote service: the port, and its HTTP implementation.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use orderly_core::messages::{StepKind, StepRequest};
use orderly_core::{OrderDetails, OrderId};
use serde::Serialize;

/// Longest answer or error text kept from a remote service.
const MAX_ANSWER: usize = 2_000;

/// What is sent to the remote service (as the JSON body).
#[derive(Debug, Clone, Serialize)]
pub struct RemoteCall {
    /// The order.
    pub order_id: OrderId,
    /// The workflow step.
    pub step: String,
    /// The action (the step, or its compensation).
    pub action: String,
    /// Do or undo.
    pub kind: StepKind,
    /// Also sent as the `Idempotency-Key` header.
    pub idempotency_key: String,
    /// For a compensation: the key of the action it undoes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compensates: Option<String>,
    /// What was ordered.
    pub details: OrderDetails,
}

impl RemoteCall {
    /// The call a request asks for.
    pub fn from_request(req: &StepRequest) -> Self {
        Self {
            order_id: req.fence.order_id.clone(),
            step: req.step.clone(),
            action: req.action.clone(),
            kind: req.kind,
            idempotency_key: req.idempotency_key.clone(),
            compensates: (req.kind == StepKind::Compensate).then(|| {
                req.compensates.clone().unwrap_or_else(|| {
                    orderly_core::step::idempotency_key(
                        &req.fence.order_id,
                        req.context.generation,
                        req.step_index,
                        &req.step,
                    )
                })
            }),
            details: req.context.details.clone(),
        }
    }
}

/// How a call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// Worth retrying: no answer, a timeout, 408, 429 or 5xx.
    #[error("transient: {error}")]
    Transient {
        /// What happened.
        error: String,
        /// How long the service asked us to wait (Retry-After).
        retry_after: Option<Duration>,
    },
    /// Retrying will not help: another 4xx, or a declared permanent error.
    #[error("permanent: {0}")]
    Permanent(String),
}

/// What a step's status probe answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeAnswer {
    /// The action took effect; its answer.
    Applied(String),
    /// The service has no record of it (404).
    NotFound,
    /// No telling: no answer, a timeout, or another status.
    Unknown(String),
}

/// A remote service an agent calls.
#[async_trait]
pub trait RemoteService: Send + Sync {
    /// Performs `call`, giving up after `timeout`. `Ok` carries the answer.
    async fn call(&self, call: &RemoteCall, timeout: Duration) -> Result<String, CallError>;

    /// Asks the status endpoint at `url` whether the action under `key` took effect,
    /// giving up after `timeout`. By default a service cannot be asked.
    async fn probe(&self, url: &str, key: &str, timeout: Duration) -> ProbeAnswer {
        let _ = (url, key, timeout);
        ProbeAnswer::Unknown("this client cannot ask the service".into())
    }
}

/// Where each action is served: `base_url/<action>` unless overridden.
#[derive(Clone, PartialEq, Eq)]
pub struct Endpoints {
    /// The default base URL, e.g. `http://remote:8080/actions`.
    pub base_url: String,
    /// Per-action URLs.
    pub overrides: HashMap<String, String>,
}

impl std::fmt::Debug for Endpoints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let overrides: std::collections::BTreeMap<&str, String> = self
            .overrides
            .iter()
            .map(|(a, u)| (a.as_str(), shown(u)))
            .collect();
        f.debug_struct("Endpoints")
            .field("base_url", &shown(&self.base_url))
            .field("overrides", &overrides)
            .finish()
    }
}

impl Endpoints {
    /// The URL of `action`.
    pub fn url(&self, action: &str) -> String {
        self.overrides
            .get(action)
            .cloned()
            .unwrap_or_else(|| format!("{}/{action}", self.base_url.trim_end_matches('/')))
    }
}

impl std::fmt::Debug for HttpRemote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpRemote")
            .field("endpoints", &self.endpoints)
            .finish_non_exhaustive()
    }
}

/// The HTTP implementation (its `Debug` shows the URLs as [`shown`]).
#[derive(Clone)]
pub struct HttpRemote {
    client: reqwest::Client,
    endpoints: Endpoints,
}

impl HttpRemote {
    /// A client for `endpoints`. Every connection it opened is kept for reuse until
    /// it has been idle for 90 s, so it holds at most as many per service as calls were
    /// in flight at once (the agent's concurrency bounds that). A smaller cap on idle
    /// connections closes the rest after each burst of calls and opens them again for
    /// the next: a TCP (or TLS) handshake per call, on both ends.
    /// https services are verified against `trust` (the platform's roots plus
    /// `ORDERLY_CA_FILE`).
    pub fn new(
        endpoints: Endpoints,
        trust: &orderly_tls::Trust,
    ) -> Result<Self, orderly_tls::Error> {
        let client = trust
            .http_client()?
            .connect_timeout(Duration::from_secs(2))
            .pool_idle_timeout(Duration::from_secs(90))
            .build()
            .map_err(|e| orderly_tls::Error::Setup(e.to_string()))?;
        Ok(Self { client, endpoints })
    }
}

fn cut(mut text: String) -> String {
    if text.len() > MAX_ANSWER {
        let mut end = MAX_ANSWER;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// The start of an answer's body, read while it streams: at most [`MAX_ANSWER`] bytes
/// are kept and nothing past them is read (a service that answers with gigabytes
/// costs the agent 2 kB), as text (invalid UTF-8 replaced).
async fn answer(mut response: reqwest::Response) -> String {
    let mut body: Vec<u8> = Vec::new();
    while body.len() < MAX_ANSWER {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = MAX_ANSWER - body.len();
                body.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            Ok(None) | Err(_) => break,
        }
    }
    cut(String::from_utf8_lossy(&body).into_owned())
}

/// A URL as it may be shown (in errors that are logged, stored in a step's detail or a
/// service's health, and sent to the dashboard and the webhook): scheme, host, port and
/// path, never its user, password, query or fragment, which may hold a key (an Azure
/// Functions `?code=`, a SAS signature).
pub fn shown(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(u) => format!(
            "{}://{}{}{}",
            u.scheme(),
            u.host_str().unwrap_or(""),
            u.port().map(|p| format!(":{p}")).unwrap_or_default(),
            u.path()
        ),
        Err(_) => "(an invalid URL)".to_owned(),
    }
}

/// Why a redirect answer is a failed call, naming where it pointed (as [`shown`]: no
/// key), or `None` for any other answer. Redirects are not followed (see
/// `orderly_tls::Trust::http_client`): the service's URL is set to where it answers.
pub fn redirected(response: &reqwest::Response) -> Option<String> {
    let status = response.status();
    if !status.is_redirection() {
        return None;
    }
    let to = response
        .headers()
        .get(reqwest::header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .map(|to| {
            // A relative Location is resolved against the call's URL.
            response
                .url()
                .join(to)
                .map(|u| shown(u.as_str()))
                .unwrap_or_else(|_| "(an invalid URL)".to_owned())
        })
        .unwrap_or_else(|| "nowhere (no Location)".to_owned());
    Some(format!(
        "HTTP {status}: redirected to {to}; redirects are not followed (set the service's URL to where it answers)"
    ))
}

/// A client error in words without the URL it names (which may hold a key): its kind
/// and cause, after the URL as [`shown`].
fn unreached(url: &str, e: reqwest::Error) -> String {
    let kind = if e.is_connect() {
        "cannot connect"
    } else if e.is_request() {
        "request failed"
    } else if e.is_body() || e.is_decode() {
        "bad answer"
    } else {
        "no answer"
    };
    let mut cause = String::new();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        cause = s.to_string();
        source = s.source();
    }
    let cause = if cause.is_empty() || cause.contains("://") {
        String::new()
    } else {
        format!(": {cause}")
    };
    format!("{kind} ({}){cause}", shown(url))
}

/// Parses `Retry-After` given in seconds (the HTTP-date form is treated as absent).
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let value = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

#[async_trait]
impl RemoteService for HttpRemote {
    async fn call(&self, call: &RemoteCall, timeout: Duration) -> Result<String, CallError> {
        let body = serde_json::to_vec(call).map_err(|e| CallError::Permanent(e.to_string()))?;
        let url = self.endpoints.url(&call.action);
        let mut request = self
            .client
            .post(&url)
            .timeout(timeout)
            .header("Idempotency-Key", &call.idempotency_key)
            .header(reqwest::header::CONTENT_TYPE, "application/json");
        // The remote service's spans join the order's trace (W3C `traceparent`), when
        // this process exports traces.
        let mut context = std::collections::BTreeMap::<String, String>::new();
        orderly_core::tracecontext::inject_current(&mut context);
        for (name, value) in &context {
            request = request.header(name.as_str(), value.as_str());
        }
        let response = request
            .body(body)
            .send()
            .await
            .map_err(|e| CallError::Transient {
                error: if e.is_timeout() {
                    "timed out".to_owned()
                } else {
                    unreached(&url, e)
                },
                retry_after: None,
            })?;
        let status = response.status();
        let wait = retry_after(response.headers());
        let moved = redirected(&response);
        let text = answer(response).await;
        if let Some(moved) = moved {
            return Err(CallError::Permanent(moved));
        }
        match status.as_u16() {
            200..=299 => Ok(text),
            408 | 429 | 500..=599 => Err(CallError::Transient {
                error: format!("HTTP {status}: {text}"),
                retry_after: wait,
            }),
            _ => Err(CallError::Permanent(format!("HTTP {status}: {text}"))),
        }
    }

    async fn probe(&self, url: &str, key: &str, timeout: Duration) -> ProbeAnswer {
        let response = match self
            .client
            .get(url)
            .timeout(timeout)
            .header("Idempotency-Key", key)
            .send()
            .await
        {
            Ok(r) => r,
            Err(e) if e.is_timeout() => return ProbeAnswer::Unknown("timed out".into()),
            Err(e) => return ProbeAnswer::Unknown(unreached(url, e)),
        };
        let status = response.status();
        let moved = redirected(&response);
        let text = answer(response).await;
        if let Some(moved) = moved {
            return ProbeAnswer::Unknown(moved);
        }
        match status.as_u16() {
            200..=299 => ProbeAnswer::Applied(text),
            404 => ProbeAnswer::NotFound,
            _ => ProbeAnswer::Unknown(format!("HTTP {status}: {text}")),
        }
    }
}
