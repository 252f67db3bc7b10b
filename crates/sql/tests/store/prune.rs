//! Retention on both dialects, on the store's injected clock: finished orders older
//! than the policy go with their steps, history and alerts; old dead letters and
//! expired duplicate-detection rows go; orders in Error, live orders and anything
//! recent stay; history stays append-only for every order that is not finished.

use std::sync::Arc;
use std::time::Duration;

use orderly_core::store::{ClaimRequest, OperatorStore, Pruned, Retention, StateStore};
use orderly_core::transport::{OutgoingMessage, QueueName, QueueSettings, Transport};
use orderly_core::{Actor, Error, InstanceId, ManualClock, OrderId, ProcessState, TimeSource};
use orderly_sql::{PgStore, SqliteStore};
use orderly_testkit::store::StoreFactory;

use crate::fixtures::{TestRole, execute_all, pg_factory, processed, sqlite_factory, submitted};

trait StoreAndQueue: StateStore + Transport {}
impl<T: StateStore + Transport> StoreAndQueue for T {}

const DAY: Duration = Duration::from_secs(86_400);

fn week() -> Retention {
    Retention {
        keep: 7 * DAY,
        // Small batches, so the test crosses batch boundaries.
        batch: 2,
    }
}

async fn gone(store: &dyn StateStore, id: &OrderId) -> bool {
    matches!(store.get(id).await, Err(Error::OrderNotFound(_)))
}

async fn retention(store: Arc<dyn StoreAndQueue>, clock: ManualClock) {
    let operator = Actor::operator("test");
    // Old: three finished (two Cancelled, one Processed), one Error, one live.
    let mut old_finished = Vec::new();
    for _ in 0..2 {
        let id = submitted(store.as_ref()).await;
        store
            .cancel(&id, &operator, "not wanted", &[])
            .await
            .unwrap();
        old_finished.push(id);
    }
    old_finished.push(processed(store.as_ref()).await);
    let failed = submitted(store.as_ref()).await;
    let claimed = store
        .claim(&ClaimRequest {
            workflows: Default::default(),
            owner: InstanceId::parse("scheduler-1").unwrap(),
            limit: 10,
            timeout: Duration::from_secs(60),
        })
        .await
        .unwrap();
    let fence = claimed
        .into_iter()
        .find(|c| c.fence.order_id == failed)
        .unwrap()
        .fence;
    store.fail(&fence, "payment declined", &[]).await.unwrap();
    let live = submitted(store.as_ref()).await;
    // An old dead letter, and a duplicate-detection row that will have expired.
    let q = QueueName::parse("work").unwrap();
    store
        .declare_queue(
            &q,
            &QueueSettings {
                duplicate_detection_window: Duration::from_secs(600),
                ..QueueSettings::default()
            },
        )
        .await
        .unwrap();
    store
        .send(&q, &[OutgoingMessage::new("m-1", b"x".to_vec())])
        .await
        .unwrap();
    let got = store.receive(&q, 1, Duration::ZERO).await.unwrap();
    store.dead_letter(&got[0], "Poison", "test").await.unwrap();

    clock.advance(8 * DAY);
    // Recent: a Cancelled order and a dead letter within the week.
    let recent = submitted(store.as_ref()).await;
    store
        .cancel(&recent, &operator, "not wanted", &[])
        .await
        .unwrap();
    store
        .send(&q, &[OutgoingMessage::new("m-2", b"y".to_vec())])
        .await
        .unwrap();
    let got = store.receive(&q, 1, Duration::ZERO).await.unwrap();
    store.dead_letter(&got[0], "Poison", "test").await.unwrap();

    let mut history = 0;
    let mut steps = 0;
    for id in &old_finished {
        let view = store.get(id).await.unwrap();
        history += view.history.len() as u64;
        steps += view.steps.len() as u64;
    }
    let expected = Pruned {
        orders: 3,
        steps,
        history,
        alerts: 0,
        dead_letters: 1,
        outbox: 0,
        dedup: 1,
    };
    // A dry run counts and removes nothing.
    assert_eq!(store.prune(&week(), true).await.unwrap(), expected);
    for id in &old_finished {
        assert!(!gone(store.as_ref(), id).await);
    }
    assert_eq!(store.prune(&week(), false).await.unwrap(), expected);
    for id in &old_finished {
        assert!(gone(store.as_ref(), id).await, "{id} was kept");
    }
    for id in [&failed, &live, &recent] {
        assert!(!gone(store.as_ref(), id).await, "{id} was removed");
    }
    assert_eq!(
        store.get(&failed).await.unwrap().state.process_state,
        ProcessState::Error
    );
    // Nothing is left to remove.
    assert!(store.prune(&week(), false).await.unwrap().is_empty());
    assert!(store.prune(&week(), true).await.unwrap().is_empty());
    // A day later with a one-day policy, the recent Cancelled order goes too.
    clock.advance(2 * DAY);
    let day = Retention {
        keep: DAY,
        batch: 500,
    };
    let p = store.prune(&day, false).await.unwrap();
    assert_eq!((p.orders, p.dead_letters), (1, 1), "{p:?}");
    assert!(gone(store.as_ref(), &recent).await);
    assert!(!gone(store.as_ref(), &failed).await);
}

