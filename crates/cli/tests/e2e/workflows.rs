//! Workflows are versioned and pinned: a rolling deployment changes the workflow while
//! orders are in flight, with the real binaries as separate processes, and every
//! order finishes on the version it started with. A scheduler leaves alone the orders
//! of versions it has not loaded (and says so); several workflows run side by side,
//! chosen by the order message.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use orderly_cli::{demo, invariants};
use orderly_core::history::HistoryKind;
use orderly_core::store::StateStore;
use orderly_core::workflow::{Workflow, Workflows};
use orderly_core::{OrderId, ProcessState};

use crate::both;
use crate::fixtures::{Db, Dialect};
use crate::processes::{count, ledger, start_sim};
use crate::procs::{Proc, bin, free_port, wait_for};

/// The built-in order workflow, written out as a file.
const V1: &str = r#"
name = "order"
[[steps]]
name = "reserve-inventory"
queue = "agent.inventory"
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

/// The next version of it: a receipt is sent after shipping.
const V2_EXTRA: &str = r#"
[[steps]]
name = "send-receipt"
queue = "agent.shipping"
timeout_ms = 10000
"#;

/// Another workflow in the same deployment, asked for by name.
const GIFT: &str = r#"
name = "gift"
[[steps]]
name = "reserve-inventory"
queue = "agent.inventory"
timeout_ms = 10000
compensation = "release-inventory"
[[steps]]
name = "ship"
queue = "agent.shipping"
timeout_ms = 10000
"#;

struct Files {
    dir: PathBuf,
}

impl Files {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "orderly-workflows-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Self { dir }
    }

    fn write(&self, name: &str, text: &str) -> (String, Workflow) {
        let path = self.dir.join(name);
        std::fs::write(&path, text).unwrap();
        let workflow = orderly_runtime::load_workflow(Some(&path)).unwrap();
        (path.display().to_string(), workflow)
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn scheduler(db: &str, id: &str, workflows: &str) -> Proc {
    Proc::start(
        "orderly-scheduler",
        db,
        &[
            "--instance-id",
            id,
            "--workflow",
            workflows,
            "--shutdown-grace-ms",
            "0",
            "--unserved-check-ms",
            "200",
        ],
    )
}

/// A log without its colour codes.
fn plain(log: &str) -> String {
    let mut out = String::with_capacity(log.len());
    let mut chars = log.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            chars.by_ref().find(|c| *c == 'm');
        } else {
            out.push(c);
        }
    }
    out
}

async fn claimed_by(store: &dyn StateStore, id: &OrderId, who: &str) -> bool {
    store
        .get(id)
        .await
        .unwrap()
        .history
        .iter()
        .any(|e| e.kind == HistoryKind::Claimed && e.actor.as_str().split('@').next() == Some(who))
}

