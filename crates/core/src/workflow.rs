//! Workflows are declared, not hard-coded: an ordered list of steps, each with the
//! agent queue that runs it, its time budget, its retry policy and an optional
//! compensating step. The scheduler reads them from configuration; agents learn a
//! step's budget and retry policy from each request.
//!
//! Every workflow has a *version*: a hash of what it means (its name, steps, queues,
//! budgets, retry policies and compensations; not the file's layout or comments). An
//! order is pinned to the version it started under ([`WorkflowRef`]) and runs on it to
//! the end, so a deployment can change a workflow while orders are in flight: a
//! scheduler applies only versions it has loaded ([`Workflows`]) and leaves the other
//! orders to schedulers that have.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::transport::QueueName;
use crate::validation::ValidationError;

mod steps;
mod versions;

pub use steps::*;
pub use versions::*;

/// Longest step name accepted (keeps idempotency keys and message ids short).
pub const MAX_STEP_NAME_LEN: usize = 40;
/// Most steps one workflow may have.
pub const MAX_STEPS: usize = 32;

/// An ordered list of steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workflow {
    /// Its name: what an order message asks for, and half of the reference an order
    /// is pinned to.
    pub name: String,
    /// The steps, run in this order.
    pub steps: Vec<StepDef>,
    /// On a permanent failure, undo the completed steps (in reverse order) before the
    /// order ends in Error.
    #[serde(default = "yes")]
    pub compensate_on_error: bool,
}

fn yes() -> bool {
    true
}

fn is_true(value: &bool) -> bool {
    *value
}

impl Default for Workflow {
    /// The order workflow: reserve-inventory, charge-payment, ship; release-inventory
    /// and refund undo the first two.
    fn default() -> Self {
        let step = |name: &str, queue: &str, compensation: Option<&str>| StepDef {
            name: name.to_owned(),
            queue: QueueName::parse(queue).unwrap_or_else(|_| unreachable_queue()),
            timeout_ms: 10_000,
            retry: RetryPolicy::default(),
            compensation: compensation.map(str::to_owned),
            undo_needed: true,
            probe: None,
        };
        Self {
            name: "order".to_owned(),
            steps: vec![
                step(
                    "reserve-inventory",
                    "agent.inventory",
                    Some("release-inventory"),
                ),
                step("charge-payment", "agent.payment", Some("refund")),
                step("ship", "agent.shipping", None),
            ],
            compensate_on_error: true,
        }
    }
}

fn unreachable_queue() -> QueueName {
    // The literal names above are valid; this only satisfies the type.
    QueueName::parse("agent").unwrap_or_else(|_| unreachable!("literal queue name"))
}

impl Workflow {
    /// Checks names, budgets and policies; the error names the field, e.g.
    /// `steps[1].timeout_ms`.
    pub fn validate(&self) -> Result<(), ValidationError> {
        check_workflow_name("name", &self.name)?;
        if self.steps.is_empty() || self.steps.len() > MAX_STEPS {
            return Err(ValidationError::new(
                "steps",
                format!("must have 1 to {MAX_STEPS} steps"),
            ));
        }
        let mut names = std::collections::HashSet::new();
        for (i, s) in self.steps.iter().enumerate() {
            let field = format!("steps[{i}]");
            for (what, name) in std::iter::once(("name", &s.name))
                .chain(s.compensation.iter().map(|c| ("compensation", c)))
            {
                check_step_name(&format!("{field}.{what}"), name)?;
                if !names.insert(name.clone()) {
                    return Err(ValidationError::new(
                        format!("{field}.{what}"),
                        format!("{name:?} is used twice; every action needs its own name"),
                    ));
                }
            }
            if !(MIN_STEP_TIMEOUT_MS..=MAX_STEP_TIMEOUT_MS).contains(&s.timeout_ms) {
                return Err(ValidationError::new(
                    format!("{field}.timeout_ms"),
                    "must be 10 ms to 24 h",
                ));
            }
            s.retry.validate(&format!("{field}.retry"))?;
            if !s.undo_needed && s.compensation.is_some() {
                return Err(ValidationError::new(
                    format!("{field}.undo_needed"),
                    "is false, yet the step has a compensation: drop one of the two",
                ));
            }
            if let Some(probe) = &s.probe {
                probe.validate(&format!("{field}.probe"))?;
            }
        }
        Ok(())
    }

    /// The step at `index`, if any.
    pub fn step(&self, index: i32) -> Option<&StepDef> {
        usize::try_from(index).ok().and_then(|i| self.steps.get(i))
    }

