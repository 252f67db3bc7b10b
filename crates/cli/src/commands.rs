//! What each command does: the commands that need no store first (posting, the local
//! runner, the messaging views, the dashboard), then those on the state store.

use anyhow::{Context, bail};
use orderly_cli::out::json_line;
use orderly_cli::outln;
use orderly_core::store::StateStore;
use orderly_core::transport::QueueName;
use orderly_core::{Actor, OrderId};

use crate::config::ConfigCommand;
use crate::triage::confirm;
use crate::{
    Command, QueueTransport, WorkflowsAction, config, outbox, post, print, provision, triage,
};

/// Runs `command` against the store at `url`; `json`: print one JSON object a line.
pub(crate) async fn run(
    command: Command,
    url: &str,
    log_json: bool,
    json: bool,
) -> anyhow::Result<()> {
    match command {
        Command::Post(args) => post::run(args, url, json).await,
        Command::Provision {
            print: provision::Format::Az,
            workflow,
            names,
        } => {
            let workflows = orderly_runtime::load_workflows(&workflow)?;
            print!("{}", provision::az(&workflows, &names));
            Ok(())
        }
        Command::Outbox { requeue } => outbox::run(url, requeue, json).await,
        Command::Demo { args } => local_runner("demo", args, url, log_json),
        Command::Bench { args } => local_runner("bench", args, url, log_json),
        Command::Up { args } => local_runner("up", args, url, log_json),
        Command::Completions { shell } => crate::completions(shell),
        Command::Man { dir } => crate::manual(dir.as_deref()),
        Command::Config {
            command: ConfigCommand::Check { file },
        } => config::check_config(&file, json),
        Command::Queues { on } => queues(url, json, &on).await,
        Command::DeadLetters { queue, limit, on } => {
            let queue = QueueName::parse(queue)?;
            let (transport, _) = on.open(url).await?;
            print::dead_letters(&transport.dead_letters(&queue, limit).await?, json)
        }
        Command::Requeue {
            queue,
            message_id,
            all,
            yes,
            on,
        } => {
            let settle = Settle {
                requeue: true,
                queue,
                message_id,
                all,
                yes,
            };
            settle_dead_letters(url, settle, &on, json).await
        }
        Command::Discard {
            queue,
            message_id,
            all,
            yes,
            on,
        } => {
            let settle = Settle {
                requeue: false,
                queue,
                message_id,
                all,
                yes,
            };
            settle_dead_letters(url, settle, &on, json).await
        }
        Command::Dashboard {
            listen,
            token,
            token_file,
            public_url,
            operators_file,
            trusted_proxy,
            proxy_header,
            on,
        } => {
            let proxy = orderly_cli::dashboard::Proxy::from_settings(
                trusted_proxy,
                proxy_header.as_deref(),
            )?;
            let access = match operators_file {
                Some(path) => orderly_cli::dashboard::Access::from_file(&path, proxy)?,
                None => orderly_cli::dashboard::Access {
                    operators: Vec::new(),
                    proxy,
                },
            };
            let token = orderly_runtime::secret(
                token.as_deref(),
                token_file.as_deref(),
                "--token / ORDERLY_DASHBOARD_TOKEN",
                "--token-file / ORDERLY_DASHBOARD_TOKEN_FILE",
            )?;
            dashboard(url, listen, token, public_url, access, &on, json).await
        }
        command => on_store(command, url, json).await,
    }
}

/// The local runner (`orderly-local`, beside this binary or on the PATH) runs `demo`,
/// `up` and `bench`: this process becomes it, with the store and the log format this
/// command line named. The operators' binary carries none of the roles.
fn local_runner(
    command: &str,
    args: Vec<std::ffi::OsString>,
    url: &str,
    log_json: bool,
) -> anyhow::Result<()> {
    let name = format!("orderly-local{}", std::env::consts::EXE_SUFFIX);
    let beside = std::env::current_exe()
        .ok()
        .map(|exe| exe.with_file_name(&name))
        .filter(|p| p.is_file());
    let program = beside.unwrap_or_else(|| name.clone().into());
    let mut runner = std::process::Command::new(&program);
    runner
        .arg(command)
        .args(args)
        .env("ORDERLY_DATABASE_URL", url);
    if log_json {
        runner.env("ORDERLY_LOG_JSON", "true");
    }
    let missing = |e: std::io::Error| {
        anyhow::anyhow!(
            "`orderly {command}` runs the local runner, orderly-local, which is neither beside \
             this binary nor on the PATH ({e}): build it with `cargo build -p orderly-local`, \
             or run `cargo run -p orderly-local -- {command}`"
        )
    };
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        // Only returns on failure: from here on this process is the runner, which gets
        // the signals (Ctrl-C, SIGTERM) and gives the exit status.
        Err(missing(runner.exec()))
    }
    #[cfg(not(unix))]
    {
        let status = runner.status().map_err(missing)?;
        std::process::exit(status.code().unwrap_or(1))
    }
}

