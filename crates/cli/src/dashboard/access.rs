//! Who uses the dashboard, when it is told: operators named in a file, each with a
//! role and a token of their own, or named by a trusted authenticating proxy in front
//! of it in the one header it is configured with (oauth2-proxy's `X-Forwarded-User` or
//! `X-Forwarded-Email`, Azure App Service Easy Auth's `X-MS-CLIENT-PRINCIPAL-NAME`),
//! believed only from the proxy's address and only when it holds exactly one name. An
//! action is then recorded under the name signed in, never the form's; an operator
//! with the `read` role sees every page and changes nothing.
//!
//! The file (`--operators-file` / `ORDERLY_DASHBOARD_OPERATORS_FILE`), one operator a
//! line, `#` comments:
//!
//! ```text
//! # name   role     token (at least 16 characters; `-`: only through the proxy)
//! alice    operate  3c1d8f0e6b2a47a9b5d4e0f1a2b3c4d5
//! bob      read     -
//! ```
//!
//! A name the proxy gives that the file does not list gets the `read` role.

use std::net::IpAddr;

use anyhow::{Context, bail};

/// What an operator may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Every page and every action.
    Operate,
    /// Every page, no action.
    Read,
}

/// One operator of the file.
#[derive(Clone)]
pub struct Operator {
    /// Recorded with their actions as `operator:NAME`.
    pub name: String,
    /// What they may do.
    pub role: Role,
    /// Their token, if they sign in with one.
    pub token: Option<String>,
}

impl std::fmt::Debug for Operator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Operator")
            .field("name", &self.name)
            .field("role", &self.role)
            .field("token", &self.token.as_ref().map(|_| "<secret>"))
            .finish()
    }
}

/// An authenticating proxy in front of the dashboard: its address, and the one header
/// in which it names the operator (whatever a client sends in any other header, or
/// from any other address, names nobody).
#[derive(Debug, Clone)]
pub struct Proxy {
    /// Requests from this address only are believed.
    pub address: IpAddr,
    /// The header the proxy sets (and overwrites) with the operator's name.
    pub header: axum::http::HeaderName,
}

impl Proxy {
    /// The proxy of the two settings, given both or neither (errors name them).
    pub fn from_settings(
        address: Option<IpAddr>,
        header: Option<&str>,
    ) -> anyhow::Result<Option<Self>> {
        const ADDRESS: &str = "--trusted-proxy / ORDERLY_DASHBOARD_TRUSTED_PROXY";
        const HEADER: &str = "--proxy-header / ORDERLY_DASHBOARD_PROXY_HEADER";
        match (address, header.map(str::trim)) {
            (None, None) => Ok(None),
            (Some(_), None) => bail!(
                "{ADDRESS} needs {HEADER}: the one header your proxy sets to the operator's \
                 name (X-Forwarded-User or X-Forwarded-Email for oauth2-proxy, \
                 X-MS-CLIENT-PRINCIPAL-NAME for App Service Easy Auth)"
            ),
            (None, Some(_)) => {
                bail!("{HEADER} is set without {ADDRESS}: say which address the proxy calls from")
            }
            (Some(address), Some(header)) => {
                let header =
                    axum::http::HeaderName::from_bytes(header.as_bytes()).map_err(|_| {
                        anyhow::anyhow!("invalid {HEADER}: {header:?} is not a header name")
                    })?;
                if [
                    axum::http::header::HOST,
                    axum::http::header::COOKIE,
                    axum::http::header::AUTHORIZATION,
                    axum::http::header::ORIGIN,
                ]
                .contains(&header)
                {
                    bail!("invalid {HEADER}: {header} is not an identity header");
                }
                Ok(Some(Self { address, header }))
            }
        }
    }
}

/// Who may use the dashboard (empty: anyone who has the shared token, or anyone on
/// loopback, naming themselves in the forms, as before operators were configured).
#[derive(Debug, Clone, Default)]
pub struct Access {
    /// The operators of the file.
    pub operators: Vec<Operator>,
    /// The authenticating proxy whose identity header is believed.
    pub proxy: Option<Proxy>,
}

impl Access {
    /// Whether operators are identified (then every request must say who it is).
    pub fn identifies(&self) -> bool {
        !self.operators.is_empty() || self.proxy.is_some()
    }

