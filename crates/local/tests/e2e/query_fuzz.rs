//! Property-based fuzzing of the dashboard's query parameters and path segments,
//! against the real `orderly dashboard` over a store the demo filled (orders in every
//! state, Error causes, dead letters, history). Each case is a page and a query built
//! from the parameters that page reads, with values that are valid, nearly valid
//! (numbers past every bound, cursors with broken times or ids, unknown states), or
//! hostile (LIKE wildcards, quotes, markup, bidi and zero-width characters, NUL, long
//! text), percent-encoded or mangled (broken escapes, bytes that are not UTF-8),
//! repeated or unknown.
//!
//! Every request must be answered (a panic drops the connection): with a page, a
//! redirect to an order, a 404, or a 400 that names what is wrong; never a 5xx. No
//! HTML page may carry a value's markup unescaped. `ORDERLY_FUZZ_CASES` sets the cases
//! (10,000 by default).

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use crate::fixtures::{Db, Dialect};
use crate::procs::{orderly, start_dashboard};

/// The mark a value carries to show whether markup reaches a page unescaped.
const MARK: &str = "<x-fuzz";

fn cases() -> u32 {
    std::env::var("ORDERLY_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

/// The pages and the parameters each reads.
const PAGES: &[(&str, &[&str])] = &[
    (
        "/orders",
        &[
            "state", "step", "q", "customer", "older", "id", "after", "waiting",
        ],
    ),
    ("/errors", &["q", "step"]),
    ("/errors/group", &["action", "workflow", "step", "pattern"]),
    ("/dead-letters", &["queue"]),
    ("/", &[]),
    ("/charts", &[]),
    ("/api/overview", &[]),
    ("/alerts", &[]),
    ("/workflows", &[]),
];

/// A value as a sender could give it.
fn value(known: Vec<String>) -> impl Strategy<Value = String> {
    prop_oneof![
        // Values the store holds: order ids, states, queues, workflows.
        proptest::sample::select(known.clone()),
        // The same, cut or grown.
        (proptest::sample::select(known), 0usize..40, ".{0,3}").prop_map(|(k, cut, tail)| format!(
            "{}{tail}",
            k.chars().take(cut).collect::<String>()
        )),
        // Numbers at and past every bound.
        prop_oneof![
            any::<i64>().prop_map(|n| n.to_string()),
            any::<u64>().prop_map(|n| n.to_string()),
            Just("1000000000000".to_owned()),
            Just("-0".to_owned()),
            Just("1e9".to_owned()),
            Just("0x10".to_owned()),
            Just("99999999999999999999999999".to_owned()),
        ],
        // Page cursors: a time and an id, broken in each part.
        (
            prop_oneof![
                Just("2026-12-03T07:00:00Z".to_owned()),
                Just("2026-13-45T99:99:99Z".to_owned()),
                Just("+275760-09-13T00:00:00Z".to_owned()),
                Just("1970-01-01T00:00:00+23:59".to_owned()),
                ".{0,24}"
            ],
            prop_oneof![Just("|"), Just("||"), Just(""), Just("%7C")],
            prop_oneof![
                Just("00000000-0000-0000-0000-000000000000".to_owned()),
                ".{0,40}"
            ],
        )
            .prop_map(|(t, sep, id)| format!("{t}{sep}{id}")),
        // Hostile text.
        prop_oneof![
            Just("%".to_owned()),
            Just("_".to_owned()),
            Just("%_\\".to_owned()),
            Just("' OR 1=1 --".to_owned()),
            Just("\"><x-fuzz onload=alert(1)>".to_owned()),
            Just("<x-fuzz></script><script>alert(1)</script>".to_owned()),
            Just("\u{202e}evil\u{200b}".to_owned()),
            Just("a\u{0000}b".to_owned()),
            Just("../../etc/passwd".to_owned()),
            Just("   ".to_owned()),
            (1usize..20_000).prop_map(|n| "x".repeat(n)),
        ],
        ".{0,40}",
    ]
}

/// One percent-encoded `key=value` pair, or a mangled one.
fn pair(keys: Vec<&'static str>, known: Vec<String>) -> impl Strategy<Value = String> {
    let key = prop_oneof![
        4 => proptest::sample::select(if keys.is_empty() { vec!["q"] } else { keys }).prop_map(str::to_owned),
        1 => "[a-z_]{1,8}",
    ];
    (key, value(known), 0u8..10).prop_map(|(k, v, how)| {
        let encoded: String = url_encode(&v);
        match how {
            // A broken escape, or one that decodes to bytes that are not UTF-8.
            0 => format!("{k}={encoded}%zz"),
            1 => format!("{k}=%ff%fe{encoded}"),
            // No value, no `=`.
            2 => k,
            // Plus as space, raw characters a browser would escape.
            3 => format!("{k}={}", v.replace(' ', "+")).replace(['#', '&'], ""),
            _ => format!("{k}={encoded}"),
        }
    })
}

fn url_encode(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A request: a page with a query, or an order's page with a fuzzed id.
fn request(known: Vec<String>) -> impl Strategy<Value = (String, String)> {
    let pages = (0..PAGES.len()).prop_flat_map({
        let known = known.clone();
        move |i| {
            let (path, keys) = PAGES[i];
            (
                Just(path.to_owned()),
                proptest::collection::vec(pair(keys.to_vec(), known.clone()), 0..6)
                    .prop_map(|pairs| pairs.join("&")),
            )
        }
    });
    let order = value(known).prop_map(|id| (format!("/orders/{}", url_encode(&id)), String::new()));
    prop_oneof![5 => pages, 1 => order]
}

#[test]
fn every_dashboard_query_is_answered_without_a_panic_a_5xx_or_unescaped_markup() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let db = rt.block_on(Db::new(Dialect::Sqlite));
    let (ok, out) = orderly(&db.url, &["demo", "--orders", "120", "--store", &db.url]);
    assert!(ok, "the demo fills the store: {out}");
    let (known, (_dash, base)) = rt.block_on(async {
        let backend = db.backend().await;
        let rows = backend
            .store
            .list(&orderly_core::store::OrderFilter {
                limit: 200,
                ..Default::default()
            })
            .await
            .unwrap()
            .orders;
        let mut known: Vec<String> = rows.iter().map(|r| r.order_id.to_string()).collect();
        known.extend(
            [
                "Pending",
                "Processing",
                "Processed",
                "Error",
                "Cancelled",
                "retry",
                "cancel",
            ]
            .map(str::to_owned),
        );
        known.extend(
            [
                "agent.inventory",
                "agent.payment",
                "replies",
                "orders",
                "order@0",
            ]
            .map(str::to_owned),
        );
        (known, start_dashboard(&db.url, &[]).await)
    });
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    });
    let statuses = std::cell::RefCell::new(std::collections::BTreeMap::<u16, u32>::new());
    let started = std::time::Instant::now();
    runner
        .run(&request(known), |(path, query)| {
            let url = if query.is_empty() {
                format!("{base}{path}")
            } else {
                format!("{base}{path}?{query}")
            };
            let (status, html, body) = rt.block_on(async {
                let r = client.get(&url).send().await.map_err(|e| {
                    TestCaseError::fail(format!("{url}: no answer ({e}): a panic?"))
                })?;
                let status = r.status().as_u16();
                let html = r
                    .headers()
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|t| t.starts_with("text/html"));
                let body = r.text().await.unwrap_or_default();
                Ok::<_, TestCaseError>((status, html, body))
            })?;
            *statuses.borrow_mut().entry(status).or_default() += 1;
            prop_assert!(
                matches!(status, 200 | 303 | 400 | 404),
                "{url}: {status}: {}",
                body.chars().take(400).collect::<String>()
            );
            if status == 400 {
                prop_assert!(!body.trim().is_empty(), "{url}: a 400 says what is wrong");
            }
            prop_assert!(
                !(html && body.contains(MARK)),
                "{url}: markup from the query reached the page unescaped"
            );
            Ok(())
        })
        .unwrap();
    let statuses = statuses.into_inner();
    eprintln!(
        "{} cases in {:.1} s, by status: {statuses:?}",
        cases(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        statuses.get(&200).copied().unwrap_or(0) > cases() / 4,
        "most cases reach a page, not only refusals: {statuses:?}"
    );
    assert!(
        statuses.get(&400).copied().unwrap_or(0) > 0,
        "some cases are refused: {statuses:?}"
    );
}
