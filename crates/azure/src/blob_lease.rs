//! The Azure Blob lease behind the supervisors' election, with `azure_storage_blob` 1.x.
//!
//! A dedicated blob (created with its container if missing, used for nothing else)
//! carries the lease. Every instance proposes its own lease id, so a second acquire by
//! another instance fails with 409 `LeaseAlreadyPresent` ("follower"). Lease calls get
//! a tight retry budget (one quick retry inside the call timeout) instead of the SDK's
//! default, which can spend about 80 s on a failing call; the elector wraps each call in
//! its own timeout as well, so a renewal can never outlive the lease.
//!
//! Authentication ([`BlobAuth`]): a storage connection string with an account key
//! (including `UseDevelopmentStorage=true` for Azurite), for which requests are signed
//! with SharedKey by a per-try policy of ours (the 1.x crate has no SharedKey support),
//! re-signed on every retry; a SAS URL; or an Entra ID token credential.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use azure_core::credentials::{Secret, TokenCredential};
use azure_core::error::ErrorKind;
use azure_core::http::policies::{Policy, PolicyResult};
use azure_core::http::{ClientOptions, Context, FixedRetryOptions, Request, RetryOptions, Url};
use azure_storage_blob::models::{AppendBlobClientCreateOptions, BlobClientAcquireLeaseOptions};
use azure_storage_blob::{
    BlobClient, BlobClientOptions, BlobContainerClient, BlobContainerClientOptions,
};
use orderly_core::leader::{Acquired, Lease, LeaseError};

/// Azurite's development account: public, documented by Microsoft, not a secret.
const DEV_ACCOUNT: &str = "devstoreaccount1";
const DEV_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
const DEV_ENDPOINT: &str = "http://127.0.0.1:10000/devstoreaccount1";

/// How lease requests authenticate.
#[derive(Clone)]
pub enum BlobAuth {
    /// Sign every request with the account key (SharedKey).
    SharedKey {
        /// The storage account's name.
        account: String,
        /// Its key, base64.
        key: Secret,
    },
    /// The container URL carries a SAS token.
    Sas,
    /// An Entra ID token (https only).
    Entra(Arc<dyn TokenCredential>),
}

impl fmt::Debug for BlobAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BlobAuth::SharedKey { account, .. } => write!(f, "SharedKey({account}, key hidden)"),
            BlobAuth::Sas => f.write_str("SAS"),
            BlobAuth::Entra(_) => f.write_str("Entra ID"),
        }
    }
}

/// Where the lease blob lives and how to reach it.
#[derive(Clone)]
pub struct BlobLocation {
    /// The container's URL (with its SAS query for [`BlobAuth::Sas`]).
    pub container_url: Url,
    /// The lease blob's name.
    pub blob: String,
    /// How requests authenticate.
    pub auth: BlobAuth,
}

impl fmt::Debug for BlobLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlobLocation")
            .field("container", &redacted(&self.container_url))
            .field("blob", &self.blob)
            .field("auth", &self.auth)
            .finish()
    }
}

/// The URL without its query (a SAS is a secret).
fn redacted(url: &Url) -> String {
    let mut u = url.clone();
    u.set_query(None);
    u.to_string()
}

/// A configuration problem, naming the setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {setting}: {reason}")]
pub struct BlobConfigError {
    /// The setting at fault.
    pub setting: &'static str,
    /// What is wrong (never the secret itself).
    pub reason: String,
}

fn config_err(setting: &'static str, reason: impl Into<String>) -> BlobConfigError {
    BlobConfigError {
        setting,
        reason: reason.into(),
    }
}

fn checked_names(container: &str, blob: &str) -> Result<(), BlobConfigError> {
    let ok_container = (3..=63).contains(&container.len())
        && container
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !container.starts_with('-')
        && !container.ends_with('-')
        && !container.contains("--");
    if !ok_container {
        return Err(config_err(
            "lease container",
            format!("{container:?} is not a container name (3-63 of a-z, 0-9, single '-')"),
        ));
    }
    if blob.is_empty() || blob.len() > 1024 || blob.contains(['?', '#']) {
        return Err(config_err(
            "lease blob",
            format!("{blob:?} is not a blob name"),
        ));
    }
    Ok(())
}

