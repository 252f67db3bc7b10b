//! PostgreSQL-specific behaviour.

use std::time::Duration;

use orderly_core::store::{ClaimRequest, IntakeStore, SchedulerStore};
use orderly_core::{InstanceId, TimeSource};
use orderly_testkit::builders;
use orderly_testkit::store::StoreFactory;

use crate::fixtures::{execute_all, pg_factory};

/// Deadlines come from the server's clock, not the worker's: the stored deadline is the
/// server's `now()` at claim time plus the timeout.
#[tokio::test]
async fn postgres_deadlines_are_computed_on_the_database_clock() {
    let f = pg_factory(TimeSource::Database).await;
    let store = f.store().await;
    let server_before: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(store.pool())
        .await
        .unwrap();
    let claimed = submit_and_claim(&store, builders::order(1), Duration::from_secs(30)).await;
    let server_after: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(store.pool())
        .await
        .unwrap();
    let started = claimed.complete_by - chrono::Duration::seconds(30);
    assert!(
        server_before <= started && started <= server_after,
        "{server_before} <= {started} <= {server_after}"
    );
    f.cleanup().await;
}

/// Submits `order` and claims it for scheduler `s`, due within `timeout`.
async fn submit_and_claim(
    store: &orderly_sql::PgStore,
    order: orderly_core::store::NewOrder,
    timeout: Duration,
) -> orderly_core::store::ClaimedOrder {
    store
        .submit(&order, &builders::submitter(), &[])
        .await
        .unwrap();
    let mut claimed = store
        .claim(&ClaimRequest {
            workflows: Default::default(),
            owner: InstanceId::parse("s").unwrap(),
            limit: 1,
            timeout,
        })
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1, "claimed {claimed:?}");
    claimed.remove(0)
}

/// The claim and sweep use partial indexes, so finished rows do not slow them down.
#[tokio::test]
async fn postgres_claim_and_sweep_use_their_partial_indexes() {
    let f = pg_factory(TimeSource::Database).await;
    let store = f.store().await;
    for (query, index) in [
        (
            "EXPLAIN SELECT order_id FROM order_state WHERE process_state = 'Pending' AND locked_by IS NULL \
             AND next_attempt_at <= now() ORDER BY next_attempt_at LIMIT 10",
            "order_state_claimable",
        ),
        (
            "EXPLAIN SELECT order_id FROM order_state WHERE process_state = 'Processing' AND complete_by < now() \
             ORDER BY complete_by LIMIT 10",
            "order_state_deadlines",
        ),
        (
            "EXPLAIN SELECT process_state, count(*) FROM order_state \
             WHERE finished_at >= now() - interval '1 hour' GROUP BY process_state",
            "order_state_finished",
        ),
    ] {
        let mut conn = store.pool().acquire().await.unwrap();
        sqlx::query("SET enable_seqscan = off")
            .execute(&mut *conn)
            .await
            .unwrap();
        let plan: Vec<String> = sqlx::query_scalar(query)
            .fetch_all(&mut *conn)
            .await
            .unwrap();
        assert!(
            plan.join("\n").contains(index),
            "{index} not used:\n{}",
            plan.join("\n")
        );
    }
    f.cleanup().await;
}

/// A step's write (the touch of its order's state row) changes no column that an index
/// of `order_state` reads, keys or predicate, and pages keep room beside their rows: so
/// PostgreSQL can update the row in place (HOT), adding no index entries. An index on
/// `updated_at`, as the finished orders' index was, makes every step's write a new
/// entry in each index.
#[tokio::test]
async fn postgres_a_step_write_touches_no_indexed_column() {
    let f = pg_factory(TimeSource::Database).await;
    let store = f.store().await;
    // What the touch of a step write sets (waiting_on only when it was set: rare).
    let written = ["current_step", "last_error", "updated_at"];
    let indexes: Vec<(String, String)> = sqlx::query_as(
        "SELECT c.relname::text, pg_get_indexdef(i.indexrelid) FROM pg_index i \
         JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = 'order_state'::regclass",
    )
    .fetch_all(store.pool())
    .await
    .unwrap();
    assert!(indexes.len() >= 5, "{indexes:?}");
    for (name, definition) in &indexes {
        let words: Vec<&str> = definition
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .collect();
        for column in written {
            assert!(
                !words.contains(&column),
                "{name} reads {column}, which every step's write changes: {definition}"
            );
        }
    }
    let options: Option<Vec<String>> =
        sqlx::query_scalar("SELECT reloptions FROM pg_class WHERE oid = 'order_state'::regclass")
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert!(
        options.unwrap_or_default().iter().any(|o| o
            .strip_prefix("fillfactor=")
            .and_then(|v| v.parse::<u8>().ok())
            < Some(100)),
        "order_state pages keep no room for a row's next version"
    );
    f.cleanup().await;
}

