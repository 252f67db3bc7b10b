//! `orderly bench` on PostgreSQL as a user runs it: on a database of its own, it reports
//! for each phase what the server wrote per order, counts a busy machine does not
//! change.

use crate::fixtures::postgres_url;
use crate::newcomer::orderly;

/// A new database on the test server (the server's row counts are per database: the
/// other tests' schemas share the test database), dropped at the end.
struct OwnDatabase {
    name: String,
    url: String,
}

impl OwnDatabase {
    async fn new() -> Self {
        let base = postgres_url();
        let name = format!("orderly_bench_{}", uuid::Uuid::new_v4().simple());
        let pool = sqlx::PgPool::connect(&base).await.expect(
            "PostgreSQL is required: start it (see README.md) or set ORDERLY_TEST_POSTGRES_URL",
        );
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
        let (server, _) = base.rsplit_once('/').expect("a URL with a database");
        Self {
            url: format!("{server}/{name}"),
            name,
        }
    }

    async fn drop_it(self) {
        let pool = sqlx::PgPool::connect(&postgres_url()).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        )))
        .execute(&pool)
        .await
        .unwrap();
        pool.close().await;
    }
}

#[tokio::test]
async fn the_bench_on_postgres_tells_the_rows_and_log_the_server_wrote_per_order() {
    let db = OwnDatabase::new().await;
    let (ok, out, err) = orderly(
        "sqlite::memory:",
        &[
            "bench",
            "--orders",
            "60",
            "--paced-rate",
            "100",
            "--store",
            &db.url,
        ],
        &[],
    );
    db.drop_it().await;
    assert!(ok, "the bench failed:\n{out}\n{err}");
    let phases: Vec<&str> = out.split("== PostgreSQL: ").skip(1).collect();
    assert_eq!(
        phases.len(),
        3,
        "a burst, a paced phase and a low-load one:\n{out}"
    );
    for phase in phases {
        assert!(phase.contains("invariants           all hold"), "{phase}");
        let line = |start: &str| {
            phase
                .lines()
                .find(|l| l.starts_with(start))
                .unwrap_or_else(|| panic!("no `{start}` line in\n{phase}"))
                .to_owned()
        };
        // How busy the machine's cores were over the phase (every process's CPU).
        let machine = line("cpu, machine");
        let busy: f64 = machine
            .split_whitespace()
            .nth(2)
            .and_then(|b| b.strip_suffix('%'))
            .and_then(|b| b.parse().ok())
            .unwrap_or_else(|| panic!("no share in {machine}"));
        assert!(
            (0.0..=100.0).contains(&busy) && machine.contains(" cores busy"),
            "{machine}"
        );
        let log = line("server log written");
        assert!(
            log.contains(" bytes per order (") && log.contains("records and"),
            "{log}"
        );
        // Every order of a run without faults writes the same rows: its details, its
        // state row, nine history entries (submitted, claimed, three steps started and
        // succeeded, completed), three step rows and seven messages (its order, and a
        // request and a reply per step), each inserted once.
        let rows = line("rows written");
        for table in [
            "orders 1.0 inserted",
            "order_state 1.0 inserted, 5.0 updated",
            "order_history 9.0 inserted",
            "order_steps 3.0 inserted, 3.0 updated",
            "queue_messages 7.0 inserted, 7.0 updated (",
        ] {
            assert!(rows.contains(table), "`{table}` missing from: {rows}");
        }
        // Each message is locked by its take and deleted. The submitter's and the
        // scheduler's takes (4 of the 7) lock in place, without new index entries; the
        // agent's move the message's visible time, which the queue's index orders by.
        let queue = rows
            .split("queue_messages 7.0 inserted, 7.0 updated (")
            .nth(1)
            .unwrap();
        let (in_place, rest) = queue.split_once("% in place), ").unwrap();
        let in_place: u32 = in_place.parse().unwrap();
        assert!(
            (1..=57).contains(&in_place) && rest.starts_with("7.0 deleted"),
            "{rows}"
        );
    }
}

