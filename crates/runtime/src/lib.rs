//! What every orderly binary shares: the common settings (database URL, instance id,
//! log format), tracing set-up, the shutdown signal, reading a workflow file, and the
//! wiring of a role: which store and transport it opens and the outbox relay
//! ([`backend`]), its operations endpoints ([`ops`]), and the supervisors' leader
//! election ([`election`]). Binaries stay thin: parse, set up, wire, `run(shutdown)`.

pub mod backend;
pub mod clock;
pub mod election;
pub mod http;
pub mod ops;
pub mod settings;
pub mod telemetry;

pub use telemetry::Telemetry;

/// This build's version and the commit it was built from, as every binary's
/// `--version` prints them (`0.1.0 (commit 1a2b3c4d5e6f)`): the checkout's `HEAD`, or
/// `ORDERLY_REVISION` where the build has no `.git` (the image's build sets it), or
/// "unknown".
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("ORDERLY_REVISION"),
    ")"
);

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use orderly_core::InstanceId;
use orderly_core::workflow::{Workflow, Workflows};
use tokio_util::sync::CancellationToken;

/// Settings every role binary takes, from flags or `ORDERLY_*` variables. Its `Debug`
/// leaves the secrets out (the database URL, the metrics token, the Service Bus
/// connection string).
#[derive(Clone, clap::Args)]
pub struct Common {
    /// State store (and embedded queues): sqlite://FILE or postgres://USER@HOST:PORT/DB.
    #[arg(
        long,
        env = "ORDERLY_DATABASE_URL",
        default_value = "sqlite://orderly.db",
        hide_env_values = true
    )]
    pub database_url: String,

    /// PostgreSQL without a password: the password is an Entra ID token from this
    /// credential (Azure Database for PostgreSQL; the URL names the role created for
    /// the identity, e.g. postgres://orderly-roles@<server>.postgres.database.azure.com/orderly),
    /// renewed before it expires. Unset: the URL's password.
    #[arg(long, env = "ORDERLY_DATABASE_CREDENTIAL", value_enum)]
    pub database_credential: Option<crate::election::CredentialKind>,

    /// This instance's id (goes into locked_by and every log line). Give a stable one
    /// (e.g. the pod name) so a restarted scheduler takes its orders back at once;
    /// by default a fresh `role@host:pid:random`.
    #[arg(long, env = "ORDERLY_INSTANCE_ID")]
    pub instance_id: Option<String>,

    /// Log as JSON lines instead of text.
    #[arg(long, env = "ORDERLY_LOG_JSON")]
    pub log_json: bool,

    /// Serve /healthz, /readyz and /metrics (Prometheus) on this address, e.g. 0.0.0.0:9090.
    #[arg(long, env = "ORDERLY_HTTP_LISTEN")]
    pub http_listen: Option<std::net::SocketAddr>,

    /// Also serve /healthz and /readyz alone on this address (e.g. 0.0.0.0:9091), with
    /// connections of their own: the orchestrator's probes are then answered whoever
    /// holds the connections of --http-listen (the intake's clients, scrapers).
    #[arg(long, env = "ORDERLY_PROBE_LISTEN")]
    pub probe_listen: Option<std::net::SocketAddr>,

    /// The token /metrics asks for as `Authorization: Bearer` (a secret, at least 16
    /// characters); required when --http-listen is not loopback. /healthz and /readyz
    /// never ask for one (the orchestrator's probes).
    #[arg(long, env = "ORDERLY_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<String>,

    /// A file holding the metrics token (e.g. a mounted secret).
    #[arg(long, env = "ORDERLY_METRICS_TOKEN_FILE")]
    pub metrics_token_file: Option<std::path::PathBuf>,

    /// Where messages travel: `sql` (the queue in the state store's database) or
    /// `servicebus` (Azure Service Bus; each state change writes its messages to the
    /// store's outbox in its transaction, and a relay in every process publishes them).
    #[arg(long, env = "ORDERLY_TRANSPORT", value_enum, default_value = "sql")]
    pub transport: TransportKind,

    /// How to reach Service Bus (`--transport servicebus`).
    #[command(flatten)]
    pub servicebus: ServiceBusArgs,

    /// Export tracing spans to an OpenTelemetry collector at this OTLP/HTTP base URL,
    /// e.g. http://otel-collector:4318 (spans go to /v1/traces). Needs a build with the
    /// `otel` feature. The standard OTEL_EXPORTER_OTLP_* variables (headers, timeout, or
    /// the endpoint itself), OTEL_SERVICE_NAME and OTEL_TRACES_SAMPLER apply too.
    #[arg(long, env = "ORDERLY_OTEL_ENDPOINT")]
    pub otel_endpoint: Option<String>,

    /// Which spans go to OpenTelemetry, in tracing's filter syntax (ORDERLY_LOG filters the logs).
    #[arg(long, env = "ORDERLY_OTEL_FILTER", default_value = "info")]
    pub otel_filter: String,

    /// At start-up, how long to keep trying to reach the state store and Service Bus
    /// (with back-off, each failure logged) before giving up: a role started
    /// beside its broker or database waits for them instead of exiting.
    #[arg(long = "startup-wait", env = "ORDERLY_STARTUP_WAIT", default_value = "60s", value_name = settings::DURATION, value_parser = duration)]
    pub startup_wait_ms: std::time::Duration,

    /// Check the settings (flags, environment, config file) and exit without starting.
    #[arg(long)]
    pub check_config: bool,
}

