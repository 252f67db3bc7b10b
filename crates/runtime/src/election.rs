//! The supervisors' election settings (flags and `ORDERLY_LEASE_*` variables) and the
//! elector they build: the SQL lease row (embedded default) or an Azure blob lease.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use orderly_azure::{BlobLease, BlobLocation, EntraSource};
use orderly_core::InstanceId;
use orderly_core::leader::SUPERVISORS as LEADERSHIP;
use orderly_core::leader::{Elector, ElectorTiming};
use orderly_core::store::StateStore;

/// Which lease elects the leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ElectorKind {
    /// A lease row in the state store (the embedded default).
    Sql,
    /// A lease on an Azure blob (production).
    Blob,
}

/// How to get an Entra ID token (for the blob lease, Service Bus).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum CredentialKind {
    /// The managed identity of the host (`AZURE_CLIENT_ID` picks a user-assigned one).
    ManagedIdentity,
    /// Kubernetes workload identity (`AZURE_CLIENT_ID`, `AZURE_TENANT_ID`,
    /// `AZURE_FEDERATED_TOKEN_FILE`).
    #[default]
    WorkloadIdentity,
    /// The developer's Azure CLI / Azure Developer CLI login.
    Developer,
}

impl CredentialKind {
    /// The Azure adapters' name for it.
    pub fn source(self) -> EntraSource {
        match self {
            CredentialKind::ManagedIdentity => EntraSource::ManagedIdentity,
            CredentialKind::WorkloadIdentity => EntraSource::WorkloadIdentity,
            CredentialKind::Developer => EntraSource::Developer,
        }
    }
}

/// Election settings. Its `Debug` shows whether the lease's secrets are set, never them.
#[derive(Clone, clap::Args)]
pub struct ElectionArgs {
    /// Which lease elects the leader supervisor.
    #[arg(long, env = "ORDERLY_ELECTOR", value_enum, default_value = "sql")]
    pub elector: ElectorKind,
    /// How long a lease lasts from its acquire or renewal (blob: 15s to 60s, whole seconds).
    #[arg(long = "lease", env = "ORDERLY_LEASE", default_value = "30s", value_name = crate::settings::DURATION, value_parser = crate::duration)]
    pub lease_ms: Duration,
    /// Time between renewals.
    #[arg(long = "renew-interval", env = "ORDERLY_LEASE_RENEW_INTERVAL", default_value = "5s", value_name = crate::settings::DURATION, value_parser = crate::period)]
    pub renew_interval_ms: Duration,
    /// Time before the next renewal after a failed one.
    #[arg(long = "renew-retry", env = "ORDERLY_LEASE_RENEW_RETRY", default_value = "2s", value_name = crate::settings::DURATION, value_parser = crate::duration)]
    pub renew_retry_ms: Duration,
    /// Leader work stops this long after the send time of the last successful renewal; shorter than the lease.
    #[arg(long = "renew-deadline", env = "ORDERLY_LEASE_RENEW_DEADLINE", default_value = "20s", value_name = crate::settings::DURATION, value_parser = crate::duration)]
    pub renew_deadline_ms: Duration,
    /// Followers try to acquire this often (plus jitter).
    #[arg(long = "acquire-retry", env = "ORDERLY_LEASE_ACQUIRE_RETRY", default_value = "2s", value_name = crate::settings::DURATION, value_parser = crate::duration)]
    pub acquire_retry_ms: Duration,
    /// Up to this fraction of the acquire retry is added at random.
    #[arg(long, env = "ORDERLY_LEASE_ACQUIRE_JITTER", default_value_t = 0.2)]
    pub acquire_jitter: f64,
    /// Each lease call is abandoned after this long.
    #[arg(long = "lease-call-timeout", env = "ORDERLY_LEASE_CALL_TIMEOUT", default_value = "3s", value_name = crate::settings::DURATION, value_parser = crate::duration)]
    pub lease_call_timeout_ms: Duration,
    /// A leader task still running this long after its cancellation ends the process.
    #[arg(long = "leader-stop-grace", env = "ORDERLY_LEADER_STOP_GRACE", default_value = "3s", value_name = crate::settings::DURATION, value_parser = crate::duration)]
    pub leader_stop_grace_ms: Duration,
    /// A leader task whose heartbeat is older than this is wedged and loses the lease.
    #[arg(long = "leader-heartbeat-timeout", env = "ORDERLY_LEADER_HEARTBEAT_TIMEOUT", default_value = "15s", value_name = crate::settings::DURATION, value_parser = crate::duration)]
    pub leader_heartbeat_timeout_ms: Duration,
    /// Blob lease: a storage connection string (AccountName/AccountKey, UseDevelopmentStorage=true, or BlobEndpoint + SharedAccessSignature).
    #[arg(
        long,
        env = "ORDERLY_LEASE_STORAGE_CONNECTION_STRING",
        hide_env_values = true
    )]
    pub lease_storage_connection_string: Option<String>,
    /// Blob lease: a file holding the connection string (e.g. a mounted secret).
    #[arg(long, env = "ORDERLY_LEASE_STORAGE_CONNECTION_STRING_FILE")]
    pub lease_storage_connection_string_file: Option<PathBuf>,
    /// Blob lease: a container URL carrying a SAS token.
    #[arg(long, env = "ORDERLY_LEASE_SAS_URL", hide_env_values = true)]
    pub lease_sas_url: Option<String>,
    /// Blob lease with Entra ID: the account's blob endpoint, https://ACCOUNT.blob.core.windows.net.
    #[arg(long, env = "ORDERLY_LEASE_ACCOUNT_URL")]
    pub lease_account_url: Option<String>,
    /// Blob lease with Entra ID: where the token comes from.
    #[arg(
        long,
        env = "ORDERLY_LEASE_CREDENTIAL",
        value_enum,
        default_value = "managed-identity"
    )]
    pub lease_credential: CredentialKind,
    /// Blob lease: the container (created if missing).
    #[arg(
        long,
        env = "ORDERLY_LEASE_CONTAINER",
        default_value = "orderly-leases"
    )]
    pub lease_container: String,
    /// Blob lease: the blob (created if missing, used for nothing else).
    #[arg(long, env = "ORDERLY_LEASE_BLOB", default_value = "supervisor-leader")]
    pub lease_blob: String,
}

