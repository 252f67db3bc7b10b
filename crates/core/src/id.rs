//! Identifiers: orders, worker instances and the actors named in history.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::validation::ValidationError;

/// Longest order id accepted; ids are chosen by clients and stored in every table.
pub const MAX_ORDER_ID_LEN: usize = 64;

/// A client-chosen order id: 1 to 64 characters of `A-Z a-z 0-9 - _ . :`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct OrderId(String);

impl OrderId {
    /// Parses an order id, refusing empty, overlong or oddly-charactered ones.
    pub fn parse(raw: impl Into<String>) -> Result<Self, ValidationError> {
        let raw = raw.into();
        if raw.is_empty() {
            return Err(ValidationError::new("order_id", "must not be empty"));
        }
        if raw.len() > MAX_ORDER_ID_LEN {
            return Err(ValidationError::new(
                "order_id",
                format!(
                    "is {} characters long, the limit is {MAX_ORDER_ID_LEN}",
                    raw.len()
                ),
            ));
        }
        if let Some(bad) = raw
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || "-_.:".contains(*c)))
        {
            return Err(ValidationError::new(
                "order_id",
                format!("contains {bad:?}; allowed are letters, digits and - _ . :"),
            ));
        }
        Ok(Self(raw))
    }

    /// A fresh random order id (for samples and tests).
    pub fn random() -> Self {
        Self(uuid::Uuid::new_v4().to_string())
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for OrderId {
    type Error = ValidationError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(value)
    }
}

impl From<OrderId> for String {
    fn from(id: OrderId) -> Self {
        id.0
    }
}

impl fmt::Display for OrderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The id of one running worker instance; it goes into `locked_by` and every log line.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct InstanceId(String);

impl InstanceId {
    /// A unique id for this process: role, host, pid and a random part,
    /// e.g. `scheduler@web-1:4242:7f3a9c21`.
    pub fn generate(role: &str) -> Self {
        let host = std::env::var("HOSTNAME")
            .ok()
            .filter(|h| !h.is_empty())
            .or_else(|| {
                std::fs::read_to_string("/etc/hostname")
                    .ok()
                    .map(|h| h.trim().to_owned())
            })
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".to_owned());
        let random = uuid::Uuid::new_v4().simple().to_string();
        Self(format!(
            "{role}@{host}:{}:{}",
            std::process::id(),
            &random[..8]
        ))
    }

    /// Parses an instance id (1 to 200 printable characters).
    pub fn parse(raw: impl Into<String>) -> Result<Self, ValidationError> {
        let raw = raw.into();
        if raw.is_empty() || raw.len() > 200 || raw.chars().any(char::is_control) {
            return Err(ValidationError::new(
                "instance_id",
                "must be 1 to 200 printable characters",
            ));
        }
        Ok(Self(raw))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for InstanceId {
    type Error = ValidationError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(value)
    }
}

impl From<InstanceId> for String {
    fn from(id: InstanceId) -> Self {
        id.0
    }
}

impl fmt::Display for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Who caused a history event: a worker instance, an operator, or the client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Actor(String);

impl Actor {
    /// What starts an operator's name in an order's history. No instance id may start
    /// with it (the role binaries refuse such an `--instance-id`), so that the history
    /// tells an operator's hand from a worker's.
    pub const OPERATOR_PREFIX: &'static str = "operator:";

    /// A worker instance acting.
    pub fn instance(id: &InstanceId) -> Self {
        Self(id.as_str().to_owned())
    }

    /// A named operator acting by hand (CLI or dashboard).
    pub fn operator(name: &str) -> Self {
        Self(format!("{}{name}", Self::OPERATOR_PREFIX))
    }

    /// Whether it was named by [`Actor::operator`]: an operator acted, not a worker or
    /// the client.
    pub fn is_operator(&self) -> bool {
        self.0.starts_with(Self::OPERATOR_PREFIX)
    }

    /// Wraps a stored actor name.
    pub fn from_stored(raw: String) -> Self {
        Self(raw)
    }

    /// The actor as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Actor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_id_accepts_uuid_and_business_ids() {
        assert!(OrderId::parse(uuid::Uuid::new_v4().to_string()).is_ok());
        assert!(OrderId::parse("SO-2026.11:0042_a").is_ok());
    }

    #[test]
    fn order_id_refuses_empty_long_and_odd_characters() {
        assert_eq!(OrderId::parse("").unwrap_err().field, "order_id");
        assert!(
            OrderId::parse("x".repeat(65))
                .unwrap_err()
                .reason
                .contains("65")
        );
        assert!(OrderId::parse("a b").is_err());
        assert!(OrderId::parse("a'; drop table orders; --").is_err());
    }

    #[test]
    fn generated_instance_ids_are_unique_and_name_the_role() {
        let a = InstanceId::generate("scheduler");
        let b = InstanceId::generate("scheduler");
        assert_ne!(a, b);
        assert!(a.as_str().starts_with("scheduler@"));
    }
}