#[tokio::test]
async fn sqlite_retention_removes_exactly_what_the_policy_lets_go() {
    let clock = ManualClock::starting_now();
    let f = sqlite_factory(TimeSource::Clock(Arc::new(clock.clone())));
    let store = SqliteStore::open(&f.url(), f.time.clone()).await.unwrap();
    retention(Arc::new(store), clock).await;
    f.cleanup().await;
}

#[tokio::test]
async fn postgres_retention_removes_exactly_what_the_policy_lets_go() {
    let clock = ManualClock::starting_now();
    let f = pg_factory(TimeSource::Clock(Arc::new(clock.clone()))).await;
    let store: PgStore = f.store().await;
    retention(Arc::new(store), clock).await;
    f.cleanup().await;
}

#[tokio::test]
async fn history_stays_append_only_for_orders_that_are_not_finished() {
    let f = sqlite_factory(TimeSource::Database);
    let store = SqliteStore::open(&f.url(), TimeSource::Database)
        .await
        .unwrap();
    let live = submitted(&store).await;
    let err = sqlx::query("DELETE FROM order_history WHERE order_id = $1")
        .bind(live.as_str())
        .execute(store.pool())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("append-only"), "{err}");
    f.cleanup().await;
    let f = pg_factory(TimeSource::Database).await;
    let store = f.store().await;
    let live = submitted(&store).await;
    let err = sqlx::query("DELETE FROM order_history WHERE order_id = $1")
        .bind(live.as_str())
        .execute(store.pool())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("append-only"), "{err}");
    // Updates stay refused even for a finished order.
    let done = submitted(&store).await;
    store
        .cancel(&done, &Actor::operator("test"), "x", &[])
        .await
        .unwrap();
    let err = sqlx::query("UPDATE order_history SET reason = 'rewritten' WHERE order_id = $1")
        .bind(done.as_str())
        .execute(store.pool())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("append-only"), "{err}");
    f.cleanup().await;
}

/// A figure of `queue_messages` in the server's statistics (`vacuum_count`,
/// `n_dead_tup`, ...), read afresh, not from the snapshot a connection keeps.
async fn queue_stat(store: &PgStore, column: &str) -> i64 {
    let mut conn = store.pool().acquire().await.unwrap();
    sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(format!(
        "SELECT {column} FROM pg_stat_user_tables \
         WHERE schemaname = current_schema() AND relname = 'queue_messages'"
    )))
    .fetch_one(&mut *conn)
    .await
    .unwrap()
}

