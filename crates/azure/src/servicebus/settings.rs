//! How to reach a namespace ([`ServiceBusSettings`]) and who provisions its queues
//! ([`QueueAdmin`]).

use async_trait::async_trait;
use azure_core::credentials::TokenCredential;
use orderly_core::ValidationError;
use orderly_core::transport::{QueueName, QueueSettings, TransportError};
use std::sync::Arc;
use std::time::Duration;

/// How the client proves who it is to the namespace.
#[derive(Clone)]
pub enum ServiceBusAuth {
    /// `Endpoint=sb://...;SharedAccessKeyName=...;SharedAccessKey=...` (a secret:
    /// never printed).
    ConnectionString(String),
    /// Entra ID tokens (passwordless: workload or managed identity), for the namespace
    /// `namespace` (`<name>.servicebus.windows.net`). The identity needs a Service Bus
    /// data role: Sender to send, Receiver to receive, on the queues or the namespace.
    Entra {
        /// The namespace's host name.
        namespace: String,
        /// Where tokens come from ([`crate::entra_credential`]).
        credential: Arc<dyn TokenCredential>,
        /// What `credential` is, for errors and logs (never a secret).
        source: String,
    },
}

/// How to reach a Service Bus namespace.
#[derive(Clone)]
pub struct ServiceBusSettings {
    /// Who the client is to the namespace.
    pub auth: ServiceBusAuth,
    /// Plain AMQP without TLS, for local emulators and test stand-ins only.
    pub unsecured: bool,
    /// Timeout of one attempt of one call.
    pub try_timeout: Duration,
    /// Retries of a failed call.
    pub max_retries: u32,
    /// The most one broker call of several messages carries: a send is split into
    /// batches of at most this many bytes (the Standard tier's 256 KB by default;
    /// Premium's is 1 MB, set by `ORDERLY_SERVICEBUS_MAX_BATCH_BYTES`).
    pub max_batch_bytes: usize,
    /// The largest message (the Standard tier's 256 KB by default; Premium takes up to
    /// 100 MB, set by `ORDERLY_SERVICEBUS_MAX_MESSAGE_BYTES`). One over the batch limit
    /// but within this goes out alone.
    pub max_message_bytes: usize,
}

/// Service Bus Standard's limit of a message and of a batch.
pub const STANDARD_MAX_BATCH_BYTES: usize = 256 * 1024;

impl std::fmt::Debug for ServiceBusSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let auth = match &self.auth {
            ServiceBusAuth::ConnectionString(_) => "connection string <secret>".to_owned(),
            ServiceBusAuth::Entra {
                namespace, source, ..
            } => format!("Entra ID ({source}) on {namespace}"),
        };
        f.debug_struct("ServiceBusSettings")
            .field("auth", &auth)
            .field("unsecured", &self.unsecured)
            .field("try_timeout", &self.try_timeout)
            .field("max_retries", &self.max_retries)
            .field("max_batch_bytes", &self.max_batch_bytes)
            .field("max_message_bytes", &self.max_message_bytes)
            .finish()
    }
}

impl ServiceBusSettings {
    /// Settings for a connection string with the defaults this adapter needs.
    pub fn new(connection_string: impl Into<String>) -> Self {
        Self::with_auth(ServiceBusAuth::ConnectionString(connection_string.into()))
    }

    /// Settings for Entra ID tokens from `credential` (described by `source`) on the
    /// namespace `namespace` (`<name>.servicebus.windows.net`, or an `sb://` URL of it),
    /// with the defaults this adapter needs. Errors name `setting`.
    pub fn entra(
        namespace: &str,
        credential: Arc<dyn TokenCredential>,
        source: impl Into<String>,
        setting: &str,
    ) -> Result<Self, ValidationError> {
        let namespace = Self::check_namespace(namespace, setting)?;
        Ok(Self::with_auth(ServiceBusAuth::Entra {
            namespace,
            credential,
            source: source.into(),
        }))
    }

