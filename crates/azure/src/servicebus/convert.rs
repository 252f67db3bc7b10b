//! Between Service Bus and orderly: errors classified as transport errors, messages
//! converted both ways, batches packed within the size limit, and calls bounded.

use azservicebus::ServiceBusMessage;
use chrono::{DateTime, Utc};
use fe2o3_amqp_types::messaging::ApplicationProperties;
use fe2o3_amqp_types::primitives::{OrderedMap, SimpleValue};
use orderly_core::ValidationError;
use orderly_core::transport::{OutgoingMessage, QueueName, TransportError};
use std::collections::BTreeMap;
use std::time::Duration;

/// A Service Bus failure, worded so that an operator looks at Service Bus.
pub(super) fn unavailable(
    queue: Option<&QueueName>,
    what: impl std::fmt::Display,
) -> TransportError {
    let text = match queue {
        Some(q) => format!("Service Bus unavailable (queue {q}): {what}"),
        None => format!("Service Bus unavailable: {what}"),
    };
    TransportError::Unavailable(text.into())
}

/// The client reports a refused link or a lost lock only in its error text.
pub(super) fn classify<E>(e: E, queue: &QueueName, message_id: Option<&str>) -> TransportError
where
    E: std::error::Error + Send + Sync + 'static,
{
    tracing::debug!(queue = %queue, error = ?e, "Service Bus call failed");
    let text = format!("{e:?} {e}").to_lowercase();
    if let Some(message_id) = message_id
        && (text.contains("lock-lost")
            || text.contains("locklost")
            || text.contains("lock supplied is invalid"))
    {
        return TransportError::LockLost {
            queue: queue.clone(),
            message_id: message_id.to_owned(),
        };
    }
    if text.contains("not-found")
        || text.contains("notfound")
        || text.contains("could not be found")
    {
        return TransportError::QueueNotFound(queue.clone());
    }
    // Too large for the entity: sending it again never succeeds.
    if text.contains("messagesizeexceeded") || text.contains("message-size-exceeded") {
        return TransportError::Invalid(ValidationError::new(
            "message",
            format!(
                "refused by {queue} as too large ({e}); lower ORDERLY_SERVICEBUS_MAX_MESSAGE_BYTES and ORDERLY_SERVICEBUS_MAX_BATCH_BYTES to the entity's limits"
            ),
        ));
    }
    if text.contains("unauthorized-access")
        || text.contains("unauthorizedaccess")
        || text.contains("unauthorized access")
    {
        return unavailable(
            Some(queue),
            format!("access refused: {e}{}", access_hint(&text, queue)),
        );
    }
    unavailable(Some(queue), format!("{e}"))
}

/// What a deployer does about an access refusal whose (lower-case) text is `text`: the
/// role that carries the claim Service Bus asked for, or where the token went wrong.
fn access_hint(text: &str, queue: &QueueName) -> String {
    let role = [
        ("'send' claim", "Azure Service Bus Data Sender"),
        ("'listen' claim", "Azure Service Bus Data Receiver"),
        ("'manage' claim", "Azure Service Bus Data Owner"),
    ]
    .into_iter()
    .find_map(|(claim, role)| text.contains(claim).then_some(role));
    match role {
        Some(role) => format!(
            " (the identity needs the role \"{role}\" on queue {queue} or on the namespace; a new role assignment takes a few minutes to apply)"
        ),
        None if text.contains("expiredtoken") || text.contains("expired") => {
            " (the Entra ID token expired and no new one was put: see the log of the credential)"
                .to_owned()
        }
        None => String::new(),
    }
}

/// Whether a failure is only a wait that ran out (ours, or the client's own
/// try-timeout): it says nothing about the link, whose answer may have been lost by the
/// client itself (fe2o3-amqp 0.14 can drop a quick settlement on a loaded machine).
pub(super) fn timed_out(e: &TransportError) -> bool {
    let TransportError::Unavailable(source) = e else {
        return false;
    };
    let text = format!("{source:?} {source}").to_lowercase();
    text.contains("timeout elapsed") || text.contains("did not answer within")
}

/// Whether a failure's text says the connection or its session is gone (as opposed to
/// one link or one message): then the whole connection is rebuilt at once.
pub(super) fn connection_gone(e: &TransportError) -> bool {
    let TransportError::Unavailable(source) = e else {
        return false;
    };
    let text = format!("{source:?} {source}").to_lowercase();
    [
        "illegalsessionstate",
        "illegal session state",
        "expectimmediatedetach",
        "session",
        "connection",
        "broken pipe",
        "reset by peer",
        "closed",
        "io error",
        "cbs",
    ]
    .iter()
    .any(|needle| text.contains(needle))
}

