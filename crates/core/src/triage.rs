//! Error orders grouped by cause, so an operator sees that 29 failures are three causes
//! and acts on one cause at once: orders are grouped by their workflow, the step they
//! failed at, and their last error with the ids and numbers stripped out.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::id::OrderId;
use crate::state::StateRow;

/// `error` with every word that carries a digit (ids, keys, numbers, codes) replaced
/// by `#`, and runs of spaces made one: two failures of the same cause read the same.
pub fn error_pattern(error: &str) -> String {
    let mut out = String::with_capacity(error.len());
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        if word.is_empty() {
            return;
        }
        if word.chars().any(|c| c.is_ascii_digit()) {
            if !out.ends_with('#') {
                out.push('#');
            }
        } else {
            out.push_str(word);
        }
        word.clear();
    };
    for c in error.chars() {
        if c.is_alphanumeric() || matches!(c, '-' | '_' | '.' | '@') {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            if c.is_whitespace() {
                if !out.ends_with(' ') && !out.is_empty() {
                    out.push(' ');
                }
            } else if !(c == '/' && out.ends_with('#')) {
                out.push(c);
            }
        }
    }
    flush(&mut word, &mut out);
    out.trim().to_owned()
}

/// What identifies a group: the workflow, the step the orders are at, the pattern.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct GroupKey {
    /// The workflow (`name@version`, or the name asked for).
    pub workflow: String,
    /// The step the orders failed at (their `current_step`).
    pub step: i32,
    /// Their last error as [`error_pattern`] reads it.
    pub pattern: String,
}

/// Error orders of one cause.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorGroup {
    /// What the orders share.
    pub key: GroupKey,
    /// The orders, oldest first.
    pub orders: Vec<OrderId>,
    /// One of their last errors, as written.
    pub example: String,
    /// When the oldest of them was created.
    pub first_seen: DateTime<Utc>,
    /// When the latest of them last changed (entered Error).
    pub last_seen: DateTime<Utc>,
}

impl ErrorGroup {
    /// How many orders.
    pub fn count(&self) -> usize {
        self.orders.len()
    }
}

/// One cause of Error orders as the store keeps it: the workflow and version the
/// orders run (as stored: `None` before they were pinned), the step they failed at and
/// the pattern of their last error.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct CauseKey {
    /// The workflow's name (`None`: the default, never started).
    pub workflow: Option<String>,
    /// The version the orders are pinned to.
    pub version: Option<String>,
    /// The step they failed at (their `current_step`).
    pub step: i32,
    /// Their last error as [`error_pattern`] reads it.
    pub pattern: String,
}

impl CauseKey {
    /// The key operators see and name a group by (as [`group_errors`] makes it).
    pub fn group_key(&self) -> GroupKey {
        GroupKey {
            workflow: crate::workflow::row_label(self.workflow.as_deref(), self.version.as_deref()),
            step: self.step,
            pattern: self.pattern.clone(),
        }
    }
}

/// How many Error orders one cause holds now, read from the store's index of causes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorCause {
    /// What the orders share.
    pub key: CauseKey,
    /// How many.
    pub count: u64,
    /// One of them: the smallest id.
    pub sample: OrderId,
    /// Its last error, as written.
    pub example: String,
    /// When the oldest of them was created.
    pub first_seen: DateTime<Utc>,
    /// When the latest of them last changed (entered Error).
    pub last_seen: DateTime<Utc>,
}

/// Groups Error orders by cause, largest group first (then by step, then pattern).
/// Rows in other states are left out.
pub fn group_errors(rows: &[StateRow]) -> Vec<ErrorGroup> {
    let mut groups: BTreeMap<GroupKey, ErrorGroup> = BTreeMap::new();
    for r in rows
        .iter()
        .filter(|r| r.process_state == crate::ProcessState::Error)
    {
        let error = r.last_error.clone().unwrap_or_default();
        let key = GroupKey {
            workflow: r.workflow_label(),
            step: r.current_step,
            pattern: error_pattern(&error),
        };
        let g = groups.entry(key.clone()).or_insert_with(|| ErrorGroup {
            key,
            orders: Vec::new(),
            example: error.clone(),
            first_seen: r.created_at,
            last_seen: r.updated_at,
        });
        g.orders.push(r.order_id.clone());
        g.first_seen = g.first_seen.min(r.created_at);
        g.last_seen = g.last_seen.max(r.updated_at);
    }
    let mut out: Vec<ErrorGroup> = groups.into_values().collect();
    out.sort_by(|a, b| b.count().cmp(&a.count()).then(a.key.cmp(&b.key)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_numbers_are_stripped_and_the_cause_kept() {
        let a = "step charge-payment failed: HTTP 422 Unprocessable Entity: charge-payment demo-1f2e3d4c-000017/0/charge-payment: declined";
        let b = "step charge-payment failed: HTTP 422 Unprocessable Entity: charge-payment demo-9a8b7c6d-000203/0/charge-payment: declined";
        assert_eq!(error_pattern(a), error_pattern(b));
        assert_eq!(
            error_pattern(a),
            "step charge-payment failed: HTTP # Unprocessable Entity: charge-payment #charge-payment: declined"
        );
        assert_ne!(
            error_pattern("step ship failed: HTTP 422: declined"),
            error_pattern("step charge-payment failed: HTTP 422: declined")
        );
        assert_eq!(
            error_pattern("order 550e8400-e29b-41d4-a716-446655440000 failed after 3   tries"),
            "order # failed after # tries"
        );
        assert_eq!(error_pattern(""), "");
    }
}
