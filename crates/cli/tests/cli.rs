//! The `orderly` binary as a newcomer runs it: the README's commands on a fresh
//! SQLite file, and the errors an operator sees.

#![allow(clippy::unwrap_used)]

#[path = "../../local/tests/support/procs.rs"]
mod procs;

use std::process::{Command, Output};

struct Db(std::path::PathBuf);

impl Db {
    fn new() -> Self {
        Db(std::env::temp_dir().join(format!("orderly-cli-{}.db", uuid::Uuid::new_v4().simple())))
    }

    fn orderly(&self, args: &[&str]) -> Output {
        Command::new(role("orderly"))
            .args(args)
            .env(
                "ORDERLY_DATABASE_URL",
                format!("sqlite://{}", self.0.display()),
            )
            .env_remove("RUST_BACKTRACE")
            .output()
            .expect("run orderly")
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", self.0.display()));
        }
    }
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn submitted_samples_are_listed_shown_and_triaged() {
    let db = Db::new();
    let out = db.orderly(&["submit", "--sample", "3", "--operator", "erin"]);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout(&out).contains("3 accepted"));

    let out = db.orderly(&["list", "--json"]);
    let rows: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    assert_eq!(rows.len(), 3);
    assert!(rows.iter().all(|r| r["process_state"] == "Pending"));
    let id = rows[0]["order_id"].as_str().expect("order id").to_owned();

    let out = db.orderly(&[
        "cancel",
        &id,
        "--reason",
        "customer called",
        "--operator",
        "erin",
    ]);
    assert!(out.status.success(), "{out:?}");
    let out = db.orderly(&["show", &id, "--json"]);
    let view: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    assert_eq!(view["state"]["process_state"], "Cancelled");
    let history = view["history"].as_array().expect("history");
    assert_eq!(history[0]["actor"], "operator:erin");
    assert_eq!(history[1]["reason"], "customer called");

    let out = db.orderly(&["counts"]);
    assert!(
        stdout(&out).contains("Pending     2") && stdout(&out).contains("Cancelled   1"),
        "{}",
        stdout(&out)
    );
}

/// `orderly list | head` as an operator types it: the reader closes the pipe after a
/// line, and orderly ends quietly with success instead of panicking on the next write.
#[test]
fn a_reader_that_closes_the_pipe_early_ends_orderly_quietly() {
    let db = Db::new();
    // Far more output than a pipe holds, so orderly is still writing when head exits.
    let out = db.orderly(&["submit", "--sample", "1000", "--operator", "erin"]);
    assert!(out.status.success(), "{out:?}");
    for list in ["list --json --limit 1000", "list --limit 1000"] {
        let out = Command::new("bash")
            .arg("-c")
            .arg(format!("set -o pipefail; \"$0\" {list} | head -n 1"))
            .arg(role("orderly"))
            .env(
                "ORDERLY_DATABASE_URL",
                format!("sqlite://{}", db.0.display()),
            )
            .env_remove("RUST_BACKTRACE")
            .output()
            .expect("run bash");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "orderly {list} | head: {out:?}");
        assert!(stderr.is_empty(), "orderly {list} | head said: {stderr}");
        assert_eq!(stdout(&out).lines().count(), 1, "{}", stdout(&out));
    }
}

#[test]
fn an_illegal_transition_fails_with_a_message_and_no_backtrace() {
    let db = Db::new();
    db.orderly(&["submit", "--sample", "1"]);
    let id = stdout(&db.orderly(&["list", "--json"]))
        .lines()
        .next()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).expect("JSON")["order_id"]
                .as_str()
                .expect("id")
                .to_owned()
        });
    let out = db.orderly(&["resubmit", &id.expect("one order"), "--reason", "retry"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("illegal transition Pending -> Pending"),
        "{err}"
    );
    assert!(!err.contains("backtrace"), "{err}");
}

#[test]
fn a_bench_rate_that_is_not_a_rate_is_refused_naming_the_flag() {
    let db = Db::new();
    for rate in ["0", "-5", "fast", "NaN"] {
        let out = db.orderly(&["bench", "--orders", "10", &format!("--paced-rate={rate}")]);
        assert!(!out.status.success(), "--paced-rate {rate} was taken");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--paced-rate") && err.contains("orders/s"),
            "{err}"
        );
    }
}

#[test]
fn an_invalid_order_file_is_refused_naming_the_field() {
    let db = Db::new();
    let file = std::env::temp_dir().join(format!(
        "orderly-cli-{}.json",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::write(
        &file,
        r#"[{"order_id":"SO-1","details":{"customer_id":"c","currency":"EUR","lines":[{"sku":"a","quantity":0,"unit_price_minor":5}]}}]"#,
    )
    .expect("write order file");
    let out = db.orderly(&["submit", file.to_str().expect("utf-8 path")]);
    let _ = std::fs::remove_file(&file);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("lines[0].quantity"), "{err}");
    assert_eq!(
        stdout(&db.orderly(&["list", "--json"])).lines().count(),
        0,
        "nothing was stored"
    );
}

#[test]
fn an_unknown_database_url_names_the_setting() {
    let out = Command::new(role("orderly"))
        .args([
            "--database-url",
            "mysql://root:hunter2-pw@db/orders",
            "counts",
        ])
        .output()
        .expect("run orderly");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("database_url"), "{err}");
    assert!(
        !err.contains("hunter2-pw"),
        "the password must not be printed: {err}"
    );
}