    /// The number of steps, as a step index type.
    pub fn len(&self) -> i32 {
        i32::try_from(self.steps.len()).unwrap_or(i32::MAX)
    }

    /// Whether the workflow has no steps (never true of a validated one).
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// The sum of the step budgets: a sensible processing timeout for a whole order.
    pub fn total_budget(&self) -> Duration {
        self.steps.iter().map(StepDef::timeout).sum()
    }

    /// Every agent queue the workflow uses, once each.
    pub fn queues(&self) -> Vec<QueueName> {
        let mut queues: Vec<QueueName> = self.steps.iter().map(|s| s.queue.clone()).collect();
        queues.sort();
        queues.dedup();
        queues
    }

    /// The version: the first 12 hex digits of a SHA-256 over a canonical text of
    /// everything that changes how an order runs (name, and per step its name, queue,
    /// budget, retry policy, compensation, status probe and whether it needs undoing;
    /// `compensate_on_error`). The same
    /// workflow written differently (key order, comments, defaults spelt out) has the
    /// same version; any change of meaning gives a new one.
    pub fn version(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut canonical = format!(
            "orderly-workflow/1\nname={}\ncompensate_on_error={}\n",
            self.name, self.compensate_on_error
        );
        for s in &self.steps {
            let r = &s.retry;
            canonical.push_str(&format!(
                "step={}|queue={}|timeout_ms={}|retry={},{},{},{}|compensation={}\n",
                s.name,
                s.queue,
                s.timeout_ms,
                r.max_attempts,
                r.initial_backoff_ms,
                r.max_backoff_ms,
                r.multiplier,
                s.compensation.as_deref().unwrap_or("-")
            ));
            // Only a step with a probe, or one that needs no undoing, says so: the
            // versions of workflows without them stay what they were.
            if let Some(p) = &s.probe {
                canonical.push_str(&format!("probe={}|not_found={:?}\n", p.url, p.not_found));
            }
            if !s.undo_needed {
                canonical.push_str("undo_needed=false\n");
            }
        }
        let digest = Sha256::digest(canonical.as_bytes());
        digest.iter().take(6).map(|b| format!("{b:02x}")).collect()
    }

    /// Its definition as the store keeps it (JSON of every field, defaults spelt out).
    pub fn to_stored(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| unreachable!("a workflow serializes"))
    }

    /// A workflow from its stored definition, checked: it parses, is valid, and is of
    /// version `expected` (a definition that does not hash to its version is refused,
    /// whatever wrote it).
    pub fn from_stored(definition: &str, expected: &WorkflowRef) -> Result<Self, ValidationError> {
        let w: Workflow = serde_json::from_str(definition).map_err(|e| {
            ValidationError::new(format!("stored workflow {expected}"), e.to_string())
        })?;
        w.validate()?;
        if w.reference() != *expected {
            return Err(ValidationError::new(
                format!("stored workflow {expected}"),
                format!("its definition is of {}", w.reference()),
            ));
        }
        Ok(w)
    }

    /// Whether orders pinned to this version may be moved to `to`: the same workflow
    /// with the same steps, so every step record, idempotency key and undo plan of an
    /// order means the same under both. Compatible: the same name, steps (names,
    /// queues, order), compensations, what needs undoing, and `compensate_on_error`;
    /// budgets, retry policies and status probes may differ. Anything else is refused,
    /// each difference named.
    pub fn compatible_with(&self, to: &Workflow) -> Result<(), Vec<String>> {
        let mut why = Vec::new();
        if self.name != to.name {
            why.push(format!("the name differs ({} and {})", self.name, to.name));
        }
        if self.compensate_on_error != to.compensate_on_error {
            why.push(format!(
                "compensate_on_error differs ({} and {})",
                self.compensate_on_error, to.compensate_on_error
            ));
        }
        if self.steps.len() != to.steps.len() {
            why.push(format!(
                "the number of steps differs ({} and {})",
                self.steps.len(),
                to.steps.len()
            ));
        }
        for (i, (a, b)) in self.steps.iter().zip(&to.steps).enumerate() {
            if a.name != b.name {
                why.push(format!(
                    "step {i} is {} in one and {} in the other",
                    a.name, b.name
                ));
                continue;
            }
            if a.queue != b.queue {
                why.push(format!(
                    "step {} goes to {} in one and {} in the other",
                    a.name, a.queue, b.queue
                ));
            }
            if a.compensation != b.compensation {
                why.push(format!(
                    "step {} is undone by {} in one and {} in the other",
                    a.name,
                    a.compensation.as_deref().unwrap_or("nothing"),
                    b.compensation.as_deref().unwrap_or("nothing")
                ));
            }
            if a.undo_needed != b.undo_needed {
                why.push(format!("step {} differs in undo_needed", a.name));
            }
        }
        if why.is_empty() { Ok(()) } else { Err(why) }
    }

    /// The reference an order running this workflow is pinned to.
    pub fn reference(&self) -> WorkflowRef {
        WorkflowRef {
            name: self.name.clone(),
            version: self.version(),
        }
    }
}

