//! `orderly config check`: a settings file checked as each worker role reads it.

use anyhow::{Context, bail};
use clap::Subcommand;
use orderly_cli::out::json_line;
use orderly_cli::{out, outln};

/// What `orderly config` does.
#[derive(Subcommand)]
pub(crate) enum ConfigCommand {
    /// Check a settings file (TOML) as each worker role would read it, with this
    /// environment: unknown keys and invalid values are named; exits non-zero if any.
    Check {
        /// The file.
        file: std::path::PathBuf,
    },
}

/// Runs each worker role's binary (beside this one) with `--config FILE
/// --check-config`: the same layering and checks it does at start-up, nothing started.
/// With `json`, one line per role: `role`, `valid`, `said` (its check's report or the
/// first error), `warnings` (old forms of settings still read).
pub(crate) fn check_config(file: &std::path::Path, json: bool) -> anyhow::Result<()> {
    let dir = std::env::current_exe()
        .context("cannot find this executable")?
        .parent()
        .map(std::path::Path::to_path_buf)
        .context("cannot find this executable's directory")?;
    let mut failed = Vec::new();
    for role in ["submitter", "scheduler", "agent", "supervisor"] {
        let bin = dir.join(format!("orderly-{role}"));
        let out = std::process::Command::new(&bin)
            .arg("--config")
            .arg(file)
            .arg("--check-config")
            .env_remove("ORDERLY_CONFIG")
            .output()
            .with_context(|| format!("cannot run {}", bin.display()))?;
        let err = String::from_utf8_lossy(&out.stderr);
        // Old forms of settings, still read: shown whether or not the rest is valid.
        let warnings: Vec<&str> = err.lines().filter(|l| l.starts_with("warning: ")).collect();
        let said = if out.status.success() {
            String::from_utf8_lossy(&out.stdout).into_owned()
        } else {
            failed.push(role);
            let first = err
                .lines()
                .find(|l| {
                    !l.trim().is_empty() && !l.contains(" INFO ") && !l.starts_with("warning: ")
                })
                .unwrap_or("failed");
            first
                .trim_start_matches("Error: ")
                .trim_start_matches("error: ")
                .to_owned()
        };
        let valid = out.status.success();
        if json {
            json_line(&serde_json::json!({
                "role": format!("orderly-{role}"),
                "valid": valid,
                "said": said.trim_end(),
                "warnings": warnings,
            }))?;
            continue;
        }
        for warning in warnings {
            outln!("orderly-{role}: {warning}");
        }
        if valid {
            out!("{said}");
        } else {
            outln!("orderly-{role}: {said}");
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        bail!("invalid settings for: {}", failed.join(", "))
    }
}