both!(
    a_rolling_change_of_workflow_finishes_every_order_on_the_version_it_started_with,
    rolling_workflow_change
);
async fn rolling_workflow_change(dialect: Dialect) {
    let files = Files::new();
    let (v1_path, v1) = files.write("v1.toml", V1);
    let (v2_path, v2) = files.write("v2.toml", &format!("{V1}{V2_EXTRA}"));
    let (gift_path, gift) = files.write("gift.toml", GIFT);
    assert_eq!(
        v1.version(),
        Workflow::default().version(),
        "v1 is the built-in workflow"
    );
    assert_ne!(v1.version(), v2.version());

    let (db, backend) = Db::with_queues(dialect, Duration::from_secs(5)).await;
    let store = backend.store.clone();
    let port = free_port();
    let remote = format!("http://127.0.0.1:{port}/actions");
    let _sim = start_sim(&db.url, port, &["--latency-ms", "100"]);
    let _submitter = Proc::start("orderly-submitter", &db.url, &[]);
    let _supervisor = Proc::start(
        "orderly-supervisor",
        &db.url,
        &["--interval-ms", "200", "--backoff-base-ms", "200"],
    );
    // Two requests at a time per queue: a batch of orders is in flight for seconds.
    let _agent = Proc::start(
        "orderly-agent",
        &db.url,
        &["--remote-url", &remote, "--concurrency", "2"],
    );
    let mut a = scheduler(&db.url, "scheduler-a", &v1_path);

    // Batch one, under v1; and an order asking for the gift workflow, which no
    // scheduler runs yet.
    let first = demo::sample_orders(40);
    let mut sent = demo::post(backend.transport.as_ref(), &first)
        .await
        .unwrap();
    // The gift order is posted as a user does: `orderly post --workflow gift`.
    let out = std::process::Command::new(bin("orderly"))
        .args(["post", "--sample", "1", "--workflow", "gift"])
        .env("ORDERLY_DATABASE_URL", &db.url)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let gift_id = text
        .lines()
        .find_map(|l| l.strip_prefix("  "))
        .map(|id| OrderId::parse(id.trim()).unwrap())
        .unwrap_or_else(|| panic!("no order id in {text}"));
    sent.insert(gift_id.clone(), chrono::Utc::now());
    wait_for(
        "a few v1 orders to finish",
        Duration::from_secs(60),
        async || count(store.as_ref(), ProcessState::Processed).await >= 3,
    )
    .await;

    // The roll, done carelessly first: B runs v2 only, and A stops (handing its orders
    // back at once). A's orders are pinned to v1: B must leave them alone.
    let b = scheduler(&db.url, "scheduler-b", &v2_path);
    a.signal("TERM");
    assert!(a.wait(Duration::from_secs(30)).success());
    let second = demo::sample_orders(20);
    sent.extend(
        demo::post(backend.transport.as_ref(), &second)
            .await
            .unwrap(),
    );
    wait_for(
        "B to finish the v2 orders",
        Duration::from_secs(90),
        async || {
            let mut done = 0;
            for o in &second {
                done += usize::from(
                    store
                        .get(&o.order_id)
                        .await
                        .is_ok_and(|v| v.state.process_state == ProcessState::Processed),
                );
            }
            done == second.len()
        },
    )
    .await;
    let mut stranded = Vec::new();
    for o in &first {
        let s = store.get(&o.order_id).await.unwrap().state;
        if s.process_state != ProcessState::Processed {
            stranded.push(o.order_id.clone());
        }
    }
    assert!(
        !stranded.is_empty(),
        "the roll happened with v1 orders in flight"
    );
    // B says why, in its log, after claim passes that left them alone: its report
    // counts exactly these orders waiting for v1.
    let said = format!("workflow={} orders={}", v1.reference(), stranded.len());
    wait_for("B to say why", Duration::from_secs(20), async || {
        plain(&b.output()).contains(&said)
    })
    .await;
    for id in &stranded {
        let s = store.get(id).await.unwrap().state;
        assert_eq!(s.process_state, ProcessState::Pending, "order {id}");
        assert_eq!(s.workflow_version.as_deref(), Some(v1.version().as_str()));
        assert!(
            !claimed_by(store.as_ref(), id, "scheduler-b").await,
            "B runs v2 only and took v1 order {id}"
        );
    }
    // And to an operator asking.
    let out = std::process::Command::new(bin("orderly"))
        .args(["workflows"])
        .env("ORDERLY_DATABASE_URL", &db.url)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.lines().any(|l| l.contains(&v1.reference().to_string())
            && l.contains("Pending")
            && l.contains(&stranded.len().to_string())),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.contains("gift (not started)") && l.contains("Pending")),
        "{text}"
    );

    // The roll done right: C runs v2 and still carries v1 on.
    let _c = scheduler(&db.url, "scheduler-c", &format!("{v2_path},{v1_path}"));
    wait_for(
        "C to finish the v1 orders on v1",
        Duration::from_secs(90),
        async || count(store.as_ref(), ProcessState::Processed).await == first.len() + second.len(),
    )
    .await;
    let gift_row = store.get(&gift_id).await.unwrap().state;
    assert_eq!(
        gift_row.process_state,
        ProcessState::Pending,
        "nobody runs gift yet"
    );

    // Another workflow side by side, chosen by the order message.
    let _d = scheduler(&db.url, "scheduler-d", &gift_path);
    wait_for(
        "D to finish the gift order",
        Duration::from_secs(60),
        async || store.get(&gift_id).await.unwrap().state.process_state == ProcessState::Processed,
    )
    .await;

    // Every order ran the version it was pinned to, each step in effect once: the
    // invariants checked against each order's own version.
    let effects = ledger(port).await;
    let all = Workflows::new(vec![v2.clone(), v1.clone(), gift.clone()]).unwrap();
    let report = invariants::report_on(store.as_ref(), Some(effects.clone()), &sent, &all, true)
        .await
        .unwrap();
    assert_eq!(report.violations, Vec::<String>::new());
    let mut actions: HashMap<&str, Vec<&str>> = HashMap::new();
    for e in effects.iter().filter(|e| e.kind == "do") {
        actions
            .entry(e.order_id.as_str())
            .or_default()
            .push(e.action.as_str());
    }
    fn expect(w: &Workflow) -> Vec<&str> {
        let mut v: Vec<&str> = w.steps.iter().map(|s| s.name.as_str()).collect();
        v.sort_unstable();
        v
    }
    for (orders, w) in [(&first, &v1), (&second, &v2)] {
        for o in orders {
            let s = store.get(&o.order_id).await.unwrap().state;
            assert_eq!(s.workflow_label(), w.reference().to_string());
            let mut got = actions.remove(o.order_id.as_str()).unwrap_or_default();
            got.sort_unstable();
            assert_eq!(got, expect(w), "order {}", o.order_id);
        }
    }
    let g = store.get(&gift_id).await.unwrap().state;
    assert_eq!(g.workflow_label(), gift.reference().to_string());
    assert!(claimed_by(store.as_ref(), &gift_id, "scheduler-d").await);
    let mut got = actions.remove(gift_id.as_str()).unwrap_or_default();
    got.sort_unstable();
    assert_eq!(got, expect(&gift));
    drop(b);
}
