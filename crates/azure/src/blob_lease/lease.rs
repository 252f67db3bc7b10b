//! The lease itself: acquire, renew and release on the dedicated blob, with a tight
//! retry budget, and Azure's answers mapped to the elector's [`LeaseError`]s.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::location::*;
use super::shared_key::*;
use async_trait::async_trait;
use azure_core::error::ErrorKind;
use azure_core::http::{ClientOptions, FixedRetryOptions, RetryOptions};
use azure_storage_blob::models::{AppendBlobClientCreateOptions, BlobClientAcquireLeaseOptions};
use azure_storage_blob::{
    BlobClient, BlobClientOptions, BlobContainerClient, BlobContainerClientOptions,
};
use orderly_core::leader::{Acquired, Lease, LeaseError};

/// One instance's lease on the blob.
pub struct BlobLease {
    container: BlobContainerClient,
    blob: BlobClient,
    describe: String,
    lease_id: String,
    duration_secs: i32,
    ensured: AtomicBool,
}

impl fmt::Debug for BlobLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlobLease")
            .field("blob", &self.describe)
            .field("lease_id", &self.lease_id)
            .finish_non_exhaustive()
    }
}

impl BlobLease {
    /// A lease of `duration` (15 to 60 whole seconds) on `location`, under a lease id of
    /// this instance's own; calls give up after `call_timeout` (one quick retry within).
    pub fn new(
        location: &BlobLocation,
        duration: Duration,
        call_timeout: Duration,
    ) -> Result<Self, BlobConfigError> {
        let secs = duration.as_secs();
        if !(15..=60).contains(&secs) || duration.subsec_nanos() != 0 {
            return Err(config_err(
                "lease",
                format!(
                    "a blob lease lasts 15 to 60 whole seconds, not {} ms",
                    duration.as_millis()
                ),
            ));
        }
        let mut options = ClientOptions {
            retry: RetryOptions::fixed(FixedRetryOptions {
                delay: Duration::from_millis(200).try_into().unwrap_or_default(),
                max_retries: 1,
                max_total_elapsed: call_timeout.try_into().unwrap_or_default(),
            }),
            transport: Some(transport(&location.trust)?),
            ..Default::default()
        };
        let credential = match &location.auth {
            BlobAuth::SharedKey { account, key } => {
                options.per_try_policies.push(Arc::new(SharedKeyPolicy {
                    account: account.clone(),
                    key: key.clone(),
                }));
                None
            }
            BlobAuth::Sas => None,
            BlobAuth::Entra(c) => Some(c.clone()),
        };
        let build = |e: azure_core::Error| config_err("lease blob URL", e.to_string());
        let container = BlobContainerClient::new(
            location.container_url.clone(),
            credential.clone(),
            Some(BlobContainerClientOptions {
                client_options: options.clone(),
                ..Default::default()
            }),
        )
        .map_err(build)?;
        let blob = BlobClient::new(
            location.blob_url(),
            credential,
            Some(BlobClientOptions {
                client_options: options,
                ..Default::default()
            }),
        )
        .map_err(build)?;
        Ok(Self {
            describe: format!("blob {}", redacted(&location.blob_url())),
            container,
            blob,
            lease_id: uuid::Uuid::new_v4().to_string(),
            duration_secs: secs as i32,
            ensured: AtomicBool::new(false),
        })
    }

    /// This instance's lease id.
    pub fn lease_id(&self) -> &str {
        &self.lease_id
    }

    /// Creates the container and the (empty) lease blob unless they exist.
    async fn ensure_blob(&self) -> Result<(), LeaseError> {
        match self.container.create(None).await {
            Ok(_) => tracing::info!(blob = %self.describe, "lease container created"),
            Err(e) if code(&e).as_deref() == Some("ContainerAlreadyExists") => {}
            Err(e) => return Err(classify(&e)),
        }
        let create = AppendBlobClientCreateOptions::default().if_not_exists();
        match self.blob.append_blob_client().create(Some(create)).await {
            Ok(_) => tracing::info!(blob = %self.describe, "lease blob created"),
            // Exists (409/412), possibly under someone's lease: either way, there.
            Err(e) if matches!(status(&e), Some(409 | 412)) => {}
            Err(e) => return Err(classify(&e)),
        }
        self.ensured.store(true, Ordering::Relaxed);
        Ok(())
    }