#[test]
fn the_readme_demo_processes_its_orders_and_checks_the_invariants() {
    let db = Db::new();
    let url = format!("sqlite://{}", db.0.display());
    let out = Command::new(role("orderly"))
        .args([
            "demo",
            "--orders",
            "60",
            "--timeout-secs",
            "120",
            "--store",
            &url,
        ])
        .env_remove("ORDERLY_LOG")
        .output()
        .expect("run orderly demo");
    let text = stdout(&out);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("orders submitted     60"), "{text}");
    assert!(text.contains("invariants           all hold"), "{text}");
    let processed: usize = text
        .lines()
        .find(|l| l.trim_start().starts_with("Processed"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap();
    let error: usize = text
        .lines()
        .find(|l| l.trim_start().starts_with("Error"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert_eq!(processed + error, 60, "{text}");
}

#[test]
fn invalid_role_settings_stop_start_up_naming_the_setting() {
    let db = Db::new();
    let url = format!("sqlite://{}", db.0.display());
    let start = |bin: &std::path::Path, args: &[&str], env: &[(&str, &str)]| {
        Command::new(bin)
            .args(args)
            .env("ORDERLY_DATABASE_URL", &url)
            .env_remove("ORDERLY_WORKFLOW")
            .envs(env.iter().copied())
            .output()
            .expect("run the binary")
    };
    let run_with = |bin: std::path::PathBuf, args: &[&str], env: &[(&str, &str)]| {
        let out = start(&bin, args, env);
        assert!(!out.status.success(), "{} {args:?} started", bin.display());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let run = |bin: std::path::PathBuf, args: &[&str]| run_with(bin, args, &[]);
    let err = run(role("orderly-supervisor"), &["--max-failures", "0"]);
    assert!(
        err.contains("max_failures") && err.contains("--max-failures"),
        "{err}"
    );
    let err = run(role("orderly-agent"), &["--remote-url", "ftp://x"]);
    assert!(err.contains("--remote-url"), "{err}");
    // A period of 0 is refused at start-up (the sweep's timer used to start and then
    // panic in tokio's interval; a poll or renewal of 0 never waits).
    for (bin, var, flag) in [
        ("orderly-supervisor", "ORDERLY_SWEEP_INTERVAL", "--interval"),
        ("orderly-scheduler", "ORDERLY_CLAIM_POLL", "--claim-poll"),
        (
            "orderly-supervisor",
            "ORDERLY_LEASE_RENEW_INTERVAL",
            "--renew-interval",
        ),
    ] {
        let out = start(&role(bin), &["--check-config"], &[(var, "0")]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bin} with {var}=0 started");
        assert!(err.contains(flag) && err.contains("no period"), "{err}");
        assert!(
            err.contains(var),
            "the variable that was set is named: {err}"
        );
    }
    let err = run(role("orderly-agent"), &["--queues", "bad queue!"]);
    assert!(err.contains("ORDERLY_AGENT_QUEUES"), "{err}");
    let wf =
        std::env::temp_dir().join(format!("orderly-wf-{}.toml", uuid::Uuid::new_v4().simple()));
    std::fs::write(
        &wf,
        "name = \"x\"\n[[steps]]\nname = \"a\"\nqueue = \"q\"\ntimeout_ms = 5\n",
    )
    .unwrap();
    let err = run(
        role("orderly-scheduler"),
        &["--workflow", wf.to_str().unwrap()],
    );
    assert!(
        err.contains("steps[0].timeout_ms") && err.contains("--workflow"),
        "{err}"
    );
    // A workflow's name is half of the version orders are pinned to: checked too.
    std::fs::write(
        &wf,
        "name = \"gift wrap\"\n[[steps]]\nname = \"a\"\nqueue = \"q\"\ntimeout_ms = 50\n",
    )
    .unwrap();
    let err = run(
        role("orderly-scheduler"),
        &["--workflow", wf.to_str().unwrap()],
    );
    let _ = std::fs::remove_file(&wf);
    assert!(
        err.contains("name") && err.contains("gift wrap") && err.contains("--workflow"),
        "{err}"
    );
    let err = run(role("orderly-remote-sim"), &["--transient-rate", "2"]);
    assert!(err.contains("transient_rate"), "{err}");
    let err = run(
        role("orderly-submitter"),
        &["--database-url", "mysql://nope"],
    );
    assert!(
        err.contains("database_url") && !err.contains("nope"),
        "the URL is not echoed: {err}"
    );
    // The database URL is checked by --check-config too, without connecting, for every role.
    for bin in [
        role("orderly-submitter"),
        role("orderly-scheduler"),
        role("orderly-agent"),
        role("orderly-supervisor"),
    ] {
        let err = run(
            bin.clone(),
            &["--database-url", "mysql://s3cr3t@db", "--check-config"],
        );
        assert!(
            err.contains("database_url") && !err.contains("s3cr3t"),
            "{}: {err}",
            bin.display()
        );
        let err = run(
            bin,
            &[
                "--database-url",
                "sqlite://never-created.db?synchronous=off",
                "--check-config",
            ],
        );
        assert!(
            err.contains("--database-url / ORDERLY_DATABASE_URL")
                && err.contains("synchronous=off"),
            "{err}"
        );
    }
    assert!(!std::path::Path::new("never-created.db").exists());
    // An instance id may not pose as an operator (whose names in an order's history
    // start `operator:`), by flag or by variable; an ordinary one is taken.
    for bin in [
        role("orderly-submitter"),
        role("orderly-scheduler"),
        role("orderly-agent"),
        role("orderly-supervisor"),
    ] {
        for err in [
            run(
                bin.clone(),
                &["--instance-id", "operator:alice", "--check-config"],
            ),
            run_with(
                bin.clone(),
                &["--check-config"],
                &[("ORDERLY_INSTANCE_ID", "operator:alice")],
            ),
        ] {
            assert!(
                err.contains("--instance-id / ORDERLY_INSTANCE_ID") && err.contains("operator:"),
                "{}: {err}",
                bin.display()
            );
        }
        let fine = start(&bin, &["--check-config", "--instance-id", "pod-7"], &[]);
        assert!(
            fine.status.success(),
            "{}: {}",
            bin.display(),
            String::from_utf8_lossy(&fine.stderr)
        );
    }
    // Service Bus: checked before anything is opened, the secret never echoed.
    for bin in [
        role("orderly-submitter"),
        role("orderly-scheduler"),
        role("orderly-supervisor"),
    ] {
        let err = run(
            bin.clone(),
            &["--transport", "servicebus", "--check-config"],
        );
        assert!(err.contains("ORDERLY_SERVICEBUS_CONNECTION"), "{err}");
        let err = run(
            bin.clone(),
            &[
                "--transport",
                "servicebus",
                "--servicebus-connection",
                "Endpoint=https://wrong;SharedAccessKey=s3cr3t-k3y",
                "--check-config",
            ],
        );
        assert!(
            err.contains("--servicebus-connection / ORDERLY_SERVICEBUS_CONNECTION")
                && !err.contains("s3cr3t-k3y"),
            "{err}"
        );
        // Passwordless: a namespace is a host name, and a key beside it is refused.
        let err = run(
            bin.clone(),
            &[
                "--transport",
                "servicebus",
                "--servicebus-namespace",
                "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKey=s3cr3t-k3y",
                "--check-config",
            ],
        );
        assert!(
            err.contains("ORDERLY_SERVICEBUS_NAMESPACE")
                && err.contains("<name>.servicebus.windows.net")
                && !err.contains("s3cr3t-k3y"),
            "{err}"
        );
        let err = run(
            bin.clone(),
            &[
                "--transport",
                "servicebus",
                "--servicebus-namespace",
                "ns.servicebus.windows.net",
                "--servicebus-connection",
                "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=a;SharedAccessKey=s3cr3t-k3y",
                "--check-config",
            ],
        );
        assert!(
            err.contains("ORDERLY_SERVICEBUS_NAMESPACE")
                && err.contains("not both")
                && !err.contains("s3cr3t-k3y"),
            "{err}"
        );
        // Workload identity outside a pod set up for it: the variables are named.
        let err = run(
            bin,
            &[
                "--transport",
                "servicebus",
                "--servicebus-namespace",
                "ns.servicebus.windows.net",
                "--check-config",
            ],
        );
        assert!(
            err.contains("ORDERLY_SERVICEBUS_CREDENTIAL") && err.contains("AZURE_TENANT_ID"),
            "{err}"
        );
    }
    // A token for a password is PostgreSQL's: with SQLite the setting stops start-up.
    let err = run(
        role("orderly-scheduler"),
        &[
            "--database-credential",
            "workload-identity",
            "--check-config",
        ],
    );
    assert!(
        err.contains("ORDERLY_DATABASE_CREDENTIAL") && err.contains("PostgreSQL only"),
        "{err}"
    );
    let err = run(role("orderly-agent"), &["--transport", "kafka"]);
    assert!(
        err.contains("--transport") && err.contains("servicebus"),
        "{err}"
    );
}

/// A build without the `otel` feature refuses an export it cannot do, rather than
/// starting without the traces the operator asked for.
#[cfg(not(feature = "otel"))]
#[test]
fn an_otel_endpoint_without_the_otel_feature_stops_start_up_naming_the_setting() {
    for bin in [
        role("orderly-submitter"),
        role("orderly-scheduler"),
        role("orderly-agent"),
        role("orderly-supervisor"),
    ] {
        let out = std::process::Command::new(&bin)
            .args(["--check-config", "--otel-endpoint", "http://collector:4318"])
            .env("ORDERLY_DATABASE_URL", "sqlite://unused.db")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{} started", bin.display());
        assert!(
            err.contains("--otel-endpoint / ORDERLY_OTEL_ENDPOINT")
                && err.contains("--features otel"),
            "{}: {err}",
            bin.display()
        );
    }
    // The span filter is checked even where nothing is exported.
    let out = std::process::Command::new(role("orderly-submitter"))
        .args(["--check-config", "--otel-filter", "info,[bad"])
        .env("ORDERLY_DATABASE_URL", "sqlite://unused.db")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--otel-filter / ORDERLY_OTEL_FILTER"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Empty is unset (the compose file passes `${ORDERLY_OTEL_ENDPOINT:-}`).
    let out = std::process::Command::new(role("orderly-agent"))
        .arg("--check-config")
        .env("ORDERLY_DATABASE_URL", "sqlite://unused.db")
        .env("ORDERLY_OTEL_ENDPOINT", "")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The standard variable, set cluster-wide perhaps, is only warned about.
    let out = std::process::Command::new(role("orderly-scheduler"))
        .arg("--check-config")
        .env("ORDERLY_DATABASE_URL", "sqlite://unused.db")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("OTEL_EXPORTER_OTLP_ENDPOINT") && err.contains("feature `otel`"),
        "{err}"
    );
}

#[test]
fn invalid_election_settings_stop_the_supervisor_naming_the_setting_and_hiding_secrets() {
    let db = Db::new();
    let url = format!("sqlite://{}", db.0.display());
    let run = |args: &[&str]| {
        let out = Command::new(role("orderly-supervisor"))
            .args(args)
            .env("ORDERLY_DATABASE_URL", &url)
            .output()
            .expect("run the binary");
        assert!(!out.status.success(), "started with {args:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run(&["--renew-deadline", "30s"]);
    assert!(
        err.contains("--renew-deadline / ORDERLY_LEASE_RENEW_DEADLINE")
            && err.contains("before its lease can expire"),
        "{err}"
    );
    let err = run(&["--alert-webhook-url", "ftp://hooks.example/t0ken-s3cr3t"]);
    assert!(
        err.contains("ORDERLY_ALERT_WEBHOOK_URL") && !err.contains("s3cr3t"),
        "{err}"
    );
    // The old form of the flag, a bare number of milliseconds, is read with a warning.
    let err = run(&["--leader-stop-grace-ms", "15000"]);
    assert!(
        err.contains("--leader-stop-grace-ms is the old form of --leader-stop-grace")
            && err.contains("--leader-stop-grace / ORDERLY_LEADER_STOP_GRACE"),
        "{err}"
    );
    let err = run(&[
        "--elector",
        "blob",
        "--lease",
        "10s",
        "--renew-deadline",
        "5s",
        "--renew-interval",
        "1s",
        "--renew-retry",
        "500ms",
    ]);
    assert!(
        err.contains("--lease / ORDERLY_LEASE") && err.contains("15 to 60"),
        "a 10 s lease is fine for the SQL lease, not for a blob: {err}"
    );
    assert!(
        !err.contains("applied migration"),
        "refused before touching the store: {err}"
    );
    // The old variable too, unless the new one is set, which wins.
    let with_env = |env: &[(&str, &str)]| {
        let out = Command::new(role("orderly-supervisor"))
            .envs(env.iter().copied())
            .env("ORDERLY_DATABASE_URL", &url)
            .arg("--check-config")
            .output()
            .expect("run the binary");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, err) = with_env(&[("ORDERLY_LEASE_RENEW_DEADLINE_MS", "30000")]);
    assert!(
        !ok && err.contains(
            "ORDERLY_LEASE_RENEW_DEADLINE_MS is the old name of ORDERLY_LEASE_RENEW_DEADLINE"
        ) && err.contains("before its lease can expire"),
        "{err}"
    );
    let (ok, err) = with_env(&[
        ("ORDERLY_LEASE_RENEW_DEADLINE_MS", "30000"),
        ("ORDERLY_LEASE_RENEW_DEADLINE", "20s"),
    ]);
    assert!(ok && !err.contains("old name"), "{err}");
    let (ok, err) = with_env(&[("ORDERLY_LEASE_RENEW_DEADLINE", "20000")]);
    assert!(
        !ok && err.contains("--renew-deadline") && err.contains("needs a unit"),
        "a bare number under the new name is refused: {err}"
    );
    let blob = [
        "--elector",
        "blob",
        "--lease-ms",
        "15000",
        "--renew-deadline-ms",
        "10000",
    ];
    let err = run(&blob);
    assert!(
        err.contains("ORDERLY_LEASE_STORAGE_CONNECTION_STRING"),
        "{err}"
    );
    assert!(
        !err.contains("applied migration"),
        "refused before touching the store: {err}"
    );
    let mut args = blob.to_vec();
    args.extend([
        "--lease-storage-connection-string",
        "AccountName=acct;AccountKey=s3cr3t-not-base64!",
    ]);
    let err = run(&args);
    assert!(
        err.contains("lease storage connection string") && err.contains("AccountKey is not base64"),
        "{err}"
    );
    assert!(!err.contains("s3cr3t"), "the key is not echoed: {err}");
    let mut args = blob.to_vec();
    args.extend([
        "--lease-sas-url",
        "https://acct.blob.core.windows.net/c?sv=1&sig=s3cr3t",
        "--lease-container",
        "Bad_Name",
    ]);
    let err = run(&args);
    assert!(!err.contains("s3cr3t"), "the SAS is not echoed: {err}");
}

/// Operators' view of the machinery: the leader, queue depths, dead letters and their
/// requeue, alert acknowledgement; on a store seeded through the library.
#[test]
fn operators_see_the_leader_queues_dead_letters_and_acknowledge_alerts() {
    use orderly_core::transport::{OutgoingMessage, QueueName, QueueSettings};
    use std::time::Duration;

    let db = Db::new();
    let url = format!("sqlite://{}", db.0.display());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let out = db.orderly(&["leader"]);
    assert!(
        stdout(&out).contains("no supervisor has led yet"),
        "{out:?}"
    );
    rt.block_on(async {
        let b = orderly_sql::connect(&url, orderly_core::TimeSource::Database)
            .await
            .unwrap();
        let sup = orderly_core::InstanceId::parse("supervisor-7").unwrap();
        b.store.begin_term("supervisor", &sup).await.unwrap();
        b.store.begin_term("supervisor", &sup).await.unwrap();
        let orders = QueueName::parse("orders").unwrap();
        b.transport
            .declare_queue(&orders, &QueueSettings::default())
            .await
            .unwrap();
        b.transport
            .send(
                &orders,
                &[OutgoingMessage::new("m-bad", b"{not json".to_vec())],
            )
            .await
            .unwrap();
        let got = b
            .transport
            .receive(&orders, 1, Duration::from_secs(5))
            .await
            .unwrap();
        b.transport
            .dead_letter(
                &got[0],
                "BodyUndecodable",
                "expected value at line 1 column 2",
            )
            .await
            .unwrap();
        let order = orderly_cli::sample::order(1);
        error_order(&*b.store, &order).await;
    });

    let out = db.orderly(&["leader", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    assert_eq!(
        (v["holder"].as_str(), v["epoch"].as_i64()),
        (Some("supervisor-7"), Some(2))
    );
    assert_eq!(v["lease_in"], "blob");

    let out = db.orderly(&["queues", "--json"]);
    let orders_depth = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|d| d["queue"] == "orders")
        .expect("the orders queue");
    assert_eq!(orders_depth["dead_lettered"], 1);

    let out = db.orderly(&["dead-letters", "orders"]);
    let text = stdout(&out);
    assert!(
        text.contains("m-bad")
            && text.contains("BodyUndecodable")
            && text.contains("line 1 column 2"),
        "{text}"
    );
    let out = db.orderly(&["dead-letters", "orders", "--json"]);
    let dl: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(dl["body"], "{not json");

    // --all asks first; a closed stdin is "no".
    let out = db.orderly(&["requeue", "orders", "--all"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing requeued"));
    let out = db.orderly(&["requeue", "orders", "m-bad"]);
    assert!(
        out.status.success() && stdout(&out).contains("requeued 1"),
        "{out:?}"
    );
    let out = db.orderly(&["requeue", "orders", "m-bad"]);
    assert!(!out.status.success(), "nothing left to requeue");
    let out = db.orderly(&["queues", "--json"]);
    assert!(
        stdout(&out)
            .contains(r#""queue":"orders","ready":1,"locked":0,"scheduled":0,"dead_lettered":0"#),
        "{}",
        stdout(&out)
    );

    let out = db.orderly(&["alerts", "--json"]);
    let alert: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(alert["last_error"], "card declined");
    let id = alert["alert_id"].as_i64().unwrap().to_string();
    let out = db.orderly(&["alerts", "--ack", &id, "--operator", "erin"]);
    assert!(
        stdout(&out).contains("acknowledged by operator:erin"),
        "{out:?}"
    );
    let out = db.orderly(&["alerts"]);
    assert!(
        stdout(&out).trim().is_empty(),
        "no open alerts: {}",
        stdout(&out)
    );
    let out = db.orderly(&["alerts", "--all"]);
    assert!(stdout(&out).contains("card declined"));
    let out = db.orderly(&["alerts", "--ack", "999"]);
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("no alert #999")
    );
}

/// Settings in layers: defaults < file < environment < flags; `orderly config check`
/// names what is wrong; values from the file never show in `--help`.
#[test]
fn settings_come_in_layers_and_a_bad_file_is_refused_naming_the_setting() {
    let dir = std::env::temp_dir();
    let write = |name: &str, text: &str| {
        let p = dir.join(format!(
            "orderly-cfg-{}-{name}.toml",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::write(&p, text).unwrap();
        p
    };
    let orderly = |args: &[&str], env: &[(&str, &str)]| {
        let mut c = Command::new(role("orderly"));
        c.args(args).env_remove("RUST_BACKTRACE");
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    let good = write(
        "good",
        "database_url = \"sqlite://orderly-never-opened.db\"\nlog_json = true\n\
         [scheduler]\nmax_in_flight = 50\n\
         [agent]\nqueues = [\"agent.inventory\", \"agent.payment\"]\nremote_url = \"http://sim:8080/actions\"\n\
         [supervisor]\nelector = \"blob\"\nlease = \"15s\"\nrenew_deadline = \"10s\"\n\
         lease_storage_connection_string = \"AccountName=acct;AccountKey=c2VjcmV0LWtleQ==\"\n",
    );
    let out = orderly(&["config", "check", good.to_str().unwrap()], &[]);
    let text = stdout(&out);
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for role in ["submitter", "scheduler", "agent", "supervisor"] {
        assert!(
            text.contains(&format!("orderly-{role}: settings OK")),
            "{text}"
        );
    }
    // A wrong value and an unknown key are named.
    let bad = write(
        "bad",
        "[scheduler]\nmax_in_flight = 0\n[agent]\nremote_uri = \"x\"\n[supervisor]\nrenew_deadline_ms = 40000\n",
    );
    let out = orderly(&["config", "check", bad.to_str().unwrap()], &[]);
    let text = stdout(&out);
    assert!(!out.status.success());
    assert!(text.contains("orderly-submitter: settings OK"), "{text}");
    assert!(
        text.contains("orderly-scheduler") && text.contains("--max-in-flight"),
        "{text}"
    );
    assert!(
        text.contains("unknown setting `remote_uri` in [agent]"),
        "{text}"
    );
    // The old key, a bare number of milliseconds, is read with a warning.
    assert!(
        text.contains("renew-deadline-ms in ")
            && text.contains("is the old form of renew-deadline")
            && text.contains("--renew-deadline / ORDERLY_LEASE_RENEW_DEADLINE"),
        "{text}"
    );
    // The environment wins over the file, and a flag over the environment.
    let sup = role("orderly-supervisor");
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let mut c = Command::new(&sup);
        c.args(args).arg("--check-config");
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    let bad_path = bad.to_str().unwrap();
    assert!(!run(&["--config", bad_path], &[]).status.success());
    assert!(
        run(
            &["--config", bad_path],
            &[("ORDERLY_LEASE_RENEW_DEADLINE", "20s")]
        )
        .status
        .success(),
        "the environment wins over the file"
    );
    assert!(
        !run(
            &["--config", bad_path, "--renew-deadline-ms", "35000"],
            &[("ORDERLY_LEASE_RENEW_DEADLINE", "20s")]
        )
        .status
        .success(),
        "a flag wins over the environment"
    );
    assert!(
        run(&[], &[("ORDERLY_CONFIG", good.to_str().unwrap())])
            .status
            .success(),
        "ORDERLY_CONFIG names the file too"
    );
    // Secrets from the file stay out of --help.
    let help = Command::new(sup)
        .args(["--config", good.to_str().unwrap(), "--help"])
        .output()
        .unwrap();
    let help = stdout(&help);
    assert!(help.contains("--lease-storage-connection-string"), "{help}");
    assert!(!help.contains("c2VjcmV0LWtleQ"), "{help}");
    let _ = std::fs::remove_file(good);
    let _ = std::fs::remove_file(bad);
}

#[test]
fn bulk_actions_select_by_filter_and_ask_first() {
    let db = Db::new();
    assert!(db.orderly(&["submit", "--sample", "4"]).status.success());
    let count = |args: &[&str]| {
        let mut all = vec!["list", "--json"];
        all.extend_from_slice(args);
        stdout(&db.orderly(&all)).lines().count()
    };
    assert_eq!(count(&["--step", "0"]), 4);
    assert_eq!(count(&["--older-than", "3600"]), 0, "all created just now");
    assert_eq!(count(&["--step", "1"]), 0);
    let out = db.orderly(&["cancel", "--all", "--state", "Pending", "--reason", "test"]);
    assert!(!out.status.success(), "a closed stdin is no");
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing done"));
    assert_eq!(count(&["--state", "Pending"]), 4);
    let out = db.orderly(&["cancel", "--all", "--reason", "test", "--yes"]);
    assert!(!out.status.success(), "--all needs a state");
    let out = db.orderly(&[
        "cancel", "--all", "--state", "Pending", "--reason", "test", "--yes",
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(count(&["--state", "Cancelled"]), 4);
    let out = db.orderly(&["resubmit", "--all", "--reason", "retry", "--yes"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no order matches"),
        "only Error orders are resubmitted"
    );
}

/// The agents' backpressure settings as an operator writes them: `on`/`off` by flag or
/// variable, a per-service off list, and each wrong value refused naming its setting.
#[test]
fn the_agents_backpressure_settings_are_taken_or_refused_naming_the_setting() {
    let db = Db::new();
    let url = format!("sqlite://{}", db.0.display());
    let agent = |args: &[&str], env: &[(&str, &str)]| {
        Command::new(role("orderly-agent"))
            .args(args)
            .arg("--check-config")
            .env("ORDERLY_DATABASE_URL", &url)
            .envs(env.iter().copied())
            .output()
            .expect("run orderly-agent")
    };
    for (args, env) in [
        (vec!["--backpressure", "off"], vec![]),
        (
            vec![
                "--backpressure",
                "on",
                "--backpressure-off",
                "agent.payment,agent.shipping",
            ],
            vec![],
        ),
        (vec![], vec![("ORDERLY_BACKPRESSURE", "off")]),
        (
            vec![
                "--probe-after",
                "1s",
                "--probe-max",
                "5s",
                "--resume-per-second",
                "50",
            ],
            vec![],
        ),
    ] {
        let out = agent(&args, &env);
        assert!(out.status.success(), "{args:?} {env:?}: {out:?}");
    }
    for (args, setting) in [
        (vec!["--backpressure", "sometimes"], "--backpressure"),
        (
            vec!["--backpressure-off", "no spaces"],
            "--backpressure-off",
        ),
        (vec!["--probe-after", "0"], "--probe-after"),
        (vec!["--probe-after", "5"], "--probe-after"),
        (
            vec!["--probe-after", "9s", "--probe-max", "1s"],
            "--probe-max",
        ),
        (vec!["--resume-per-second", "0"], "--resume-per-second"),
        (vec!["--breaker-failures", "0"], "--breaker-failures"),
    ] {
        let out = agent(&args, &[]);
        assert!(!out.status.success(), "{args:?} was taken");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(setting), "{args:?}: {err}");
    }
}

/// Retention as an operator runs it: finished orders older than the span are counted
/// first, removed only when confirmed, and live orders are never touched.
#[test]
fn prune_counts_first_asks_and_removes_only_finished_orders() {
    let db = Db::new();
    assert!(db.orderly(&["submit", "--sample", "5"]).status.success());
    let ids: Vec<String> = stdout(&db.orderly(&["list", "--json"]))
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).expect("JSON")["order_id"]
                .as_str()
                .expect("id")
                .to_owned()
        })
        .collect();
    assert_eq!(ids.len(), 5);
    for id in &ids[..3] {
        let out = db.orderly(&["cancel", id, "--reason", "not wanted"]);
        assert!(out.status.success(), "{out:?}");
    }
    std::thread::sleep(std::time::Duration::from_millis(1_100));
    let out = db.orderly(&["prune", "--older-than", "1s", "--dry-run"]);
    assert!(out.status.success(), "{out:?}");
    let said = stdout(&out);
    assert!(
        said.contains("older than 1s, would remove: 3 finished orders"),
        "{said}"
    );
    let out = db.orderly(&["prune", "--older-than", "1s"]);
    assert!(!out.status.success(), "a closed stdin is no");
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing removed"));
    let out = db.orderly(&["prune", "--older-than", "1s", "--yes", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let removed = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("JSON"))
        .find(|v| v["what"] == "removed")
        .expect("a removed line");
    assert_eq!(removed["orders"], 3);
    assert!(removed["history"].as_u64().unwrap_or(0) >= 6, "{removed}");
    let left = stdout(&db.orderly(&["list", "--json"])).lines().count();
    assert_eq!(left, 2, "the two Pending orders stay");
    for id in &ids[..3] {
        let out = db.orderly(&["show", id]);
        assert!(!out.status.success(), "{id} is gone");
    }
    let out = db.orderly(&["prune", "--older-than", "1w"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("the unit is ms, s, m, h or d"),
        "{out:?}"
    );
}

/// The dashboard end to end in a real headless browser (Debian's chromium, driven by
/// playwright-core from `tests/browser`): the Error list, search, an order's page,
/// Retry -> Pending; a forged POST refused. Then over plain HTTP: a non-loopback
/// address needs a token, and requests without it are refused.
#[test]
fn the_dashboard_lists_errors_shows_an_order_and_retries_it_in_a_real_browser() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let script = root.join("tests/browser/dashboard.mjs");
    assert!(
        root.join("tests/browser/node_modules/playwright-core")
            .exists(),
        "the browser test needs `npm ci --prefix tests/browser` (.ci/run does)"
    );
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        std::path::Path::new(&chromium).exists(),
        "the browser test needs Debian's chromium at {chromium} (apt-get install chromium; .ci/run does)"
    );
    let db = Db::new();
    let url = format!("sqlite://{}", db.0.display());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let order = orderly_cli::sample::order(7);
    let id = order.order_id.as_str().to_owned();
    rt.block_on(async {
        let b = orderly_sql::connect(&url, orderly_core::TimeSource::Database)
            .await
            .unwrap();
        error_order(&*b.store, &order).await;
    });
    let (mut dash, port) = start_dashboard(&url, "127.0.0.1", None);
    let out = Command::new("node")
        .arg(&script)
        .arg(format!("http://127.0.0.1:{port}"))
        .arg(&id)
        .env("CHROMIUM", &chromium)
        .output()
        .expect("node");
    let _ = dash.kill();
    let _ = dash.wait();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The store agrees: Pending again, by the dashboard's operator.
    let shown = db.orderly(&["show", &id, "--json"]);
    let view: serde_json::Value = serde_json::from_str(&stdout(&shown)).unwrap();
    assert_eq!(view["state"]["process_state"], "Pending");
    let last = view["history"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["actor"], "operator:dashboard");
    assert_eq!(last["reason"], "fixed the card (browser test)");

    // Not loopback: refused without a token; with one, only requests carrying it pass.
    let out = Command::new(role("orderly"))
        .args(["dashboard", "--listen", "0.0.0.0:0"])
        .env("ORDERLY_DATABASE_URL", &url)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("ORDERLY_DASHBOARD_TOKEN"));
    let (mut dash, port) = start_dashboard(&url, "0.0.0.0", Some("t0ken-for-test"));
    rt.block_on(async {
        let base = format!("http://127.0.0.1:{port}");
        let c = procs::http_builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        assert_eq!(
            c.get(format!("{base}/")).send().await.unwrap().status(),
            401
        );
        assert_eq!(
            c.get(format!("{base}/"))
                .bearer_auth("wrong")
                .send()
                .await
                .unwrap()
                .status(),
            401
        );
        let ok = c
            .get(format!("{base}/"))
            .bearer_auth("t0ken-for-test")
            .send()
            .await
            .unwrap();
        assert_eq!(ok.status(), 200);
        let text = ok.text().await.unwrap();
        assert!(
            text.contains("Supervisors") && text.contains("count-Pending"),
            "{text}"
        );
        let r = c
            .get(format!("{base}/errors?token=t0ken-for-test&q=declined"))
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.status(),
            303,
            "the token goes into a cookie and out of the URL"
        );
        assert_eq!(
            r.headers()["location"],
            "/errors?q=declined",
            "the rest of the query stays"
        );
        assert!(
            r.headers()["set-cookie"]
                .to_str()
                .unwrap()
                .contains("HttpOnly")
        );
        // The operations endpoints: probes open to the orchestrator, metrics behind the
        // token, with the store's figures read at scrape time.
        for probe in ["/healthz", "/readyz"] {
            let r = c.get(format!("{base}{probe}")).send().await.unwrap();
            assert_eq!(r.status(), 200, "{probe} needs no token");
        }
        assert_eq!(
            c.get(format!("{base}/metrics"))
                .send()
                .await
                .unwrap()
                .status(),
            401
        );
        let m = c
            .get(format!("{base}/metrics"))
            .bearer_auth("t0ken-for-test")
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        // Its own figures; the store-wide gauges are the leading supervisor's.
        assert!(m.contains("orderly_store_up{role=\"dashboard\"} 1"), "{m}");
        assert!(!m.contains("orderly_orders{"), "{m}");
    });
    let _ = dash.kill();
    let _ = dash.wait();
}

/// `orderly dashboard` on a free port of `host` (with `token`), once it accepts
/// connections.
fn start_dashboard(url: &str, host: &str, token: Option<&str>) -> (std::process::Child, u16) {
    use std::time::Duration;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let mut cmd = Command::new(role("orderly"));
    cmd.args(["dashboard", "--listen", &format!("{host}:{port}")])
        .env("ORDERLY_DATABASE_URL", url)
        .env_remove("ORDERLY_DASHBOARD_TOKEN")
        .stdout(std::process::Stdio::null());
    if let Some(token) = token {
        cmd.env("ORDERLY_DASHBOARD_TOKEN", token);
    }
    let dash = cmd.spawn().expect("start orderly dashboard");
    let t = std::time::Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the dashboard did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    (dash, port)
}

/// Submits `order`, claims it and fails it ("card declined"): an order in Error.
async fn error_order(
    store: &dyn orderly_core::store::StateStore,
    order: &orderly_core::store::NewOrder,
) {
    store
        .submit(order, &orderly_core::Actor::operator("t"), &[])
        .await
        .expect("submit");
    let owner = orderly_core::InstanceId::parse("scheduler-1").expect("instance id");
    let claimed = store
        .claim(&orderly_core::store::ClaimRequest {
            workflows: Default::default(),
            owner,
            limit: 1,
            timeout: std::time::Duration::from_secs(60),
        })
        .await
        .expect("claim");
    store
        .fail(&claimed[0].fence, "card declined", &[])
        .await
        .expect("fail");
}

/// A binary of ours (see `support/procs.rs`: the role binaries are built first).
fn role(name: &str) -> std::path::PathBuf {
    procs::bin(name)
}

/// With `ORDERLY_LOG_JSON=true` every line a role writes is JSON, its last words
/// included: a refused setting, and a database it could not reach within
/// `ORDERLY_STARTUP_WAIT` after retrying (each retry logged).
#[test]
fn start_up_errors_are_json_lines_when_logs_are_json() {
    let json_lines = |out: &Output| -> Vec<serde_json::Value> {
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .collect()
    };
    let out = Command::new(role("orderly-scheduler"))
        .args(["--claim-batch", "0"])
        .env("ORDERLY_LOG_JSON", "true")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["level"], "ERROR");
    assert!(
        lines[0]["fields"]["message"]
            .as_str()
            .unwrap()
            .contains("--claim-batch"),
        "{lines:?}"
    );

    // A broker nothing listens for (an address of its own, port 5672 closed): retried
    // with back-off, the failure logged once (its repeats at debug, so a deployer reads
    // one line with its cause, not one a try), then given up naming the setting.
    let db = Db::new();
    let started = std::time::Instant::now();
    let out = Command::new(role("orderly-submitter"))
        .env("ORDERLY_LOG_JSON", "true")
        .env(
            "ORDERLY_DATABASE_URL",
            format!("sqlite://{}", db.0.display()),
        )
        .env("ORDERLY_TRANSPORT", "servicebus")
        .env("ORDERLY_SERVICEBUS_UNSECURED", "true")
        .env(
            "ORDERLY_SERVICEBUS_CONNECTION",
            "Endpoint=sb://127.0.0.9;SharedAccessKeyName=k;SharedAccessKey=c2VjcmV0LWtleQ==",
        )
        .env("ORDERLY_STARTUP_WAIT", "3s")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let lines = json_lines(&out);
    let retries = lines
        .iter()
        .filter(|l| {
            l["level"] == "WARN"
                && l["fields"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("Service Bus not reachable yet")
        })
        .count();
    assert_eq!(retries, 1, "{lines:?}");
    let last = lines.last().unwrap();
    assert_eq!(last["level"], "ERROR");
    let message = last["fields"]["message"].as_str().unwrap();
    assert!(
        message.contains("ORDERLY_SERVICEBUS_CONNECTION"),
        "{message}"
    );
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("c2VjcmV0LWtleQ=="),
        "the key was logged"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(30));

    // A setting retrying cannot mend is not waited on: an unsupported database URL.
    let started = std::time::Instant::now();
    let out = Command::new(role("orderly-submitter"))
        .env("ORDERLY_LOG_JSON", "true")
        .env("ORDERLY_DATABASE_URL", "mysql://nope")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(json_lines(&out).last().unwrap()["level"], "ERROR");
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
}

/// Filters far beyond the calendar are refused or read as "everything", never a
/// panic: the dashboard's `older` (minutes) shows the form again naming the field and
/// keeps serving; `orderly list --older-than` with the largest number lists nothing
/// (no order is that old), without failing.
#[test]
fn huge_age_filters_are_refused_or_mean_everything_never_a_panic() {
    let db = Db::new();
    let url = format!("sqlite://{}", db.0.display());
    let out = db.orderly(&["submit", "--sample", "2", "--operator", "test"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (mut dash, port) = start_dashboard(&url, "127.0.0.1", None);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let base = format!("http://127.0.0.1:{port}");
        for older in ["1000000000000", "99999999999999999999", "-5"] {
            let r = procs::get(format!("{base}/orders?older={older}"))
                .await
                .unwrap();
            // The form again, with what is wrong (the connection is not dropped).
            assert_eq!(r.status(), 200, "older={older}");
            let page = r.text().await.unwrap();
            assert!(
                page.contains("older than: a number of minutes"),
                "older={older}: {page}"
            );
        }
        let r = procs::get(format!("{base}/orders?older=0")).await.unwrap();
        assert_eq!(r.status(), 200);
        let r = procs::get(format!("{base}/healthz")).await.unwrap();
        assert_eq!(r.status(), 200, "still serving");
    });
    let _ = dash.kill();
    let _ = dash.wait();
    let out = db.orderly(&["list", "--older-than", &u64::MAX.to_string(), "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout(&out).lines().count(),
        0,
        "nothing is that old: {}",
        stdout(&out)
    );
    let out = db.orderly(&["list", "--older-than", "0", "--json"]);
    assert_eq!(stdout(&out).lines().count(), 2, "{}", stdout(&out));
}

/// Every binary's `--version` names the commit it was built from: this checkout's
/// `HEAD` (the test builds from it), as an operator asks a running image which build
/// it is.
#[test]
fn every_binary_names_the_commit_it_was_built_from() {
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .expect("git runs");
    assert!(head.status.success(), "the tests run in a git checkout");
    let head = String::from_utf8_lossy(&head.stdout).trim().to_owned();
    for name in procs::BINARIES {
        let out = Command::new(role(name)).arg("--version").output().unwrap();
        assert!(out.status.success(), "{name} --version: {out:?}");
        let version = stdout(&out);
        assert_eq!(
            version.trim(),
            format!("{name} {} (commit {head})", env!("CARGO_PKG_VERSION")),
            "{name}"
        );
    }
}

/// `orderly completions SHELL` prints a script the shell reads (bash checks its
/// syntax) naming every command; `orderly man` prints the manual page and `--dir`
/// writes one per command, each from the same definitions as `--help`.
#[test]
fn completions_and_manual_pages_cover_every_command() {
    let help = Command::new(role("orderly"))
        .arg("--help")
        .output()
        .unwrap();
    let help = stdout(&help);
    // The commands `--help` lists, between "Commands:" and the next heading.
    let commands: Vec<String> = help
        .split("Commands:")
        .nth(1)
        .expect("--help lists the commands")
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .filter(|c| c != "help")
        .collect();
    assert!(commands.len() > 20, "{commands:?}");
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = Command::new(role("orderly"))
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(out.status.success(), "{shell}: {out:?}");
        let script = stdout(&out);
        for command in &commands {
            assert!(
                script.contains(command.as_str()),
                "{shell} completes no {command}"
            );
        }
    }
    let dir = std::env::temp_dir().join(format!("orderly-man-{}", uuid::Uuid::new_v4().simple()));
    let bash = dir.with_extension("bash");
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new(role("orderly"))
        .args(["completions", "bash"])
        .output()
        .unwrap();
    std::fs::write(&bash, &out.stdout).unwrap();
    let syntax = Command::new("bash").arg("-n").arg(&bash).output().unwrap();
    assert!(
        syntax.status.success(),
        "bash refuses the script: {syntax:?}"
    );

    let page = Command::new(role("orderly")).arg("man").output().unwrap();
    assert!(page.status.success(), "{page:?}");
    let page = stdout(&page);
    assert!(page.contains(".TH orderly 1"), "{page}");
    assert!(
        page.contains("(commit "),
        "the page names the build: {page}"
    );
    let out = Command::new(role("orderly"))
        .args(["man", "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    for command in &commands {
        let file = dir.join(format!("orderly-{command}.1"));
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("no page for {command} ({}): {e}", file.display()));
        assert!(text.contains(".SH NAME"), "{}", file.display());
    }
    assert!(dir.join("orderly.1").exists());
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&bash);
}

/// The exit codes `orderly --help` and docs/running.md promise: 0 done, 1 the command
/// failed (why on stderr), 2 the command line refused (named on stderr).
#[test]
fn exit_codes_are_the_documented_ones() {
    let db = Db::new();
    let help = db.orderly(&["--help"]);
    assert_eq!(help.status.code(), Some(0));
    assert!(stdout(&help).contains("Exit codes: 0 done; 1 the command failed"));
    let running = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/running.md"),
    )
    .unwrap();
    assert!(running.contains("Exit codes, the same for `orderly` and every role binary"));

    let refused = db.orderly(&["list", "--limit", "x"]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--limit"));

    let failed = db.orderly(&["show", "3f2c7a0e-1111-4222-8333-444455556666"]);
    assert_eq!(failed.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&failed.stderr).contains("not found"));

    let done = db.orderly(&["counts"]);
    assert_eq!(done.status.code(), Some(0), "{done:?}");
}

/// The lines of `out`'s standard output, each a JSON object (`--json`: NDJSON, and
/// nothing else on standard output).
fn json_lines(out: &Output) -> Vec<serde_json::Map<String, serde_json::Value>> {
    stdout(out)
        .lines()
        .map(|l| match serde_json::from_str(l) {
            Ok(serde_json::Value::Object(o)) => o,
            other => panic!("not a JSON object ({other:?}): {l}\n{}", stdout(out)),
        })
        .collect()
}

/// A script drives every command with `--json`: each prints one JSON object a line on
/// standard output and nothing else (a list one per item, an action one per order or
/// message it acted on, with the store's refusals among them), questions go to
/// standard error, an error ends it as one JSON line there; commands that print no
/// results refuse `--json` with exit code 2.
#[test]
fn every_command_scripts_with_json_lines() {
    let db = Db::new();
    let url = format!("sqlite://{}", db.0.display());
    let ok = |args: &[&str]| {
        let out = db.orderly(args);
        assert!(
            out.status.success(),
            "orderly {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        json_lines(&out)
    };

    let migrated = ok(&["migrate", "--json"]);
    assert_eq!(migrated.len(), 1);
    assert!(migrated[0]["queues"].as_array().unwrap().len() >= 3);
    let file = std::env::temp_dir().join(format!(
        "orderly-cli-{}.json",
        uuid::Uuid::new_v4().simple()
    ));
    let two = [orderly_cli::sample::order(1), orderly_cli::sample::order(2)];
    std::fs::write(&file, serde_json::to_string(&two).unwrap()).unwrap();
    let file = file.to_str().unwrap();
    let submitted = ok(&["submit", file, "--json"]);
    assert_eq!(submitted.len(), 2);
    assert!(submitted.iter().all(|s| s["outcome"] == "accepted"));
    let again = ok(&["submit", file, "--json"]);
    assert!(
        again.iter().all(|s| s["outcome"] == "duplicate"),
        "{again:?}"
    );
    let _ = std::fs::remove_file(file);
    assert_eq!(ok(&["submit", "--sample", "1", "--json"]).len(), 1);
    // An order in Error (the oldest Pending one, claimed and failed), for the retry.
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let b = orderly_sql::connect(&url, orderly_core::TimeSource::Database)
            .await
            .unwrap();
        error_order(&*b.store, &orderly_cli::sample::order(40)).await;
    });
    let in_error = ok(&["list", "--state", "Error", "--json"]);
    assert_eq!(in_error.len(), 1);
    let failed_id = in_error[0]["order_id"].as_str().unwrap().to_owned();

    let listed = ok(&["list", "--json"]);
    assert_eq!(listed.len(), 4);
    let first = listed
        .iter()
        .map(|o| o["order_id"].as_str().unwrap().to_owned())
        .find(|id| *id != failed_id)
        .unwrap();
    let shown = ok(&["show", &first, "--json"]);
    assert_eq!(shown.len(), 1);
    assert_eq!(shown[0]["state"]["order_id"], first.as_str());
    assert!(!shown[0]["history"].as_array().unwrap().is_empty());
    let counts = ok(&["counts", "--json"]);
    let count = |state: &str| {
        counts
            .iter()
            .find(|c| c["state"] == state)
            .map(|c| c["orders"].as_i64().unwrap())
    };
    assert_eq!(count("Pending"), Some(3));
    assert_eq!(count("Error"), Some(1));
    assert!(!ok(&["workflows", "--json"]).is_empty());
    let alerts = ok(&["alerts", "--json"]);
    assert_eq!(alerts.len(), 1);
    assert_eq!(alerts[0]["order_id"], failed_id.as_str());
    ok(&["alerts", "--system", "--json"]);
    assert!(ok(&["services", "--json"]).is_empty());
    let leader = ok(&["leader", "--json"]);
    assert_eq!(leader.len(), 1);
    assert_eq!(leader[0]["live"], false);
    assert!(
        ok(&["queues", "--json"])
            .iter()
            .any(|q| q["queue"] == "orders")
    );
    assert!(ok(&["dead-letters", "orders", "--json"]).is_empty());
    assert_eq!(ok(&["outbox", "--json"]).len(), 1);
    let pruned = ok(&["prune", "--dry-run", "--json"]);
    assert_eq!(pruned.len(), 1);
    assert_eq!(pruned[0]["orders"], 0);

    // The settings check: a line per role, valid or not.
    let settings = std::env::temp_dir().join(format!(
        "orderly-cfg-{}.toml",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::write(&settings, "[scheduler]\nmax_in_flight = 0\n").unwrap();
    let out = db.orderly(&["config", "check", settings.to_str().unwrap(), "--json"]);
    let _ = std::fs::remove_file(&settings);
    assert_eq!(out.status.code(), Some(1));
    let roles = json_lines(&out);
    assert_eq!(roles.len(), 4, "{roles:?}");
    let scheduler = roles
        .iter()
        .find(|r| r["role"] == "orderly-scheduler")
        .unwrap();
    assert_eq!(scheduler["valid"], false);
    assert!(
        scheduler["said"]
            .as_str()
            .unwrap()
            .starts_with("invalid value '0' for '--max-in-flight"),
        "{scheduler:?}"
    );
    assert!(roles.iter().any(|r| r["valid"] == true));

    // Actions: a line per order acted on.
    let retried = ok(&["resubmit", &failed_id, "--reason", "card fixed", "--json"]);
    assert_eq!(retried.len(), 1);
    assert_eq!(retried[0]["order_id"], failed_id.as_str());
    assert_eq!(retried[0]["state"], "Pending");
    // A question goes to standard error; declined, nothing is done.
    let mut asked = Command::new(role("orderly"))
        .args([
            "cancel", "--all", "--state", "Pending", "--reason", "x", "--json",
        ])
        .env("ORDERLY_DATABASE_URL", &url)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(asked.stdin.take());
    let out = asked.wait_with_output().unwrap();
    assert!(out.stdout.is_empty(), "{}", stdout(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("[y/N]"));

    let cancelled = ok(&[
        "cancel", "--all", "--state", "Pending", "--yes", "--reason", "test", "--json",
    ]);
    assert_eq!(cancelled.len(), 4);
    assert!(cancelled.iter().all(|c| c.contains_key("order_id")));
    // The store's refusal is a line of the results; the command fails.
    let out = db.orderly(&["resubmit", &first, "--reason", "x", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let refused = json_lines(&out);
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0]["order_id"], first.as_str());
    assert!(refused[0]["error"].as_str().is_some_and(|e| !e.is_empty()));
    // The error that ends a command: one JSON line on standard error.
    let out = db.orderly(&["show", "no-such-order", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    let last: serde_json::Value = serde_json::from_str(err.trim()).unwrap_or_else(|e| {
        panic!("not one JSON line ({e}): {err}");
    });
    assert!(
        last["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("no-such-order")),
        "{err}"
    );
    // Commands that print no results refuse it, naming it.
    for args in [
        &["man", "--json"][..],
        &["completions", "bash", "--json"],
        &["provision", "--print", "az", "--json"],
        &["--json", "bench"],
    ] {
        let out = db.orderly(args);
        assert_eq!(out.status.code(), Some(2), "orderly {args:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("--json"),
            "orderly {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A script drives the dashboard's JSON API as an operator clicks through its pages:
/// behind the same token, every page's data reads as JSON, and every action is taken
/// with a JSON body (recorded under the operator's name) and refused as JSON when the
/// order's state does not allow it; a form-encoded or cross-site action is refused.
#[test]
fn the_dashboards_json_api_reads_every_page_and_takes_every_action() {
    use orderly_core::transport::{OutgoingMessage, QueueName, QueueSettings};
    use serde_json::{Value, json};
    use std::time::Duration;

    let db = Db::new();
    let url = format!("sqlite://{}", db.0.display());
    let rt = tokio::runtime::Runtime::new().unwrap();
    // Two orders in Error of one cause, and a dead letter on the orders queue.
    let (a, b) = (orderly_cli::sample::order(1), orderly_cli::sample::order(2));
    let (a_id, b_id) = (a.order_id.to_string(), b.order_id.to_string());
    rt.block_on(async {
        let s = orderly_sql::connect(&url, orderly_core::TimeSource::Database)
            .await
            .unwrap();
        error_order(&*s.store, &a).await;
        error_order(&*s.store, &b).await;
        // An alert about the system, as a leader raises it.
        s.store
            .raise(
                &orderly_core::conditions::Condition {
                    kind: orderly_core::conditions::ConditionKind::DeadLetters,
                    subject: "orders".into(),
                    detail: "1 dead letter on queue orders (was 0)".into(),
                },
                "supervisor-1",
                &|_| Vec::new(),
            )
            .await
            .unwrap()
            .unwrap();
        let orders = QueueName::parse("orders").unwrap();
        s.transport
            .declare_queue(&orders, &QueueSettings::default())
            .await
            .unwrap();
        s.transport
            .send(
                &orders,
                &[OutgoingMessage::new("m-bad", b"{not json".to_vec())],
            )
            .await
            .unwrap();
        let got = s
            .transport
            .receive(&orders, 1, Duration::from_secs(5))
            .await
            .unwrap();
        s.transport
            .dead_letter(&got[0], "BodyUndecodable", "expected value")
            .await
            .unwrap();
    });
    let (mut dash, port) = start_dashboard(&url, "127.0.0.1", Some("s3cret"));
    let base = format!("http://127.0.0.1:{port}");
    let http = procs::http();
    let get = |path: &str| {
        let r = rt
            .block_on(
                http.get(format!("{base}{path}"))
                    .bearer_auth("s3cret")
                    .send(),
            )
            .unwrap();
        let status = r.status().as_u16();
        (status, rt.block_on(r.json::<Value>()).unwrap())
    };
    let post = |path: &str, body: Value| {
        let r = rt
            .block_on(
                http.post(format!("{base}{path}"))
                    .bearer_auth("s3cret")
                    .json(&body)
                    .send(),
            )
            .unwrap();
        let status = r.status().as_u16();
        (status, rt.block_on(r.json::<Value>()).unwrap())
    };

    // The token is asked for as on the pages.
    let r = rt
        .block_on(http.get(format!("{base}/api/orders")).send())
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);

    // Orders, paged by cursor; a bad filter is named.
    let (status, page) = get("/api/orders?state=Error&limit=1");
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["orders"].as_array().unwrap().len(), 1);
    let first = page["orders"][0]["order_id"].as_str().unwrap().to_owned();
    let next = page["next"].as_str().expect("a next page").to_owned();
    let (_, rest) = get(&format!(
        "/api/orders?state=Error&limit=1&after={}",
        next.replace('+', "%2B").replace('|', "%7C")
    ));
    let second = rest["orders"][0]["order_id"].as_str().unwrap().to_owned();
    let mut both = [first.clone(), second];
    both.sort();
    let mut expected = [a_id.clone(), b_id.clone()];
    expected.sort();
    assert_eq!(both, expected);
    let (status, bad) = get("/api/orders?limit=0");
    assert_eq!(status, 400);
    assert!(bad["error"].as_str().unwrap().contains("limit"), "{bad}");
    let (status, order) = get(&format!("/api/orders/{a_id}"));
    assert_eq!(status, 200);
    assert_eq!(order["state"]["process_state"], "Error");
    assert!(!order["history"].as_array().unwrap().is_empty());
    let (status, _) = get("/api/orders/no-such-order");
    assert_eq!(status, 404);

    // The errors page's groups.
    let (_, errors) = get("/api/errors");
    assert_eq!(errors["error_orders"], 2);
    let groups = errors["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 1, "{errors}");
    assert_eq!(groups[0]["count"], 2);
    assert_eq!(groups[0]["orders"], json!([a_id, b_id]), "oldest first");

    // An action is refused unless its body is JSON, and from another site.
    let r = rt
        .block_on(
            http.post(format!("{base}/api/orders/{a_id}/retry"))
                .bearer_auth("s3cret")
                .form(&[("reason", "x")])
                .send(),
        )
        .unwrap();
    assert_eq!(r.status().as_u16(), 415);
    let r = rt
        .block_on(
            http.post(format!("{base}/api/orders/{a_id}/retry"))
                .bearer_auth("s3cret")
                .header("origin", "http://evil.example")
                .json(&json!({}))
                .send(),
        )
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    let (_, order) = get(&format!("/api/orders/{a_id}"));
    assert_eq!(order["state"]["process_state"], "Error", "nothing was done");

    // Retry one order, under the operator's name; again, it is refused as a conflict.
    let (status, retried) = post(
        &format!("/api/orders/{a_id}/retry"),
        json!({ "reason": "card fixed", "operator": "erin" }),
    );
    assert_eq!(status, 200, "{retried}");
    assert_eq!(retried["state"], "Pending");
    assert_eq!(retried["by"], "operator:erin");
    let (_, order) = get(&format!("/api/orders/{a_id}"));
    let last = order["history"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["actor"], "operator:erin", "{last}");
    assert_eq!(last["reason"], "card fixed", "{last}");
    let (status, conflict) = post(&format!("/api/orders/{a_id}/retry"), json!({}));
    assert_eq!(status, 409, "{conflict}");
    assert!(conflict["error"].is_string());
    let (status, unknown) = post(
        &format!("/api/orders/{a_id}/retry"),
        json!({ "reasn": "x" }),
    );
    assert_eq!(status, 422, "an unknown field is refused: {unknown}");

    // Cancel what is left of the cause, as a group.
    let (status, done) = post(
        "/api/errors/group",
        json!({
            "action": "cancel",
            "workflow": groups[0]["workflow"],
            "step": groups[0]["step"],
            "pattern": groups[0]["pattern"],
            "reason": "customer gave up",
        }),
    );
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["moved"], 1);
    let (_, order) = get(&format!("/api/orders/{b_id}"));
    assert_ne!(order["state"]["process_state"], "Error");
    let (status, _) = post(
        "/api/errors/group",
        json!({ "action": "forget", "workflow": "w", "step": 0, "pattern": "p" }),
    );
    assert_eq!(status, 400);

    // Bulk: the orders named, or all a filter matches (a misspelt filter is refused,
    // not taken as none; a dry run only counts).
    let (status, typo) = post(
        "/api/orders/bulk",
        json!({ "action": "cancel", "filter": { "stat": "Pending" } }),
    );
    assert_eq!(status, 400);
    assert!(typo["error"].as_str().unwrap().contains("stat"), "{typo}");
    let (_, dry) = post(
        "/api/orders/bulk",
        json!({ "action": "cancel", "filter": { "state": "Pending" }, "dry_run": true }),
    );
    assert_eq!(dry["selected"], 1, "{dry}");
    assert_eq!(
        get(&format!("/api/orders/{a_id}")).1["state"]["process_state"],
        "Pending"
    );
    let (status, named) = post(
        "/api/orders/bulk",
        json!({ "action": "retry", "order_ids": [a_id] }),
    );
    assert_eq!(status, 200, "{named}");
    assert_eq!(named["moved"], 0);
    assert_eq!(named["refused"][0]["order_id"], a_id.as_str(), "{named}");
    let (status, all) = post(
        "/api/orders/bulk",
        json!({ "action": "cancel", "filter": { "state": "Pending" }, "operator": "erin" }),
    );
    assert_eq!(status, 200, "{all}");
    assert_eq!(
        (all["selected"].clone(), all["moved"].clone()),
        (json!(1), json!(1))
    );
    assert_ne!(
        get(&format!("/api/orders/{a_id}")).1["state"]["process_state"],
        "Pending"
    );

    // Alerts, acknowledged.
    let (_, alerts) = get("/api/alerts?all=true");
    let order_alerts = alerts["orders"].as_array().unwrap();
    assert_eq!(order_alerts.len(), 2, "{alerts}");
    let alert_id = order_alerts[0]["alert_id"].as_i64().unwrap();
    let (status, acked) = post(
        &format!("/api/alerts/{alert_id}/ack"),
        json!({ "operator": "erin" }),
    );
    assert_eq!(status, 200, "{acked}");
    assert_eq!(acked["acknowledged_by"], "operator:erin");
    let (status, _) = post("/api/alerts/999999/ack", json!({}));
    assert_eq!(status, 404);
    // An alert about the system, acknowledged: still open, with who.
    let system = alerts["system"].as_array().unwrap();
    assert_eq!(system.len(), 1, "{alerts}");
    let system_id = system[0]["alert_id"].as_i64().unwrap();
    let (status, acked) = post(
        &format!("/api/alerts/system/{system_id}/ack"),
        json!({ "operator": "erin" }),
    );
    assert_eq!(status, 200, "{acked}");
    assert_eq!(acked["acknowledged_by"], "operator:erin");
    assert_eq!(acked["resolved_at"], Value::Null);
    let (_, open) = get("/api/alerts");
    assert_eq!(
        open["system"][0]["acknowledged_by"], "operator:erin",
        "{open}"
    );
    let (status, _) = post("/api/alerts/system/999999/ack", json!({}));
    assert_eq!(status, 404);

    // The charts' figures: the two orders, cancelled by now, and the dead letter.
    let (status, activity) = get("/api/activity?range=24h");
    assert_eq!(status, 200, "{activity}");
    assert_eq!(activity["bin_minutes"], 15);
    let bins = activity["bins"].as_array().unwrap();
    assert_eq!(bins.len(), 96);
    let sum = |field: &str| -> i64 { bins.iter().map(|b| b[field].as_i64().unwrap()).sum() };
    assert_eq!(
        (sum("cancelled"), sum("error"), sum("dead_letters")),
        (2, 0, 1),
        "{activity}"
    );
    assert_eq!(get("/api/activity?range=2d").0, 400);

    // The other pages' data.
    let (status, flows) = get("/api/workflows");
    assert_eq!(status, 200);
    assert!(
        flows["in_flight"].is_array() && flows["stored"].is_array(),
        "{flows}"
    );
    assert_eq!(get("/api/services").1, json!([]));
    assert_eq!(get("/api/leader").1["holder"], Value::Null);
    let (_, queues) = get("/api/queues");
    assert!(
        queues
            .as_array()
            .unwrap()
            .iter()
            .any(|q| q["queue"] == "orders" && q["dead_lettered"] == 1),
        "{queues}"
    );
    let (status, resumed) = post("/api/services/agent.payment/resume", json!({}));
    assert_eq!(status, 200, "{resumed}");
    assert_eq!(resumed["was_up"], true);

    // Dead letters: listed with their body, requeued; one that is not there is named.
    let (_, letters) = get("/api/dead-letters?queue=orders");
    assert_eq!(letters.as_array().unwrap().len(), 1, "{letters}");
    assert_eq!(letters[0]["body"], "{not json");
    let (status, gone) = post(
        "/api/dead-letters/discard",
        json!({ "queue": "orders", "message_id": "no-such-message" }),
    );
    assert_eq!(status, 404, "{gone}");
    let (status, requeued) = post(
        "/api/dead-letters/requeue",
        json!({ "queue": "orders", "message_id": "m-bad" }),
    );
    assert_eq!(status, 200, "{requeued}");
    assert_eq!(requeued["requeued"], 1);
    assert_eq!(get("/api/dead-letters?queue=orders").1, json!([]));

    dash.kill().ok();
    dash.wait().ok();
}