/// A receiver that found its queue drained skips its first look and waits; what
/// another process sends meanwhile (another store: its own wake-ups, heard through
/// `LISTEN`) still reaches it, each of a stream of sends, and each within the receive
/// that was waiting for it. (The short pause lets the receive begin waiting before the
/// send; the test passes whichever comes first.)
#[tokio::test]
async fn postgres_a_receiver_that_found_its_queue_drained_still_receives_another_process_send() {
    use orderly_core::transport::{OutgoingMessage, QueueName, QueueSettings, Transport};
    let f = pg_factory(TimeSource::Database).await;
    let (here, there) = (f.store().await, f.store().await);
    let queue = QueueName::parse("agent.drained").unwrap();
    here.declare_queue(&queue, &QueueSettings::default())
        .await
        .unwrap();
    // Found drained (and listening from then on).
    for _ in 0..2 {
        assert!(
            here.receive(&queue, 10, Duration::from_millis(200))
                .await
                .unwrap()
                .is_empty()
        );
    }
    for i in 0..5 {
        let send = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            there
                .send(
                    &queue,
                    &[OutgoingMessage::new(format!("m-{i}"), b"{}".to_vec())],
                )
                .await
                .unwrap();
        };
        let (got, ()) = tokio::join!(here.receive(&queue, 10, Duration::from_secs(10)), send);
        let got = got.unwrap();
        assert_eq!(got.len(), 1, "message {i}");
        assert_eq!(got[0].message_id, format!("m-{i}"));
        Transport::complete(&here, &got[0]).await.unwrap();
    }
    f.cleanup().await;
}

/// A batch of step writes that sends in its own statement tells other processes, at
/// commit, of each queue it sent to (their receivers wake without polling), and of no
/// queue only a refused write would have sent to.
#[tokio::test]
async fn postgres_a_step_write_that_sends_notifies_other_processes_of_its_queues() {
    use orderly_core::store::{StepUpdate, StepWrite};
    use orderly_core::transport::{Envelope, OutgoingMessage, QueueName, Transport};
    use orderly_core::{Fence, StepStatus};
    let f = pg_factory(TimeSource::Database).await;
    let store = f.store().await;
    let (heard, unheard, marker) = (
        QueueName::parse("agent.heard").unwrap(),
        QueueName::parse("agent.unheard").unwrap(),
        QueueName::parse("agent.marker").unwrap(),
    );
    let mut listener = listening(&store, &[&heard, &unheard, &marker]).await;
    for n in 0..2 {
        store
            .submit(&builders::order(n), &builders::submitter(), &[])
            .await
            .unwrap();
    }
    let claimed = store
        .claim(&ClaimRequest {
            workflows: Default::default(),
            owner: InstanceId::parse("s").unwrap(),
            limit: 2,
            timeout: Duration::from_secs(60),
        })
        .await
        .unwrap();
    let write = |fence: &Fence, expect: i32, q: &QueueName| StepWrite {
        complete: false,
        fence: fence.clone(),
        expect_step: Some(expect),
        updates: vec![StepUpdate {
            index: expect,
            name: "step".into(),
            status: StepStatus::Succeeded,
            detail: None,
            idempotency_key: format!("k-{}", fence.order_id),
            irreversible: false,
        }],
        sends: vec![Envelope {
            queue: q.clone(),
            message: OutgoingMessage::new(format!("to-{q}"), b"{}".to_vec()),
        }],
    };
    let outcomes = store
        .record_steps(&[
            write(&claimed[0].fence, 0, &heard),
            write(&claimed[1].fence, 3, &unheard),
        ])
        .await
        .unwrap();
    assert!(outcomes[0].is_ok() && outcomes[1].is_err(), "{outcomes:?}");
    store
        .send(&marker, &[OutgoingMessage::new("m", b"{}".to_vec())])
        .await
        .unwrap();
    // Delivered in commit order: by the marker's, the write's have all come.
    let queues = heard_until(&mut listener, marker.as_str()).await;
    assert!(
        queues.iter().any(|(q, _)| q == heard.as_str()),
        "{queues:?}"
    );
    assert!(
        !queues.iter().any(|(q, _)| q == unheard.as_str()),
        "{queues:?}"
    );
    f.cleanup().await;
}