/// Runs a network call with a time limit; a call that outlasts it is an error.
pub(super) async fn bounded<T, E>(
    limit: Duration,
    queue: &QueueName,
    what: &str,
    call: impl std::future::Future<Output = Result<T, E>>,
) -> Result<Result<T, E>, TransportError> {
    tokio::time::timeout(limit, call).await.map_err(|_| {
        unavailable(
            Some(queue),
            format!("{what} did not answer within {} ms", limit.as_millis()),
        )
    })
}

/// `text` with the secrets of `connection_string` blanked out: its shared access key,
/// or its shared access signature (whole, and its `sig=` value on its own, which is
/// what a client quotes back).
pub(super) fn redact(text: &str, connection_string: &str) -> String {
    let mut out = text.to_owned();
    for part in connection_string.split(';') {
        let part = part.trim();
        for name in ["SharedAccessKey=", "SharedAccessSignature="] {
            if let Some(secret) = part.strip_prefix(name).filter(|v| !v.is_empty()) {
                out = out.replace(secret, "<secret>");
                if let Some(sig) = secret
                    .split(['&', ' '])
                    .find_map(|kv| kv.strip_prefix("sig="))
                    .filter(|v| !v.is_empty())
                {
                    out = out.replace(sig, "<secret>");
                }
            }
        }
    }
    out
}

pub(super) fn to_offset(t: DateTime<Utc>) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(
        t.timestamp_nanos_opt().unwrap_or(0),
    ))
    .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

pub(super) fn from_offset(t: time::OffsetDateTime) -> DateTime<Utc> {
    DateTime::from_timestamp_nanos(i64::try_from(t.unix_timestamp_nanos()).unwrap_or(0))
}

pub(super) fn properties(p: Option<&ApplicationProperties>) -> BTreeMap<String, String> {
    p.map(|p| {
        p.0.iter()
            .filter_map(|(k, v)| match v {
                SimpleValue::String(s) => Some((k.clone(), s.clone())),
                _ => None,
            })
            .collect()
    })
    .unwrap_or_default()
}

/// A fraction in [0, 1) for jitter, without a random-number dependency.
pub(super) fn rand_fraction() -> f64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    f64::from(nanos % 1_000_000) / 1_000_000.0
}

/// What a message weighs on the wire, near enough to pack batches: its body, id,
/// correlation id and properties, and a fixed allowance for the AMQP framing of its
/// sections (header, properties, annotations) and its place in the batch.
pub fn wire_size(m: &OutgoingMessage) -> usize {
    const FRAMING: usize = 256;
    m.body.len()
        + m.message_id.len()
        + m.correlation_id.as_ref().map_or(0, String::len)
        + m.properties
            .iter()
            .map(|(k, v)| k.len() + v.len() + 8)
            .sum::<usize>()
        + FRAMING
}

/// Splits `messages` into consecutive batches of at most `max_batch` bytes each
/// ([`wire_size`]); a message over `max_batch` but within `max_message` goes in a batch
/// of its own (a broker call of one message is held to the message limit, not the
/// batch's). A message over `max_message` is refused, naming `queue`, the message and
/// the sizes, before anything is sent.
pub fn batches<'m>(
    queue: &QueueName,
    messages: &'m [OutgoingMessage],
    max_message: usize,
    max_batch: usize,
) -> Result<Vec<&'m [OutgoingMessage]>, TransportError> {
    let mut out = Vec::new();
    let (mut start, mut size) = (0, 0);
    for (i, m) in messages.iter().enumerate() {
        let w = wire_size(m);
        if w > max_message {
            return Err(ValidationError::new(
                "message",
                format!(
                    "{} is {w} bytes, over the {max_message} bytes a message to {queue} may have \
                     (ORDERLY_SERVICEBUS_MAX_MESSAGE_BYTES; Service Bus Standard allows 256 KB): nothing sent",
                    m.message_id
                ),
            )
            .into());
        }
        if i > start && size + w > max_batch {
            out.push(&messages[start..i]);
            (start, size) = (i, 0);
        }
        size += w;
    }
    if start < messages.len() {
        out.push(&messages[start..]);
    }
    Ok(out)
}