/// How to reach Azure Service Bus (with `--transport servicebus`).
#[derive(Clone, Default, clap::Args)]
pub struct ServiceBusArgs {
    /// Service Bus: the namespace's connection string, Endpoint=sb://...;SharedAccessKeyName=...;SharedAccessKey=... (a secret).
    #[arg(long, env = "ORDERLY_SERVICEBUS_CONNECTION", hide_env_values = true)]
    pub servicebus_connection: Option<String>,

    /// Service Bus: a file holding the connection string (e.g. a mounted secret).
    #[arg(long, env = "ORDERLY_SERVICEBUS_CONNECTION_FILE")]
    pub servicebus_connection_file: Option<std::path::PathBuf>,

    /// Service Bus without a key: the namespace's host name (<name>.servicebus.windows.net),
    /// reached with Entra ID tokens from --servicebus-credential (instead of a connection
    /// string). The identity needs "Azure Service Bus Data Sender" and "Data Receiver"
    /// on the queues the role uses (or on the namespace).
    #[arg(long, env = "ORDERLY_SERVICEBUS_NAMESPACE")]
    pub servicebus_namespace: Option<String>,

    /// Service Bus with --servicebus-namespace: where the Entra ID token comes from
    /// (workload identity reads AZURE_CLIENT_ID, AZURE_TENANT_ID and
    /// AZURE_FEDERATED_TOKEN_FILE, which the cluster sets).
    #[arg(
        long,
        env = "ORDERLY_SERVICEBUS_CREDENTIAL",
        value_enum,
        default_value = "workload-identity"
    )]
    pub servicebus_credential: crate::election::CredentialKind,

    /// Service Bus: plain AMQP without TLS, for the local emulator only.
    #[arg(long, env = "ORDERLY_SERVICEBUS_UNSECURED")]
    pub servicebus_unsecured: bool,

    /// Service Bus: the largest message, in bytes (Standard: 256 KB; Premium up to
    /// 100 MB, as the entity is set). A larger one is refused before it is sent, and
    /// only it: the others sent with it go out.
    #[arg(long, env = "ORDERLY_SERVICEBUS_MAX_MESSAGE_BYTES", default_value_t = orderly_azure::STANDARD_MAX_BATCH_BYTES, value_parser = sb_bytes)]
    pub servicebus_max_message_bytes: usize,

    /// Service Bus: the most one call of several messages carries, in bytes
    /// (Standard: 256 KB; Premium: 1 MB). Sends are split into batches within it.
    #[arg(long, env = "ORDERLY_SERVICEBUS_MAX_BATCH_BYTES", default_value_t = orderly_azure::STANDARD_MAX_BATCH_BYTES, value_parser = sb_bytes)]
    pub servicebus_max_batch_bytes: usize,
}

