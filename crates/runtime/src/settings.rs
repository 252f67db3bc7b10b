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
    let args: Vec<OsString> = std::env::args_os().collect();
    let mut cmd = T::command().arg(
        clap::Arg::new("config")
            .long("config")
            .env("ORDERLY_CONFIG")
            .value_name("FILE")
            .help("Settings file (TOML): shared keys at the top, a table per role; env and flags win over it"),
    );
    if let Some(file) = config_path(&args) {
        let known: Vec<String> = cmd
            .get_arguments()
            .filter_map(|a| a.get_long().map(str::to_string))
            .collect();
        for (flag, value) in file_settings(&file, role, &known)? {
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
    let matches = cmd
        .try_get_matches_from(args)
        .unwrap_or_else(|e| refused(&format!("orderly-{role}"), e));
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