impl std::fmt::Debug for ElectionArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = |v: &Option<String>| v.as_ref().map(|_| "<set>");
        f.debug_struct("ElectionArgs")
            .field("elector", &self.elector)
            .field("lease", &self.lease_ms)
            .field("renew_interval", &self.renew_interval_ms)
            .field("renew_retry", &self.renew_retry_ms)
            .field("renew_deadline", &self.renew_deadline_ms)
            .field("acquire_retry", &self.acquire_retry_ms)
            .field("acquire_jitter", &self.acquire_jitter)
            .field("lease_call_timeout", &self.lease_call_timeout_ms)
            .field("leader_stop_grace", &self.leader_stop_grace_ms)
            .field(
                "leader_heartbeat_timeout",
                &self.leader_heartbeat_timeout_ms,
            )
            .field(
                "lease_storage_connection_string",
                &set(&self.lease_storage_connection_string),
            )
            .field(
                "lease_storage_connection_string_file",
                &self.lease_storage_connection_string_file,
            )
            .field("lease_sas_url", &set(&self.lease_sas_url))
            .field("lease_account_url", &self.lease_account_url)
            .field("lease_credential", &self.lease_credential)
            .field("lease_container", &self.lease_container)
            .field("lease_blob", &self.lease_blob)
            .finish()
    }
}

/// The flag and variable of each timing field, for error messages.
fn setting_name(field: &str) -> &'static str {
    match field {
        "lease" => "--lease / ORDERLY_LEASE",
        "renew_interval" => "--renew-interval / ORDERLY_LEASE_RENEW_INTERVAL",
        "renew_retry" => "--renew-retry / ORDERLY_LEASE_RENEW_RETRY",
        "renew_deadline" => "--renew-deadline / ORDERLY_LEASE_RENEW_DEADLINE",
        "retry" => "--acquire-retry / ORDERLY_LEASE_ACQUIRE_RETRY",
        "retry_jitter" => "--acquire-jitter / ORDERLY_LEASE_ACQUIRE_JITTER",
        "call_timeout" => "--lease-call-timeout / ORDERLY_LEASE_CALL_TIMEOUT",
        "stop_grace" => "--leader-stop-grace / ORDERLY_LEADER_STOP_GRACE",
        "heartbeat_timeout" => "--leader-heartbeat-timeout / ORDERLY_LEADER_HEARTBEAT_TIMEOUT",
        _ => "the election settings",
    }
}