/// A Service Bus size limit: 4096 to 104857600 bytes.
fn sb_bytes(raw: &str) -> Result<usize, String> {
    raw.trim()
        .parse::<usize>()
        .ok()
        .filter(|n| (4096..=100 * 1024 * 1024).contains(n))
        .ok_or_else(|| format!("{raw:?}: must be a number of bytes from 4096 to 104857600"))
}

/// Where messages travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum TransportKind {
    /// The queue in the state store's database (one transaction for a change and its
    /// messages).
    #[default]
    Sql,
    /// Azure Service Bus, fed from the state store's transactional outbox.
    Servicebus,
}

impl std::fmt::Debug for Common {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Common")
            .field("database_url", &"<redacted>")
            .field("database_credential", &self.database_credential)
            .field("instance_id", &self.instance_id)
            .field("log_json", &self.log_json)
            .field("http_listen", &self.http_listen)
            .field("probe_listen", &self.probe_listen)
            .field(
                "metrics_token",
                &self.metrics_token.as_ref().map(|_| "<redacted>"),
            )
            .field("metrics_token_file", &self.metrics_token_file)
            .field("transport", &self.transport)
            .field("servicebus", &self.servicebus)
            .field("otel_endpoint", &self.otel_endpoint)
            .field("otel_filter", &self.otel_filter)
            .field("startup_wait_ms", &self.startup_wait_ms)
            .field("check_config", &self.check_config)
            .finish()
    }
}

impl std::fmt::Debug for ServiceBusArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceBusArgs")
            .field(
                "servicebus_connection",
                &self.servicebus_connection.as_ref().map(|_| "<redacted>"),
            )
            .field(
                "servicebus_connection_file",
                &self.servicebus_connection_file,
            )
            .field("servicebus_namespace", &self.servicebus_namespace)
            .field("servicebus_credential", &self.servicebus_credential)
            .field("servicebus_unsecured", &self.servicebus_unsecured)
            .field(
                "servicebus_max_message_bytes",
                &self.servicebus_max_message_bytes,
            )
            .field(
                "servicebus_max_batch_bytes",
                &self.servicebus_max_batch_bytes,
            )
            .finish()
    }
}

impl ServiceBusArgs {
    /// The Service Bus connection string, from the flag / variable or its file. Errors
    /// name the setting, never the value.
    pub fn connection(&self) -> anyhow::Result<String> {
        match (&self.servicebus_connection, &self.servicebus_connection_file) {
            (Some(_), Some(_)) => anyhow::bail!(
                "give either --servicebus-connection / ORDERLY_SERVICEBUS_CONNECTION or \
                 --servicebus-connection-file / ORDERLY_SERVICEBUS_CONNECTION_FILE, not both"
            ),
            (Some(cs), None) => Ok(cs.clone()),
            (None, Some(path)) => std::fs::read_to_string(path)
                .map(|cs| cs.trim().to_owned())
                .with_context(|| {
                    format!(
                        "cannot read --servicebus-connection-file / ORDERLY_SERVICEBUS_CONNECTION_FILE {}",
                        path.display()
                    )
                }),
            (None, None) => anyhow::bail!(
                "--transport servicebus needs --servicebus-namespace / ORDERLY_SERVICEBUS_NAMESPACE \
                 (Entra ID, passwordless) or --servicebus-connection / ORDERLY_SERVICEBUS_CONNECTION \
                 (or its _FILE form)"
            ),
        }
    }
}

impl Common {
    /// With `--check-config`: checks the database URL without connecting and says the
    /// settings of `role` are valid; `Ok(true)` means "exit now".
    pub fn checked(&self, role: &str) -> anyhow::Result<bool> {
        if self.check_config {
            self.ops_listen()?;
            orderly_sql::check_url(&self.database_url)
                .context("--database-url / ORDERLY_DATABASE_URL")?;
            backend::database_password(self.database_credential, &self.database_url)?;
            println!("{role}: settings OK");
        }
        Ok(self.check_config)
    }
}