/// A batch of new orders tells other processes, at commit, that orders can be claimed
/// and of each queue its accepted orders sent to; a batch that accepts none (all
/// duplicates) tells them nothing.
#[tokio::test]
async fn postgres_a_batch_of_new_orders_notifies_other_processes() {
    use orderly_core::store::Submission;
    use orderly_core::transport::{Envelope, OutgoingMessage, QueueName, Transport};
    let f = pg_factory(TimeSource::Database).await;
    let store = f.store().await;
    let (notices, marker) = (
        QueueName::parse("client.notices").unwrap(),
        QueueName::parse("agent.marker2").unwrap(),
    );
    let mut listener = listening(&store, &[&notices, &marker]).await;
    let submission = |n: u64| Submission {
        order: builders::order_with_id(&format!("notified-{n}"), n),
        sends: vec![Envelope {
            queue: notices.clone(),
            message: OutgoingMessage::new(format!("received-{n}"), b"{}".to_vec()),
        }],
    };
    let actor = builders::submitter();
    let outcomes = store
        .submit_many(&[submission(900), submission(901)], &actor)
        .await
        .unwrap();
    assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
    let mark = || OutgoingMessage::new(uuid::Uuid::new_v4().to_string(), b"{}".to_vec());
    store.send(&marker, &[mark()]).await.unwrap();
    // Other tests' stores notify on the same channel: this store's carry its origin.
    let first = heard_until(&mut listener, marker.as_str()).await;
    let origin = first
        .iter()
        .find(|(w, _)| w == notices.as_str())
        .map(|(_, origin)| origin.clone())
        .unwrap_or_else(|| panic!("the notices queue's notification: {first:?}"));
    assert!(
        first.iter().any(|(w, o)| w == "#claimable" && *o == origin),
        "{first:?}"
    );
    let got = store.receive(&notices, 10, Duration::ZERO).await.unwrap();
    let ids: Vec<&str> = got.iter().map(|m| m.message_id.as_str()).collect();
    assert_eq!(ids, ["received-900", "received-901"]);

    // Both again: duplicates, nothing sent, nothing to claim.
    let outcomes = store
        .submit_many(&[submission(900), submission(901)], &actor)
        .await
        .unwrap();
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Ok(orderly_core::store::SubmitOutcome::Duplicate))),
        "{outcomes:?}"
    );
    store.send(&marker, &[mark()]).await.unwrap();
    let again = heard_until(&mut listener, marker.as_str()).await;
    assert!(!again.iter().any(|(_, o)| *o == origin), "{again:?}");
    assert!(
        store
            .receive(&notices, 10, Duration::from_millis(10))
            .await
            .unwrap()
            .is_empty()
    );
    for m in &got {
        Transport::complete(&store, m).await.unwrap();
    }
    f.cleanup().await;
}

/// Declares `queues` as orderly creates them and listens, from `store`'s database, on
/// the channel of the queues' notifications (which other tests' schemas share: each
/// payload names its queue and the store that sent it).
async fn listening(
    store: &orderly_sql::PgStore,
    queues: &[&orderly_core::transport::QueueName],
) -> sqlx::postgres::PgListener {
    use orderly_core::transport::Transport;
    for q in queues {
        store
            .declare_queue(q, &orderly_core::messages::queues::settings(q))
            .await
            .unwrap();
    }
    let mut listener = sqlx::postgres::PgListener::connect_with(store.pool())
        .await
        .unwrap();
    listener.listen("orderly_queue_sends").await.unwrap();
    listener
}

