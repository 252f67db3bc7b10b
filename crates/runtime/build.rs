//! The commit the binaries are built from, for `--version`: `ORDERLY_REVISION` when the
//! build sets it (the image's build, which has no `.git`), else the checkout's `HEAD`,
//! else "unknown".

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=ORDERLY_REVISION");
    let given = std::env::var("ORDERLY_REVISION")
        .ok()
        .map(|r| r.trim().to_owned())
        .filter(|r| !r.is_empty() && r != "unknown")
        // A whole commit id, as `git rev-parse HEAD` gives it: its first 12 digits.
        .map(
            |r| match r.len() > 12 && r.chars().all(|c| c.is_ascii_hexdigit()) {
                true => r[..12].to_owned(),
                false => r,
            },
        );
    let revision = given
        .or_else(from_git)
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=ORDERLY_REVISION={revision}");
}

/// `HEAD`'s commit, 12 hex digits, and a rebuild when it moves.
fn from_git() -> Option<String> {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_owned())
    };
    let dir = git(&["rev-parse", "--absolute-git-dir"])?;
    let dir = Path::new(&dir);
    for watched in ["HEAD", "packed-refs"] {
        println!("cargo:rerun-if-changed={}", dir.join(watched).display());
    }
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        println!("cargo:rerun-if-changed={}", dir.join(branch).display());
    }
    git(&["rev-parse", "--short=12", "HEAD"]).filter(|c| c.chars().all(|c| c.is_ascii_hexdigit()))
}