/// The queues' depths.
async fn queues(url: &str, json: bool, on: &QueueTransport) -> anyhow::Result<()> {
    let (_, inspector) = on.open(url).await?;
    print::depths(&inspector.count_depths().await?, json)?;
    if on.is_servicebus() && !json {
        outln!(
            "(Service Bus: counted by peeking, at most {} per queue; `ready` includes locked and \
             scheduled messages. Exact counts are Azure Monitor metrics.)",
            orderly_azure::PEEK_COUNT_CAP
        );
    }
    Ok(())
}

/// What `orderly requeue` (`requeue`) or `orderly discard` does: one dead letter of
/// `queue`, or `all` of them (asking first unless `yes`).
struct Settle {
    requeue: bool,
    queue: String,
    message_id: Option<String>,
    all: bool,
    yes: bool,
}

/// Requeues (or discards) one dead letter of `queue`, or all of them once confirmed.
async fn settle_dead_letters(
    url: &str,
    settle: Settle,
    on: &QueueTransport,
    json: bool,
) -> anyhow::Result<()> {
    let Settle {
        requeue,
        queue,
        message_id,
        all,
        yes,
    } = settle;
    let verb = if requeue { "requeue" } else { "discard" };
    let done = if requeue { "requeued" } else { "discarded" };
    let queue = QueueName::parse(queue)?;
    let (transport, inspector) = on.open(url).await?;
    if all && !yes {
        let n = transport.dead_letters(&queue, u32::MAX).await?.len();
        if !confirm(&format!("{verb} all {n} dead letters of {queue}?"))? {
            bail!("nothing {done}");
        }
    }
    let n = if requeue {
        inspector
            .requeue_dead_letters(&queue, message_id.as_deref())
            .await?
    } else {
        inspector
            .discard_dead_letters(&queue, message_id.as_deref())
            .await?
    };
    if n == 0 {
        bail!("no such dead letter on {queue}");
    }
    if json {
        json_line(&serde_json::json!({
            "queue": queue.as_str(),
            "message_id": message_id,
            done: n,
        }))?;
    } else {
        outln!("{done} {n} message(s) on {queue}");
    }
    Ok(())
}

/// Serves the dashboard until SIGTERM or Ctrl-C.
async fn dashboard(
    url: &str,
    listen: std::net::SocketAddr,
    token: Option<String>,
    public_url: Option<reqwest::Url>,
    access: orderly_cli::dashboard::Access,
    on: &QueueTransport,
    json: bool,
) -> anyhow::Result<()> {
    let mut backend = orderly_runtime::backend::connect_store(url)
        .await
        .context("cannot open the state store named by --database-url / ORDERLY_DATABASE_URL")?;
    if on.is_servicebus() {
        // The store's outbox feeds Service Bus; the queues shown are Service Bus's.
        let (transport, inspector) = on.open(url).await?;
        backend.transport = transport;
        backend.inspector = inspector;
    }
    let shutdown = orderly_runtime::shutdown_on_signals();
    let ops = orderly_runtime::ops::endpoints(
        "dashboard",
        backend.clone(),
        orderly_runtime::ops::install_metrics()?,
        Vec::new(),
    );
    let (addr, task) =
        orderly_cli::dashboard::serve(listen, backend, token, public_url, access, ops, shutdown)
            .await?;
    if json {
        json_line(&serde_json::json!({ "dashboard": format!("http://{addr}/") }))?;
    } else {
        outln!("dashboard on http://{addr}/");
    }
    task.await?;
    Ok(())
}

/// The commands on the state store.
async fn on_store(command: Command, url: &str, json: bool) -> anyhow::Result<()> {
    let backend = orderly_runtime::backend::connect_store(url)
        .await
        .context("cannot open the state store named by --database-url / ORDERLY_DATABASE_URL")?;
    match command {
        Command::Migrate { workflow } => migrate(&backend, &workflow, json).await,
        command @ (Command::Submit { .. }
        | Command::Prune { .. }
        | Command::Resubmit { .. }
        | Command::Cancel { .. }
        | Command::Workflows {
            action: Some(_), ..
        }) => change(command, backend.store.as_ref(), json).await,
        command => view(command, backend.store.as_ref(), json).await,
    }
}

/// The operators' changes: submit, prune, retry, cancel, move between versions.
async fn change(command: Command, store: &dyn StateStore, json: bool) -> anyhow::Result<()> {
    match command {
        Command::Submit {
            file,
            sample,
            operator,
        } => triage::submit(store, file, sample, &operator, json).await?,
        Command::Prune {
            older_than,
            dry_run,
            yes,
        } => triage::prune(store, older_than, dry_run, yes, json).await?,
        Command::Resubmit {
            order_id,
            all: _,
            filter,
            yes,
            reason,
            operator,
        } => {
            let why = triage::Why {
                reason: &reason,
                operator: &operator,
            };
            triage::resubmit(store, order_id, filter, yes, &why, json).await?;
        }
        Command::Cancel {
            order_id,
            all: _,
            filter,
            yes,
            reason,
            operator,
            no_compensation,
        } => {
            triage::cancel(
                store,
                order_id,
                &filter,
                yes,
                &triage::Why {
                    reason: &reason,
                    operator: &operator,
                },
                no_compensation,
                json,
            )
            .await?;
        }
        Command::Workflows {
            action:
                Some(WorkflowsAction::Migrate {
                    from,
                    to,
                    states,
                    yes,
                    reason,
                    operator,
                }),
            ..
        } => {
            let version = triage::Versions {
                from: &from,
                to: &to,
                states: &states,
            };
            triage::move_version(store, &version, yes, &reason, &operator, json).await?;
        }
        _ => unreachable!("not a change"),
    }
    Ok(())
}