/// What notifications `listener` hears until one for the queue `marker`: each as what
/// it says (a queue, or `#claimable`) and its origin (the store that sent it).
async fn heard_until(
    listener: &mut sqlx::postgres::PgListener,
    marker: &str,
) -> Vec<(String, String)> {
    let mut heard = Vec::new();
    loop {
        let n = tokio::time::timeout(Duration::from_secs(30), listener.recv())
            .await
            .expect("the marker's notification")
            .unwrap();
        let (what, origin) = n.payload().split_once(' ').unwrap_or((n.payload(), ""));
        if what == marker {
            return heard;
        }
        heard.push((what.to_owned(), origin.to_owned()));
    }
}

/// The bench's server counters: rows written by table (inserted, updated, of which in
/// place, deleted), transactions committed and the log written, as differences
/// between two readings; a table with nothing written is left out.
#[tokio::test]
async fn postgres_server_counters_tell_the_rows_written_by_table_between_two_readings() {
    use sqlx::Connection;
    let f = pg_factory(TimeSource::Database).await;
    let url = crate::fixtures::postgres_url();
    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
    let table = format!("{}.counted", f.schema);
    execute_all(
        &mut conn,
        &[
            format!("CREATE TABLE {table} (id int PRIMARY KEY, note text)"),
            format!("CREATE TABLE {}.untouched (id int)", f.schema),
            "SELECT pg_stat_force_next_flush()".to_owned(),
        ],
    )
    .await;
    let before = orderly_sql::postgres::server_counters(&url).await.unwrap();
    execute_all(
        &mut conn,
        &[
            format!("INSERT INTO {table} SELECT g, 'new' FROM generate_series(1, 5) g"),
            // Two updates change no indexed column (in place), one changes the key.
            format!("UPDATE {table} SET note = 'seen' WHERE id IN (1, 4)"),
            format!("UPDATE {table} SET id = 10 WHERE id = 2"),
            format!("DELETE FROM {table} WHERE id = 3"),
            // Published when this connection goes idle, before it answers.
            "SELECT pg_stat_force_next_flush()".to_owned(),
        ],
    )
    .await;
    let after = orderly_sql::postgres::server_counters(&url).await.unwrap();
    let done = after.since(&before);
    let counted = done
        .tables
        .iter()
        .find(|t| t.table == table)
        .unwrap_or_else(|| panic!("{table} not among {:?}", done.tables));
    assert_eq!(
        (
            counted.inserted,
            counted.updated,
            counted.in_place,
            counted.deleted
        ),
        (5, 3, 2, 1)
    );
    assert_eq!(counted.total(), 9);
    assert!(
        !done.tables.iter().any(|t| t.table.ends_with(".untouched")),
        "a table with nothing written is left out: {:?}",
        done.tables
    );
    assert!(done.commits >= 4, "four transactions committed: {done:?}");
    assert!(done.wal_position > 0, "the writes were logged: {done:?}");
    if let Some((records, _)) = done.wal_records {
        assert!(records > 0, "{done:?}");
    }
    let _ = conn.close().await;
    f.cleanup().await;
}

