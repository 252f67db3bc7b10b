//! Every page of the real `orderly dashboard` rendered over a store whose every text
//! field an outsider can reach holds markup: the customer and the lines of an order,
//! a step's name, key and answer, the error a remote service gave, an operator's
//! reason, a dead letter's reason, description and body, a service's last error, a
//! system alert's subject and detail, and the query values the pages echo. The
//! markup must come back escaped on every page that shows the field, and never as
//! markup.

use std::time::Duration;

use orderly_core::conditions::{Condition, ConditionKind};
use orderly_core::service::OutagePolicy;
use orderly_core::store::{ClaimRequest, NewOrder, OrderFilter, StepUpdate};
use orderly_core::transport::{OutgoingMessage, QueueName};
use orderly_core::{Actor, Currency, InstanceId, OrderDetails, OrderId, OrderLine, ProcessState};

use crate::fixtures::{Db, Dialect};
use crate::procs::{http_builder, start_dashboard};

/// Markup that breaks out of an attribute (both quotes) and opens an element.
const EVIL: &str = "\"'><x-evil>";
/// How it reads once escaped.
const ESCAPED: &str = "&lt;x-evil&gt;";
/// How it would read had it got through as markup.
const RAW: &str = "<x-evil";

fn evil(prefix: &str) -> String {
    format!("{prefix}{EVIL}")
}

