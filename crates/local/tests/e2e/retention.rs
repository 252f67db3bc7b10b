//! Retention run by the leading supervisor, as the real binary on a new database: with
//! `--retain-finished 1s --prune-every 1s` it removes the finished orders (with their
//! history) once they are older than the span, and leaves the live ones.

use std::time::Duration;

use orderly_core::ProcessState;
use orderly_testkit::builders;

use crate::both;
use crate::fixtures::{Db, Dialect};
use crate::procs::{Proc, wait_for};

both!(
    the_leading_supervisor_prunes_finished_orders_by_its_policy,
    leader_prunes
);
async fn leader_prunes(dialect: Dialect) {
    let (db, backend) = Db::with_queues(dialect, Duration::from_secs(5)).await;
    let store = backend.store.clone();
    let mut ids = Vec::new();
    for n in 0..4 {
        let order = builders::order(n);
        store
            .submit(&order, &builders::submitter(), &[])
            .await
            .unwrap();
        ids.push(order.order_id);
    }
    let operator = orderly_core::Actor::operator("test");
    for id in &ids[..2] {
        let row = store
            .cancel(id, &operator, "not wanted", &[])
            .await
            .unwrap();
        assert_eq!(row.process_state, ProcessState::Cancelled);
    }
    let supervisor = Proc::start(
        "orderly-supervisor",
        &db.url,
        &[
            "--interval-ms",
            "200",
            "--retain-finished",
            "1s",
            "--prune-every",
            "1s",
        ],
    );
    wait_for(
        "the cancelled orders pruned",
        Duration::from_secs(30),
        async || {
            let mut all_gone = true;
            for id in &ids[..2] {
                all_gone &= matches!(
                    store.get(id).await,
                    Err(orderly_core::Error::OrderNotFound(_))
                );
            }
            all_gone
        },
    )
    .await;
    for id in &ids[2..] {
        assert_eq!(
            store.get(id).await.unwrap().state.process_state,
            ProcessState::Pending,
            "live orders stay"
        );
    }
    // The supervisor logs a prune after its commit, so the rows can be seen gone a
    // moment before the line is written; the two orders may go in one round or two.
    let reported = async || {
        let pruned: u32 = supervisor
            .output()
            .lines()
            .filter(|line| line.contains("pruned what the retention policy lets go"))
            .filter_map(|line| {
                line.split("orders=")
                    .nth(1)?
                    .split(' ')
                    .next()?
                    .parse::<u32>()
                    .ok()
            })
            .sum();
        pruned == 2
    };
    wait_for("the prune reported", Duration::from_secs(10), reported).await;
}

/// On PostgreSQL the leading supervisor, as the real binary, vacuums the queue's table
/// once the messages it carried left enough dead row versions behind (the server's own
/// autovacuum is off on the test server, and looks once a minute at best elsewhere).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_leading_supervisor_vacuums_the_queue_table_on_postgres() {
    use orderly_core::transport::QueueName;
    let (db, backend) = Db::with_queues(Dialect::Postgres, Duration::from_secs(5)).await;
    let queue = QueueName::parse("e2e.churn").unwrap();
    orderly_testkit::transport::churn(
        backend.transport.as_ref(),
        &queue,
        "m",
        orderly_core::store::TIDY_MIN_DEAD as usize,
    )
    .await;
    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
    let vacuums = || async {
        let mut conn = pool.acquire().await.unwrap();
        sqlx::query("SELECT pg_stat_clear_snapshot()")
            .execute(&mut *conn)
            .await
            .unwrap();
        sqlx::query_scalar::<_, i64>(
            "SELECT vacuum_count FROM pg_stat_user_tables \
             WHERE schemaname = current_schema() AND relname = 'queue_messages'",
        )
        .fetch_one(&mut *conn)
        .await
        .unwrap()
    };
    assert_eq!(vacuums().await, 0);
    let _supervisor = Proc::start(
        "orderly-supervisor",
        &db.url,
        &["--interval-ms", "200", "--vacuum-every", "1s"],
    );
    wait_for(
        "the queue's table vacuumed",
        Duration::from_secs(30),
        async || vacuums().await >= 1,
    )
    .await;
    pool.close().await;
}

both!(
    the_leading_supervisor_tallies_the_finished_orders,
    leader_tallies
);
/// The leading supervisor, as the real binary on a new database, tallies the finished
/// orders as it takes the lead (and every minute after): the tallies' mark leaves the
/// epoch for the minute before last, and the counts by state read the same before and
/// after.
async fn leader_tallies(dialect: Dialect) {
    let (db, backend) = Db::with_queues(dialect, Duration::from_secs(5)).await;
    let store = backend.store.clone();
    let operator = orderly_core::Actor::operator("test");
    for n in 0..3 {
        let order = builders::order(n);
        store
            .submit(&order, &builders::submitter(), &[])
            .await
            .unwrap();
        if n < 2 {
            store
                .cancel(&order.order_id, &operator, "not wanted", &[])
                .await
                .unwrap();
        }
    }
    let counts = async || -> Vec<(ProcessState, i64)> { store.count_by_state().await.unwrap() };
    let before = counts().await;
    let mark = async || -> String {
        match dialect {
            Dialect::Sqlite => {
                let pool = sqlx::SqlitePool::connect(&db.url).await.unwrap();
                let upto = sqlx::query_scalar("SELECT upto FROM finished_tally_mark")
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                pool.close().await;
                upto
            }
            Dialect::Postgres => {
                let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
                let upto = sqlx::query_scalar(
                    "SELECT to_char(upto AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI') \
                     FROM finished_tally_mark",
                )
                .fetch_one(&pool)
                .await
                .unwrap();
                pool.close().await;
                upto
            }
        }
    };
    assert!(
        mark().await.starts_with("1970-01-01"),
        "nothing tallied yet"
    );
    let _supervisor = Proc::start("orderly-supervisor", &db.url, &["--interval-ms", "200"]);
    wait_for(
        "the leader's first tally",
        Duration::from_secs(30),
        async || !mark().await.starts_with("1970-01-01"),
    )
    .await;
    let upto = mark().await;
    let now = store.store_now().await.unwrap();
    let expected = [1, 2].map(|back| {
        orderly_core::activity::minute_of(now - chrono::Duration::minutes(back))
            .format("%Y-%m-%dT%H:%M")
            .to_string()
    });
    assert!(
        expected.iter().any(|m| upto.starts_with(m.as_str())),
        "tallied up to {upto}, expected the minute before last ({expected:?})"
    );
    assert_eq!(counts().await, before, "the same counts from the tallies");
}