impl Common {
    /// Where to serve the operations endpoints (`--http-listen`) and the token
    /// /metrics asks for: `None` without a listener. Refused, naming the setting, off
    /// loopback without a token (the metrics name the deployment's queues, instances
    /// and order counts), and for a token too short to be a secret.
    pub fn ops_listen(&self) -> anyhow::Result<Option<ops::Listen>> {
        const SETTING: &str = "--metrics-token / ORDERLY_METRICS_TOKEN";
        let Some(addr) = self.http_listen else {
            if self.probe_listen.is_some() {
                anyhow::bail!(
                    "--probe-listen / ORDERLY_PROBE_LISTEN needs --http-listen / ORDERLY_HTTP_LISTEN \
                     (the operations endpoints it stands beside)"
                );
            }
            return Ok(None);
        };
        if self.probe_listen == Some(addr) {
            anyhow::bail!(
                "--probe-listen / ORDERLY_PROBE_LISTEN is the address of --http-listen / ORDERLY_HTTP_LISTEN: give it a port of its own"
            );
        }
        let token = secret(
            self.metrics_token.as_deref(),
            self.metrics_token_file.as_deref(),
            SETTING,
            "--metrics-token-file / ORDERLY_METRICS_TOKEN_FILE",
        )?;
        match &token {
            Some(t) if t.chars().count() < 16 || t.chars().any(char::is_control) => {
                anyhow::bail!("invalid {SETTING}: a secret of at least 16 printable characters")
            }
            None if !addr.ip().is_loopback() => anyhow::bail!(
                "--http-listen / ORDERLY_HTTP_LISTEN {addr} is not loopback: /metrics needs \
                 {SETTING} (or its _FILE form), which Prometheus sends as \
                 `Authorization: Bearer` (/healthz and /readyz stay open)"
            ),
            _ => {}
        }
        Ok(Some(ops::Listen {
            addr,
            metrics_token: token,
            probes: self.probe_listen,
        }))
    }

    /// The instance id: the configured one, or a fresh one for `role`.
    pub fn instance(&self, role: &str) -> anyhow::Result<InstanceId> {
        match &self.instance_id {
            Some(id) => configured_instance(id),
            None => Ok(InstanceId::generate(role)),
        }
    }
}

/// An `--instance-id` as given: a valid id that does not pose as an operator.
fn configured_instance(raw: &str) -> anyhow::Result<InstanceId> {
    const SETTING: &str = "--instance-id / ORDERLY_INSTANCE_ID";
    let prefix = orderly_core::Actor::OPERATOR_PREFIX;
    if raw.starts_with(prefix) {
        anyhow::bail!(
            "invalid {SETTING} {raw:?}: {prefix:?} starts the names of operators in an \
             order's history, so an instance id may not start with it"
        );
    }
    InstanceId::parse(raw).with_context(|| format!("invalid {SETTING}"))
}

/// What the logs show unless `ORDERLY_LOG` says otherwise: `info`, but for the Azure
/// SDK's line per failed HTTP try ("failed to execute `reqwest` request", at info, with
/// no cause), which would repeat at every retry: orderly logs each failure itself, once
/// per change, with its cause chain (the certificate, DNS, refused, the HTTP status).
pub const DEFAULT_LOG_FILTER: &str = "info,typespec_client_core::http::policies::logging=warn";