/// A step's budget: at least this, in ms.
pub const MIN_STEP_TIMEOUT_MS: u64 = 10;
/// A step's budget: at most this (24 h), in ms.
pub const MAX_STEP_TIMEOUT_MS: u64 = 24 * 3600 * 1000;

/// Checks a step or action name (in a workflow file or a step request): 1 to 40
/// letters, digits, `-` or `_`. Action names go into the remote service's URL, so
/// nothing else may pass.
pub fn check_step_name(field: &str, name: &str) -> Result<(), ValidationError> {
    check_name(field, name, MAX_STEP_NAME_LEN)
}

/// 1 to `max` letters, digits, `-` or `_`: every name a workflow holds.
fn check_name(field: &str, name: &str, max: usize) -> Result<(), ValidationError> {
    if name.is_empty()
        || name.len() > max
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(ValidationError::new(
            field,
            format!("must be 1 to {max} letters, digits, - or _ (got {name:?})"),
        ));
    }
    Ok(())
}

/// Longest workflow name accepted.
pub const MAX_WORKFLOW_NAME_LEN: usize = 40;

/// Checks a workflow name (in a workflow file or an order message): 1 to 40 letters,
/// digits, `-` or `_`.
pub fn check_workflow_name(field: &str, name: &str) -> Result<(), ValidationError> {
    check_name(field, name, MAX_WORKFLOW_NAME_LEN)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Budgets, retries and probes may change under an order; its steps, their queues,
    /// order and compensations, and what needs undoing may not.
    #[test]
    fn a_version_is_compatible_when_only_budgets_retries_or_probes_differ() {
        let v1 = Workflow::default();
        let mut v2 = v1.clone();
        v2.steps[0].timeout_ms *= 3;
        v2.steps[1].retry.max_attempts += 2;
        assert_ne!(v1.version(), v2.version());
        assert_eq!(v1.compatible_with(&v2), Ok(()));
        let changed = |f: &dyn Fn(&mut Workflow)| {
            let mut w = v1.clone();
            f(&mut w);
            v1.compatible_with(&w).unwrap_err().join("; ")
        };
        assert!(changed(&|w| w.steps.truncate(2)).contains("number of steps differs (3 and 2)"));
        assert!(
            changed(&|w| w.steps.swap(0, 1))
                .contains("step 0 is reserve-inventory in one and charge-payment")
        );
        assert!(
            changed(&|w| w.steps[1].queue = QueueName::parse("agent.billing").unwrap())
                .contains("goes to agent.payment in one and agent.billing")
        );
        assert!(
            changed(&|w| w.steps[1].compensation = Some("void".into()))
                .contains("undone by refund in one and void")
        );
        assert!(
            changed(&|w| w.steps[2].undo_needed = false).contains("ship differs in undo_needed")
        );
        assert!(changed(&|w| w.compensate_on_error = false).contains("compensate_on_error"));
        assert!(changed(&|w| w.name = "gift".into()).contains("name differs"));
    }

    /// The default workflow as a file would give it: defaults left out, keys
    /// reordered; ship, which cannot be undone, last.
    const DEFAULT_AS_TOML: &str = r#"
            compensate_on_error = true
            name = "order"
            [[steps]]
            queue = "agent.inventory"
            name = "reserve-inventory"
            timeout_ms = 10000
            compensation = "release-inventory"
            [[steps]]
            name = "charge-payment"
            queue = "agent.payment"
            timeout_ms = 10000
            compensation = "refund"
            [[steps]]
            name = "ship"
            queue = "agent.shipping"
            timeout_ms = 10000
        "#;

    #[test]
    fn the_default_workflow_is_valid_and_undoes_its_first_two_steps() {
        let w = Workflow::default();
        w.validate().unwrap();
        let names: Vec<_> = w.steps.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["reserve-inventory", "charge-payment", "ship"]);
        assert_eq!(
            w.steps[0].compensation.as_deref(),
            Some("release-inventory")
        );
        assert_eq!(w.steps[1].compensation.as_deref(), Some("refund"));
        assert_eq!(w.steps[2].compensation, None);
        // ship cannot be taken back; the other two can.
        let fixed: Vec<bool> = w.steps.iter().map(StepDef::cannot_be_undone).collect();
        assert_eq!(fixed, [false, false, true]);
    }

    /// `undo_needed = false` marks a step whose effect may stand: it is read from a
    /// file, refused beside a compensation (naming the setting), and part of the
    /// version; a workflow that leaves it out keeps the version it had.
    #[test]
    fn a_step_that_needs_no_undoing_says_so_and_the_version_follows() {
        let text = DEFAULT_AS_TOML;
        let plain: Workflow = toml::from_str(text).unwrap();
        assert_eq!(plain.version(), Workflow::default().version());
        assert!(plain.steps[2].cannot_be_undone());
        let notify: Workflow = toml::from_str(&format!("{text}undo_needed = false\n")).unwrap();
        notify.validate().unwrap();
        assert!(!notify.steps[2].cannot_be_undone());
        assert_ne!(notify.version(), plain.version());
        // Written out, only a step that needs no undoing says so.
        let written = |w: &Workflow| serde_json::to_string(w).unwrap();
        assert!(!written(&plain).contains("undo_needed"));
        assert!(written(&notify).contains(r#""undo_needed":false"#));
        let mut both = Workflow::default();
        both.steps[0].undo_needed = false;
        assert_eq!(both.validate().unwrap_err().field, "steps[0].undo_needed");
    }

    #[test]
    fn validation_names_the_field_at_fault() {
        let mut w = Workflow::default();
        w.steps[1].timeout_ms = 0;
        assert_eq!(w.validate().unwrap_err().field, "steps[1].timeout_ms");
        let mut w = Workflow::default();
        w.steps[2].compensation = Some("refund".into());
        assert_eq!(w.validate().unwrap_err().field, "steps[2].compensation");
        let mut w = Workflow::default();
        w.steps[0].retry.max_attempts = 0;
        assert_eq!(
            w.validate().unwrap_err().field,
            "steps[0].retry.max_attempts"
        );
    }

    #[test]
    fn the_version_follows_the_meaning_not_the_layout() {
        let w = Workflow::default();
        let v = w.version();
        assert_eq!(v.len(), 12);
        assert_eq!(Workflow::default().version(), v, "stable");
        // The same workflow read from TOML with defaults left out and keys reordered.
        let parsed: Workflow = toml::from_str(DEFAULT_AS_TOML).unwrap();
        assert_eq!(parsed.version(), v);
        let mut changed = Workflow::default();
        changed.steps[2].timeout_ms += 1;
        assert_ne!(changed.version(), v);
        let renamed = Workflow {
            name: "order-v2".into(),
            ..Workflow::default()
        };
        assert_ne!(renamed.version(), v);
        let r = w.reference();
        assert_eq!(WorkflowRef::parse(&r.to_string()).unwrap(), r);
        assert!(WorkflowRef::parse("order").is_err());
        assert!(WorkflowRef::parse("or der@abc").is_err());
    }

    #[test]
    fn a_status_probe_is_read_checked_and_part_of_the_version() {
        let toml_text = r#"
            name = "order"
            [[steps]]
            name = "charge-payment"
            queue = "agent.payment"
            timeout_ms = 10000
            probe = { url = "https://payment.example/charges/{key}", not_found = "unknown" }
        "#;
        let w: Workflow = toml::from_str(toml_text).unwrap();
        w.validate().unwrap();
        let probe = w.steps[0].probe.clone().unwrap();
        assert_eq!(probe.not_found, NotFound::Unknown);
        assert_eq!(
            probe.url_for("o 1/0/charge-payment", "o 1", "charge-payment"),
            "https://payment.example/charges/o%201%2F0%2Fcharge-payment"
        );
        // The 404 meaning defaults to "not applied".
        let plain: Workflow =
            toml::from_str(&toml_text.replace(r#", not_found = "unknown""#, "")).unwrap();
        assert_eq!(
            plain.steps[0].probe.as_ref().unwrap().not_found,
            NotFound::NotApplied
        );
        // A probe changes how an order runs: a new version; without one, the old version.
        let mut without = w.clone();
        without.steps[0].probe = None;
        assert_ne!(w.version(), without.version());
        assert_ne!(w.version(), plain.version());
        assert_eq!(Workflow::default().version(), {
            let mut d = Workflow::default();
            d.steps[1].probe = None;
            d.version()
        });
        for (url, why) in [
            ("ftp://payment/{key}", "http"),
            ("http://payment/charges", "{key}"),
        ] {
            let mut bad = w.clone();
            bad.steps[0].probe = Some(StatusProbe {
                url: url.into(),
                not_found: NotFound::NotApplied,
            });
            let err = bad.validate().unwrap_err();
            assert_eq!(err.field, "steps[0].probe.url");
            assert!(err.to_string().contains(why), "{err}");
        }
        assert!(
            toml::from_str::<Workflow>(&toml_text.replace("not_found", "when_404")).is_err(),
            "an unknown key is refused"
        );
    }

    #[test]
    fn a_catalogue_starts_new_orders_on_the_first_version_of_a_name_and_carries_on_all() {
        let v1 = Workflow::default();
        let mut v2 = Workflow::default();
        v2.steps[2].timeout_ms = 20_000;
        let mut gift = Workflow {
            name: "gift".into(),
            ..Workflow::default()
        };
        gift.steps.truncate(1);
        let c = Workflows::new(vec![v2.clone(), gift.clone(), v1.clone()]).unwrap();
        assert_eq!(c.default_workflow().reference(), v2.reference());
        let f = c.filter();
        assert_eq!(f.default_name, "order");
        assert_eq!(f.start.get("order"), Some(&v2.version()));
        assert_eq!(f.start.get("gift"), Some(&gift.version()));
        assert_eq!(f.carry_on.len(), 3);
        assert!(c.get(Some(&v1.reference())).is_some());
        assert!(c.serves(None, None));
        assert!(c.serves(Some("order"), Some(&v1.version())));
        assert!(!c.serves(Some("order"), Some("0123456789ab")));
        assert!(!c.serves(Some("returns"), None));
        let only_v2 = Workflows::single(v2).unwrap();
        assert!(only_v2.get(Some(&v1.reference())).is_none());
        assert!(Workflows::new(Vec::new()).is_err());
        let bad = Workflow {
            name: "has space".into(),
            ..Workflow::default()
        };
        assert_eq!(Workflows::single(bad).unwrap_err().field, "name");
    }

    #[test]
    fn backoff_grows_by_the_multiplier_and_stops_at_the_cap() {
        let p = RetryPolicy {
            max_attempts: 10,
            initial_backoff_ms: 100,
            max_backoff_ms: 1_000,
            multiplier: 2.0,
        };
        assert_eq!(p.backoff_cap(1), Duration::from_millis(100));
        assert_eq!(p.backoff_cap(3), Duration::from_millis(400));
        assert_eq!(p.backoff_cap(9), Duration::from_millis(1_000));
    }

    /// A stored definition comes back as the same workflow, of the same version; one
    /// altered after it was stored is refused, naming the version it claims.
    #[test]
    fn a_stored_definition_round_trips_and_an_altered_one_is_refused() {
        let w = Workflow::default();
        let stored = w.to_stored();
        assert_eq!(Workflow::from_stored(&stored, &w.reference()).unwrap(), w);
        let altered = stored.replace("10000", "20000");
        assert_ne!(altered, stored);
        let err = Workflow::from_stored(&altered, &w.reference()).unwrap_err();
        assert!(
            err.to_string().contains(&w.reference().to_string()),
            "{err}"
        );
        assert!(Workflow::from_stored("{}", &w.reference()).is_err());
    }

    /// Stored versions are carried on; a workflow the scheduler was given keeps
    /// starting new orders on its own version, and one it has no file for starts them
    /// on its latest stored version.
    #[test]
    fn stored_versions_are_carried_on_and_start_only_what_no_file_gives() {
        let given = Workflows::single(Workflow::default()).unwrap();
        let mut older = Workflow::default();
        older.steps[0].timeout_ms = 5_000;
        let gift_v1 = Workflow {
            name: "gift".into(),
            ..Workflow::default()
        };
        let mut gift_v2 = gift_v1.clone();
        gift_v2.steps.pop();
        let all = given.with_stored([older.clone(), gift_v1.clone(), gift_v2.clone()]);
        for w in [&older, &gift_v1, &gift_v2, &Workflow::default()] {
            assert!(all.get(Some(&w.reference())).is_some(), "{}", w.reference());
        }
        let f = all.filter();
        assert_eq!(f.start["order"], Workflow::default().version());
        assert_eq!(f.start["gift"], gift_v2.version(), "the latest stored");
        assert_eq!(
            all.default_workflow().reference(),
            Workflow::default().reference()
        );
        assert!(all.serves(Some("gift"), None));
        assert!(all.serves(Some("order"), Some(&older.version())));
    }
}