/// `bench --processes` runs the phases again with every role its own process, from the
/// binaries beside the runner, checks the same invariants, and prints both runs side
/// by side.
#[tokio::test]
async fn the_bench_as_deployed_runs_every_role_as_a_process_and_compares() {
    let (ok, out, err) = orderly(
        "sqlite::memory:",
        &[
            "bench",
            "--orders",
            "100",
            "--paced-rate",
            "100",
            "--processes",
        ],
        &[],
    );
    assert!(ok, "the bench failed:\n{out}\n{err}");
    let deployed: Vec<&str> = out.split("== SQLite, as deployed: ").skip(1).collect();
    assert_eq!(deployed.len(), 3, "three phases as deployed:\n{out}");
    for phase in &deployed {
        assert!(phase.contains("invariants           all hold"), "{phase}");
        assert!(
            phase.contains("  Processed          100"),
            "every order Processed: {phase}"
        );
    }
    let table = out
        .split("== SQLite: in process | as deployed (one process per role)")
        .nth(1)
        .unwrap_or_else(|| panic!("no side-by-side table:\n{out}"));
    let rows: Vec<&str> = table.lines().skip(2).take(3).collect();
    for (row, phase) in rows
        .iter()
        .zip(["burst of 100", "paced at 100", "paced at 100"])
    {
        assert!(row.starts_with(phase), "{row:?} in\n{table}");
        // Three figures each side: orders/s, p50, p99.
        let figures = row
            .split('|')
            .map(|side| side.split_whitespace().rev().take(3).count());
        assert!(figures.clone().all(|n| n == 3), "{row:?}");
    }
}

