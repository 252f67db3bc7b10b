//! Settings in layers: the binary's defaults, then a TOML file (`--config FILE` or
//! `ORDERLY_CONFIG`), then `ORDERLY_*` environment variables, then flags; each later
//! layer wins. The file's top-level keys are the settings every role shares
//! (`database_url`, `log_json`, `http_listen`, `instance_id`); a table per role
//! (`[scheduler]`, `[agent]`, `[supervisor]`, `[submitter]`, `[remote-sim]`) holds its
//! own. Keys are the long flag names, `_` or `-` alike. An unknown key, or a value the
//! setting refuses, stops start-up naming it. Values from the file never appear in
//! `--help`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// The value name of every setting that takes a span of time
/// (`#[arg(value_name = DURATION, value_parser = crate::duration)]`): their old names
/// are still read, with a warning ([`legacy_args`], and the environment in [`parse`]).
pub const DURATION: &str = "DURATION";

/// The old forms of a duration setting: a flag suffix, a variable suffix, and the unit
/// of the bare number they held (`--claim-poll-ms 250`, `ORDERLY_CLAIM_POLL_MS=250`).
const OLD_FORMS: &[(&str, &str, &str)] = &[("-ms", "_MS", "ms"), ("-secs", "_SECS", "s")];

/// The duration settings of `cmd` and of its subcommands: long flag, variable, id.
fn durations(cmd: &clap::Command) -> Vec<(String, Option<String>, clap::Id)> {
    let mut out: Vec<(String, Option<String>, clap::Id)> = cmd
        .get_arguments()
        .filter(|a| {
            a.get_value_names()
                .is_some_and(|names| names.iter().any(|n| n.as_str() == DURATION))
        })
        .filter_map(|a| {
            let env = a.get_env().map(|e| e.to_string_lossy().into_owned());
            Some((a.get_long()?.to_owned(), env, a.get_id().clone()))
        })
        .collect();
    for sub in cmd.get_subcommands() {
        out.extend(durations(sub));
    }
    out
}

/// `args` with the old flags of `cmd`'s duration settings in their new form
/// (`--claim-poll-ms 250` becomes `--claim-poll 250ms`), and a warning for each.
pub fn legacy_args(cmd: &clap::Command, args: Vec<OsString>) -> (Vec<OsString>, Vec<String>) {
    let settings = durations(cmd);
    let old = |flag: &str| {
        settings.iter().find_map(|(long, _, _)| {
            OLD_FORMS.iter().find_map(|(suffix, _, unit)| {
                (flag == format!("--{long}{suffix}")).then(|| (long.clone(), *unit))
            })
        })
    };
    let mut out = Vec::with_capacity(args.len());
    let mut warnings = Vec::new();
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        let Some(text) = arg.to_str().map(str::to_owned) else {
            out.push(arg);
            continue;
        };
        if text == "--" {
            out.push(arg);
            out.extend(it.by_ref());
            break;
        }
        let (flag, inline) = match text.split_once('=') {
            Some((f, v)) => (f.to_owned(), Some(v.to_owned())),
            None => (text.clone(), None),
        };
        let Some((long, unit)) = old(&flag) else {
            out.push(arg);
            continue;
        };
        let value = match inline {
            Some(v) => Some(v),
            None => it.next().map(|v| v.to_string_lossy().into_owned()),
        };
        warnings.push(format!(
            "{flag} is the old form of --{long} (a duration, e.g. 30s); it is read for now"
        ));
        out.push(OsString::from(format!("--{long}")));
        if let Some(v) = value {
            out.push(OsString::from(orderly_core::duration::legacy(&v, unit)));
        }
    }
    (out, warnings)
}

/// The old variables of `cmd`'s duration settings that are set while the new one is
/// not: the setting, its value in the new form, and a warning.
fn legacy_env(cmd: &clap::Command) -> Vec<(clap::Id, String, String)> {
    let mut out = Vec::new();
    for (_, env, id) in durations(cmd) {
        let Some(env) = env else { continue };
        if std::env::var_os(&env).is_some() {
            continue;
        }
        for (_, suffix, unit) in OLD_FORMS {
            let old = format!("{env}{suffix}");
            if let Ok(raw) = std::env::var(&old) {
                out.push((
                    id.clone(),
                    orderly_core::duration::legacy(&raw, unit),
                    format!(
                        "{old} is the old name of {env} (a duration, e.g. 30s); it is read for now"
                    ),
                ));
                break;
            }
        }
    }
    out
}

/// Parses `T`, a command line with no config file (`orderly`, `orderly-local`), after
/// [`legacy_args`] put the old forms of its duration flags in their new form (each
/// with a warning); a refused command line ends the process as [`refused`] does.
pub fn parse_command_line<T: clap::Parser>(binary: &str) -> T {
    let (args, warnings) = legacy_args(&T::command(), std::env::args_os().collect());
    for w in &warnings {
        warn(binary, w);
    }
    let cmd = T::command();
    T::try_parse_from(args.clone()).unwrap_or_else(|e| refused(binary, from_where(&cmd, &args, e)))
}