/// Waits until the server counts at least `dead` dead rows in `queue_messages` (it
/// publishes a connection's counts about once a second), by `deadline`.
async fn until_dead_rows(store: &PgStore, dead: i64, deadline: std::time::Instant) {
    while queue_stat(store, "n_dead_tup").await < dead {
        assert!(
            std::time::Instant::now() < deadline,
            "the churn was never counted"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Tidies until it vacuums `queue_messages` (the server reports what the churn left
/// about once a second), by `deadline`; what it reported of that vacuum.
async fn tidy_until_the_queue_is_vacuumed(
    store: &PgStore,
    deadline: std::time::Instant,
) -> orderly_core::store::Vacuumed {
    use orderly_core::store::SupervisorStore;
    loop {
        let tidied = store.tidy().await.unwrap().vacuumed;
        if let Some(v) = tidied.into_iter().find(|v| v.table == "queue_messages") {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "queue_messages was never vacuumed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// On PostgreSQL the leader's tidy vacuums a hot table once enough dead row versions
/// have piled up in it, and not before: the queue's churn is vacuumed, the server
/// counts the vacuum, and what the next take reads past is gone.
#[tokio::test]
async fn postgres_tidy_vacuums_the_queue_once_its_churn_left_enough_behind() {
    use orderly_core::store::{SupervisorStore, TIDY_MIN_DEAD};
    let f = pg_factory(TimeSource::Database).await;
    let store = f.store().await;
    // The server processes report their counts about once a second when idle.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let q = QueueName::parse("tidy").unwrap();
    // A little churn: under the threshold, nothing is vacuumed, once the server has
    // counted what it left (each message: its lock, its delete).
    orderly_testkit::transport::churn(&store, &q, "few", 50).await;
    until_dead_rows(&store, 100, deadline).await;
    let tidied = store.tidy().await.unwrap().vacuumed;
    assert!(
        tidied.iter().all(|v| v.table != "queue_messages"),
        "vacuumed below the threshold: {tidied:?}"
    );
    assert_eq!(queue_stat(&store, "vacuum_count").await, 0);

    // Enough: each message leaves two dead versions (its lock, its delete).
    orderly_testkit::transport::churn(&store, &q, "many", TIDY_MIN_DEAD as usize).await;
    let vacuumed = tidy_until_the_queue_is_vacuumed(&store, deadline).await;
    assert!(vacuumed.dead_rows >= TIDY_MIN_DEAD, "{vacuumed:?}");
    assert!(queue_stat(&store, "vacuum_count").await >= 1);
    // A vacuum removes only what no transaction may still see: the other tests'
    // transactions in this database can hold the churn back a while, and the next
    // tidy vacuums again.
    loop {
        let dead = queue_stat(&store, "n_dead_tup").await;
        if dead < TIDY_MIN_DEAD as i64 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{dead} dead rows after the vacuums"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        store.tidy().await.unwrap();
    }
    // Nothing left to do right after.
    assert!(
        store
            .tidy()
            .await
            .unwrap()
            .vacuumed
            .iter()
            .all(|v| v.table != "queue_messages")
    );
    f.cleanup().await;
}

/// A session left open in a transaction holds back what any vacuum may remove. The
/// leader's tidy vacuums the queue's churn once under it, and then not again while it
/// stands, however much more piles up (each vacuum would remove nothing); once it
/// ends, the next tidy vacuums and the churn is gone.
#[tokio::test]
async fn postgres_tidy_does_not_vacuum_again_what_an_open_transaction_holds_back() {
    use orderly_core::store::{SupervisorStore, TIDY_MIN_DEAD};
    use sqlx::Connection;
    let f = pg_factory(TimeSource::Database).await;
    let store = f.store().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let q = QueueName::parse("held").unwrap();
    let mut holder = sqlx::PgConnection::connect_with(&f.options())
        .await
        .unwrap();
    let holder_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut holder)
        .await
        .unwrap();
    sqlx::query("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut holder)
        .await
        .unwrap();
    sqlx::query("SELECT txid_current()")
        .execute(&mut holder)
        .await
        .unwrap();
    // Until no transaction or snapshot in the database is older than the holder's.
    // Once so, it stays so (nothing begins older than what already runs): from then
    // on every vacuum runs under the holder's horizon.
    let mut admin = store.pool().acquire().await.unwrap();
    let mut holder_is_oldest = async || {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_stat_activity o, pg_stat_activity h \
             WHERE h.pid = $1 AND o.datname = current_database() AND o.pid <> h.pid \
                 AND greatest(age(o.backend_xid), age(o.backend_xmin)) \
                     > greatest(age(h.backend_xid), age(h.backend_xmin))",
        )
        .bind(holder_pid)
        .fetch_one(&mut *admin)
        .await
        .unwrap()
            == 0
    };

    while !holder_is_oldest().await {
        assert!(
            std::time::Instant::now() < deadline,
            "another session stayed older than the holder"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    orderly_testkit::transport::churn(&store, &q, "many", TIDY_MIN_DEAD as usize).await;
    let vacuumed = tidy_until_the_queue_is_vacuumed(&store, deadline).await;
    assert!(vacuumed.dead_rows >= TIDY_MIN_DEAD, "{vacuumed:?}");
    let vacuums = queue_stat(&store, "vacuum_count").await;
    // Nothing was removable, and more piles up behind the same transaction.
    orderly_testkit::transport::churn(&store, &q, "more", TIDY_MIN_DEAD as usize).await;
    until_dead_rows(&store, 3 * TIDY_MIN_DEAD as i64, deadline).await;
    let mut tidied = Vec::new();
    for _ in 0..5 {
        tidied.extend(store.tidy().await.unwrap().vacuumed);
    }
    assert!(
        tidied.iter().all(|v| v.table != "queue_messages"),
        "vacuumed again under the same horizon: {tidied:?}"
    );
    assert_eq!(queue_stat(&store, "vacuum_count").await, vacuums);
    assert!(queue_stat(&store, "n_dead_tup").await >= 3 * TIDY_MIN_DEAD as i64);

    // The transaction ends: the next tidy vacuums, and this time it removes the churn
    // (other tests' transactions may hold it back a moment longer).
    sqlx::query("COMMIT").execute(&mut holder).await.unwrap();
    holder.close().await.unwrap();
    loop {
        store.tidy().await.unwrap();
        if queue_stat(&store, "n_dead_tup").await < TIDY_MIN_DEAD as i64 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the churn was not removed after the transaction ended"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(queue_stat(&store, "vacuum_count").await > vacuums);
    drop(admin);
    f.cleanup().await;
}

/// A store whose role does not own the tables (nor is a superuser) may not vacuum
/// them: its tidy leaves them to their owner and says it vacuumed nothing, where a
/// `VACUUM` would only have warned and skipped them. The owner's tidy then does it.
#[tokio::test]
async fn postgres_tidy_by_a_role_that_does_not_own_the_tables_vacuums_nothing() {
    use orderly_core::store::{SupervisorStore, TIDY_MIN_DEAD};
    let f = pg_factory(TimeSource::Database).await;
    let owner = f.store().await;
    let mut admin = owner.pool().acquire().await.unwrap();
    let test_role = TestRole::create(&mut admin).await;
    let role = test_role.0.as_str();
    execute_all(
        &mut admin,
        &[
            format!("GRANT USAGE, CREATE ON SCHEMA {} TO {role}", f.schema),
            format!("GRANT ALL ON ALL TABLES IN SCHEMA {} TO {role}", f.schema),
            format!(
                "GRANT ALL ON ALL SEQUENCES IN SCHEMA {} TO {role}",
                f.schema
            ),
        ],
    )
    .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let q = QueueName::parse("tidy").unwrap();
    orderly_testkit::transport::churn(&owner, &q, "many", TIDY_MIN_DEAD as usize).await;
    until_dead_rows(&owner, TIDY_MIN_DEAD as i64, deadline).await;
    let guest = PgStore::connect(f.options().username(role), 2, TimeSource::Database)
        .await
        .expect("a role with the tables' privileges opens the store");
    let tidied = guest.tidy().await.unwrap().vacuumed;
    assert!(tidied.is_empty(), "vacuumed without owning: {tidied:?}");
    assert_eq!(queue_stat(&owner, "vacuum_count").await, 0);
    guest.pool().close().await;
    // The owner's tidy vacuums the queue's churn.
    let vacuumed = tidy_until_the_queue_is_vacuumed(&owner, deadline).await;
    assert!(vacuumed.dead_rows >= TIDY_MIN_DEAD, "{vacuumed:?}");
    drop(admin);
    f.cleanup().await;
}

/// The queue's table empties out whenever the system is idle. A vacuum then must not
/// cut its file to nothing: the server would take the table for empty, and a take
/// planned then (every connection plans again after a vacuum) would read the whole
/// table in full at every execution after it, however full it got. With its pages
/// kept, the one plan for any take walks the queue's index to find its messages, and
/// goes to each by its row's address to lock or dead-letter it. Found again by `seq`,
/// the server chose between the primary key and the queue's own index (which holds
/// `seq` too) by their sizes: planned on a small queue, the take walked the whole of
/// `queue_messages_ready` once per message it locked, 5,054 buffers for a take of 97.
#[tokio::test]
async fn postgres_a_vacuum_of_the_emptied_queue_keeps_its_pages_and_the_take_its_index() {
    use orderly_core::store::TIDY_MIN_DEAD;
    let f = pg_factory(TimeSource::Database).await;
    let store = f.store().await;
    let q = QueueName::parse("emptied").unwrap();
    // Every message sent is taken and completed: the table ends empty.
    orderly_testkit::transport::churn(&store, &q, "m", 2 * TIDY_MIN_DEAD as usize).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    tidy_until_the_queue_is_vacuumed(&store, deadline).await;
    let mut conn = store.pool().acquire().await.unwrap();
    let (pages, file_pages, live): (i32, i64, i64) = sqlx::query_as(
        "SELECT c.relpages, pg_relation_size(c.oid) / 8192, \
            (SELECT count(*) FROM queue_messages) \
         FROM pg_class c WHERE c.oid = 'queue_messages'::regclass",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    assert_eq!(live, 0, "the churn left messages behind");
    assert!(
        pages > 0 && file_pages > 0,
        "the vacuum cut the emptied table to {file_pages} pages (the server counts {pages})"
    );
    // The plan the server keeps for every take, whatever the queue and the limit.
    let prepare = format!(
        "PREPARE take_now(text, timestamptz, bigint, int, text, bigint) AS {}",
        orderly_sql::postgres::TAKE
    );
    sqlx::raw_sql("SET plan_cache_mode = force_generic_plan")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(prepare))
        .execute(&mut *conn)
        .await
        .unwrap();
    let plan: Vec<String> =
        sqlx::query_scalar("EXPLAIN EXECUTE take_now('emptied', NULL, 10, 10, 'token', 30000)")
            .fetch_all(&mut *conn)
            .await
            .unwrap();
    sqlx::raw_sql("DEALLOCATE take_now; RESET plan_cache_mode")
        .execute(&mut *conn)
        .await
        .unwrap();
    let plan = plan.join("\n");
    assert!(
        plan.contains("queue_messages_ready") && !plan.contains("Seq Scan"),
        "the take reads the whole table:\n{plan}"
    );
    assert!(
        plan.matches("Tid Scan on queue_messages").count() == 2 && !plan.contains("seq = ANY"),
        "the take finds the messages it locks or dead-letters again by a scan:\n{plan}"
    );
    drop(conn);
    f.cleanup().await;
}

/// SQLite frees what deletes and updates leave as they commit: tidy has nothing to do.
#[tokio::test]
async fn sqlite_tidy_has_nothing_to_vacuum() {
    use orderly_core::store::{SupervisorStore, TIDY_MIN_DEAD};
    let f = sqlite_factory(TimeSource::Database);
    let store = SqliteStore::open(&f.url(), f.time.clone()).await.unwrap();
    orderly_testkit::transport::churn(
        &store,
        &QueueName::parse("tidy").unwrap(),
        "m",
        TIDY_MIN_DEAD as usize,
    )
    .await;
    assert_eq!(store.tidy().await.unwrap().vacuumed, Vec::new());
    f.cleanup().await;
}