/// The bench's count of one database's log: the records of its own relations and the
/// commits of its transactions, read from the log, while another database's writes
/// made meanwhile are left out (the server-wide position counts both); counting turns
/// automatic vacuuming off on the database's tables and back on, and a vacuum between
/// phases is logged in the same database.
#[tokio::test]
async fn postgres_the_log_of_one_database_leaves_out_what_another_wrote_meanwhile() {
    use sqlx::Connection;
    let url = crate::fixtures::postgres_url();
    let server = url.rsplit_once('/').unwrap().0.to_owned();
    let mut admin = sqlx::PgConnection::connect(&format!("{server}/postgres"))
        .await
        .unwrap();
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let (ours, theirs) = (
        format!("orderly_log_ours_{tag}"),
        format!("orderly_log_theirs_{tag}"),
    );
    for name in [&ours, &theirs] {
        execute_all(&mut admin, &[format!("CREATE DATABASE {name}")]).await;
    }
    let ours_url = format!("{server}/{ours}");
    let mut a = sqlx::PgConnection::connect(&ours_url).await.unwrap();
    let mut b = sqlx::PgConnection::connect(&format!("{server}/{theirs}"))
        .await
        .unwrap();
    for conn in [&mut a, &mut b] {
        execute_all(
            conn,
            &["CREATE TABLE t (id int PRIMARY KEY, note text)".to_owned()],
        )
        .await;
    }
    let readable = orderly_sql::postgres::begin_counting(&ours_url)
        .await
        .unwrap();
    assert!(readable, "the test role reads the log (pg_walinspect)");
    let options: Option<Vec<String>> =
        sqlx::query_scalar("SELECT reloptions FROM pg_class WHERE relname = 't'")
            .fetch_one(&mut a)
            .await
            .unwrap();
    assert!(
        options
            .unwrap_or_default()
            .contains(&"autovacuum_enabled=false".to_owned()),
        "counting turns automatic vacuuming off"
    );
    let before = orderly_sql::postgres::server_counters(&ours_url)
        .await
        .unwrap();
    // 100 rows here in one transaction: 100 heap and 100 index records and a commit
    // (and a record or two for new pages); 2,000 rows there.
    execute_all(
        &mut a,
        &["INSERT INTO t SELECT g, 'here' FROM generate_series(1, 100) g".to_owned()],
    )
    .await;
    execute_all(
        &mut b,
        &["INSERT INTO t SELECT g, 'there' FROM generate_series(1, 2000) g".to_owned()],
    )
    .await;
    let after = orderly_sql::postgres::server_counters(&ours_url)
        .await
        .unwrap();
    let log =
        orderly_sql::postgres::database_log(&ours_url, before.wal_position, after.wal_position)
            .await
            .unwrap()
            .expect("the log is readable");
    assert!(
        (201..=220).contains(&log.records),
        "100 rows, their index entries and a commit: {log:?}"
    );
    assert!(
        log.bytes > 0 && log.bytes < after.wal_position - before.wal_position,
        "{log:?}"
    );
    execute_all(&mut a, &["DELETE FROM t WHERE id <= 50".to_owned()]).await;
    let (from, to) = orderly_sql::postgres::vacuum(&ours_url).await.unwrap();
    let vacuumed = orderly_sql::postgres::database_log(&ours_url, from, to)
        .await
        .unwrap()
        .expect("the log is readable");
    assert!(
        vacuumed.records > 0,
        "the vacuum cleared 50 dead rows: {vacuumed:?}"
    );
    orderly_sql::postgres::end_counting(&ours_url)
        .await
        .unwrap();
    let options: Option<Vec<String>> =
        sqlx::query_scalar("SELECT reloptions FROM pg_class WHERE relname = 't'")
            .fetch_one(&mut a)
            .await
            .unwrap();
    assert_eq!(options, None, "automatic vacuuming back as it was");
    let _ = a.close().await;
    let _ = b.close().await;
    for name in [&ours, &theirs] {
        execute_all(&mut admin, &[format!("DROP DATABASE {name} WITH (FORCE)")]).await;
    }
}