impl BlobLocation {
    /// From a storage connection string: `UseDevelopmentStorage=true` (Azurite), or
    /// `AccountName`/`AccountKey` with `BlobEndpoint` or `DefaultEndpointsProtocol` +
    /// `EndpointSuffix`, or `BlobEndpoint` + `SharedAccessSignature`.
    pub fn from_connection_string(
        connection_string: &str,
        container: &str,
        blob: &str,
    ) -> Result<Self, BlobConfigError> {
        const SETTING: &str = "lease storage connection string";
        checked_names(container, blob)?;
        let mut fields = std::collections::HashMap::new();
        for part in connection_string
            .split(';')
            .map(str::trim)
            .filter(|p| !p.is_empty())
        {
            let Some((k, v)) = part.split_once('=') else {
                return Err(config_err(
                    SETTING,
                    "expected Key=Value pairs separated by ';'",
                ));
            };
            fields.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
        let get = |k: &str| fields.get(k).map(String::as_str);
        let (endpoint, auth) =
            if get("usedevelopmentstorage").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
                let endpoint = match get("developmentstorageproxyuri") {
                    Some(proxy) => format!("{}/{DEV_ACCOUNT}", proxy.trim_end_matches('/')),
                    None => DEV_ENDPOINT.to_string(),
                };
                (
                    endpoint,
                    BlobAuth::SharedKey {
                        account: DEV_ACCOUNT.into(),
                        key: Secret::new(DEV_KEY),
                    },
                )
            } else if let Some(sas) = get("sharedaccesssignature") {
                let endpoint = get("blobendpoint").ok_or_else(|| {
                    config_err(SETTING, "a SharedAccessSignature needs a BlobEndpoint")
                })?;
                (
                    format!(
                        "{}?{}",
                        endpoint.trim_end_matches('/'),
                        sas.trim_start_matches('?')
                    ),
                    BlobAuth::Sas,
                )
            } else {
                let account = get("accountname")
                    .ok_or_else(|| config_err(SETTING, "AccountName is missing"))?;
                let key = get("accountkey")
                    .ok_or_else(|| config_err(SETTING, "AccountKey is missing"))?;
                if azure_core::base64::decode(key).is_err() {
                    return Err(config_err(SETTING, "AccountKey is not base64"));
                }
                let endpoint = match get("blobendpoint") {
                    Some(e) => e.trim_end_matches('/').to_string(),
                    None => format!(
                        "{}://{account}.blob.{}",
                        get("defaultendpointsprotocol").unwrap_or("https"),
                        get("endpointsuffix").unwrap_or("core.windows.net")
                    ),
                };
                (
                    endpoint,
                    BlobAuth::SharedKey {
                        account: account.to_string(),
                        key: Secret::new(key.to_string()),
                    },
                )
            };
        let container_url = container_url(&endpoint, container)
            .map_err(|e| config_err(SETTING, format!("the blob endpoint is not a URL: {e}")))?;
        Ok(Self {
            container_url,
            blob: blob.to_string(),
            auth,
        })
    }

    /// From a container URL carrying a SAS token (`https://acct.blob.core.windows.net/c?sv=...`).
    pub fn from_sas_url(sas_url: &str, blob: &str) -> Result<Self, BlobConfigError> {
        const SETTING: &str = "lease SAS URL";
        let url =
            Url::parse(sas_url).map_err(|e| config_err(SETTING, format!("not a URL: {e}")))?;
        if !url.query_pairs().any(|(k, _)| k == "sig") {
            return Err(config_err(
                SETTING,
                "the URL carries no SAS token (no sig=)",
            ));
        }
        let container = url
            .path_segments()
            .and_then(|mut s| s.rfind(|p| !p.is_empty()))
            .ok_or_else(|| config_err(SETTING, "the URL names no container"))?
            .to_string();
        checked_names(&container, blob)?;
        Ok(Self {
            container_url: url,
            blob: blob.to_string(),
            auth: BlobAuth::Sas,
        })
    }

    /// From an account's blob endpoint (`https://acct.blob.core.windows.net`) and an
    /// Entra ID credential.
    pub fn with_credential(
        account_url: &str,
        container: &str,
        blob: &str,
        credential: Arc<dyn TokenCredential>,
    ) -> Result<Self, BlobConfigError> {
        const SETTING: &str = "lease account URL";
        checked_names(container, blob)?;
        let url = container_url(account_url, container)
            .map_err(|e| config_err(SETTING, format!("not a URL: {e}")))?;
        if url.scheme() != "https" {
            return Err(config_err(
                SETTING,
                "Entra ID tokens are sent over https only",
            ));
        }
        Ok(Self {
            container_url: url,
            blob: blob.to_string(),
            auth: BlobAuth::Entra(credential),
        })
    }

    fn blob_url(&self) -> Url {
        let mut url = self.container_url.clone();
        if let Ok(mut segments) = url.path_segments_mut() {
            segments.pop_if_empty().push(&self.blob);
        }
        url
    }
}

