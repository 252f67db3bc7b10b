//! A process killed half-way through a state change and the messages it causes leaves
//! neither behind. The child is this test binary run again; it blocks in the middle of
//! its transaction (after the state change and its first message) on a duplicate-check
//! row the parent holds, and the parent kills it there with SIGKILL.

use std::process::{Command, Stdio};
use std::str::FromStr;
use std::time::{Duration, Instant};

use orderly_core::store::{ClaimRequest, IntakeStore, OperatorStore, SchedulerStore, StepUpdate};
use orderly_core::transport::{Envelope, OutgoingMessage, QueueName, QueueSettings, Transport};
use orderly_core::{Epoch, Fence, InstanceId, OrderId, StepStatus, TimeSource};
use orderly_sql::PgStore;
use orderly_testkit::builders;
use orderly_testkit::store::StoreFactory;
use sqlx::postgres::PgConnectOptions;

use crate::fixtures::{pg_factory, postgres_url};

const CHILD: &str = "ORDERLY_CRASH_CHILD";
const TEST: &str = "crash::postgres_a_process_killed_half_way_through_a_change_leaves_neither_the_change_nor_its_messages";

fn envelope(queue: &str, id: &str) -> Envelope {
    Envelope {
        queue: QueueName::parse(queue).unwrap(),
        message: OutgoingMessage::new(id, b"{}".to_vec()),
    }
}

/// The child: record a step with two messages; the second blocks on the parent's row.
async fn child(spec: &str) {
    let [schema, order_id, epoch] = spec.splitn(3, ' ').collect::<Vec<_>>()[..] else {
        panic!("bad spec {spec}")
    };
    let options = PgConnectOptions::from_str(&postgres_url())
        .unwrap()
        .options([("search_path", schema)]);
    let store = PgStore::connect(options, 2, TimeSource::Database)
        .await
        .unwrap();
    let fence = Fence {
        order_id: OrderId::parse(order_id).unwrap(),
        owner: InstanceId::parse("scheduler-child").unwrap(),
        epoch: Epoch(epoch.parse().unwrap()),
    };
    let step = StepUpdate {
        index: 0,
        name: "reserve-inventory".into(),
        status: StepStatus::Started,
        detail: None,
        idempotency_key: "test-key".into(),
        irreversible: false,
    };
    let sends = [
        envelope("agent-inventory", "step-0"),
        envelope("client-replies", "held-by-parent"),
    ];
    let _ = store.record_step(&fence, &step, &sends).await;
    unreachable!("the parent kills this process before the change can finish");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_process_killed_half_way_through_a_change_leaves_neither_the_change_nor_its_messages()
 {
    if let Ok(spec) = std::env::var(CHILD) {
        return child(&spec).await;
    }
    let f = pg_factory(TimeSource::Database).await;
    let store = f.store().await;
    for q in ["agent-inventory", "client-replies"] {
        store
            .declare_queue(&QueueName::parse(q).unwrap(), &QueueSettings::default())
            .await
            .unwrap();
    }
    let order = builders::order(1);
    store
        .submit(&order, &builders::submitter(), &[])
        .await
        .unwrap();
    let owner = InstanceId::parse("scheduler-child").unwrap();
    let claimed = store
        .claim(&ClaimRequest {
            workflows: Default::default(),
            owner,
            limit: 1,
            timeout: Duration::from_secs(300),
        })
        .await
        .unwrap()
        .remove(0);
    let before = store.get(&order.order_id).await.unwrap();

    // Hold the duplicate-check row of the child's second message in an open transaction.
    let mut holder = store.pool().begin().await.unwrap();
    sqlx::query("INSERT INTO queue_dedup (queue, message_id, expires_at) VALUES ('client-replies', 'held-by-parent', now() + interval '1 hour')")
        .execute(&mut *holder)
        .await
        .unwrap();

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", TEST, "--nocapture"])
        .env(
            CHILD,
            format!("{} {} {}", f.schema, order.order_id, claimed.fence.epoch.0),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();

    // Wait until the child is blocked on our row: half-way through its transaction.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'orderly' \
             AND wait_event_type = 'Lock' AND query LIKE '%INSERT INTO queue_dedup%'",
        )
        .fetch_one(store.pool())
        .await
        .unwrap();
        if waiting > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the child never reached the middle of its transaction"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the child exited early"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    holder.rollback().await.unwrap();

    // The server notices the dead connection and rolls its transaction back.
    let deadline = Instant::now() + Duration::from_secs(30);
    while sqlx::query_scalar::<_, i64>(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'orderly' AND state = 'idle in transaction'",
    )
    .fetch_one(store.pool())
    .await
    .unwrap()
        > 0
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after = store.get(&order.order_id).await.unwrap();
    assert_eq!(
        after.state, before.state,
        "the step's state change did not survive"
    );
    assert!(after.steps.is_empty(), "no step record");
    assert_eq!(after.history, before.history, "no history entry");
    for q in ["agent-inventory", "client-replies"] {
        let got = store
            .receive(&QueueName::parse(q).unwrap(), 10, Duration::ZERO)
            .await
            .unwrap();
        assert!(
            got.is_empty(),
            "{q}: the message written before the kill did not survive: {got:?}"
        );
    }
    StoreFactory::cleanup(&f).await;
}