/// A write abandoned while its `BEGIN` is on the wire (a shutdown, a timeout, a
/// `select!` that took another branch) leaves no transaction open on its connection:
/// the pool's next user runs on its own. sqlx 0.9 arms its rollback guard only once
/// `BEGIN` is answered, so a begin dropped before that handed the pool a connection
/// inside a transaction nothing would end: its next users' statements ran in it,
/// holding their locks and committing nothing until someone's `COMMIT`, or rolled back
/// with the connection (seen as a test's clean-up waiting for ever on a connection
/// "idle in transaction" after the roles stopped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_write_abandoned_during_its_begin_leaves_no_transaction_open() {
    use std::future::Future;
    use std::task::{Context, Waker};
    let f = pg_factory(TimeSource::Database).await;
    // One connection: the abandoned write's is the next user's.
    let store = orderly_sql::PgStore::connect(f.options(), 1, TimeSource::Database)
        .await
        .unwrap();
    let mut cx = Context::from_waker(Waker::noop());
    let submitter = builders::submitter();
    let mut abandoned = 0;
    for i in 0..40 {
        let order = builders::order_with_id(&format!("abandoned-{i}"), 1);
        {
            let mut write = std::pin::pin!(store.submit(&order, &submitter, &[]));
            // Polled once: it takes the connection and sends BEGIN; then dropped.
            if write.as_mut().poll(&mut cx).is_pending() {
                abandoned += 1;
            }
        }
        // Two statements on the connection: in a transaction of their own each, or
        // both in one left open.
        let mut conn = store.pool().acquire().await.unwrap();
        let mut ids = Vec::new();
        for _ in 0..2 {
            let id: i64 = sqlx::query_scalar("SELECT txid_current()")
                .fetch_one(&mut *conn)
                .await
                .unwrap();
            ids.push(id);
        }
        assert_ne!(
            ids[0], ids[1],
            "after abandoned write {i}, the pool's connection is inside a transaction"
        );
    }
    assert!(abandoned > 0, "no write was abandoned on the way");
    // And the store writes and commits as before.
    let order = builders::order_with_id("kept", 1);
    store.submit(&order, &submitter, &[]).await.unwrap();
    let other = sqlx::PgPool::connect_with(f.options()).await.unwrap();
    let kept: i64 = sqlx::query_scalar("SELECT count(*) FROM orders WHERE order_id = 'kept'")
        .fetch_one(&other)
        .await
        .unwrap();
    assert_eq!(kept, 1, "committed: seen from another connection");
    other.close().await;
    store.pool().close().await;
    f.cleanup().await;
}

/// A cancel that races the start of a step that can never be undone is refused at
/// once, naming the step. Here the start (a scheduler's step write: the state row
/// touched, the step row written `irreversible`) is in flight, not yet committed, when
/// the operator's cancel begins. The cancel locks the order's row before it reads the
/// order's steps, so it waits for the start and then sees it. Had it read first, it
/// would have found nothing in the way, and its update, waiting behind the start for
/// the row, would have gone through afterwards on an order whose step was under way.
#[tokio::test]
async fn postgres_a_cancel_racing_the_start_of_a_step_that_cannot_be_undone_is_refused() {
    use orderly_core::step::StepStatus;
    use orderly_core::store::{OperatorStore, StepUpdate, StepWrite};
    use orderly_core::{Actor, Error, ProcessState};
    use sqlx::Connection;

    let f = pg_factory(TimeSource::Database).await;
    let store = f.store().await;
    let fence = submit_and_claim(
        &store,
        builders::order_with_id("race-1", 1),
        Duration::from_secs(60),
    )
    .await
    .fence;
    // Step 0 done (it can be undone): a cancel now would undo it, then end Cancelled.
    let verdicts = store
        .record_steps(&[StepWrite {
            complete: false,
            fence: fence.clone(),
            expect_step: Some(0),
            updates: vec![StepUpdate {
                index: 0,
                name: "reserve".into(),
                status: StepStatus::Succeeded,
                detail: None,
                idempotency_key: "race-1/0".into(),
                irreversible: false,
            }],
            sends: Vec::new(),
        }])
        .await
        .unwrap();
    assert!(matches!(verdicts[..], [Ok(())]), "{verdicts:?}");
    let before = store.get(&fence.order_id).await.unwrap();

    // The scheduler starts step 1, which cannot be undone; not committed yet.
    let mut start = sqlx::PgConnection::connect_with(&f.options())
        .await
        .unwrap();
    let xid: String = {
        execute_all(
            &mut start,
            &[
                "BEGIN".to_owned(),
                "UPDATE order_state SET current_step = 1, updated_at = now() \
                 WHERE order_id = 'race-1'"
                    .to_owned(),
                format!(
                    "INSERT INTO order_steps (order_id, step_index, name, status, \
                     idempotency_key, attempts, detail, epoch, updated_at, irreversible) \
                     VALUES ('race-1', 1, 'ship', 'Started', 'race-1/1', 1, NULL, {}, now(), true)",
                    fence.epoch.0
                ),
            ],
        )
        .await;
        sqlx::query_scalar("SELECT pg_current_xact_id()::text")
            .fetch_one(&mut start)
            .await
            .unwrap()
    };
    let ops = Actor::operator("ops");
    let cancel = {
        let store = store.clone();
        let (order_id, ops) = (fence.order_id.clone(), ops.clone());
        tokio::spawn(async move {
            store
                .request_cancel(&order_id, &ops, "customer called", &[])
                .await
        })
    };
    // The cancel waits for the start's transaction (for the order's row).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_locks WHERE NOT granted \
             AND locktype = 'transactionid' AND transactionid::text = $1",
        )
        .bind(&xid)
        .fetch_one(store.pool())
        .await
        .unwrap();
        if waiting > 0 {
            break;
        }
        assert!(
            !cancel.is_finished(),
            "the cancel ended without waiting for the step's start: {:?}",
            cancel.await
        );
        assert!(
            std::time::Instant::now() < deadline,
            "the cancel never waited for the step's start"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    execute_all(&mut start, &["COMMIT".to_owned()]).await;

    match cancel.await.unwrap() {
        Err(Error::PastReturn { order_id, steps }) => {
            assert_eq!((order_id, steps.as_str()), (fence.order_id.clone(), "ship"));
        }
        other => panic!("refused, naming ship: {other:?}"),
    }
    let after = store.get(&fence.order_id).await.unwrap();
    assert_eq!(
        (
            after.state.process_state,
            after.state.locked_by.as_ref(),
            after.state.lock_epoch
        ),
        (ProcessState::Processing, Some(&fence.owner), fence.epoch),
        "the order runs on under its scheduler"
    );
    assert_eq!(
        after.history.len(),
        before.history.len(),
        "and its history says nothing of the cancel"
    );
    f.cleanup().await;
}