/// Logs to stderr, filtered by `ORDERLY_LOG` (default [`DEFAULT_LOG_FILTER`]), as text or
/// JSON lines.
/// For tools; the role binaries use [`telemetry::init`], which can also export spans.
pub fn init_tracing(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("ORDERLY_LOG")
        .unwrap_or_else(|_| DEFAULT_LOG_FILTER.into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// Whether `ORDERLY_LOG_JSON` asks for JSON lines (`true`, as the setting takes it), read
/// from the environment alone so that it applies before any setting is parsed.
pub fn log_json_from_env() -> bool {
    std::env::var("ORDERLY_LOG_JSON").is_ok_and(|v| v == "true")
}

static ERRORS_AS_JSON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// From now on [`exit`] says the error as one JSON line, whatever `ORDERLY_LOG_JSON`
/// says (a command line that asked for JSON: `--json`, `--log-json`).
pub fn errors_as_json() {
    ERRORS_AS_JSON.store(true, std::sync::atomic::Ordering::Release);
}

/// A binary's last word: the error that ended it, on stderr, as one JSON line (the
/// shape of the JSON logs: timestamp, level, fields.message, target) when
/// `ORDERLY_LOG_JSON` is on or [`errors_as_json`] was called, else as `error: ...`
/// with its causes; exit code 1.
pub fn exit(binary: &str, result: anyhow::Result<()>) -> std::process::ExitCode {
    let Err(e) = result else {
        return std::process::ExitCode::SUCCESS;
    };
    let message = causes(e.as_ref());
    if log_json_from_env() || ERRORS_AS_JSON.load(std::sync::atomic::Ordering::Acquire) {
        let line = serde_json::json!({
            "timestamp": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            "level": "ERROR",
            "fields": { "message": message },
            "target": binary,
        });
        eprintln!("{line}");
    } else {
        eprintln!("error: {message}");
    }
    std::process::ExitCode::FAILURE
}

pub use orderly_core::error::causes;

/// Runs `main` to its end on a multi-threaded runtime whose worker threads have room
/// (8 MiB stacks) for the Service Bus client's deep calls, then ends as [`exit`] does.
pub fn run_with_deep_stacks(
    binary: &str,
    main: impl std::future::Future<Output = anyhow::Result<()>>,
) -> std::process::ExitCode {
    match tokio::runtime::Builder::new_multi_thread()
        .thread_stack_size(8 << 20)
        .enable_all()
        .build()
    {
        Ok(runtime) => exit(binary, runtime.block_on(main)),
        Err(e) => exit(
            binary,
            Err(anyhow::anyhow!("cannot start the async runtime: {e}")),
        ),
    }
}

/// A token cancelled on SIGTERM or SIGINT (Ctrl-C).
pub fn shutdown_on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let mut term = match signal(SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(error = %e, "cannot listen for SIGTERM");
                    let _ = tokio::signal::ctrl_c().await;
                    t.cancel();
                    return;
                }
            };
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
                _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
        t.cancel();
    });
    token
}

/// Reads a workflow from a TOML file, or the default order workflow without one, and
/// validates it. Errors name the file and the field.
pub fn load_workflow(path: Option<&Path>) -> anyhow::Result<Workflow> {
    let workflow = match path {
        None => Workflow::default(),
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read workflow file {}", path.display()))?;
            toml::from_str::<Workflow>(&text)
                .with_context(|| format!("invalid workflow file {}", path.display()))?
        }
    };
    workflow
        .validate()
        .context("invalid workflow (setting --workflow / ORDERLY_WORKFLOW)")?;
    Ok(workflow)
}

/// Reads the workflows a scheduler runs from TOML files (the default order workflow
/// without any): the first is the default for orders that name none; for a name given
/// more than once, the first file is the version new orders start on and the others
/// only finish orders pinned to them. Errors name the file and the field.
pub fn load_workflows(paths: &[std::path::PathBuf]) -> anyhow::Result<Workflows> {
    let workflows = if paths.is_empty() {
        vec![Workflow::default()]
    } else {
        paths
            .iter()
            .map(|p| load_workflow(Some(p)))
            .collect::<anyhow::Result<Vec<_>>>()?
    };
    Workflows::new(workflows).context("invalid workflows (setting --workflow / ORDERLY_WORKFLOW)")
}

/// Parses a span of time for a setting or flag, in the one syntax every one takes
/// ([`orderly_core::duration`]): `250ms`, `30s`, `5m`, `7d`, or `0`.
pub fn duration(raw: &str) -> Result<Duration, String> {
    orderly_core::duration::parse(raw)
}

/// A secret given either as a value or as a file holding it (a mounted secret), trimmed;
/// both at once, or a file that cannot be read, is refused naming the settings (never
/// the secret).
pub fn secret(
    value: Option<&str>,
    file: Option<&std::path::Path>,
    setting: &str,
    file_setting: &str,
) -> anyhow::Result<Option<String>> {
    Ok(match (value, file) {
        (Some(_), Some(_)) => anyhow::bail!("give either {setting} or {file_setting}, not both"),
        (Some(t), None) => Some(t.trim().to_owned()),
        (None, Some(path)) => Some(
            std::fs::read_to_string(path)
                .map(|t| t.trim().to_owned())
                .with_context(|| format!("cannot read {file_setting} {}", path.display()))?,
        ),
        (None, None) => None,
    })
}

