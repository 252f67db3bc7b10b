//! Property-based fuzzing of every decoder of input that crosses a trust boundary: the
//! messages on the queues (an order, a step request, a step reply, a status notice, and
//! the alerts a client reads: an order's, a service's outage, a system condition),
//! the workflow files and stored definitions, and the names and references parsed
//! from settings and URLs. Each case starts from a valid value and mutates it the way
//! a broken or hostile sender would (a field replaced by any JSON value, removed or
//! added, bytes flipped, inserted or cut), or is arbitrary text.
//!
//! Each decoder must not panic, and must either give a value that survives its own
//! checks and round-trips (encoded again and decoded, the same value), or a named
//! error. `ORDERLY_FUZZ_CASES` sets the cases per decoder (10,000 by default; e.g.
//! 1,000,000 for a long run); a failure proptest finds is kept in
//! `tests/fuzz.proptest-regressions` and replayed first on every run.

#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestRunner};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use orderly_core::messages::{StatusNotice, StepReply, StepRequest};
use orderly_core::store::NewOrder;
use orderly_core::transport::QueueName;
use orderly_core::workflow::{Workflow, WorkflowRef};
use orderly_core::{InstanceId, OrderId};

fn cases() -> u32 {
    std::env::var("ORDERLY_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

fn runner() -> TestRunner {
    TestRunner::new(Config {
        cases: cases(),
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fuzz.proptest-regressions"
        )))),
        max_shrink_iters: 10_000,
        ..Config::default()
    })
}

/// Any JSON value a sender could put in a field: extremes of numbers, text with
/// control, bidi and zero-width characters, long text, nesting.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        prop_oneof![
            Just(f64::MAX),
            Just(f64::MIN_POSITIVE),
            Just(-0.0),
            any::<f64>()
        ]
        .prop_filter("JSON numbers are finite", |f| f.is_finite())
        .prop_map(|f| json!(f)),
        ".{0,40}".prop_map(Value::String),
        prop_oneof![
            Just("\u{202e}evil\u{200b}"),
            Just("a\u{0000}b"),
            Just("../../etc/passwd"),
            Just("http://169.254.169.254/"),
            Just("2026-13-45T99:99:99Z"),
            Just("-1"),
            Just(""),
        ]
        .prop_map(|s| Value::String(s.to_owned())),
        (1usize..200_000).prop_map(|n| Value::String("x".repeat(n))),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map(".{0,12}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// One structural mutation of the node numbered `.0` (in a pre-order walk): replace
/// it, remove it (from its object or array), or add a field to it.
#[derive(Debug, Clone)]
enum Mutation {
    Replace(usize, Value),
    Remove(usize),
    AddField(usize, String, Value),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any_json()).prop_map(|(p, v)| Mutation::Replace(p, v)),
        any::<usize>().prop_map(Mutation::Remove),
        (any::<usize>(), "[a-z_]{1,12}", any_json())
            .prop_map(|(p, k, v)| Mutation::AddField(p, k, v)),
    ]
}

fn count(v: &Value) -> usize {
    1 + match v {
        Value::Array(a) => a.iter().map(count).sum(),
        Value::Object(o) => o.values().map(count).sum(),
        _ => 0,
    }
}

/// Applies `m` to the node numbered `target`; `n` counts the nodes walked. Returns
/// whether it was found (and, for a removal of a child, whether the parent must drop
/// it: the second flag).
fn apply(v: &mut Value, m: &Mutation, target: usize, n: &mut usize) -> (bool, bool) {
    let here = *n;
    *n += 1;
    if here == target {
        match m {
            Mutation::Replace(_, with) => *v = with.clone(),
            Mutation::AddField(_, k, with) => match v {
                Value::Object(o) => {
                    o.insert(k.clone(), with.clone());
                }
                _ => *v = with.clone(),
            },
            Mutation::Remove(_) => return (true, true),
        }
        return (true, false);
    }
    match v {
        Value::Array(a) => {
            for i in 0..a.len() {
                let (found, drop) = apply(&mut a[i], m, target, n);
                if found {
                    if drop {
                        a.remove(i);
                    }
                    return (true, false);
                }
            }
        }
        Value::Object(o) => {
            let keys: Vec<String> = o.keys().cloned().collect();
            for k in keys {
                let (found, drop) = apply(o.get_mut(&k).unwrap(), m, target, n);
                if found {
                    if drop {
                        o.remove(&k);
                    }
                    return (true, false);
                }
            }
        }
        _ => {}
    }
    (false, false)
}