fn container_url(endpoint: &str, container: &str) -> Result<Url, String> {
    let mut url = Url::parse(endpoint).map_err(|e| e.to_string())?;
    if url.cannot_be_a_base() {
        return Err(format!("{endpoint:?} cannot hold a path"));
    }
    let query = url.query().map(str::to_string);
    url.set_query(None);
    if let Ok(mut segments) = url.path_segments_mut() {
        segments.pop_if_empty().push(container);
    }
    url.set_query(query.as_deref());
    Ok(url)
}

/// Signs each try with SharedKey (Authorization: SharedKey account:signature).
#[derive(Clone)]
struct SharedKeyPolicy {
    account: String,
    key: Secret,
}

impl fmt::Debug for SharedKeyPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SharedKeyPolicy({})", self.account)
    }
}

/// The SharedKey string to sign for `request` (Blob service, version 2015-02-21 and
/// later): the verb, the standard headers in their fixed order (an empty
/// Content-Length when 0), the `x-ms-` headers sorted, then the resource with its
/// query parameters sorted.
pub(crate) fn string_to_sign(account: &str, request: &Request) -> String {
    let header = |name: &str| {
        request
            .headers()
            .iter()
            .find(|(k, _)| k.as_str().eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str().to_string())
            .unwrap_or_default()
    };
    let length = match request.body().len() {
        Some(0) | None => String::new(),
        Some(n) => n.to_string(),
    };
    let mut ms: Vec<(String, String)> = request
        .headers()
        .iter()
        .filter(|(k, _)| k.as_str().to_ascii_lowercase().starts_with("x-ms-"))
        .map(|(k, v)| {
            (
                k.as_str().to_ascii_lowercase(),
                v.as_str().split_whitespace().collect::<Vec<_>>().join(" "),
            )
        })
        .collect();
    ms.sort();
    let mut s = format!(
        "{}\n{}\n{}\n{}\n{}\n{}\n\n{}\n{}\n{}\n{}\n{}\n",
        request.method().as_ref(),
        header("content-encoding"),
        header("content-language"),
        length,
        header("content-md5"),
        header("content-type"),
        header("if-modified-since"),
        header("if-match"),
        header("if-none-match"),
        header("if-unmodified-since"),
        header("range"),
    );
    for (k, v) in &ms {
        s.push_str(k);
        s.push(':');
        s.push_str(v);
        s.push('\n');
    }
    s.push('/');
    s.push_str(account);
    s.push_str(request.url().path());
    let mut params: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for (k, v) in request.url().query_pairs() {
        params
            .entry(k.to_ascii_lowercase())
            .or_default()
            .push(v.into_owned());
    }
    for (k, mut vs) in params {
        vs.sort();
        s.push('\n');
        s.push_str(&k);
        s.push(':');
        s.push_str(&vs.join(","));
    }
    s
}

#[async_trait]
impl Policy for SharedKeyPolicy {
    async fn send(
        &self,
        ctx: &Context,
        request: &mut Request,
        next: &[Arc<dyn Policy>],
    ) -> PolicyResult {
        let now = azure_core::time::OffsetDateTime::now_utc();
        request.insert_header("x-ms-date", azure_core::time::to_rfc7231(&now));
        let signature =
            azure_core::hmac::hmac_sha256(&string_to_sign(&self.account, request), &self.key)?;
        request.insert_header(
            "authorization",
            format!("SharedKey {}:{signature}", self.account),
        );
        match next.split_first() {
            Some((first, rest)) => first.send(ctx, request, rest).await,
            None => Err(azure_core::Error::with_message(
                ErrorKind::Other,
                "SharedKeyPolicy must not be the last policy",
            )),
        }
    }
}

/// Where an Entra ID token comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntraSource {
    /// The host's managed identity (`AZURE_CLIENT_ID` picks a user-assigned one).
    ManagedIdentity,
    /// Kubernetes workload identity (`AZURE_CLIENT_ID`, `AZURE_TENANT_ID`,
    /// `AZURE_FEDERATED_TOKEN_FILE`).
    WorkloadIdentity,
    /// The developer's Azure CLI / Azure Developer CLI login.
    Developer,
}