    /// Reads the operators file `path` (errors name the setting and the line, never a
    /// token).
    pub fn from_file(path: &std::path::Path, proxy: Option<Proxy>) -> anyhow::Result<Self> {
        const SETTING: &str = "--operators-file / ORDERLY_DASHBOARD_OPERATORS_FILE";
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {SETTING} {}", path.display()))?;
        let mut operators: Vec<Operator> = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [name, role, token] = fields[..] else {
                bail!(
                    "invalid {SETTING}, line {}: expected NAME ROLE TOKEN",
                    n + 1
                );
            };
            if !valid_name(name) {
                bail!(
                    "invalid {SETTING}, line {}: a name is 1 to 64 ASCII letters, digits, '-', '_', '.' or '@'",
                    n + 1
                );
            }
            let role = match role {
                "operate" => Role::Operate,
                "read" => Role::Read,
                _ => bail!(
                    "invalid {SETTING}, line {}: the role is operate or read",
                    n + 1
                ),
            };
            let token = match token {
                "-" => None,
                t if t.len() >= 16 => Some(t.to_owned()),
                _ => bail!(
                    "invalid {SETTING}, line {}: a token has at least 16 characters (the value is not shown)",
                    n + 1
                ),
            };
            if operators.iter().any(|o| o.name == name) {
                bail!("invalid {SETTING}, line {}: {name} is listed twice", n + 1);
            }
            if token.is_some() && operators.iter().any(|o| o.token == token) {
                bail!(
                    "invalid {SETTING}, line {}: two operators share a token",
                    n + 1
                );
            }
            operators.push(Operator {
                name: name.to_owned(),
                role,
                token,
            });
        }
        if operators.is_empty() && proxy.is_none() {
            bail!("invalid {SETTING}: it lists no operator");
        }
        Ok(Self { operators, proxy })
    }

    /// The operator whose token this is.
    pub fn by_token(&self, token: &str) -> Option<&Operator> {
        // Every token is compared, so the time taken does not say which was close.
        let mut found = None;
        for o in &self.operators {
            if o.token
                .as_deref()
                .is_some_and(|t| super::auth::same(t, token))
            {
                found = Some(o);
            }
        }
        found
    }

    /// The role of a name the proxy gives (`read` unless the file says otherwise).
    pub fn role_of(&self, name: &str) -> Role {
        self.operators
            .iter()
            .find(|o| o.name == name)
            .map_or(Role::Read, |o| o.role)
    }
}

/// An operator's name as the audit trail keeps it: 1 to 64 ASCII letters, digits,
/// `-`, `_`, `.` or `@` (so it reads the same in a header, a form, a log and the
/// history).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operators_file_is_read_and_a_bad_line_is_named_without_its_token() {
        let dir =
            std::env::temp_dir().join(format!("orderly-ops-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("operators");
        std::fs::write(
            &file,
            "# who\nalice operate 0123456789abcdef0123\nbob read -  # via the proxy\n",
        )
        .unwrap();
        let a = Access::from_file(&file, None).unwrap();
        assert_eq!(a.by_token("0123456789abcdef0123").unwrap().name, "alice");
        assert!(a.by_token("0123456789abcdef0124").is_none());
        assert_eq!(a.role_of("bob"), Role::Read);
        assert_eq!(a.role_of("carol"), Role::Read);
        assert!(!format!("{a:?}").contains("0123456789abcdef"));
        for (text, says) in [
            ("alice admin 0123456789abcdef0123\n", "line 1: the role"),
            ("alice operate short-secret\n", "at least 16"),
            ("alice operate\n", "NAME ROLE TOKEN"),
            ("al ice operate 0123456789abcdef0123 x\n", "NAME ROLE TOKEN"),
            ("a<b> operate 0123456789abcdef0123\n", "a name is"),
            ("jos\u{e9} operate 0123456789abcdef0123\n", "a name is"),
        ] {
            std::fs::write(&file, text).unwrap();
            let e = Access::from_file(&file, None).unwrap_err().to_string();
            assert!(
                e.contains(says) && e.contains("ORDERLY_DASHBOARD_OPERATORS_FILE"),
                "{text}: {e}"
            );
            assert!(!e.contains("short-secret"), "{e}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