/// `bench --counters --limits FILE`, as the test command runs it: within the limits it
/// says so and succeeds; over one it fails naming the store, phase, figure, value and
/// limit; a file that limits nothing on this store is refused rather than passing.
#[test]
fn the_quick_bench_checks_its_counters_against_a_limits_file() {
    let dir =
        std::env::temp_dir().join(format!("orderly-limits-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let roomy = file(
        "roomy.toml",
        "[sqlite.burst]\nwrite_transactions_per_order = 50.0\n[sqlite.low]\nwrite_transactions_per_order = 50.0\n",
    );
    let tight = file(
        "tight.toml",
        "[sqlite.low]\nwrite_transactions_per_order = 0.01\n",
    );
    let other = file("other.toml", "[postgres.low]\nrows_per_order = 44.5\n");
    let bench = |limits: &str| {
        orderly(
            "sqlite::memory:",
            &["bench", "--counters", "--orders", "100", "--limits", limits],
            &[],
        )
    };

    let (ok, out, err) = bench(&roomy);
    assert!(ok, "within roomy limits:\n{out}\n{err}");
    assert!(
        out.contains("counters             within the limits (sqlite)"),
        "{out}"
    );
    assert!(out.contains("write_transactions_per_order"), "{out}");
    for line in [
        "statements_per_order",
        "round_trips_per_order",
        "commits_per_order",
        "rows by table",
        "statements by text, per order",
        "idle, the roles waiting for 10 s",
        "statements_per_second",
    ] {
        assert!(out.contains(line), "no {line:?} in\n{out}");
    }

    let (ok, out, err) = bench(&tight);
    assert!(!ok, "over a limit yet it passed:\n{out}");
    assert!(
        err.contains("sqlite.low.write_transactions_per_order = ")
            && err.contains("over its limit of 0.01"),
        "{err}"
    );

    let (ok, _, err) = bench(&other);
    assert!(
        !ok,
        "a file with no SQLite limits checked nothing, yet passed"
    );
    assert!(err.contains("no limits for sqlite"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `orderly bench console` on `store` and checks what it seeded and printed: every
/// page answered (the bench stops at a page that does not), the orders are where the
/// scale puts them, each Error order has its alert, and a seeded order reads as one the
/// roles finished (its steps and its history, oldest first, ending where its state is).
async fn console_bench_on(store: &str, dialect: &str) {
    let (ok, out, err) = orderly(
        "sqlite::memory:",
        &[
            "bench",
            "console",
            "--orders",
            "3000",
            "--requests",
            "2",
            "--store",
            store,
        ],
        &[],
    );
    assert!(ok, "the console bench failed:\n{out}\n{err}");
    assert!(
        out.contains(&format!("== {dialect}: seeding 3330 orders")),
        "{out}"
    );
    assert!(
        out.contains("the first tally of the finished orders"),
        "{out}"
    );
    for page in [
        "/ ",
        "/?range=7d ",
        "/api/activity?range=24h ",
        "/errors ",
        "/orders?customer=",
        "/api/errors ",
        "/orders/err-0000150 ",
    ] {
        let line = out
            .lines()
            .find(|l| l.starts_with(page))
            .unwrap_or_else(|| panic!("no line for {page} in\n{out}"));
        let figures: Vec<f64> = line
            .split_whitespace()
            .skip(1)
            .take(3)
            .map(|f| f.parse().unwrap_or_else(|_| panic!("{line}")))
            .collect();
        assert!(
            figures[0] > 0.0 && figures[0] <= figures[1] && figures[1] <= figures[2],
            "{line}"
        );
    }
    let seeded = orderly_sql::open(store, orderly_core::TimeSource::Database)
        .await
        .unwrap();
    let counts: std::collections::HashMap<_, _> =
        seeded.count_by_state().await.unwrap().into_iter().collect();
    use orderly_core::ProcessState::*;
    assert_eq!(counts[&Processed], 2970, "{counts:?}");
    assert_eq!(counts[&Cancelled], 30, "{counts:?}");
    assert_eq!(counts[&Error], 300, "{counts:?}");
    assert_eq!(counts[&Pending] + counts[&Processing], 30, "{counts:?}");
    assert_eq!(seeded.alerts(false, 1_000).await.unwrap().len(), 300);
    for (id, state, last) in [
        (
            "done-0001500",
            Processed,
            orderly_core::history::HistoryKind::Completed,
        ),
        (
            "err-0000151",
            Error,
            orderly_core::history::HistoryKind::Failed,
        ),
    ] {
        let view = seeded
            .get(&orderly_core::OrderId::parse(id).unwrap())
            .await
            .unwrap();
        assert_eq!(view.state.process_state, state);
        let history = &view.history;
        assert_eq!(
            history.first().map(|h| h.kind),
            Some(orderly_core::history::HistoryKind::Submitted)
        );
        assert_eq!(
            history.last().map(|h| (h.kind, h.to_state)),
            Some((last, state))
        );
        assert!(
            history.windows(2).all(|w| w[0].at <= w[1].at),
            "{history:?}"
        );
        match state {
            Processed => assert!(
                view.steps
                    .iter()
                    .all(|s| s.status == orderly_core::StepStatus::Succeeded)
            ),
            _ => assert_eq!(
                view.steps.last().map(|s| (s.index, s.status)),
                Some((view.state.current_step, orderly_core::StepStatus::Failed))
            ),
        }
    }
}

#[tokio::test]
async fn the_console_bench_seeds_sqlite_and_times_every_page() {
    let file = std::env::temp_dir().join(format!(
        "orderly-console-test-{}.db",
        uuid::Uuid::new_v4().simple()
    ));
    console_bench_on(&format!("sqlite://{}", file.display()), "SQLite").await;
    for end in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{end}", file.display()));
    }
}

#[tokio::test]
async fn the_console_bench_seeds_postgres_and_times_every_page() {
    let db = OwnDatabase::new().await;
    let url = db.url.clone();
    // The database goes whether the checks pass or not.
    let checked = tokio::spawn(async move { console_bench_on(&url, "PostgreSQL").await }).await;
    db.drop_it().await;
    checked.unwrap();
}