/// `e` with the environment variable named when the refused value came from it rather
/// than from the command line (clap names only the flag, which the user never typed).
fn from_where(cmd: &clap::Command, args: &[OsString], mut e: clap::Error) -> clap::Error {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if !matches!(
        e.kind(),
        ErrorKind::InvalidValue | ErrorKind::ValueValidation
    ) {
        return e;
    }
    let Some(ContextValue::String(shown)) = e.get(ContextKind::InvalidArg) else {
        return e;
    };
    let Some(long) = shown
        .strip_prefix("--")
        .and_then(|rest| rest.split([' ', '=']).next())
        .map(str::to_owned)
    else {
        return e;
    };
    let typed = args.iter().any(|a| {
        let a = a.to_string_lossy();
        a == format!("--{long}") || a.starts_with(&format!("--{long}="))
    });
    let env = cmd
        .get_arguments()
        .find(|a| a.get_long() == Some(long.as_str()))
        .and_then(clap::Arg::get_env)
        .map(|v| v.to_string_lossy().into_owned());
    if let Some(env) = env.filter(|v| !typed && std::env::var_os(v).is_some()) {
        e.insert(
            ContextKind::Suggested,
            ContextValue::StyledStrs(vec![
                format!("the value comes from the environment variable {env}").into(),
            ]),
        );
    }
    e
}

/// Prints a start-up warning of `binary` (before its logs are set up): a JSON line like
/// its logs when `ORDERLY_LOG_JSON` is on, else plain text.
pub fn warn(binary: &str, message: &str) {
    if crate::log_json_from_env() {
        let line = serde_json::json!({
            "timestamp": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            "level": "WARN",
            "fields": { "message": message },
            "target": binary,
        });
        eprintln!("{line}");
    } else {
        eprintln!("warning: {message}");
    }
}

/// The roles whose tables a file may hold.
pub const ROLES: &[&str] = &[
    "scheduler",
    "agent",
    "supervisor",
    "submitter",
    "remote-sim",
];

/// The settings shared by every role (top-level keys of the file).
pub const COMMON: &[&str] = &["database-url", "instance-id", "log-json", "http-listen"];

/// The config file named by `--config` in `args`, or by `ORDERLY_CONFIG`.
fn config_path(args: &[OsString]) -> Option<PathBuf> {
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        let a = a.to_string_lossy();
        if a == "--config" {
            return it.next().map(PathBuf::from);
        }
        if let Some(p) = a.strip_prefix("--config=") {
            return Some(PathBuf::from(p));
        }
    }
    std::env::var_os("ORDERLY_CONFIG").map(PathBuf::from)
}

fn scalar(key: &str, v: &toml::Value) -> anyhow::Result<String> {
    Ok(match v {
        toml::Value::String(s) => s.clone(),
        toml::Value::Integer(i) => i.to_string(),
        toml::Value::Float(f) => f.to_string(),
        toml::Value::Boolean(b) => b.to_string(),
        toml::Value::Array(items) => items
            .iter()
            .map(|i| scalar(key, i))
            .collect::<anyhow::Result<Vec<_>>>()?
            .join(","),
        _ => bail!("setting `{key}` must be a string, number, boolean or list"),
    })
}

/// The `(flag, value)` pairs `file` sets for `role`, checked against `known` flags.
pub fn file_settings(
    file: &Path,
    role: &str,
    known: &[String],
) -> anyhow::Result<Vec<(String, String)>> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read the config file {}", file.display()))?;
    let table: toml::Table =
        toml::from_str(&text).with_context(|| format!("invalid config file {}", file.display()))?;
    let mut out = Vec::new();
    for (key, value) in &table {
        let flag = key.replace('_', "-");
        if let toml::Value::Table(section) = value {
            if !ROLES.contains(&flag.as_str()) {
                bail!(
                    "invalid config file {}: unknown table [{key}] (roles: {})",
                    file.display(),
                    ROLES.join(", ")
                );
            }
            if flag != role {
                continue;
            }
            for (k, v) in section {
                let f = k.replace('_', "-");
                if !known.contains(&f) || f == "config" {
                    bail!(
                        "invalid config file {}: unknown setting `{k}` in [{key}]",
                        file.display()
                    );
                }
                out.push((f, scalar(k, v)?));
            }
        } else {
            if !COMMON.contains(&flag.as_str()) {
                bail!(
                    "invalid config file {}: unknown top-level setting `{key}` (shared settings: {}; role settings go in a [role] table)",
                    file.display(),
                    COMMON.join(", ")
                );
            }
            out.push((flag, scalar(key, value)?));
        }
    }
    Ok(out)
}

