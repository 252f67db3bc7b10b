//! The deployer's path, checked without Docker or a cluster: the compose file, the
//! emulator's Config.json, the image's Dockerfile, the Kubernetes manifests and the
//! provisioning script, each against its published schema (scripts/check-deploy-files)
//! and against what the binaries really read, run and declare; the image's entry point
//! walked as the image runs it (uid 10001 in /data); the KEDA queries run on a real
//! store.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use orderly_core::messages::queues;
use orderly_core::transport::{OutgoingMessage, QueueName};
use orderly_core::workflow::Workflows;
use serde_json::Value;

use crate::fixtures::{Db, Dialect};
use crate::procs::{bin, free_port, get, wait_for};

/// What a scheduler scales on besides the replies queue: the orders it claims.
const CLAIMABLE: &str = "claimable orders";

/// KEDA's query for the orders waiting to be claimed (the same in both overlays).
fn claimable_query() -> String {
    read("deploy/kubernetes/sql-queue/scaling.yaml")
        .lines()
        .filter_map(|l| l.trim().strip_prefix("query: "))
        .find(|q| q.contains("FROM order_state"))
        .expect("a query of the claimable orders")
        .trim_matches('"')
        .to_owned()
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The binaries the image holds, with their `--help` (which lists every `[env: ...]`).
fn binaries() -> BTreeMap<&'static str, String> {
    crate::procs::BINARIES
        .into_iter()
        .map(|b| {
            let out = Command::new(bin(b)).arg("--help").output().unwrap();
            (b, String::from_utf8_lossy(&out.stdout).into_owned())
        })
        .collect()
}

