//! Passwords that change: an Entra ID access token used as the database password, as
//! Azure Database for PostgreSQL takes it (passwordless). The store asks a
//! [`PasswordSource`] for one before it connects and again before it expires; where
//! tokens come from (workload identity, a managed identity) is the Azure adapter's.

use std::time::SystemTime;

/// A password good for opening connections until `expires_at`.
#[derive(Clone)]
pub struct Password {
    secret: String,
    /// When it stops being accepted for a new connection.
    pub expires_at: SystemTime,
}

impl Password {
    /// `secret`, good until `expires_at`.
    pub fn new(secret: impl Into<String>, expires_at: SystemTime) -> Self {
        Self {
            secret: secret.into(),
            expires_at,
        }
    }

    /// The password itself (a secret: never log it).
    pub fn secret(&self) -> &str {
        &self.secret
    }
}

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Password")
            .field("secret", &"<secret>")
            .field("expires_at", &self.expires_at)
            .finish()
    }
}

/// Where a changing password comes from.
#[async_trait::async_trait]
pub trait PasswordSource: Send + Sync + std::fmt::Debug {
    /// A current password; the error says why there is none, with its cause (never a
    /// secret).
    async fn password(&self) -> Result<Password, String>;

    /// What the source is, for logs and errors (e.g. "workload identity (client id
    /// ...)"; never a secret).
    fn describe(&self) -> String;
}

/// When to ask for the next password, `now`, for one that expires at `expires_at`:
/// five minutes before (an identity's token cache renews in its last five minutes), or
/// half-way for one with less than ten minutes left; at once for one already gone.
pub fn renew_in(expires_at: SystemTime, now: SystemTime) -> std::time::Duration {
    const EARLY: std::time::Duration = std::time::Duration::from_secs(300);
    let left = expires_at.duration_since(now).unwrap_or_default();
    left - EARLY.min(left / 2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_password_is_renewed_before_it_expires() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert_eq!(
            renew_in(now + Duration::from_secs(3600), now),
            Duration::from_secs(3300)
        );
        assert_eq!(
            renew_in(now + Duration::from_secs(6), now),
            Duration::from_secs(3)
        );
        assert_eq!(renew_in(now - Duration::from_secs(1), now), Duration::ZERO);
    }

    #[test]
    fn a_password_never_shows() {
        let p = Password::new("t0ken", SystemTime::UNIX_EPOCH);
        assert!(!format!("{p:?}").contains("t0ken"));
        assert_eq!(p.secret(), "t0ken");
    }
}