/// Ends the process on a command line clap refused (or on `--help` / `--version`): a
/// refused setting comes as a JSON line like every other start-up error when
/// `ORDERLY_LOG_JSON` is on, else as clap shows it.
pub fn refused(binary: &str, e: clap::Error) -> ! {
    use clap::error::ErrorKind;
    let shown = matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion);
    if shown || !crate::log_json_from_env() {
        e.exit()
    }
    let _ = crate::exit(
        binary,
        Err(anyhow::anyhow!(
            "{}",
            e.render()
                .to_string()
                .trim_start_matches("error: ")
                .trim_end()
        )),
    );
    std::process::exit(2)
}

/// Parses `T` (a binary's flags, with `#[arg(long, env = ...)]`) for `role` from the
/// layers. Exits with clap's message on bad flags, as `Parser::parse` does.
pub fn parse<T: clap::Parser>(role: &str) -> anyhow::Result<T> {
    let binary = format!("orderly-{role}");
    let (args, warnings) = legacy_args(&T::command(), std::env::args_os().collect());
    for w in &warnings {
        warn(&binary, w);
    }
    let mut cmd = T::command().arg(
        clap::Arg::new("config")
            .long("config")
            .env("ORDERLY_CONFIG")
            .value_name("FILE")
            .help("Settings file (TOML): shared keys at the top, a table per role; env and flags win over it"),
    );
    if let Some(file) = config_path(&args) {
        let mut known: Vec<String> = cmd
            .get_arguments()
            .filter_map(|a| a.get_long().map(str::to_string))
            .collect();
        let settings = durations(&cmd);
        let old_keys: Vec<(String, String, &str)> = settings
            .iter()
            .flat_map(|(long, _, _)| {
                OLD_FORMS
                    .iter()
                    .map(move |(suffix, _, unit)| (format!("{long}{suffix}"), long.clone(), *unit))
            })
            .collect();
        known.extend(old_keys.iter().map(|(old, _, _)| old.clone()));
        for (flag, value) in file_settings(&file, role, &known)? {
            let (flag, value) = match old_keys.iter().find(|(old, _, _)| *old == flag) {
                Some((old, long, unit)) => {
                    warn(
                        &binary,
                        &format!(
                            "{old} in {} is the old form of {long} (a duration, e.g. \"30s\"); it is read for now",
                            file.display()
                        ),
                    );
                    (long.clone(), orderly_core::duration::legacy(&value, unit))
                }
                None => (flag, value),
            };
            let id = cmd
                .get_arguments()
                .find(|a| a.get_long() == Some(flag.as_str()))
                .map(|a| a.get_id().clone())
                .with_context(|| format!("unknown setting `{flag}`"))?;
            cmd = cmd.mut_arg(id, |a| {
                let takes_value = a.get_num_args().is_none_or(|n| n.takes_values());
                let a = a.default_value(value);
                if takes_value && !matches!(a.get_action(), clap::ArgAction::SetTrue) {
                    a.hide_default_value(true)
                } else {
                    a
                }
            });
        }
    }
    // The old variables come after the file (the environment wins over it) and before
    // the new variables and the flags, which clap reads over any default.
    for (id, value, warning) in legacy_env(&cmd) {
        warn(&binary, &warning);
        cmd = cmd.mut_arg(id, |a| a.default_value(value).hide_default_value(true));
    }
    let matches = cmd
        .clone()
        .try_get_matches_from(args.clone())
        .unwrap_or_else(|e| refused(&binary, from_where(&cmd, &args, e)));
    T::from_arg_matches(&matches).map_err(|e| anyhow::anyhow!("{e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> PathBuf {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p =
            std::env::temp_dir().join(format!("orderly-settings-{}-{n}.toml", std::process::id()));
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn a_file_sets_shared_and_role_settings_and_refuses_unknown_keys_by_name() {
        let known: Vec<String> = ["database-url", "log-json", "max-in-flight", "workflow"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let f = file(
            "database_url = \"sqlite://x.db\"\nlog_json = true\n[scheduler]\nmax_in_flight = 50\n[agent]\nqueues = [\"a\", \"b\"]\n",
        );
        let got = file_settings(&f, "scheduler", &known).unwrap();
        assert_eq!(
            got,
            vec![
                ("database-url".to_string(), "sqlite://x.db".to_string()),
                ("log-json".to_string(), "true".to_string()),
                ("max-in-flight".to_string(), "50".to_string()),
            ]
        );
        for (text, expected) in [
            (
                "[scheduler]\nmax_in_flite = 50\n",
                "unknown setting `max_in_flite` in [scheduler]",
            ),
            (
                "max_in_flight = 50\n",
                "unknown top-level setting `max_in_flight`",
            ),
            ("[shceduler]\nx = 1\n", "unknown table [shceduler]"),
        ] {
            let e = file_settings(&file(text), "scheduler", &known)
                .unwrap_err()
                .to_string();
            assert!(e.contains(expected), "{e}");
        }
    }
}
