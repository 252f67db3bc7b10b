//! SharedKey request signing (the 1.x blob crate has none): a per-try pipeline policy
//! that signs every request, retries included.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use azure_core::credentials::Secret;
use azure_core::error::ErrorKind;
use azure_core::http::policies::{Policy, PolicyResult};
use azure_core::http::{Context, Request};

/// Signs each try with SharedKey (Authorization: SharedKey account:signature).
#[derive(Clone)]
pub(super) struct SharedKeyPolicy {
    pub(super) account: String,
    pub(super) key: Secret,
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