    async fn acquire_once(&self) -> azure_core::Result<()> {
        self.blob
            .acquire_lease(
                self.duration_secs,
                Some(BlobClientAcquireLeaseOptions {
                    proposed_lease_id: Some(self.lease_id.clone()),
                    ..Default::default()
                }),
            )
            .await
            .map(drop)
    }
}

fn status(e: &azure_core::Error) -> Option<u16> {
    e.http_status().map(u16::from)
}

fn code(e: &azure_core::Error) -> Option<String> {
    match e.kind() {
        ErrorKind::HttpResponse { error_code, .. } => error_code.clone(),
        _ => None,
    }
}

/// `e` and its causes, `: `-separated, each said once.
fn with_causes(e: &azure_core::Error) -> String {
    without_queries(&orderly_core::error::causes(e))
}

/// `text` with the query of every URL in it cut (a SAS token is a secret, and the
/// HTTP client's errors name the URL they failed on).
fn without_queries(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (before, url) = rest.split_at(at);
        out.push_str(before);
        let end = url
            .find(|c: char| c.is_whitespace() || matches!(c, ')' | '"' | '\''))
            .unwrap_or(url.len());
        let (url, after) = url.split_at(end);
        match url.find('?') {
            Some(q) => {
                out.push_str(&url[..q]);
                out.push_str("?(query hidden)");
            }
            None => out.push_str(url),
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

/// The service's answer as a lease error: auth and bad requests will not get better by
/// retrying; the rest may.
fn classify(e: &azure_core::Error) -> LeaseError {
    let what = match (status(e), code(e)) {
        (Some(s), Some(c)) => format!("HTTP {s} {c}"),
        (Some(s), None) => format!("HTTP {s}"),
        // No answer: the cause chain says why (refused, timed out, a certificate the
        // trust does not cover), which an operator needs more than "retry expired".
        _ => with_causes(e),
    };
    match status(e) {
        Some(400 | 401 | 403) => LeaseError::Misconfigured(what),
        _ => LeaseError::Unavailable(what),
    }
}

#[async_trait]
impl Lease for BlobLease {
    fn describe(&self) -> String {
        self.describe.clone()
    }

    async fn try_acquire(&self) -> Result<Acquired, LeaseError> {
        if !self.ensured.load(Ordering::Relaxed) {
            self.ensure_blob().await?;
        }
        match self.acquire_once().await {
            Ok(()) => Ok(Acquired::Yes(None)),
            Err(e) if code(&e).as_deref() == Some("LeaseAlreadyPresent") => {
                Ok(Acquired::HeldByOther)
            }
            Err(e) if status(&e) == Some(404) => {
                // Deleted under us: create it again next time.
                self.ensured.store(false, Ordering::Relaxed);
                Err(classify(&e))
            }
            Err(e) => Err(classify(&e)),
        }
    }

    async fn renew(&self) -> Result<(), LeaseError> {
        match self.blob.renew_lease(self.lease_id.clone(), None).await {
            Ok(_) => Ok(()),
            // 409: another lease id holds it, or the lease expired and was taken or
            // broken; 404: the blob is gone. Either way, not ours.
            Err(e) if matches!(status(&e), Some(409 | 404 | 412)) => {
                Err(LeaseError::Lost(classify(&e).to_string()))
            }
            Err(e) => Err(classify(&e)),
        }
    }

    async fn release(&self) -> Result<(), LeaseError> {
        match self.blob.release_lease(self.lease_id.clone(), None).await {
            Ok(_) => Ok(()),
            Err(e) if matches!(status(&e), Some(409 | 404 | 412)) => {
                Err(LeaseError::Lost(classify(&e).to_string()))
            }
            Err(e) => Err(classify(&e)),
        }
    }
}

#[cfg(test)]
mod redaction {
    #[test]
    fn a_sas_in_an_error_is_cut_from_every_url() {
        let text = "error sending request for url (https://a.blob.core.windows.net/c/leader?sv=1&sig=SECRET): refused; http://x/y ok";
        let cut = super::without_queries(text);
        assert!(!cut.contains("SECRET") && !cut.contains("sv=1"), "{cut}");
        assert!(
            cut.contains("https://a.blob.core.windows.net/c/leader?(query hidden)): refused"),
            "{cut}"
        );
        assert!(cut.ends_with("http://x/y ok"), "{cut}");
    }
}