impl ElectionArgs {
    /// The timing, validated for the chosen lease; errors name the setting.
    pub fn timing(&self) -> anyhow::Result<ElectorTiming> {
        let timing = ElectorTiming {
            lease: self.lease_ms,
            renew_interval: self.renew_interval_ms,
            renew_retry: self.renew_retry_ms,
            renew_deadline: self.renew_deadline_ms,
            retry: self.acquire_retry_ms,
            retry_jitter: self.acquire_jitter,
            call_timeout: self.lease_call_timeout_ms,
            stop_grace: self.leader_stop_grace_ms,
            heartbeat_timeout: self.leader_heartbeat_timeout_ms,
        };
        let checked = match self.elector {
            ElectorKind::Sql => timing.validate(),
            ElectorKind::Blob => timing.validate_for_blob(),
        };
        checked.map_err(|e| anyhow::anyhow!("invalid {}: {}", setting_name(&e.field), e.reason))?;
        Ok(timing)
    }

    fn blob_location(&self) -> anyhow::Result<BlobLocation> {
        let from_file = match &self.lease_storage_connection_string_file {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .with_context(|| {
                        format!(
                            "cannot read --lease-storage-connection-string-file / ORDERLY_LEASE_STORAGE_CONNECTION_STRING_FILE {}",
                            path.display()
                        )
                    })?
                    .trim()
                    .to_string(),
            ),
            None => None,
        };
        let given = [
            self.lease_storage_connection_string.is_some() || from_file.is_some(),
            self.lease_sas_url.is_some(),
            self.lease_account_url.is_some(),
        ];
        if given.iter().filter(|g| **g).count() != 1 {
            bail!(
                "--elector blob needs exactly one of ORDERLY_LEASE_STORAGE_CONNECTION_STRING (or _FILE), \
                 ORDERLY_LEASE_SAS_URL, ORDERLY_LEASE_ACCOUNT_URL"
            );
        }
        // The lease endpoint's certificate is checked against the platform's roots and
        // ORDERLY_CA_FILE, as every other client's.
        let trust = orderly_tls::Trust::from_env()?;
        let location = if let Some(cs) = self.lease_storage_connection_string.clone().or(from_file)
        {
            BlobLocation::from_connection_string(&cs, &self.lease_container, &self.lease_blob)?
        } else if let Some(sas) = &self.lease_sas_url {
            BlobLocation::from_sas_url(sas, &self.lease_blob)?
        } else {
            let url = self.lease_account_url.as_deref().unwrap_or_default();
            let credential =
                orderly_azure::entra_credential(self.lease_credential.source(), &trust)?;
            BlobLocation::with_credential(url, &self.lease_container, &self.lease_blob, credential)?
        };
        Ok(location.with_trust(trust))
    }

    /// Checks every election setting (and builds the blob lease's client), before
    /// anything connects anywhere.
    pub fn prepare(&self) -> anyhow::Result<PreparedElection> {
        let timing = self.timing()?;
        let blob = match self.elector {
            ElectorKind::Sql => None,
            ElectorKind::Blob => {
                let location = self.blob_location()?;
                Some(BlobLease::new(
                    &location,
                    timing.lease,
                    timing.call_timeout,
                )?)
            }
        };
        Ok(PreparedElection { timing, blob })
    }
}

/// Election settings that passed their checks.
#[derive(Debug)]
pub struct PreparedElection {
    timing: ElectorTiming,
    blob: Option<BlobLease>,
}

impl PreparedElection {
    /// The elector for `instance`, its terms kept in `store`.
    pub fn elector(
        self,
        store: Arc<dyn StateStore>,
        instance: InstanceId,
    ) -> anyhow::Result<Elector> {
        match self.blob {
            None => Ok(orderly_core::leader::sql_elector(
                LEADERSHIP,
                store,
                instance,
                self.timing,
            )?),
            Some(lease) => Ok(Elector::new(
                LEADERSHIP,
                instance,
                Arc::new(lease),
                store,
                self.timing,
            )?),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ElectionArgs;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        election: ElectionArgs,
    }

    #[test]
    fn the_debug_form_says_a_lease_secret_is_set_without_showing_it() {
        let cli = Cli::parse_from([
            "x",
            "--lease-storage-connection-string",
            "AccountName=a;AccountKey=s3cr3tKey==",
            "--lease-sas-url",
            "https://a.blob.core.windows.net/c?sv=1&sig=s3cr3tSig",
        ]);
        let shown = format!("{:?}", cli.election);
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert!(shown.contains("lease_sas_url: Some(\"<set>\")"), "{shown}");
    }
}
