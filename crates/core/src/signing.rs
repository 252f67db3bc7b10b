//! The step requests and replies between schedulers and agents are signed with a key
//! kept in the state store, so that whoever may only send to a queue cannot have a
//! service called (a request names the order, the action and the details the agent
//! passes on) or redirect an order's notices and change its details for later steps
//! (a reply carries the context the scheduler goes on with). The roles read the key
//! from the store at start ([`crate::store::SchedulerStore::message_key`]); the first
//! role to ask creates it.
//!
//! The signature is an HMAC-SHA256 of the body, in the message's `orderly-signature`
//! property. A message without it, or with one that does not match, is dead-lettered
//! with the reason and never acted on.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::transport::{OutgoingMessage, ReceivedMessage};

/// The application property that carries a message's signature.
pub const SIGNATURE: &str = "orderly-signature";

/// The scheme prefix of a signature: HMAC-SHA256 of the body, hex.
const SCHEME: &str = "v1=";

/// The secret's length in bytes.
const LEN: usize = 32;

/// The key that signs and checks the messages of one deployment. Its `Debug` never
/// shows the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct MessageKey {
    secret: [u8; LEN],
}

impl std::fmt::Debug for MessageKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MessageKey(<secret>)")
    }
}

/// Why a received message's signature was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadSignature {
    /// No signature at all.
    #[error(
        "unsigned: no {SIGNATURE} property, so it was not sent by a scheduler or agent of this deployment"
    )]
    Missing,
    /// A signature that is not one this key made of this body.
    #[error(
        "bad signature: its body was not signed with this deployment's key (forged or altered on the way)"
    )]
    Mismatch,
}

impl MessageKey {
    /// A new random key (from the operating system's generator, through the thread's
    /// cryptographically secure one).
    #[must_use]
    pub fn generate() -> Self {
        use rand::Rng;
        let mut secret = [0u8; LEN];
        rand::rng().fill(&mut secret);
        Self { secret }
    }

    /// The key stored as hex by [`Self::to_hex`].
    ///
    /// # Errors
    /// A text that is not 64 hex digits (the stored key is damaged).
    pub fn from_hex(text: &str) -> Result<Self, String> {
        if text.len() != 2 * LEN {
            return Err(format!(
                "the stored message key has {} characters, not {}",
                text.len(),
                2 * LEN
            ));
        }
        let bytes = unhex(text).ok_or_else(|| "the stored message key is not hex".to_owned())?;
        let mut secret = [0u8; LEN];
        secret.copy_from_slice(&bytes);
        Ok(Self { secret })
    }

    /// The key as 64 hex digits, as stored.
    #[must_use]
    pub fn to_hex(&self) -> String {
        hex(&self.secret)
    }

    fn mac(&self, body: &[u8]) -> Hmac<Sha256> {
        // HMAC takes a key of any length: this cannot fail.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.secret)
            .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"));
        mac.update(body);
        mac
    }

    /// Signs `message`'s body (its [`SIGNATURE`] property).
    pub fn sign(&self, message: &mut OutgoingMessage) {
        let tag = self.mac(&message.body).finalize().into_bytes();
        message
            .properties
            .insert(SIGNATURE.to_owned(), format!("{SCHEME}{}", hex(&tag)));
    }

    /// Whether `message`'s body was signed with this key (compared in constant time).
    ///
    /// # Errors
    /// [`BadSignature`] saying what is wrong.
    pub fn check(&self, message: &ReceivedMessage) -> Result<(), BadSignature> {
        let signature = message
            .properties
            .get(SIGNATURE)
            .ok_or(BadSignature::Missing)?;
        let tag = signature
            .strip_prefix(SCHEME)
            .and_then(unhex)
            .ok_or(BadSignature::Mismatch)?;
        self.mac(&message.body)
            .verify_slice(&tag)
            .map_err(|_| BadSignature::Mismatch)
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(2 * bytes.len()), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    text.as_bytes()
        .chunks_exact(2)
        .map(|pair| {
            let s = std::str::from_utf8(pair).ok()?;
            u8::from_str_radix(s, 16).ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn received(m: &OutgoingMessage) -> ReceivedMessage {
        ReceivedMessage {
            queue: crate::transport::QueueName::parse("agent.payments").unwrap(),
            message_id: m.message_id.clone(),
            correlation_id: None,
            properties: m.properties.clone(),
            body: m.body.clone(),
            delivery_count: 1,
            enqueued_at: chrono::Utc::now(),
            locked_until: chrono::Utc::now(),
            lock_token: crate::transport::LockToken("t".into()),
            sequence_number: 1,
        }
    }

    #[test]
    fn a_signed_message_checks_and_an_altered_one_does_not() {
        let key = MessageKey::generate();
        let mut m = OutgoingMessage::new("m1", br#"{"order_id":"o-1"}"#.to_vec());
        key.sign(&mut m);
        assert_eq!(key.check(&received(&m)), Ok(()));

        let mut altered = received(&m);
        altered.body = br#"{"order_id":"o-2"}"#.to_vec();
        assert_eq!(key.check(&altered), Err(BadSignature::Mismatch));

        let other = MessageKey::generate();
        assert_eq!(other.check(&received(&m)), Err(BadSignature::Mismatch));

        let mut unsigned = received(&m);
        unsigned.properties.clear();
        assert_eq!(key.check(&unsigned), Err(BadSignature::Missing));

        let mut garbled = received(&m);
        garbled.properties.insert(SIGNATURE.into(), "v1=zz".into());
        assert_eq!(key.check(&garbled), Err(BadSignature::Mismatch));
    }

    #[test]
    fn the_key_round_trips_through_its_stored_form_and_never_shows() {
        let key = MessageKey::generate();
        let stored = key.to_hex();
        assert_eq!(stored.len(), 64);
        assert_eq!(MessageKey::from_hex(&stored), Ok(key.clone()));
        assert!(MessageKey::from_hex("abc").is_err());
        assert!(MessageKey::from_hex(&"g".repeat(64)).is_err());
        assert_eq!(format!("{key:?}"), "MessageKey(<secret>)");
        assert_ne!(MessageKey::generate(), key);
    }
}
