//! Entra ID tokens as the PostgreSQL password: Azure Database for PostgreSQL takes an
//! access token for its scope in place of a password, from a role created for the
//! identity (`pgaadauth_create_principal`), over TLS. The store asks for one before it
//! connects and renews it before it expires (`orderly_sql`'s pools).

use std::sync::Arc;
use std::time::SystemTime;

use azure_core::credentials::TokenCredential;
use orderly_core::credentials::{Password, PasswordSource};

/// The scope of Azure Database for PostgreSQL's tokens.
pub const POSTGRES_SCOPE: &str = "https://ossrdbms-aad.database.windows.net/.default";

/// Passwords that are Entra ID tokens from `credential`.
#[derive(Debug)]
pub struct EntraPassword {
    credential: Arc<dyn TokenCredential>,
    source: String,
}

impl EntraPassword {
    /// Tokens of `credential`, described as `source` in logs and errors.
    pub fn new(credential: Arc<dyn TokenCredential>, source: impl Into<String>) -> Self {
        Self {
            credential,
            source: source.into(),
        }
    }
}

#[async_trait::async_trait]
impl PasswordSource for EntraPassword {
    async fn password(&self) -> Result<Password, String> {
        let token = self
            .credential
            .get_token(&[POSTGRES_SCOPE], None)
            .await
            .map_err(|e| format!("no Entra ID token: {}", orderly_core::error::causes(&e)))?;
        Ok(Password::new(
            token.token.secret(),
            SystemTime::from(token.expires_on),
        ))
    }

    fn describe(&self) -> String {
        self.source.clone()
    }
}
