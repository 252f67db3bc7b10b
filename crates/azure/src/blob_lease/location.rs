//! Where the lease blob is and how to authenticate to it: connection strings (with
//! Azurite's development account), SAS URLs and Entra ID credentials, each checked
//! with an error that names the setting and never echoes a secret.

use std::fmt;
use std::sync::Arc;

use azure_core::credentials::{Secret, TokenCredential};
use azure_core::http::Url;

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
    /// Whose certificates the https endpoint may present (the platform's roots by
    /// default; [`BlobLocation::with_trust`] adds a CA).
    pub trust: orderly_tls::Trust,
}

impl fmt::Debug for BlobLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlobLocation")
            .field("container", &redacted(&self.container_url))
            .field("blob", &self.blob)
            .field("auth", &self.auth)
            .field("trust", &self.trust)
            .finish()
    }
}

/// The URL without its query (a SAS is a secret).
pub(super) fn redacted(url: &Url) -> String {
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

pub(super) fn config_err(setting: &'static str, reason: impl Into<String>) -> BlobConfigError {
    BlobConfigError {
        setting,
        reason: reason.into(),
    }
}

pub(super) fn checked_names(container: &str, blob: &str) -> Result<(), BlobConfigError> {
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
            trust: orderly_tls::Trust::platform(),
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
            trust: orderly_tls::Trust::platform(),
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
            trust: orderly_tls::Trust::platform(),
        })
    }

    /// The same location, verifying its https endpoint against `trust`.
    pub fn with_trust(mut self, trust: orderly_tls::Trust) -> Self {
        self.trust = trust;
        self
    }

    pub(super) fn blob_url(&self) -> Url {
        let mut url = self.container_url.clone();
        if let Ok(mut segments) = url.path_segments_mut() {
            segments.pop_if_empty().push(&self.blob);
        }
        url
    }
}

pub(super) fn container_url(endpoint: &str, container: &str) -> Result<Url, String> {
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

/// The HTTP transport of Azure calls: the one client of [`orderly_tls`], over rustls
/// with `trust`.
pub(super) fn transport(
    trust: &orderly_tls::Trust,
) -> Result<azure_core::http::Transport, BlobConfigError> {
    let client = trust
        .http_client()
        .and_then(|b| {
            b.build()
                .map_err(|e| orderly_tls::Error::Setup(e.to_string()))
        })
        .map_err(|e| config_err("lease TLS", e.to_string()))?;
    Ok(azure_core::http::Transport::new(Arc::new(client)))
}

/// What a credential is told instead of the environment: each field left `None` is
/// read from its variable (`AZURE_TENANT_ID`, `AZURE_CLIENT_ID`,
/// `AZURE_FEDERATED_TOKEN_FILE`, `AZURE_AUTHORITY_HOST`), as the pods of workload
/// identity have them.
#[derive(Debug, Clone, Default)]
pub struct EntraIdentity {
    /// The directory (tenant) id.
    pub tenant_id: Option<String>,
    /// The client id of the identity (a user-assigned managed identity's, or the
    /// federated application's).
    pub client_id: Option<String>,
    /// The file the cluster writes the service account token to.
    pub token_file: Option<std::path::PathBuf>,
    /// Where tokens are asked for (Entra ID's login host of the cloud; https only).
    pub authority_host: Option<String>,
}

impl EntraSource {
    /// What the credential of this source is, for logs and errors: the kind and the
    /// client id (never a secret).
    pub fn describe(self, identity: &EntraIdentity) -> String {
        let client_id = identity
            .client_id
            .clone()
            .or_else(|| std::env::var("AZURE_CLIENT_ID").ok())
            .filter(|id| !id.is_empty());
        match (self, client_id) {
            (EntraSource::WorkloadIdentity, Some(id)) => {
                format!("workload identity (client id {id})")
            }
            (EntraSource::WorkloadIdentity, None) => {
                "workload identity (no AZURE_CLIENT_ID)".into()
            }
            (EntraSource::ManagedIdentity, Some(id)) => {
                format!("managed identity (client id {id})")
            }
            (EntraSource::ManagedIdentity, None) => {
                "the host's system-assigned managed identity".into()
            }
            (EntraSource::Developer, _) => "the developer's Azure CLI login".into(),
        }
    }
}

/// The token credential of `source`, with the identity's settings from the environment;
/// its token requests (to Entra ID or the host's identity endpoint) go over `trust`.
pub fn entra_credential(
    source: EntraSource,
    trust: &orderly_tls::Trust,
) -> Result<Arc<dyn TokenCredential>, BlobConfigError> {
    entra_credential_for(source, &EntraIdentity::default(), trust)
}

/// [`entra_credential`], told `identity` instead of what the environment says.
pub fn entra_credential_for(
    source: EntraSource,
    identity: &EntraIdentity,
    trust: &orderly_tls::Trust,
) -> Result<Arc<dyn TokenCredential>, BlobConfigError> {
    let failed = |e: azure_core::Error| config_err("Entra ID credential", e.to_string());
    let authority_host = identity
        .authority_host
        .clone()
        .or_else(|| std::env::var("AZURE_AUTHORITY_HOST").ok())
        .filter(|host| !host.is_empty());
    let client_options = azure_core::http::ClientOptions {
        transport: Some(transport(trust)?),
        cloud: authority_host.map(|host| {
            let mut custom = azure_core::cloud::CustomConfiguration::default();
            custom.authority_host = host;
            Arc::new(custom.into())
        }),
        ..Default::default()
    };
    Ok(match source {
        EntraSource::ManagedIdentity => {
            let options = azure_identity::ManagedIdentityCredentialOptions {
                user_assigned_id: identity
                    .client_id
                    .clone()
                    .or_else(|| std::env::var("AZURE_CLIENT_ID").ok())
                    .map(azure_identity::UserAssignedId::ClientId),
                client_options,
            };
            azure_identity::ManagedIdentityCredential::new(Some(options)).map_err(failed)?
        }
        EntraSource::WorkloadIdentity => azure_identity::WorkloadIdentityCredential::new(Some(
            azure_identity::WorkloadIdentityCredentialOptions {
                credential_options: azure_identity::ClientAssertionCredentialOptions {
                    client_options,
                },
                tenant_id: identity.tenant_id.clone(),
                client_id: identity.client_id.clone(),
                token_file_path: identity.token_file.clone(),
            },
        ))
            .map_err(|e| {
                config_err(
                    "Entra ID credential",
                    format!("workload identity needs AZURE_CLIENT_ID, AZURE_TENANT_ID and AZURE_FEDERATED_TOKEN_FILE (set by the cluster for a pod whose service account is annotated with the identity's client id): {e}"),
                )
            })?,
        EntraSource::Developer => azure_identity::DeveloperToolsCredential::new(None).map_err(failed)?,
    })
}