/// Parses how often something runs ([`duration`]): longer than 0, since a period of 0
/// is a loop that never waits (or, for a timer, a panic at start).
pub fn period(raw: &str) -> Result<Duration, String> {
    let d = duration(raw)?;
    if d.is_zero() {
        Err(format!(
            "{:?} is no period: give how long to wait between two runs, e.g. 1s",
            raw.trim()
        ))
    } else {
        Ok(d)
    }
}

/// Parses a span of time for retention and alerts ([`duration`]), between 1 s and 100
/// years.
pub fn span(raw: &str) -> Result<Duration, String> {
    let d = duration(raw)?;
    if (Duration::from_secs(1)..=Duration::from_secs(100 * 365 * 86_400)).contains(&d) {
        Ok(d)
    } else {
        Err(format!("{:?} must be between 1s and 100 years", raw.trim()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_period_of_zero_is_refused() {
        assert_eq!(period("250ms"), Ok(Duration::from_millis(250)));
        for zero in ["0", "0s", "0ms"] {
            let e = period(zero).unwrap_err();
            assert!(e.contains("no period"), "{e}");
        }
    }

    #[test]
    fn an_instance_id_posing_as_an_operator_is_refused_naming_the_setting() {
        let err = format!("{:#}", configured_instance("operator:alice").unwrap_err());
        assert!(err.contains("--instance-id / ORDERLY_INSTANCE_ID"), "{err}");
        assert!(err.contains("operator:"), "{err}");
        let err = format!("{:#}", configured_instance("").unwrap_err());
        assert!(err.contains("--instance-id / ORDERLY_INSTANCE_ID"), "{err}");
        for fine in ["scheduler-a", "operators-pod-1", "supervisor@host:1:ab"] {
            assert_eq!(configured_instance(fine).unwrap().as_str(), fine);
        }
    }

    #[test]
    fn spans_read_as_operators_write_them() {
        assert_eq!(span("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(span("36h"), Ok(Duration::from_secs(36 * 3_600)));
        assert_eq!(span("90m"), Ok(Duration::from_secs(5_400)));
        assert_eq!(span(" 45s "), Ok(Duration::from_secs(45)));
        assert_eq!(span("1500ms"), Ok(Duration::from_millis(1_500)));
        for bad in [
            "7",
            "d",
            "7w",
            "-1d",
            "0s",
            "0",
            "999ms",
            "1.5d",
            "999999999999d",
        ] {
            assert!(span(bad).is_err(), "{bad} was taken");
        }
    }

    #[test]
    fn a_workflow_file_with_an_unknown_key_is_refused_naming_it() {
        let dir = std::env::temp_dir().join(format!("orderly-wf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("wf.toml");
        std::fs::write(
            &file,
            "name = \"x\"\n[[steps]]\nname = \"a\"\nqueue = \"q\"\ntimeout_ms = 100\ntimeot = 3\n",
        )
        .unwrap();
        let err = format!("{:#}", load_workflow(Some(&file)).unwrap_err());
        assert!(err.contains("timeot"), "{err}");
        std::fs::write(
            &file,
            "name = \"x\"\n[[steps]]\nname = \"a\"\nqueue = \"q\"\ntimeout_ms = 1\n",
        )
        .unwrap();
        let err = format!("{:#}", load_workflow(Some(&file)).unwrap_err());
        assert!(err.contains("steps[0].timeout_ms"), "{err}");
        std::fs::write(
            &file,
            "name = \"two\"\ncompensate_on_error = false\n[[steps]]\nname = \"a\"\nqueue = \"q\"\ntimeout_ms = 100\ncompensation = \"undo-a\"\n[steps.retry]\nmax_attempts = 3\ninitial_backoff_ms = 10\nmax_backoff_ms = 100\nmultiplier = 2.0\n",
        )
        .unwrap();
        let w = load_workflow(Some(&file)).unwrap();
        assert_eq!(w.steps[0].retry.max_attempts, 3);
        assert!(!w.compensate_on_error);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