    /// The host name of the namespace `given` (a host, or an `sb://` URL of it); the
    /// error names `setting`, never the value (it may be a misplaced secret).
    pub fn check_namespace(given: &str, setting: &str) -> Result<String, ValidationError> {
        namespace_host(given).ok_or_else(|| {
            ValidationError::new(
                setting.to_owned(),
                "must be the namespace's host name, <name>.servicebus.windows.net (or sb://<name>.servicebus.windows.net/)",
            )
        })
    }

    /// `text` without the secrets of these settings (a connection string's key or
    /// signature; Entra ID tokens are never put in a text).
    pub(crate) fn redact(&self, text: &str) -> String {
        match &self.auth {
            ServiceBusAuth::ConnectionString(cs) => super::redact(text, cs),
            ServiceBusAuth::Entra { .. } => text.to_owned(),
        }
    }

    fn with_auth(auth: ServiceBusAuth) -> Self {
        Self {
            auth,
            unsecured: false,
            try_timeout: Duration::from_secs(10),
            max_retries: 2,
            max_batch_bytes: STANDARD_MAX_BATCH_BYTES,
            max_message_bytes: STANDARD_MAX_BATCH_BYTES,
        }
    }

    /// Settings from the environment: `ORDERLY_SERVICEBUS_CONNECTION` (required, a
    /// secret) and `ORDERLY_SERVICEBUS_UNSECURED` (`true` for plain AMQP to a local
    /// emulator; default `false`). Errors name the variable, never its value.
    pub fn from_env() -> Result<Self, ValidationError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// Checks that `connection` looks like a Service Bus connection string; the error
    /// names `setting`, never the value (it holds a secret).
    pub fn check_connection(connection: &str, setting: &str) -> Result<(), ValidationError> {
        let has = |key: &str| {
            connection
                .split(';')
                .any(|part| part.trim().starts_with(key))
        };
        if !has("Endpoint=sb://") || !(has("SharedAccessKey=") || has("SharedAccessSignature=")) {
            return Err(ValidationError::new(
                setting.to_owned(),
                "must look like Endpoint=sb://<namespace>/;SharedAccessKeyName=...;SharedAccessKey=... \
                 (the value is not shown: it holds a secret)",
            ));
        }
        Ok(())
    }

    fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, ValidationError> {
        const CONNECTION: &str = "ORDERLY_SERVICEBUS_CONNECTION";
        const UNSECURED: &str = "ORDERLY_SERVICEBUS_UNSECURED";
        let connection = var(CONNECTION)
            .filter(|c| !c.trim().is_empty())
            .ok_or_else(|| {
                ValidationError::new(
                    CONNECTION,
                    "is not set: give the namespace's connection string",
                )
            })?;
        Self::check_connection(&connection, CONNECTION)?;
        let unsecured = match var(UNSECURED).as_deref().map(str::trim) {
            None | Some("") | Some("false") => false,
            Some("true") => true,
            Some(_) => return Err(ValidationError::new(UNSECURED, "must be true or false")),
        };
        let bytes = |name: &'static str| match var(name).as_deref().map(str::trim) {
            None | Some("") => Ok(STANDARD_MAX_BATCH_BYTES),
            Some(raw) => raw
                .parse::<usize>()
                .ok()
                .filter(|n| (4096..=100 * 1024 * 1024).contains(n))
                .ok_or_else(|| {
                    ValidationError::new(name, "must be a number of bytes from 4096 to 104857600")
                }),
        };
        Ok(Self {
            unsecured,
            max_batch_bytes: bytes("ORDERLY_SERVICEBUS_MAX_BATCH_BYTES")?,
            max_message_bytes: bytes("ORDERLY_SERVICEBUS_MAX_MESSAGE_BYTES")?,
            ..Self::new(connection)
        })
    }
}

/// The host name of a namespace given as a host or as an `sb://host/` URL; `None` for
/// anything else (a path, a connection string, spaces).
fn namespace_host(given: &str) -> Option<String> {
    let given = given.trim();
    let host = given
        .strip_prefix("sb://")
        .map_or(given, |rest| rest.trim_end_matches('/'));
    let valid = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty() && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        });
    valid.then(|| host.to_ascii_lowercase())
}