/// `--help` of `binary`, or of `orderly SUB` for the operators' tool.
fn help(command: &[String]) -> String {
    let mut c = Command::new(bin(&command[0]));
    if command[0] == "orderly" {
        c.args(&command[1..]);
    }
    let out = c.arg("--help").output().unwrap();
    assert!(out.status.success(), "{command:?} --help");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs the schema checks on the files under `root`: the objects they found, or the
/// problems named.
fn check_deploy_files(root: &Path) -> Result<Vec<Value>, String> {
    let out = Command::new("python3")
        .arg(self::root().join("scripts/check-deploy-files"))
        .arg(root)
        .output()
        .expect("python3");
    if out.status.success() {
        Ok(serde_json::from_slice(&out.stdout).expect("the objects, as JSON"))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The queues `orderly provision --print az` creates, each with its flags.
fn provisioned(script: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    script
        .lines()
        .filter_map(|l| l.strip_prefix("az servicebus queue create "))
        .map(|rest| {
            let words: Vec<&str> = rest.split_whitespace().collect();
            let flags: BTreeMap<String, String> = words
                .windows(2)
                .filter(|w| w[0].starts_with("--"))
                .map(|w| {
                    (
                        w[0].trim_start_matches("--").to_owned(),
                        w[1].trim_matches('"').to_owned(),
                    )
                })
                .collect();
            (flags["name"].clone(), flags)
        })
        .collect()
}

fn provision(args: &[&str]) -> String {
    let out = Command::new(bin("orderly"))
        .args(["provision", "--print", "az"])
        .args(args)
        .env("ORDERLY_PG_ADMIN_PASSWORD", "pw-that-must-not-show")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Seconds of an ISO 8601 duration of the forms Azure and the emulator take.
fn iso_secs(text: &str) -> u64 {
    let (days, time) = match text.strip_prefix('P').unwrap().split_once('T') {
        Some((d, t)) => (d, t),
        None => (text.strip_prefix('P').unwrap(), ""),
    };
    let mut secs = 0;
    let mut n = String::new();
    for (part, units) in [
        (days, [('D', 86_400), ('D', 0), ('D', 0)]),
        (time, [('H', 3600), ('M', 60), ('S', 1)]),
    ] {
        for c in part.chars() {
            if c.is_ascii_digit() {
                n.push(c);
            } else {
                let unit = units
                    .iter()
                    .find(|(u, _)| *u == c)
                    .unwrap_or_else(|| panic!("{text}: unit {c}"))
                    .1;
                secs += n.parse::<u64>().unwrap() * unit;
                n.clear();
            }
        }
    }
    secs
}

/// Every deployment file passes its published schema, and the check is real: a file
/// with one misspelt field is refused, naming it.
#[test]
fn the_deployment_files_pass_their_published_schemas_and_a_misspelt_field_fails_them() {
    let objects = check_deploy_files(&root()).unwrap_or_else(|p| panic!("{p}"));
    let kinds: BTreeSet<String> = objects
        .iter()
        .map(|o| o["object"]["kind"].as_str().unwrap().to_owned())
        .collect();
    for kind in [
        "Deployment",
        "Service",
        "ConfigMap",
        "ServiceAccount",
        "PodDisruptionBudget",
        "ScaledObject",
        "TriggerAuthentication",
        "Kustomization",
    ] {
        assert!(kinds.contains(kind), "no {kind} among {kinds:?}");
    }

    for (file, from, to, named) in [
        (
            "docker-compose.yml",
            "  restart: unless-stopped",
            "  restrat: unless-stopped",
            "restrat",
        ),
        (
            "deploy/kubernetes/base/scheduler.yaml",
            "      terminationGracePeriodSeconds:",
            "      terminationGracePeriod:",
            "terminationGracePeriod",
        ),
        (
            "deploy/kubernetes/servicebus/scaling.yaml",
            "  minReplicaCount: 1",
            "  minReplicas: 1",
            "ScaledObject orderly-agent",
        ),
        (
            "deploy/kubernetes/servicebus/kustomization.yaml",
            "  - scaling.yaml",
            "  - scale.yaml",
            "scale.yaml does not exist",
        ),
    ] {
        let copy =
            std::env::temp_dir().join(format!("orderly-deploy-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&copy).unwrap();
        let status = Command::new("cp")
            .args(["-r", "--parents", "docker-compose.yml", "deploy"])
            .arg(&copy)
            .current_dir(root())
            .status();
        if !status.is_ok_and(|s| s.success()) {
            panic!("cannot copy the deployment files");
        }
        let path = copy.join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(from), "{file} has no {from:?}");
        std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
        let refused = check_deploy_files(&copy).expect_err(&format!("{file} with {to:?} passes"));
        assert!(refused.contains(named), "{file}: {refused}");
        let _ = std::fs::remove_dir_all(&copy);
    }
}

/// The compose file starts what it says: every command is one of our binaries, every
/// `ORDERLY_*` it sets is read by the binary it runs, instance ids are stable and
/// unique, images are pinned, no healthcheck runs a tool its image lacks, the emulator
/// keeps its state in SQL Server, and its Config.json declares every queue the roles
/// use, as `orderly provision` does, within the emulator's limits.
#[test]
fn compose_runs_our_binaries_with_settings_they_read_and_declares_every_queue_within_the_emulators_limits()
 {
    let compose: Value = {
        let out = Command::new("python3")
            .args([
                "-c",
                "import sys, yaml, json; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))",
            ])
            .arg(root().join("docker-compose.yml"))
            .output()
            .expect("python3 with PyYAML");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let services = compose["services"].as_object().unwrap();
    let mut instance_ids = BTreeSet::new();
    let mut roles: BTreeMap<String, usize> = BTreeMap::new();
    for (name, svc) in services {
        let image = svc["image"].as_str().unwrap_or_default();
        assert!(!image.is_empty(), "{name} has no image");
        if image != "orderly:local" {
            let tag = image.rsplit_once(':').map(|(_, t)| t).unwrap_or("");
            assert!(
                !tag.is_empty() && tag != "latest",
                "{name}: {image} is not pinned"
            );
        }
        let Some(command) = svc["command"].as_array() else {
            continue;
        };
        let command: Vec<String> = command
            .iter()
            .map(|c| c.as_str().unwrap().to_owned())
            .collect();
        if !command[0].starts_with("orderly") {
            continue;
        }
        *roles.entry(command.join(" ")).or_default() += 1;
        let help = help(&command);
        for (var, _) in svc["environment"].as_object().unwrap() {
            if var.starts_with("ORDERLY_") {
                assert!(
                    help.contains(&format!("[env: {var}")),
                    "{name}: {} does not read {var}",
                    command.join(" ")
                );
            }
        }
        if let Some(id) = svc["environment"]["ORDERLY_INSTANCE_ID"].as_str() {
            assert!(
                instance_ids.insert(id.to_owned()),
                "{name}: instance id {id} twice"
            );
        } else {
            assert!(
                ["remote-sim", "dashboard"].contains(&name.as_str()),
                "{name} has no stable instance id"
            );
        }
        if let Some(test) = svc["healthcheck"]["test"].as_array() {
            // The image has curl (Dockerfile), and each role serves the path it probes.
            assert_eq!(test[1], "curl", "{name}: {test:?}");
        }
    }
    assert_eq!(
        roles,
        BTreeMap::from([
            ("orderly dashboard".to_owned(), 1),
            ("orderly-agent".to_owned(), 1),
            ("orderly-remote-sim".to_owned(), 1),
            ("orderly-scheduler".to_owned(), 2),
            ("orderly-submitter".to_owned(), 1),
            ("orderly-supervisor".to_owned(), 2),
        ])
    );
    // The emulator: no healthcheck (its image has no shell or HTTP client), SQL Server
    // (SQL Edge is retired); its health endpoint asked by a one-shot container of our
    // image (which has curl), which the roles wait for.
    let sb = &services["servicebus"];
    assert!(
        sb.get("healthcheck").is_none(),
        "the emulator cannot run a healthcheck"
    );
    let ready = &services["servicebus-ready"];
    let probe: Vec<&str> = ready["entrypoint"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(probe[0], "curl");
    assert_eq!(probe.last(), Some(&"http://servicebus:5300/health"));
    assert_eq!(ready["restart"], "no");
    assert_eq!(ready["image"], "orderly:local");
    assert!(
        sb["image"]
            .as_str()
            .unwrap()
            .starts_with("mcr.microsoft.com/azure-messaging/servicebus-emulator:2.")
    );
    assert_eq!(sb["environment"]["SQL_SERVER"], "mssql");
    assert!(
        services["mssql"]["image"]
            .as_str()
            .unwrap()
            .starts_with("mcr.microsoft.com/mssql/server:2022-")
    );
    assert!(!read("docker-compose.yml").contains("azure-sql-edge"));
    for role in ["scheduler-1", "agent-1", "supervisor-1", "submitter"] {
        assert_eq!(
            services[role]["depends_on"]["servicebus-ready"]["condition"],
            "service_completed_successfully",
            "{role}"
        );
    }
    // The documented client path goes through the queue or the intake, not `orderly submit`.
    let header = read("docker-compose.yml");
    assert!(
        header.contains("orderly post --sample"),
        "the header shows orderly post"
    );
    assert!(
        !header.contains("orderly submit"),
        "orderly submit bypasses the queue"
    );
    assert_eq!(
        services["submitter"]["environment"]["ORDERLY_HTTP_INTAKE"],
        "true"
    );
    // The intake example of docs/containers.md is an order the intake accepts.
    let docs = read("docs/containers.md");
    let body = docs
        .split("-d '")
        .nth(1)
        .and_then(|rest| rest.split('\'').next())
        .expect("the intake example");
    let order: orderly_core::store::NewOrder = serde_json::from_str(body).unwrap();
    order.validate().unwrap();
    let connection = services["scheduler-1"]["environment"]["ORDERLY_SERVICEBUS_CONNECTION"]
        .as_str()
        .unwrap();
    orderly_azure::ServiceBusSettings::check_connection(connection, "compose").unwrap();

    // Within the emulator's 10 AMQP connections: one per process on Service Bus (one
    // more while it replaces a broken one), and room for `orderly post` beside them.
    let on_servicebus = services
        .values()
        .filter(|s| s["environment"]["ORDERLY_TRANSPORT"] == "servicebus")
        .count();
    assert!(
        on_servicebus + 1 + 2 <= 10,
        "{on_servicebus} processes on the emulator: no room for a reconnect and the CLI"
    );
    // Host ports only for what a user opens (intake, dashboard, the emulator's AMQP off
    // the port a local RabbitMQ holds); none that a local PostgreSQL or Azurite holds.
    let published: Vec<String> = services
        .values()
        .filter(|s| s["profiles"].is_null())
        .flat_map(|s| s["ports"].as_array().cloned().unwrap_or_default())
        .map(|p| p.as_str().unwrap().to_owned())
        .collect();
    for taken in ["5432", "5672", "10000"] {
        assert!(
            !published
                .iter()
                .any(|p| p.split(':').rev().nth(1) == Some(taken)),
            "host port {taken} is published: {published:?}"
        );
    }

    // Config.json: the emulator's schema (one namespace `sbemulatorns`, at most 50
    // queues, required keys) and its limits: time to live 5 min to 1 h, duplicate
    // detection 5 s to 5 min, lock 5 s to 5 min, 1 to 10 deliveries.
    let config: Value =
        serde_json::from_str(&read("deploy/servicebus-emulator/Config.json")).unwrap();
    let user = &config["UserConfig"];
    assert!(user["Logging"]["Type"].is_string());
    let namespaces = user["Namespaces"].as_array().unwrap();
    assert_eq!(namespaces.len(), 1);
    assert_eq!(namespaces[0]["Name"], "sbemulatorns");
    assert!(namespaces[0]["Topics"].is_array());
    let declared = namespaces[0]["Queues"].as_array().unwrap();
    assert!(declared.len() <= 50);
    let script = provision(&[]);
    let wanted = provisioned(&script);
    let mut names = BTreeSet::new();
    for q in declared {
        let name = q["Name"].as_str().unwrap();
        names.insert(name.to_owned());
        let p = &q["Properties"];
        let within = |key: &str, lo: u64, hi: u64| {
            let s = iso_secs(p[key].as_str().unwrap());
            assert!(
                (lo..=hi).contains(&s),
                "{name}: {key} {s} s is outside the emulator's {lo}..={hi} s"
            );
            s
        };
        within("DefaultMessageTimeToLive", 300, 3600);
        let window = within("DuplicateDetectionHistoryTimeWindow", 5, 300);
        let lock = within("LockDuration", 5, 300);
        let deliveries = p["MaxDeliveryCount"].as_u64().unwrap();
        assert!((1..=10).contains(&deliveries), "{name}: MaxDeliveryCount");
        // As provisioned on Azure, but for the emulator's caps.
        let azure = &wanted[name];
        assert_eq!(lock, iso_secs(&azure["lock-duration"]), "{name}: lock");
        assert_eq!(
            deliveries.to_string(),
            azure["max-delivery-count"],
            "{name}: deliveries"
        );
        assert_eq!(
            p["RequiresDuplicateDetection"]
                .as_bool()
                .unwrap()
                .to_string(),
            azure["enable-duplicate-detection"],
            "{name}"
        );
        assert_eq!(
            window,
            iso_secs(&azure["duplicate-detection-history-time-window"]).min(300),
            "{name}: window"
        );
        assert_eq!(p["RequiresSession"], false, "{name}");
    }
    assert_eq!(
        names,
        wanted.keys().cloned().collect(),
        "Config.json declares the queues the roles use"
    );
}

/// The image: non-root, with /data its writable working directory and a volume, the
/// binaries it copies all ours, labels with version and source, dependencies cached;
/// and `orderly up` run as the image runs it (uid 10001, in an empty /data, with the
/// image's environment) keeps its SQLite store there, logs JSON lines, and processes
/// orders posted to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_runs_orderly_up_on_sqlite_in_its_data_directory_as_its_user() {
    let dockerfile = read("Dockerfile");
    let bins = binaries();
    for line in [
        "USER 10001:10001",
        "WORKDIR /data",
        "VOLUME /data",
        "chown 10001:10001 /data",
    ] {
        assert!(dockerfile.contains(line), "the Dockerfile has {line:?}");
    }
    for label in [
        "org.opencontainers.image.version",
        "org.opencontainers.image.revision",
        "org.opencontainers.image.source",
    ] {
        assert!(dockerfile.contains(label), "label {label}");
    }
    // Builders without BuildKit (`az acr build`, the classic builder) take no mounts,
    // heredocs or frontend directive.
    for buildkit_only in ["--mount=", "<<", "# syntax="] {
        assert!(
            !dockerfile.contains(buildkit_only),
            "the Dockerfile needs BuildKit: {buildkit_only}"
        );
    }
    assert!(
        dockerfile.contains("COPY .cargo .cargo") && root().join(".cargo/config.toml").is_file()
    );
    let copied: BTreeSet<&str> = dockerfile
        .split("target/release/")
        .skip(1)
        .filter_map(|rest| rest.split_whitespace().next())
        .collect();
    assert_eq!(
        copied,
        bins.keys().copied().collect(),
        "the image holds every binary"
    );
    for package in [
        "orderly-cli",
        "orderly-local",
        "orderly-submitter",
        "orderly-scheduler",
        "orderly-agent",
        "orderly-supervisor",
        "orderly-remote-sim",
    ] {
        assert!(
            dockerfile.contains(&format!("-p {package}")),
            "the image builds {package}"
        );
    }
    // The image's environment, as the final stage's ENV lines set it (the build
    // stage's are the build's).
    let env_block = dockerfile
        .rsplit("\nFROM ")
        .next()
        .unwrap()
        .split("\nENV ")
        .nth(1)
        .unwrap()
        .split("\nEXPOSE")
        .next()
        .unwrap();
    let image_env: Vec<(String, String)> = env_block
        .split(['\\', '\n', ' '])
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    assert!(
        image_env
            .iter()
            .any(|(k, v)| k == "ORDERLY_LOG_JSON" && v == "true"),
        "{image_env:?}"
    );
    let all_help: String = bins.values().cloned().collect();
    for (k, _) in &image_env {
        assert!(
            all_help.contains(&format!("[env: {k}")),
            "{k} is read by no binary"
        );
    }

    // /data: empty, owned by the image's user; run as that user where we can (root).
    let data = std::env::temp_dir().join(format!(
        "orderly-image-data-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&data).unwrap();
    let as_image_user = nix_is_root();
    if as_image_user {
        assert!(
            Command::new("chown")
                .args(["10001:10001"])
                .arg(&data)
                .status()
                .unwrap()
                .success()
        );
    }
    let run = |args: &[&str]| -> Command {
        let mut c = if as_image_user {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=10001", "--regid=10001", "--clear-groups"])
                .arg(bin("orderly"));
            c
        } else {
            Command::new(bin("orderly"))
        };
        c.args(args)
            .current_dir(&data)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .envs(image_env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        c
    };
    let port = free_port();
    let log = data.join("up.log");
    let mut up = run(&["up"])
        .env("ORDERLY_DASHBOARD_LISTEN", format!("127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    wait_for("orderly up ready", Duration::from_secs(60), async || {
        get(format!("http://127.0.0.1:{port}/readyz"))
            .await
            .is_ok_and(|r| r.status() == 200)
    })
    .await;
    // The image's HEALTHCHECK, run as Docker runs it (`sh -c`, the image's environment):
    // healthy while `orderly up` serves, unhealthy once it is gone. The role port of the
    // image's environment is moved to one nothing here serves, so that no other test's
    // listener can answer for it.
    let healthcheck = dockerfile
        .split("\nHEALTHCHECK ")
        .nth(1)
        .and_then(|h| h.split_once("CMD "))
        .map(|(_, cmd)| cmd.lines().next().unwrap().to_owned())
        .expect("a HEALTHCHECK with a CMD");
    let quiet_port = free_port();
    let probe = || {
        Command::new("sh")
            .args(["-c", &healthcheck])
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .envs(image_env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("ORDERLY_HTTP_LISTEN", format!("0.0.0.0:{quiet_port}"))
            .env("ORDERLY_DASHBOARD_LISTEN", format!("127.0.0.1:{port}"))
            .output()
            .unwrap()
    };
    assert!(
        image_env.iter().any(|(k, _)| k == "ORDERLY_HTTP_LISTEN"),
        "the image sets the roles' listen address: {image_env:?}"
    );
    let healthy = probe();
    assert!(
        healthy.status.success(),
        "orderly up is unhealthy: {healthy:?}"
    );
    let posted = run(&["post", "--sample", "20"]).output().unwrap();
    assert!(
        posted.status.success(),
        "{}",
        String::from_utf8_lossy(&posted.stderr)
    );
    wait_for("20 orders processed", Duration::from_secs(90), async || {
        let out = run(&["counts"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["Processed", "20"])
    })
    .await;
    let _ = Command::new("kill")
        .args(["-TERM", &up.id().to_string()])
        .status();
    let status = up.wait().unwrap();
    assert!(status.success(), "orderly up exits 0 on SIGTERM: {status}");
    assert!(!probe().status.success(), "healthy with nothing serving");
    assert!(data.join("orderly.db").is_file(), "the store is in /data");
    let logged = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = logged.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(lines.len() > 3, "{logged}");
    for l in &lines {
        let v: Value =
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}"));
        assert!(v["level"].is_string() && v["fields"].is_object(), "{l}");
    }
    let _ = std::fs::remove_dir_all(&data);
}

fn nix_is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// The Kubernetes manifests run what the binaries are: every command is ours, every
/// setting (env and the shared ConfigMap) is one that binary reads, probes are the
/// paths it serves on the port it listens on, the grace period outlasts its drain,
/// secrets come from the Secret `orderly provision` creates (never a literal), the pods
/// run as the image's user, the supervisors have a disruption budget, and KEDA scales
/// each role on exactly the queues it reads.
#[test]
fn the_kubernetes_manifests_run_our_binaries_with_settings_they_read_and_scale_on_the_queues_they_read()
 {
    let objects: Vec<(String, Value)> = check_deploy_files(&root())
        .unwrap_or_else(|p| panic!("{p}"))
        .into_iter()
        .map(|o| (o["file"].as_str().unwrap().to_owned(), o["object"].clone()))
        .collect();
    let of = |kind: &str, dir: &str| -> Vec<&Value> {
        objects
            .iter()
            .filter(|(f, o)| o["kind"] == kind && f.contains(dir))
            .map(|(_, o)| o)
            .collect()
    };
    // Each ConfigMap of the base by name: `orderly-config`, which every role reads, and
    // `orderly-lease`, the supervisors'.
    let configs: BTreeMap<String, serde_json::Map<String, Value>> = of("ConfigMap", "/base/")
        .into_iter()
        .map(|c| {
            (
                c["metadata"]["name"].as_str().unwrap().to_owned(),
                c["data"].as_object().unwrap().clone(),
            )
        })
        .collect();
    let config = configs["orderly-config"].clone();
    let script = provision(&[]);
    let secret_keys: BTreeSet<String> = script
        .split("--from-literal=")
        .skip(1)
        .map(|rest| rest.split('=').next().unwrap().to_owned())
        .collect();
    let mut deployments = BTreeMap::new();
    for d in of("Deployment", "/base/") {
        let name = d["metadata"]["name"].as_str().unwrap().to_owned();
        let pod = &d["spec"]["template"]["spec"];
        let c = &pod["containers"][0];
        let command: Vec<String> = c["command"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect();
        let help = help(&command);
        let mut env: BTreeMap<String, String> = BTreeMap::new();
        for from in c["envFrom"].as_array().unwrap() {
            let map = from["configMapRef"]["name"].as_str().unwrap();
            let data = configs
                .get(map)
                .unwrap_or_else(|| panic!("{name}: no ConfigMap {map} in the base"));
            for (k, v) in data {
                if map != "orderly-config" {
                    assert!(
                        help.contains(&format!("[env: {k}")),
                        "{name}: {k} from the ConfigMap {map} is read by no binary it runs"
                    );
                }
                env.insert(k.clone(), v.as_str().unwrap().to_owned());
            }
        }
        assert!(
            env.contains_key("ORDERLY_TRANSPORT"),
            "{name}: reads orderly-config"
        );
        for e in c["env"].as_array().unwrap() {
            let var = e["name"].as_str().unwrap();
            assert!(
                help.contains(&format!("[env: {var}")),
                "{name}: {} does not read {var}",
                command.join(" ")
            );
            if let Some(v) = e["value"].as_str() {
                assert!(
                    ![
                        "TOKEN",
                        "CONNECTION",
                        "PASSWORD",
                        "KEY",
                        "DATABASE_URL",
                        "REMOTE_URL"
                    ]
                    .iter()
                    .any(|s| var.contains(s) && !var.ends_with("_FILE")),
                    "{name}: {var} is a literal in the manifest"
                );
                env.insert(var.to_owned(), v.to_owned());
            } else if let Some(key) = e["valueFrom"]["secretKeyRef"]["key"].as_str() {
                assert_eq!(e["valueFrom"]["secretKeyRef"]["name"], "orderly-secrets");
                assert!(
                    secret_keys.contains(key),
                    "{name}: {var} reads secret key {key}, which provisioning does not create"
                );
                env.insert(var.to_owned(), "<secret>".to_owned());
            } else {
                env.insert(var.to_owned(), "<field>".to_owned());
            }
        }
        for var in config.keys() {
            let reads = help.contains(&format!("[env: {var}"));
            assert!(
                reads || name == "orderly-dashboard",
                "{name}: {var} from the ConfigMap is read by no binary it runs"
            );
        }
        assert!(env.contains_key("ORDERLY_DATABASE_URL"), "{name}");
        if name != "orderly-dashboard" {
            assert_eq!(
                env["ORDERLY_INSTANCE_ID"], "<field>",
                "{name}: the pod name as instance id"
            );
        }
        // The process's operations port first; the probes on the roles' probe port
        // (the dashboard serves them on its one port).
        let port_of = |listen: &str| -> u64 { listen.rsplit(':').next().unwrap().parse().unwrap() };
        let listen = env
            .get("ORDERLY_DASHBOARD_LISTEN")
            .or(env.get("ORDERLY_HTTP_LISTEN"))
            .unwrap();
        assert_eq!(c["ports"][0]["containerPort"], port_of(listen), "{name}");
        let probed = if name == "orderly-dashboard" {
            port_of(listen)
        } else {
            assert!(
                help.contains("[env: ORDERLY_PROBE_LISTEN"),
                "{name}: reads ORDERLY_PROBE_LISTEN"
            );
            port_of(&env["ORDERLY_PROBE_LISTEN"])
        };
        for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
            let named = c[probe]["httpGet"]["port"].as_str().unwrap();
            let port = c["ports"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == named)
                .unwrap_or_else(|| panic!("{name}: {probe} on an undeclared port {named}"));
            assert_eq!(port["containerPort"], probed, "{name}: {probe}");
        }
        assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz", "{name}");
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz", "{name}");
        // The image's user, no root.
        assert_eq!(pod["securityContext"]["runAsUser"], 10001, "{name}");
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{name}");
        for r in ["cpu", "memory"] {
            assert!(
                c["resources"]["requests"][r].is_string(),
                "{name}: requests.{r}"
            );
        }
        assert!(
            c["resources"]["limits"]["memory"].is_string(),
            "{name}: a memory limit"
        );
        deployments.insert(name, (pod.clone(), env, command, d["spec"].clone()));
    }
    // Grace outlasts the drain: a scheduler finishes what it holds for
    // ORDERLY_SHUTDOWN_GRACE, then the outbox relay drains for up to 5 s; a supervisor
    // stops its leader work within ORDERLY_LEADER_STOP_GRACE (3s by default).
    let grace = |name: &str| {
        deployments[name].0["terminationGracePeriodSeconds"]
            .as_u64()
            .unwrap()
            * 1000
    };
    let relay_drain = 5_000;
    let scheduler_drain = u64::try_from(
        orderly_core::duration::parse(
            &deployments["orderly-scheduler"].1["ORDERLY_SHUTDOWN_GRACE"],
        )
        .unwrap()
        .as_millis(),
    )
    .unwrap();
    assert!(grace("orderly-scheduler") >= scheduler_drain + relay_drain + 5_000);
    assert!(grace("orderly-supervisor") >= 3_000 + relay_drain + 5_000);
    assert!(grace("orderly-agent") >= relay_drain + 5_000);
    // The supervisors: blob lease with workload identity (no key), a disruption budget.
    let sup = &deployments["orderly-supervisor"];
    assert_eq!(sup.1["ORDERLY_ELECTOR"], "blob");
    assert_eq!(sup.1["ORDERLY_LEASE_CREDENTIAL"], "workload-identity");
    assert!(sup.1["ORDERLY_LEASE_ACCOUNT_URL"].starts_with("https://"));
    assert_eq!(sup.0["serviceAccountName"], "orderly");
    // On different nodes where there are several.
    let apart = &sup.0["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        [0]["podAffinityTerm"];
    assert_eq!(apart["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(
        apart["labelSelector"]["matchLabels"]["app.kubernetes.io/name"],
        "orderly-supervisor"
    );
    let pdb = of("PodDisruptionBudget", "/base/")[0];
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"],
        "orderly-supervisor"
    );
    assert!(objects.iter().any(|(_, o)| o["kind"] == "ServiceAccount"
        && o["metadata"]["annotations"]["azure.workload.identity/client-id"].is_string()));
    // Passwordless: every pod takes the identity's Entra ID tokens (workload identity)
    // for Service Bus and PostgreSQL; no Service Bus key, no database password.
    for d in of("Deployment", "/base/") {
        let name = d["metadata"]["name"].as_str().unwrap();
        assert_eq!(
            d["spec"]["template"]["metadata"]["labels"]["azure.workload.identity/use"], "true",
            "{name}"
        );
        let env = &deployments[name].1;
        assert_eq!(
            env["ORDERLY_DATABASE_CREDENTIAL"], "workload-identity",
            "{name}"
        );
        assert!(
            env["ORDERLY_SERVICEBUS_NAMESPACE"].ends_with(".servicebus.windows.net"),
            "{name}"
        );
        assert!(
            !env.keys()
                .any(|k| k.starts_with("ORDERLY_SERVICEBUS_CONNECTION")),
            "{name}: a Service Bus key"
        );
    }
    assert!(!secret_keys.contains("servicebus-connection"));
    assert!(
        script.contains("--from-literal=database-url=\"postgres://orderly-roles@"),
        "the database URL names the identity's role and no password"
    );

    // KEDA: each role on the queues it reads (default workflow), on Service Bus and on
    // the SQL queue, and the schedulers on the orders they claim from the store.
    let step_queues: BTreeSet<String> =
        Workflows::single(orderly_core::workflow::Workflow::default())
            .unwrap()
            .queues()
            .iter()
            .map(|q| q.as_str().to_owned())
            .collect();
    let expected: BTreeMap<&str, BTreeSet<String>> = BTreeMap::from([
        ("orderly-agent", step_queues),
        (
            "orderly-scheduler",
            [queues::REPLIES, CLAIMABLE].map(String::from).into(),
        ),
        (
            "orderly-submitter",
            [queues::ORDERS].map(String::from).into(),
        ),
    ]);
    for (dir, trigger) in [
        ("/servicebus/", "azure-servicebus"),
        ("/sql-queue/", "postgresql"),
    ] {
        let scaled = of("ScaledObject", dir);
        assert_eq!(scaled.len(), expected.len(), "{dir}");
        for so in scaled {
            let target = so["spec"]["scaleTargetRef"]["name"].as_str().unwrap();
            assert!(
                deployments.contains_key(target),
                "{dir}: {target} is no Deployment"
            );
            let mut read = BTreeSet::new();
            // KEDA owns the count: a `replicas` in the Deployment would reset it.
            assert!(
                deployments[target].3.get("replicas").is_none(),
                "{target}: sets replicas, which its ScaledObject owns"
            );
            for t in so["spec"]["triggers"].as_array().unwrap() {
                let query = t["metadata"]["query"].as_str().unwrap_or_default();
                if query.contains("FROM order_state") {
                    assert_eq!(t["type"], "postgresql", "{dir} {target}");
                    assert_eq!(query, claimable_query(), "{dir} {target}");
                    read.insert(CLAIMABLE.to_owned());
                    continue;
                }
                assert_eq!(t["type"], trigger, "{dir} {target}");
                let auth = t["authenticationRef"]["name"].as_str().unwrap();
                assert!(
                    of("TriggerAuthentication", dir)
                        .iter()
                        .any(|a| a["metadata"]["name"] == auth),
                    "{dir}: {auth}"
                );
                if trigger == "azure-servicebus" {
                    read.insert(t["metadata"]["queueName"].as_str().unwrap().to_owned());
                    assert!(
                        t["metadata"]["messageCount"]
                            .as_str()
                            .unwrap()
                            .parse::<u32>()
                            .unwrap()
                            > 0
                    );
                } else {
                    let query = t["metadata"]["query"].as_str().unwrap();
                    let inside = query
                        .split("queue IN (")
                        .nth(1)
                        .unwrap()
                        .split(')')
                        .next()
                        .unwrap();
                    read.extend(
                        inside
                            .split(',')
                            .map(|q| q.trim().trim_matches('\'').to_owned()),
                    );
                    assert!(
                        t["metadata"]["targetQueryValue"]
                            .as_str()
                            .unwrap()
                            .parse::<u32>()
                            .unwrap()
                            > 0
                    );
                }
            }
            assert_eq!(
                read, expected[target],
                "{dir}: {target} scales on the queues it reads"
            );
            assert!(
                so["spec"]["minReplicaCount"].as_u64().unwrap() >= 1,
                "{target}: never to zero"
            );
        }
    }
    // The SQL overlay switches the transport.
    let patch = objects
        .iter()
        .find(|(f, o)| f.contains("/sql-queue/") && o["kind"] == "ConfigMap")
        .unwrap();
    assert_eq!(patch.1["data"]["ORDERLY_TRANSPORT"], "sql");
}

/// KEDA's queries on the SQL queue count what a role has to get through (waiting and in
/// work, not scheduled for later), on a real store with messages sent, taken and
/// completed as the roles do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keda_queries_on_the_sql_queue_count_what_waits_and_what_is_in_work() {
    let (db, backend) = Db::with_queues(Dialect::Postgres, Duration::from_secs(30)).await;
    let scaling = read("deploy/kubernetes/sql-queue/scaling.yaml");
    let agent_query = scaling
        .lines()
        .filter_map(|l| l.trim().strip_prefix("query: "))
        .find(|q| q.contains("agent.inventory"))
        .unwrap()
        .trim_matches('"')
        .to_owned();
    let options: sqlx::postgres::PgConnectOptions = db.url.parse().unwrap();
    let pool = sqlx::PgPool::connect_with(options).await.unwrap();
    let count = async || -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(agent_query.clone()))
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    assert_eq!(count().await, 0);
    let send = async |queue: &str, n: usize, later: bool| {
        let q = QueueName::parse(queue).unwrap();
        let messages: Vec<OutgoingMessage> = (0..n)
            .map(|i| {
                let mut m = OutgoingMessage::new(format!("{queue}-{later}-{i}"), b"{}".to_vec());
                if later {
                    m.scheduled_enqueue_time =
                        Some(chrono::Utc::now() + chrono::Duration::hours(1));
                }
                m
            })
            .collect();
        backend.transport.send(&q, &messages).await.unwrap();
    };
    send("agent.inventory", 5, false).await;
    send("agent.payment", 3, false).await;
    send("agent.shipping", 2, true).await; // scheduled for later: nothing to do yet
    send("replies", 7, false).await; // another role's queue
    assert_eq!(count().await, 8);
    let inventory = QueueName::parse("agent.inventory").unwrap();
    let taken = backend
        .transport
        .receive(&inventory, 3, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(taken.len(), 3);
    assert_eq!(count().await, 8, "messages in work still count");
    for m in &taken[..2] {
        backend.transport.complete(m).await.unwrap();
    }
    assert_eq!(count().await, 6, "completed ones do not");

    // The schedulers' query: orders submitted and not yet claimed.
    let claimable = async || -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(claimable_query()))
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    assert_eq!(claimable().await, 0);
    for n in 1..=3 {
        backend
            .store
            .submit(
                &orderly_testkit::builders::order(n),
                &orderly_testkit::builders::submitter(),
                &[],
            )
            .await
            .unwrap();
    }
    assert_eq!(claimable().await, 3, "submitted orders wait to be claimed");
    pool.close().await;
}

/// `orderly provision --print az` creates every queue the roles declare for the
/// workflows it is given (a new step queue appears when a workflow names one), with the
/// settings the roles rely on; it is valid bash, and secrets stay in the environment.
#[test]
fn provisioning_creates_every_queue_the_roles_declare_with_the_settings_they_rely_on() {
    let script = provision(&[]);
    let check = Command::new("bash")
        .args(["-n", "-c", &script])
        .status()
        .unwrap();
    assert!(check.success(), "not valid bash:\n{script}");
    assert!(
        !script.contains("pw-that-must-not-show"),
        "a secret was printed"
    );
    let default = Workflows::single(orderly_core::workflow::Workflow::default()).unwrap();
    let mut roles_declare: BTreeSet<String> = orderly_runtime::backend::fixed_queues()
        .iter()
        .map(|q| q.as_str().to_owned())
        .collect();
    roles_declare.extend(default.queues().iter().map(|q| q.as_str().to_owned()));
    let queues = provisioned(&script);
    assert_eq!(
        queues.keys().cloned().collect::<BTreeSet<_>>(),
        roles_declare
    );
    for (name, flags) in &queues {
        let settings = queues::settings(&QueueName::parse(name).unwrap());
        assert_eq!(
            iso_secs(&flags["lock-duration"]),
            settings.lock_duration.as_secs(),
            "{name}"
        );
        assert_eq!(
            flags["max-delivery-count"],
            settings.max_delivery_count.to_string(),
            "{name}"
        );
        // Every queue detects duplicates on Service Bus: the outbox relay may publish twice.
        assert_eq!(flags["enable-duplicate-detection"], "true", "{name}");
        assert!(
            iso_secs(&flags["duplicate-detection-history-time-window"]) >= 60,
            "{name}"
        );
        assert_eq!(
            flags["enable-dead-lettering-on-message-expiration"], "true",
            "{name}"
        );
    }
    for needed in [
        "az servicebus namespace create",
        "--sku Standard",
        "az storage container-rm create",
        "--name \"$CONTAINER\"",
        "az aks create",
        "--enable-oidc-issuer --enable-workload-identity --enable-keda",
        "system:serviceaccount:kube-system:keda-operator",
        "Azure Service Bus Data Owner",
        "firewall-rule create",
        "--dry-run=client -o yaml | kubectl apply -f -",
        "Storage Blob Data Contributor",
        "az identity federated-credential create",
        "az postgres flexible-server create",
        "require_secure_transport --value on",
        "sslmode=verify-full",
        "kubectl --namespace orderly create secret generic orderly-secrets",
    ] {
        assert!(script.contains(needed), "no {needed:?} in\n{script}");
    }
    // The lease container is the one the supervisors' manifest names.
    assert!(script.contains("CONTAINER=orderly-leases"));
    assert!(
        read("deploy/kubernetes/base/config.yaml")
            .contains("ORDERLY_LEASE_CONTAINER: orderly-leases")
    );

    // A workflow with a step on a queue of its own: provisioning follows it.
    let file = std::env::temp_dir().join(format!(
        "orderly-provision-{}.toml",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::write(
        &file,
        "name = \"gift\"\n[[steps]]\nname = \"wrap\"\nqueue = \"agent.giftwrap\"\ntimeout_ms = 10000\n",
    )
    .unwrap();
    let script = provision(&["--workflow", file.to_str().unwrap()]);
    let queues = provisioned(&script);
    assert!(queues.contains_key("agent.giftwrap"), "{script}");
    assert!(
        !queues.contains_key("agent.inventory"),
        "only the workflows given"
    );
    assert!(
        script.contains("gift@"),
        "the header names the workflow version"
    );
    let _ = std::fs::remove_file(file);
}

/// The smoke test of docs/containers.md, as written there: its order is taken by a real
/// submitter's intake with the intake token, and read back by its id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_docs_smoke_test_order_is_taken_by_the_intake() {
    let doc = read("docs/containers.md");
    let smoke = doc
        .split("### 5. Smoke test")
        .nth(1)
        .expect("a smoke test in docs/containers.md");
    let body = smoke
        .split("-d '")
        .nth(1)
        .and_then(|rest| rest.split('\'').next())
        .expect("the smoke test's order in docs/containers.md");
    let order: Value = serde_json::from_str(body).unwrap();
    let id = order["order_id"].as_str().unwrap().to_owned();
    assert!(
        smoke.contains(&format!("http://localhost:8080/orders/{id}")),
        "the smoke test reads back the order it posted"
    );
    let (db, _backend) = Db::with_queues(Dialect::Sqlite, Duration::from_secs(5)).await;
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let token = "a-smoke-test-intake-token-0123456789";
    let _submitter = crate::procs::Proc::start_with(
        "orderly-submitter",
        &db.url,
        &["--http-listen", &listen, "--http-intake"],
        &[("ORDERLY_INTAKE_TOKEN", token)],
    );
    crate::newcomer::wait_listening(port).await;
    let http = crate::procs::http();
    let posted = http
        .post(format!("http://{listen}/orders"))
        .bearer_auth(token)
        .header("Content-Type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), 202, "{}", posted.text().await.unwrap());
    let mut read_back = String::new();
    wait_for(
        "the smoke test's order read back",
        Duration::from_secs(20),
        async || {
            let r = http
                .get(format!("http://{listen}/orders/{id}"))
                .bearer_auth(token)
                .send()
                .await
                .unwrap();
            read_back = r.text().await.unwrap();
            read_back.contains(&id) && read_back.contains("Pending")
        },
    )
    .await;
}
