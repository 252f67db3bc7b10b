//! orderly's one TLS stack, shared by every client in every binary: rustls with the
//! ring crypto provider, verifying servers against the platform's trust store (on
//! Linux the system bundle, which `SSL_CERT_FILE` / `SSL_CERT_DIR` replace) plus an
//! extra CA bundle named by `ORDERLY_CA_FILE` (a private CA, a TLS-inspecting proxy,
//! a test CA).
//!
//! It owns trust and the crypto provider, nothing else: no client here decides what
//! to connect to. HTTP clients take [`Trust::client_config`] (or, with the `http`
//! feature, [`Trust::http_client`]); the PostgreSQL driver takes the CA file itself
//! (`sslrootcert`), since sqlx builds its own rustls configuration.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::ClientConfig;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// The environment variable naming an extra CA bundle (PEM) to trust.
pub const CA_FILE_VAR: &str = "ORDERLY_CA_FILE";

/// Why the trust could not be set up. Each names the setting or file at fault.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The CA file could not be read.
    #[error("cannot read the CA bundle {path} ({CA_FILE_VAR}): {source}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The CA file holds no certificate, or one that does not parse.
    #[error("invalid CA bundle {path} ({CA_FILE_VAR}): {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The platform verifier or the HTTP client could not be built.
    #[error("cannot set up TLS: {0}")]
    Setup(String),
}

/// Installs ring as the process's rustls crypto provider, once; later calls (and a
/// provider another part of the process installed first) are fine.
pub fn install_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// What this process trusts: the platform's roots plus `extra`.
#[derive(Clone, Default)]
pub struct Trust {
    extra: Arc<Vec<CertificateDer<'static>>>,
    ca_file: Option<PathBuf>,
}

impl fmt::Debug for Trust {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Trust")
            .field("extra_roots", &self.extra.len())
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

impl Trust {
    /// The platform's roots plus the bundle `ORDERLY_CA_FILE` names, if set. Errors
    /// (unreadable or empty file) name the variable and the file.
    pub fn from_env() -> Result<Self, Error> {
        match std::env::var_os(CA_FILE_VAR).filter(|v| !v.is_empty()) {
            Some(path) => Self::with_ca_file(Path::new(&path)),
            None => Ok(Self::platform()),
        }
    }

    /// The platform's roots only.
    pub fn platform() -> Self {
        install_provider();
        Self::default()
    }

    /// The platform's roots plus every certificate of the PEM file at `path`.
    pub fn with_ca_file(path: &Path) -> Result<Self, Error> {
        let pem = std::fs::read(path).map_err(|source| Error::Unreadable {
            path: path.to_path_buf(),
            source,
        })?;
        let mut trust = Self::with_ca_pem(&pem).map_err(|reason| Error::Invalid {
            path: path.to_path_buf(),
            reason,
        })?;
        trust.ca_file = Some(path.to_path_buf());
        Ok(trust)
    }

    /// The platform's roots plus every certificate of `pem` (at least one).
    pub fn with_ca_pem(pem: &[u8]) -> Result<Self, String> {
        install_provider();
        let certs = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("not a PEM certificate bundle: {e}"))?;
        if certs.is_empty() {
            return Err("it holds no certificate (expected PEM `BEGIN CERTIFICATE` blocks)".into());
        }
        Ok(Self {
            extra: Arc::new(certs),
            ca_file: None,
        })
    }

    /// The CA file this trust was read from, for clients that load it themselves
    /// (PostgreSQL's `sslrootcert`).
    pub fn ca_file(&self) -> Option<&Path> {
        self.ca_file.as_deref()
    }

    /// How many certificates it trusts beyond the platform's.
    pub fn extra_roots(&self) -> usize {
        self.extra.len()
    }

    /// A rustls client configuration verifying servers against this trust.
    pub fn client_config(&self) -> Result<ClientConfig, Error> {
        install_provider();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = if self.extra.is_empty() {
            rustls_platform_verifier::Verifier::new(provider.clone())
        } else {
            rustls_platform_verifier::Verifier::new_with_extra_roots(
                self.extra.iter().cloned(),
                provider.clone(),
            )
        }
        .map_err(|e| Error::Setup(format!("the platform's certificate verifier: {e}")))?;
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Setup(e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier))
            .with_no_client_auth();
        Ok(config)
    }

    /// A `reqwest` client builder whose TLS is this trust's, and which follows no
    /// redirect: a redirect would resend a call's body and headers (its
    /// Idempotency-Key, a token) to wherever the answer points, and make that host's
    /// answer the call's. A 3xx is answered to the caller as it came.
    #[cfg(feature = "http")]
    pub fn http_client(&self) -> Result<reqwest::ClientBuilder, Error> {
        Ok(reqwest::Client::builder()
            .tls_backend_preconfigured(self.client_config()?)
            .redirect(reqwest::redirect::Policy::none()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_without_certificates_is_refused_naming_the_variable_and_file() {
        let dir = std::env::temp_dir().join(format!("orderly-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let e = Trust::with_ca_file(&empty).unwrap_err().to_string();
        assert!(e.contains(CA_FILE_VAR) && e.contains("empty.pem"), "{e}");
        assert!(e.contains("holds no certificate"), "{e}");
        let missing = dir.join("missing.pem");
        let e = Trust::with_ca_file(&missing).unwrap_err().to_string();
        assert!(
            e.contains("cannot read") && e.contains("missing.pem"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
