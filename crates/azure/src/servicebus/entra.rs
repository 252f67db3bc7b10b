//! Entra ID tokens for the Service Bus client. The `azservicebus` client speaks the
//! token credential trait of azure_core 0.25; `azure_identity` 1.x (workload and
//! managed identity) implements azure_core 1.x's. [`Bridged`] hands the second's tokens
//! to the first, and does two things the pair would otherwise get wrong:
//!
//! - **Renewal before expiry.** The client puts a new token on a link when the old one
//!   *expires*, not before; `azure_identity` renews a cached token only in its last
//!   five minutes. The token is handed over with an expiry [`EARLY`] (at most half its
//!   remaining life) before the real one: the client's renewal then comes while the
//!   old token still holds, and inside the window where the identity fetches a new one.
//! - **Errors a deployer can act on.** A failed token request is logged when it starts
//!   failing or its cause changes (with the cause: the token exchange's AADSTS code and
//!   text, a missing variable, a refused certificate), and once when it works again;
//!   the client's own error carries the same text.

use azure_core::credentials::TokenCredential;
use azure_core_sb::credentials::{
    AccessToken as SbAccessToken, TokenCredential as SbTokenCredential,
    TokenRequestOptions as SbTokenRequestOptions,
};
use std::sync::{Arc, Mutex};
use time::{Duration, OffsetDateTime};

/// How long before its real expiry a token is handed over as expiring.
pub(super) const EARLY: Duration = Duration::minutes(4);

/// An azure_core 1.x credential as the Service Bus client's.
pub(super) struct Bridged {
    inner: Arc<dyn TokenCredential>,
    /// What the credential is (for the log and errors).
    source: String,
    /// The cause of the last failure, while failing.
    failing: Mutex<Option<String>>,
}

impl std::fmt::Debug for Bridged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bridged")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl Bridged {
    pub(super) fn new(inner: Arc<dyn TokenCredential>, source: String) -> Arc<Self> {
        Arc::new(Self {
            inner,
            source,
            failing: Mutex::new(None),
        })
    }

    /// Records the outcome of a token request; logs only a change.
    fn record(&self, outcome: Result<(), &str>) {
        let mut failing = self.failing.lock().unwrap_or_else(|e| e.into_inner());
        match (outcome, failing.as_deref()) {
            (Ok(()), Some(_)) => {
                tracing::info!(credential = %self.source, "Service Bus: Entra ID token obtained again");
                *failing = None;
            }
            (Err(cause), last) if last != Some(cause) => {
                tracing::warn!(credential = %self.source, cause, "Service Bus: cannot get an Entra ID token");
                *failing = Some(cause.to_owned());
            }
            (Err(cause), _) => {
                tracing::debug!(credential = %self.source, cause, "Service Bus: still no Entra ID token");
            }
            (Ok(()), None) => {}
        }
    }
}

/// The expiry the client is told for a token that really expires at `expires_on`.
pub(super) fn told_expiry(expires_on: OffsetDateTime, now: OffsetDateTime) -> OffsetDateTime {
    let left = expires_on - now;
    if left <= Duration::ZERO {
        return expires_on;
    }
    expires_on - EARLY.min(left / 2)
}

#[async_trait::async_trait]
impl SbTokenCredential for Bridged {
    async fn get_token(
        &self,
        scopes: &[&str],
        _options: Option<SbTokenRequestOptions>,
    ) -> azure_core_sb::Result<SbAccessToken> {
        match self.inner.get_token(scopes, None).await {
            Ok(token) => {
                self.record(Ok(()));
                Ok(SbAccessToken::new(
                    token.token.secret().to_owned(),
                    told_expiry(token.expires_on, OffsetDateTime::now_utc()),
                ))
            }
            Err(e) => {
                let cause = orderly_core::error::causes(&e);
                self.record(Err(&cause));
                Err(azure_core_sb::Error::message(
                    azure_core_sb::error::ErrorKind::Credential,
                    format!(
                        "cannot get an Entra ID token for Service Bus from {}: {cause}",
                        self.source
                    ),
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use azure_core::credentials::{AccessToken, TokenRequestOptions};
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn a_token_is_told_to_expire_early_by_at_most_half_its_life() {
        let now = OffsetDateTime::now_utc();
        let hour = now + Duration::hours(1);
        assert_eq!(told_expiry(hour, now), hour - Duration::minutes(4));
        let short = now + Duration::seconds(6);
        assert_eq!(told_expiry(short, now), now + Duration::seconds(3));
        let gone = now - Duration::seconds(1);
        assert_eq!(told_expiry(gone, now), gone);
    }

    /// A credential that fails its first `fails` requests, then answers.
    #[derive(Debug)]
    struct Flaky {
        fails: u32,
        calls: AtomicU32,
    }

    #[async_trait::async_trait]
    impl TokenCredential for Flaky {
        async fn get_token(
            &self,
            _scopes: &[&str],
            _options: Option<TokenRequestOptions<'_>>,
        ) -> azure_core::Result<AccessToken> {
            let n = self.calls.fetch_add(1, Ordering::SeqCst);
            if n < self.fails {
                return Err(azure_core::Error::with_message(
                    azure_core::error::ErrorKind::Credential,
                    "AADSTS70021: No matching federated identity record found",
                ));
            }
            Ok(AccessToken::new(
                "t0ken",
                OffsetDateTime::now_utc() + Duration::hours(1),
            ))
        }
    }

    #[tokio::test]
    async fn a_failure_names_the_source_and_the_cause_and_is_kept_until_it_works() {
        let bridged = Bridged::new(
            Arc::new(Flaky {
                fails: 2,
                calls: AtomicU32::new(0),
            }),
            "workload identity (client id abc)".into(),
        );
        let scopes = ["https://servicebus.azure.net/.default"];
        let e = bridged
            .get_token(&scopes, None)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("workload identity (client id abc)"), "{e}");
        assert!(e.contains("AADSTS70021"), "{e}");
        assert!(bridged.failing.lock().unwrap().is_some());
        bridged.get_token(&scopes, None).await.unwrap_err();
        let token = bridged.get_token(&scopes, None).await.unwrap();
        assert_eq!(token.token.secret(), "t0ken");
        assert!(bridged.failing.lock().unwrap().is_none());
        assert!(token.expires_on < OffsetDateTime::now_utc() + Duration::minutes(57));
    }
}