/// The operators' views of the store, and the acknowledgements and resumes made there.
async fn view(command: Command, store: &dyn StateStore, json: bool) -> anyhow::Result<()> {
    match command {
        Command::List { filter, limit } => {
            let page = store.list(&filter.to_store(limit)).await?;
            let services = store
                .services()
                .await?
                .into_iter()
                .map(|h| (h.service.clone(), h))
                .collect();
            print::orders(&page.orders, &services, json)?;
            if page.next.is_some() && !json {
                outln!("(more orders: raise --limit or filter)");
            }
        }
        Command::Show { order_id } => {
            let view = store.get(&OrderId::parse(order_id)?).await?;
            print::order(&view, json)?;
        }
        Command::Counts => {
            for (state, n) in store.count_by_state().await? {
                if json {
                    json_line(&serde_json::json!({ "state": state, "orders": n }))?;
                } else {
                    outln!("{:<11} {n}", state.as_str());
                }
            }
        }
        Command::Workflows { action: None } => {
            print::workflows(
                &store.workflows_in_flight().await?,
                &store.stored_workflows().await?,
                json,
            )?;
        }
        Command::Alerts {
            ack: Some(id),
            operator,
            ..
        } => {
            let Some(alert) = store
                .acknowledge_alert(id, &Actor::operator(&operator))
                .await?
            else {
                bail!("no alert #{id}");
            };
            print::alerts(std::slice::from_ref(&alert), json)?;
        }
        Command::Alerts {
            all,
            limit,
            system: true,
            ..
        } => print::system_alerts(&store.system_alerts(!all, limit).await?, json)?,
        Command::Alerts { all, limit, .. } => {
            print::alerts(&store.alerts(!all, limit).await?, json)?
        }
        Command::Services {
            resume: Some(service),
            operator,
        } => resume_service(store, &service, &operator, json).await?,
        Command::Services { .. } => print::services(&store.services().await?, json)?,
        Command::Leader => {
            let term = store.term(orderly_core::leader::SUPERVISORS).await?;
            print::leader(term.as_ref(), json)?;
        }
        _ => unreachable!("run without the store, or a change"),
    }
    Ok(())
}

/// Applies the migrations, declares the queues the workflows use and stores their
/// versions.
async fn migrate(
    backend: &orderly_sql::Backend,
    workflow: &[std::path::PathBuf],
    json: bool,
) -> anyhow::Result<()> {
    let workflows = orderly_runtime::load_workflows(workflow)?;
    let wanted: Vec<QueueName> = orderly_runtime::backend::fixed_queues()
        .into_iter()
        .chain(workflows.queues())
        .collect();
    orderly_runtime::backend::ensure_queues(backend.transport.as_ref(), wanted.clone()).await?;
    let added = backend
        .store
        .record_workflows(&workflows.definitions(), "operator:orderly-migrate")
        .await?;
    let names: Vec<&str> = wanted.iter().map(QueueName::as_str).collect();
    let versions: Vec<String> = workflows.references().map(ToString::to_string).collect();
    if json {
        return json_line(&serde_json::json!({
            "migrated": true,
            "queues": names,
            "workflow_versions": versions,
            "new_versions": added,
        }));
    }
    outln!("migrations applied; the store is up to date");
    outln!("queues declared: {}", names.join(", "));
    outln!(
        "workflow versions stored: {} ({added} new); every scheduler runs orders pinned to them",
        versions.join(", ")
    );
    Ok(())
}

/// An operator marks `service` up: its waiting orders resume.
async fn resume_service(
    store: &dyn StateStore,
    service: &str,
    operator: &str,
    json: bool,
) -> anyhow::Result<()> {
    let actor = Actor::operator(operator);
    match store.report_success(service, actor.as_str()).await? {
        Some(back) => {
            if json {
                json_line(&serde_json::json!({
                    "service": service,
                    "marked_up_by": actor.as_str(),
                    "resumed": back.resumed,
                    "health": back.health,
                }))?;
            } else {
                outln!(
                    "{service} marked up by {actor}: {} waiting orders resume at {}/s",
                    back.resumed,
                    back.health.resume_per_second
                );
            }
        }
        None => {
            let waiting = store.resume_waiting(service, actor.as_str()).await?;
            if json {
                json_line(&serde_json::json!({
                    "service": service,
                    "was_up": true,
                    "resumed": waiting,
                }))?;
            } else {
                outln!("{service} was up already; {waiting} orders left waiting resume");
            }
        }
    }
    Ok(())
}
