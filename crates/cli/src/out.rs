//! Standard output that a closed pipe ends quietly.
//!
//! `orderly list --json | head -1` closes the pipe after one line; `println!` would
//! panic on the next write. Like any command-line tool, orderly stops there instead:
//! the reader has what it wanted, so the process exits with success and says nothing.

use std::io::Write;

/// Writes `args` and a newline to standard output (see [`outln!`](crate::outln)).
pub fn line(args: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    let written = out.write_fmt(args).and_then(|()| out.write_all(b"\n"));
    ended(written);
}

/// Writes `args` to standard output without a newline and flushes it (a question).
pub fn partial(args: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    let written = out.write_fmt(args).and_then(|()| out.flush());
    ended(written);
}

/// Writes `value` as one line of JSON (`--json`: one JSON value a line, NDJSON).
pub fn json_line(value: &impl serde::Serialize) -> anyhow::Result<()> {
    let text = serde_json::to_string(value)?;
    line(format_args!("{text}"));
    Ok(())
}

fn ended(written: std::io::Result<()>) {
    match written {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => {
            eprintln!("error: cannot write to standard output: {e}");
            std::process::exit(1);
        }
    }
}

/// `println!` for orderly's output: a reader that closed the pipe ends the process
/// quietly with success instead of a panic; another write error ends it with one line
/// on standard error.
#[macro_export]
macro_rules! outln {
    () => {
        $crate::out::line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::out::line(format_args!($($arg)*))
    };
}

/// `print!` and a flush, for a question awaiting its answer on the same line.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::out::partial(format_args!($($arg)*))
    };
}
