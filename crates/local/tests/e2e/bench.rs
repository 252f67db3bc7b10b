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