/// Two orders in Error and one being cancelled, each field they carry made hostile, a dead
/// letter, a service down and a system alert, all hostile.
async fn seed(backend: &orderly_sql::Backend) -> Vec<OrderId> {
    let store = &backend.store;
    let owner = InstanceId::parse("scheduler@hostile").unwrap();
    let mut ids = Vec::new();
    for n in 0..3 {
        let id = OrderId::parse(format!("o-hostile-{n}")).unwrap();
        let details = OrderDetails::new(
            evil("c"),
            Currency::parse("EUR").unwrap(),
            vec![OrderLine {
                sku: evil("s"),
                quantity: 1,
                unit_price_minor: 100,
            }],
        )
        .unwrap();
        let order = NewOrder {
            order_id: id.clone(),
            details,
            reply_to: None,
            workflow: None,
        };
        store
            .submit(&order, &orderly_testkit::builders::submitter(), &[])
            .await
            .unwrap();
        ids.push(id);
    }
    let claimed = store
        .claim(&ClaimRequest {
            owner: owner.clone(),
            limit: 3,
            timeout: Duration::from_secs(300),
            workflows: std::sync::Arc::default(),
        })
        .await
        .unwrap();
    assert_eq!(claimed.len(), 3);
    for c in &claimed {
        let step = StepUpdate {
            index: 0,
            name: evil("step"),
            status: orderly_core::StepStatus::Started,
            detail: Some(evil("answer")),
            idempotency_key: evil("key"),
            irreversible: false,
        };
        store.record_step(&c.fence, &step, &[]).await.unwrap();
    }
    // Two fail with a remote service's hostile error; an operator asks to cancel the
    // third, with a hostile reason.
    for c in &claimed[..2] {
        store
            .fail(&c.fence, &evil("remote said "), &[])
            .await
            .unwrap();
    }
    store
        .request_cancel(
            &claimed[2].fence.order_id,
            &Actor::operator("ops"),
            &evil("reason "),
            &[],
        )
        .await
        .unwrap();
    // A dead letter: a body, a reason and a description from outside.
    let orders = QueueName::parse("orders").unwrap();
    backend
        .transport
        .send(
            &orders,
            &[OutgoingMessage::new("m-hostile", evil("body").into_bytes())],
        )
        .await
        .unwrap();
    let received = backend
        .transport
        .receive(&orders, 1, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(received.len(), 1, "the message to dead-letter");
    backend
        .transport
        .dead_letter(&received[0], &evil("Reason"), &evil("description "))
        .await
        .unwrap();
    // A service down with a hostile error, and a system alert.
    store
        .report_failure(
            "agent.payment",
            &evil("connection refused "),
            &InstanceId::parse("agent@hostile").unwrap(),
            &OutagePolicy::default(),
        )
        .await
        .unwrap();
    store
        .raise(
            &Condition {
                kind: ConditionKind::DeadLetters,
                subject: evil("subject"),
                detail: evil("detail "),
            },
            "supervisor@hostile",
            &|_| Vec::new(),
        )
        .await
        .unwrap();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_escapes_hostile_text_in_every_field() {
    let (db, backend) = Db::with_queues(Dialect::Sqlite, Duration::from_secs(30)).await;
    let ids = seed(&backend).await;
    let rows = backend
        .store
        .list(&OrderFilter {
            state: Some(ProcessState::Error),
            limit: 100,
            ..OrderFilter::default()
        })
        .await
        .unwrap()
        .orders;
    let groups = orderly_core::triage::group_errors(&rows);
    assert_eq!(groups.len(), 1, "one cause");
    let key = &groups[0].key;
    let q = |v: &str| -> String {
        v.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => {
                    (b as char).to_string()
                }
                b => format!("%{b:02X}"),
            })
            .collect()
    };
    let group = format!(
        "/errors/group?action=retry&workflow={}&step={}&pattern={}",
        q(&key.workflow),
        key.step,
        q(&key.pattern)
    );
    let (_dash, base) = start_dashboard(&db.url, &[]).await;
    let http = http_builder().build().unwrap();
    // Each page, and whether it shows a hostile field (so the escaped text must be there).
    let pages: Vec<(String, bool)> = vec![
        ("/".into(), true),
        ("/orders".into(), true),
        (
            format!("/orders?q={0}&customer={0}&waiting={0}", q(EVIL)),
            true,
        ),
        (format!("/orders/{}", ids[0]), true),
        (format!("/orders/{}", ids[2]), true),
        ("/errors".into(), true),
        (format!("/errors?q={}", q(EVIL)), true),
        (group, true),
        ("/alerts".into(), true),
        ("/workflows".into(), false),
        ("/dead-letters?queue=orders".into(), true),
        ("/charts".into(), false),
        ("/api/overview".into(), false),
    ];
    for (path, shows) in &pages {
        let response = http.get(format!("{base}{path}")).send().await.unwrap();
        let status = response.status();
        let body = response.text().await.unwrap();
        assert!(status.is_success(), "{path}: {status}\n{body}");
        assert!(
            !body.contains(RAW),
            "{path} carries hostile markup unescaped:\n{body}"
        );
        if *shows {
            assert!(
                body.contains(ESCAPED),
                "{path} shows none of the hostile fields (escaped):\n{body}"
            );
        }
    }
    // Field by field, where each is shown.
    let page = |path: String| {
        let http = http.clone();
        let base = base.clone();
        async move {
            http.get(format!("{base}{path}"))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        }
    };
    let order = page(format!("/orders/{}", ids[0])).await;
    // The details are shown as JSON, which escapes the quote first.
    for field in ["c\\", "s\\", "step", "answer", "key", "remote said "] {
        let escaped = format!("{field}&quot;'&gt;&lt;x-evil&gt;");
        assert!(
            order.contains(&escaped),
            "the order's page shows {field:?} escaped:\n{order}"
        );
    }
    let cancelled = page(format!("/orders/{}", ids[2])).await;
    assert!(cancelled.contains("reason &quot;"), "{cancelled}");
    let dead = page("/dead-letters?queue=orders".into()).await;
    for field in ["Reason", "description ", "body"] {
        assert!(
            dead.contains(&format!("{field}&quot;")),
            "dead letters show {field:?} escaped:\n{dead}"
        );
    }
    let overview = page("/".into()).await;
    for field in ["connection refused ", "subject", "detail "] {
        assert!(
            overview.contains(&format!("{field}&quot;")),
            "the overview shows {field:?} escaped:\n{overview}"
        );
    }
}