/// A store whose connections go silent (a partition that swallows every byte and
/// resets nothing) fails each statement left unanswered after its answer timeout, as an
/// outage, instead of waiting for ever; healed, it works again on new connections. Cut
/// and healed more times than the pool has connections, sometimes while a connection
/// is being handed back: a lost one is never handed back to the pool, and one stuck in
/// the pool's check does not hold its place for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_statement_a_partition_leaves_unanswered_fails_after_the_answer_timeout_and_the_store_recovers()
 {
    use orderly_core::Actor;
    use orderly_core::store::OperatorStore;
    let f = pg_factory(TimeSource::Database).await;
    drop(f.store().await); // migrated, directly
    let partition = orderly_testkit::partition::Partition::to(f.options().get_port()).await;
    let options = f.options().host("127.0.0.1").port(partition.port);
    let bound = Duration::from_millis(500);
    let store =
        orderly_sql::PgStore::connect_answering_within(options, 2, TimeSource::Database, bound)
            .await
            .unwrap();
    let operator = Actor::operator("test");
    let mut n = 0;
    let mut next = || {
        n += 1;
        builders::order(n)
    };
    for round in 0..6 {
        store.submit(&next(), &operator, &[]).await.unwrap();
        // Even rounds cut once the connection is back in the pool: the next statement
        // goes out on it and is not answered. Odd rounds cut at once, while the pool
        // checks the connection handed back (sqlx's own check waits unbounded): the
        // next statement waits for a new connection, which the partition holds, and
        // the pool, timed out, is replaced if a connection stuck in that check.
        let settled = round % 2 == 0;
        if settled {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        partition.cut();
        let started = std::time::Instant::now();
        let refused = store.submit(&next(), &operator, &[]).await.unwrap_err();
        let waited = started.elapsed();
        assert!(
            matches!(refused, orderly_core::Error::Unavailable(_)),
            "round {round}: {refused}"
        );
        if settled {
            assert!(
                refused.to_string().contains("did not answer within 500 ms"),
                "round {round}: {refused}"
            );
        }
        // Bounded (by the answer timeout, or the pool's 15 s wait for a connection),
        // not a hang.
        assert!(
            waited < Duration::from_secs(20),
            "round {round}: {waited:?}"
        );
        partition.heal();
        // A connection opened before the cut and idle since may be handed out once more
        // (those idle under a second are not checked): it fails within the bound too.
        let mut tries = 0;
        loop {
            tries += 1;
            match store.submit(&next(), &operator, &[]).await {
                Ok(_) => break,
                Err(orderly_core::Error::Unavailable(_)) if tries < 4 => {}
                Err(e) => panic!("round {round}, try {tries}: {e}"),
            }
        }
        assert!(store.count_by_state().await.is_ok(), "round {round}");
    }
    drop(store);
    f.cleanup().await;
}