pub(super) fn to_service_bus(m: &OutgoingMessage) -> Result<ServiceBusMessage, TransportError> {
    let mut sb = ServiceBusMessage::new(m.body.clone());
    sb.set_message_id(m.message_id.clone()).map_err(|e| {
        TransportError::Invalid(ValidationError::new("message_id", format!("{e:?}")))
    })?;
    sb.set_correlation_id(m.correlation_id.clone());
    if !m.properties.is_empty() {
        let mut map = OrderedMap::new();
        for (k, v) in &m.properties {
            map.insert(k.clone(), SimpleValue::String(v.clone()));
        }
        *sb.application_properties_mut() = Some(ApplicationProperties(map));
    }
    if let Some(at) = m.scheduled_enqueue_time {
        sb.set_scheduled_enqueue_time(to_offset(at));
    }
    Ok(sb)
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn an_access_refusal_names_the_role_that_carries_the_claim() {
        let queue = orderly_core::transport::QueueName::parse("orders").unwrap();
        let refused = std::io::Error::other(
            "amqp:unauthorized-access: Unauthorized access. 'Send' claim(s) are required to perform this operation. Resource: 'sb://ns/orders'.",
        );
        let e = super::classify(refused, &queue, None).to_string();
        assert!(e.contains("access refused"), "{e}");
        assert!(
            e.contains("\"Azure Service Bus Data Sender\" on queue orders"),
            "{e}"
        );
        let refused = std::io::Error::other("Unauthorized access. 'Listen' claim(s) are required");
        let e = super::classify(refused, &queue, None).to_string();
        assert!(e.contains("Azure Service Bus Data Receiver"), "{e}");
        let expired =
            std::io::Error::other("amqp:unauthorized-access: ExpiredToken: The token is expired.");
        let e = super::classify(expired, &queue, None).to_string();
        assert!(e.contains("token expired"), "{e}");
    }

    #[test]
    fn a_key_or_a_signature_in_the_connection_string_never_shows() {
        let key = "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=Root;SharedAccessKey=k3yValue=";
        assert_eq!(
            redact("failed with k3yValue= in it", key),
            "failed with <secret> in it"
        );
        let sas = "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessSignature=SharedAccessSignature sr=amqp%3A%2F%2Fns&sig=s1gnatureValue%3D&se=1900000000&skn=Root";
        let text = "token SharedAccessSignature sr=amqp%3A%2F%2Fns&sig=s1gnatureValue%3D&se=1900000000&skn=Root refused; sig=s1gnatureValue%3D";
        let shown = redact(text, sas);
        assert!(!shown.contains("s1gnatureValue"), "{shown}");
        assert_eq!(redact("nothing secret", sas), "nothing secret");
    }
}

#[cfg(test)]
mod batch_tests {
    use super::{batches, wire_size};
    use orderly_core::transport::{OutgoingMessage, QueueName, TransportError};

    fn sized(id: &str, body: usize) -> OutgoingMessage {
        OutgoingMessage::new(id, vec![b'x'; body])
    }

    #[test]
    fn a_message_over_the_batch_limit_goes_alone_and_one_over_the_message_limit_is_refused() {
        let q = QueueName::parse("agent.payment").unwrap();
        let small = sized("s", 100);
        let w = wire_size(&small);
        // Premium-like: messages up to 10 KB, batches up to 3 small ones.
        let (max_message, max_batch) = (10_000, 3 * w);
        let messages = vec![
            small.clone(),
            small.clone(),
            sized("big", 5_000),
            small.clone(),
            small.clone(),
            small.clone(),
            small.clone(),
        ];
        let parts = batches(&q, &messages, max_message, max_batch).unwrap();
        let ids: Vec<Vec<&str>> = parts
            .iter()
            .map(|p| p.iter().map(|m| m.message_id.as_str()).collect())
            .collect();
        assert_eq!(
            ids,
            vec![vec!["s", "s"], vec!["big"], vec!["s", "s", "s"], vec!["s"]]
        );
        let too_big = vec![small, sized("huge", 20_000)];
        let e = batches(&q, &too_big, max_message, max_batch).unwrap_err();
        assert!(matches!(e, TransportError::Invalid(_)), "{e}");
        let text = e.to_string();
        assert!(
            text.contains("huge")
                && text.contains("ORDERLY_SERVICEBUS_MAX_MESSAGE_BYTES")
                && text.contains("10000"),
            "{text}"
        );
    }
}