fn mutated(valid: &Value, mutations: &[Mutation]) -> Value {
    let mut v = valid.clone();
    for m in mutations {
        let pick = match m {
            Mutation::Replace(p, _) | Mutation::Remove(p) | Mutation::AddField(p, _, _) => *p,
        };
        let target = pick % count(&v);
        let (_, drop_root) = apply(&mut v, m, target, &mut 0);
        if drop_root {
            v = Value::Null;
        }
    }
    v
}

/// Bytes of a valid message, flipped, inserted, cut.
fn byte_edits(valid: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    let len = valid.len().max(1);
    proptest::collection::vec((0..len, any::<u8>(), 0u8..3), 1..8).prop_map(move |edits| {
        let mut b = valid.clone();
        for (at, byte, op) in edits {
            let at = at.min(b.len());
            match op {
                0 if at < b.len() => b[at] = byte,
                1 => b.insert(at, byte),
                _ => b.truncate(at),
            }
        }
        b
    })
}

/// The property of a decoder: no panic; a value passes through `check` without
/// panicking and, encoded again, decodes to itself; an error says something.
fn decoder<T>(name: &str, valid: &T, check: fn(&T))
where
    T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let decode = |bytes: &[u8]| -> Result<(), TestCaseError> {
        match serde_json::from_slice::<T>(bytes) {
            Ok(v) => {
                check(&v);
                let again: T =
                    serde_json::from_slice(&serde_json::to_vec(&v).unwrap()).map_err(|e| {
                        TestCaseError::fail(format!(
                            "{name}: encoded again it does not decode: {e}"
                        ))
                    })?;
                prop_assert_eq!(&again, &v, "{} does not round-trip", name);
            }
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
        Ok(())
    };
    let valid_json = serde_json::to_value(valid).unwrap();
    decode(&serde_json::to_vec(&valid_json).unwrap()).unwrap();
    runner()
        .run(&proptest::collection::vec(mutation(), 1..4), |mutations| {
            decode(&serde_json::to_vec(&mutated(&valid_json, &mutations)).unwrap())
        })
        .unwrap_or_else(|e| panic!("{name} (structure): {e}"));
    runner()
        .run(
            &byte_edits(serde_json::to_vec(&valid_json).unwrap()),
            |bytes| decode(&bytes),
        )
        .unwrap_or_else(|e| panic!("{name} (bytes): {e}"));
}

fn details() -> Value {
    json!({"customer_id": "c-1", "currency": "EUR",
           "lines": [{"sku": "A-1", "quantity": 2, "unit_price_minor": 1250}]})
}

fn step_request() -> StepRequest {
    let flow = Workflow::default();
    serde_json::from_value(json!({
        "fence": {"order_id": "o-1", "owner": "scheduler-a", "epoch": 3},
        "step_index": 1, "step": "charge-payment", "action": "charge-payment", "kind": "do",
        "idempotency_key": "o-1/1/charge-payment", "complete_by": "2026-12-02T10:00:00Z",
        "timeout_ms": 10000, "retry": flow.steps[1].retry,
        "reply_to": "replies",
        "context": {"details": details(), "notify_to": "client-7", "generation": 2,
                    "workflow": flow.reference().to_string()},
        "probe": {"url": "https://payment.internal/charges/{key}", "not_found": "not-applied"},
        "uncertain": true,
    }))
    .unwrap()
}

#[test]
fn step_requests_decode_or_are_refused_by_name() {
    decoder("StepRequest", &step_request(), |r| {
        let _ = r.check();
        let _ = r.matches(&Workflow::default(), "agent.payment");
        let _ = r.message_id();
    });
}

#[test]
fn step_replies_decode_or_are_refused_by_name() {
    let request = step_request();
    let reply: StepReply = serde_json::from_value(json!({
        "fence": request.fence, "step_index": 1, "step": "charge-payment",
        "action": "charge-payment", "kind": "do",
        "outcome": {"result": "succeeded", "detail": "charged 25.00 EUR"},
        "agent": "agent-1", "replied_at": "2026-12-02T09:59:58Z",
        "complete_by": "2026-12-02T10:00:00Z", "attempts": 2, "context": request.context,
    }))
    .unwrap();
    decoder("StepReply", &reply, |r| {
        let _ = r.message_id();
    });
}

#[test]
fn orders_decode_or_are_refused_by_name() {
    let order: NewOrder = serde_json::from_value(json!({
        "order_id": "o-1", "details": details(), "reply_to": "client-7", "workflow": "order",
    }))
    .unwrap();
    decoder("NewOrder", &order, |o| {
        let _ = o.validate();
    });
}