/// The token credential of `source`.
pub fn entra_credential(source: EntraSource) -> Result<Arc<dyn TokenCredential>, BlobConfigError> {
    let failed = |e: azure_core::Error| config_err("lease credential", e.to_string());
    Ok(match source {
        EntraSource::ManagedIdentity => {
            let options = std::env::var("AZURE_CLIENT_ID").ok().map(|id| {
                azure_identity::ManagedIdentityCredentialOptions {
                    user_assigned_id: Some(azure_identity::UserAssignedId::ClientId(id)),
                    ..Default::default()
                }
            });
            azure_identity::ManagedIdentityCredential::new(options).map_err(failed)?
        }
        EntraSource::WorkloadIdentity => azure_identity::WorkloadIdentityCredential::new(None)
            .map_err(|e| {
                config_err(
                    "lease credential",
                    format!("workload identity needs AZURE_CLIENT_ID, AZURE_TENANT_ID and AZURE_FEDERATED_TOKEN_FILE: {e}"),
                )
            })?,
        EntraSource::Developer => azure_identity::DeveloperToolsCredential::new(None).map_err(failed)?,
    })
}

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

/// The service's answer as a lease error: auth and bad requests will not get better by
/// retrying; the rest may.
fn classify(e: &azure_core::Error) -> LeaseError {
    let what = match (status(e), code(e)) {
        (Some(s), Some(c)) => format!("HTTP {s} {c}"),
        (Some(s), None) => format!("HTTP {s}"),
        _ => e.to_string(),
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
mod tests {
    use super::*;

    #[test]
    fn connection_strings_give_the_endpoint_and_name_the_setting_when_wrong() {
        let dev =
            BlobLocation::from_connection_string("UseDevelopmentStorage=true", "leases", "leader")
                .unwrap();
        assert_eq!(
            dev.container_url.as_str(),
            "http://127.0.0.1:10000/devstoreaccount1/leases"
        );
        assert_eq!(
            dev.blob_url().as_str(),
            "http://127.0.0.1:10000/devstoreaccount1/leases/leader"
        );
        let prod = BlobLocation::from_connection_string(
            "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=a2V5;EndpointSuffix=core.windows.net",
            "leases",
            "leader",
        )
        .unwrap();
        assert_eq!(
            prod.container_url.as_str(),
            "https://acct.blob.core.windows.net/leases"
        );
        assert!(
            !format!("{prod:?}").contains("a2V5"),
            "the key is never printed"
        );
        let err = BlobLocation::from_connection_string("AccountName=acct", "leases", "leader")
            .unwrap_err();
        assert_eq!(err.setting, "lease storage connection string");
        assert!(err.reason.contains("AccountKey"));
        let err =
            BlobLocation::from_connection_string("UseDevelopmentStorage=true", "Bad_Name", "x")
                .unwrap_err();
        assert_eq!(err.setting, "lease container");
        let sas = BlobLocation::from_sas_url(
            "https://acct.blob.core.windows.net/leases?sv=2024&sig=abc",
            "leader",
        )
        .unwrap();
        assert_eq!(
            sas.blob_url().as_str(),
            "https://acct.blob.core.windows.net/leases/leader?sv=2024&sig=abc"
        );
        assert!(
            !format!("{sas:?}").contains("sig"),
            "the SAS is never printed"
        );
        assert_eq!(
            BlobLocation::from_sas_url("https://acct.blob.core.windows.net/leases", "leader")
                .unwrap_err()
                .setting,
            "lease SAS URL"
        );
    }

    #[test]
    fn the_string_to_sign_follows_the_shared_key_layout() {
        let url = Url::parse(
            "http://127.0.0.1:10000/devstoreaccount1/leases/leader?comp=lease&timeout=3",
        )
        .unwrap();
        let mut request = Request::new(url, azure_core::http::Method::Put);
        request.insert_header("x-ms-version", "2026-04-06");
        request.insert_header("x-ms-lease-action", "acquire");
        request.insert_header("x-ms-date", "Sun, 22 Nov 2026 21:00:00 GMT");
        request.insert_header("if-match", "\"etag\"");
        assert_eq!(
            string_to_sign("devstoreaccount1", &request),
            "PUT\n\n\n\n\n\n\n\n\"etag\"\n\n\n\n\
             x-ms-date:Sun, 22 Nov 2026 21:00:00 GMT\nx-ms-lease-action:acquire\nx-ms-version:2026-04-06\n\
             /devstoreaccount1/devstoreaccount1/leases/leader\ncomp:lease\ntimeout:3"
        );
    }

    #[test]
    fn a_blob_lease_outside_15_to_60_whole_seconds_is_refused() {
        let loc =
            BlobLocation::from_connection_string("UseDevelopmentStorage=true", "leases", "leader")
                .unwrap();
        for bad in [14_000, 61_000, 15_500] {
            let err = BlobLease::new(&loc, Duration::from_millis(bad), Duration::from_secs(3))
                .unwrap_err();
            assert_eq!(err.setting, "lease");
        }
        assert!(BlobLease::new(&loc, Duration::from_secs(15), Duration::from_secs(3)).is_ok());
    }
}