/// Creates (or checks) queues with their settings.
#[async_trait]
pub trait QueueAdmin: Send + Sync {
    /// Makes `queue` exist with `settings`.
    async fn declare(
        &self,
        queue: &QueueName,
        settings: &QueueSettings,
    ) -> Result<(), TransportError>;

    /// Makes `queue` exist, leaving an existing one as it is where the admin can tell;
    /// returns whether it created it. By default the same as [`QueueAdmin::declare`].
    async fn ensure(
        &self,
        queue: &QueueName,
        settings: &QueueSettings,
    ) -> Result<bool, TransportError> {
        self.declare(queue, settings).await.map(|()| false)
    }
}

/// Queues provisioned outside orderly (the production case): `declare_queue` validates
/// the settings and otherwise trusts the infrastructure; a missing queue shows up as
/// `QueueNotFound` on first use.
#[derive(Debug, Default, Clone, Copy)]
pub struct Provisioned;

#[async_trait]
impl QueueAdmin for Provisioned {
    async fn declare(
        &self,
        _queue: &QueueName,
        _settings: &QueueSettings,
    ) -> Result<(), TransportError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::servicebus::redact;

    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    const GOOD: &str =
        "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=app;SharedAccessKey=s3cr3t=";

    #[test]
    fn settings_come_from_the_environment() {
        let s = ServiceBusSettings::from_vars(vars(&[("ORDERLY_SERVICEBUS_CONNECTION", GOOD)]))
            .unwrap();
        assert!(!s.unsecured);
        let s = ServiceBusSettings::from_vars(vars(&[
            ("ORDERLY_SERVICEBUS_CONNECTION", GOOD),
            ("ORDERLY_SERVICEBUS_UNSECURED", "true"),
        ]))
        .unwrap();
        assert!(s.unsecured);
    }

    #[test]
    fn a_namespace_is_a_host_name() {
        assert_eq!(
            namespace_host("ns.servicebus.windows.net").as_deref(),
            Some("ns.servicebus.windows.net")
        );
        assert_eq!(
            namespace_host(" sb://NS.servicebus.windows.net/ ").as_deref(),
            Some("ns.servicebus.windows.net")
        );
        assert_eq!(namespace_host("127.0.0.9").as_deref(), Some("127.0.0.9"));
        for bad in [
            "",
            "sb://",
            "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKey=x",
            "ns.servicebus.windows.net/queue",
            "ns..windows.net",
            "ns servicebus",
        ] {
            assert_eq!(namespace_host(bad), None, "{bad}");
        }
    }

    #[test]
    fn bad_settings_name_the_variable_and_never_show_the_secret() {
        let missing = ServiceBusSettings::from_vars(vars(&[])).unwrap_err();
        assert_eq!(missing.field, "ORDERLY_SERVICEBUS_CONNECTION");
        let odd = ServiceBusSettings::from_vars(vars(&[(
            "ORDERLY_SERVICEBUS_CONNECTION",
            "s3cr3t-garbage",
        )]))
        .unwrap_err();
        assert_eq!(odd.field, "ORDERLY_SERVICEBUS_CONNECTION");
        assert!(!odd.to_string().contains("s3cr3t"));
        let flag = ServiceBusSettings::from_vars(vars(&[
            ("ORDERLY_SERVICEBUS_CONNECTION", GOOD),
            ("ORDERLY_SERVICEBUS_UNSECURED", "yes"),
        ]))
        .unwrap_err();
        assert_eq!(flag.field, "ORDERLY_SERVICEBUS_UNSECURED");
        let s = ServiceBusSettings::new(GOOD);
        assert!(
            !format!("{s:?}").contains("s3cr3t"),
            "Debug hides the connection string"
        );
        assert_eq!(
            redact("failed for SharedAccessKey=s3cr3t=", GOOD),
            "failed for SharedAccessKey=<secret>"
        );
    }
}