#[test]
fn status_notices_decode_or_are_refused_by_name() {
    let notice: StatusNotice = serde_json::from_value(json!({
        "order_id": "o-1", "status": "failed", "step": "ship", "detail": "declined",
    }))
    .unwrap();
    decoder("StatusNotice", &notice, |n| {
        let _ = n.envelope(Some("client-7"), "3");
    });
}

#[test]
fn order_alerts_decode_or_are_refused_by_name() {
    let alert: orderly_core::store::Alert = serde_json::from_value(json!({
        "alert_id": 7, "order_id": "o-1", "raised_at": "2026-12-06T10:00:00Z",
        "step_index": 2, "step": "ship", "last_error": "declined", "failure_count": 3,
        "reply_to": "client-7", "published_at": null, "acknowledged_at": null,
        "acknowledged_by": null,
    }))
    .unwrap();
    decoder("Alert", &alert, |_| {});
}

#[test]
fn service_alerts_decode_or_are_refused_by_name() {
    let alert: orderly_core::service::ServiceAlert = serde_json::from_value(json!({
        "kind": "service_down", "service": "agent.payment", "outage": 4,
        "down_since": "2026-12-06T10:00:00Z", "up_at": null,
        "last_error": "503 from the service", "waiting": 12,
    }))
    .unwrap();
    decoder("ServiceAlert", &alert, |_| {});
}

#[test]
fn condition_notices_decode_or_are_refused_by_name() {
    let notice: orderly_core::conditions::ConditionNotice = serde_json::from_value(json!({
        "event": "raised",
        "alert": {
            "alert_id": 9, "kind": "pending_too_old", "subject": "orders",
            "detail": "the oldest Pending order waited 12 min",
            "raised_at": "2026-12-06T10:00:00Z", "raised_by": "supervisor-1",
            "resolved_at": null,
        },
    }))
    .unwrap();
    decoder("ConditionNotice", &notice, |n| {
        let _ = n.message_id();
    });
}

#[test]
fn stored_workflow_definitions_decode_or_are_refused_by_name() {
    decoder("Workflow", &Workflow::default(), |w| {
        let _ = w.validate();
        let _ = w.version();
        let _ = w.compatible_with(&Workflow::default());
        let _ = Workflow::from_stored(&w.to_stored(), &w.reference());
    });
}

#[test]
fn workflow_files_parse_or_are_refused_by_name() {
    let text = r#"
name = "order"
compensate_on_error = true
[[steps]]
name = "reserve-inventory"
queue = "agent.inventory"
timeout_ms = 10000
compensation = "release-inventory"
retry = { max_attempts = 4, initial_backoff_ms = 100, max_backoff_ms = 2000, multiplier = 2.0 }
[[steps]]
name = "charge-payment"
queue = "agent.payment"
timeout_ms = 10000
compensation = "refund"
probe = { url = "https://payment.internal/charges/{key}", not_found = "not-applied" }
[[steps]]
name = "ship"
queue = "agent.shipping"
timeout_ms = 10000
undo_needed = false
"#
    .to_owned();
    assert!(toml::from_str::<Workflow>(&text).is_ok());
    runner()
        .run(&byte_edits(text.into_bytes()), |bytes| {
            let text = String::from_utf8_lossy(&bytes);
            match toml::from_str::<Workflow>(&text) {
                Ok(w) => {
                    let _ = w.validate();
                    let _ = w.version();
                }
                Err(e) => prop_assert!(!e.to_string().is_empty()),
            }
            Ok(())
        })
        .unwrap();
}

/// The names and references read from settings, URLs and messages: any text.
#[test]
fn names_and_references_parse_or_are_refused_by_name() {
    runner()
        .run(
            &proptest::string::string_regex("(?s).{0,300}").unwrap(),
            |text| {
                for result in [
                    OrderId::parse(text.clone())
                        .map(|v| v.to_string())
                        .map_err(|e| e.to_string()),
                    QueueName::parse(text.clone())
                        .map(|v| v.to_string())
                        .map_err(|e| e.to_string()),
                    InstanceId::parse(text.clone())
                        .map(|v| v.to_string())
                        .map_err(|e| e.to_string()),
                    WorkflowRef::parse(&text)
                        .map(|v| v.to_string())
                        .map_err(|e| e.to_string()),
                ] {
                    match result {
                        // What parses is what was given.
                        Ok(v) => prop_assert_eq!(&v, &text),
                        Err(e) => prop_assert!(!e.is_empty()),
                    }
                }
                let _ = orderly_core::workflow::check_step_name("step", &text);
                Ok(())
            },
        )
        .unwrap();
}
