//! How driver errors become store errors.

use orderly_core::Error;

/// Maps a driver error: undecodable data is `Corrupt`, everything else (I/O, pool
/// timeouts, busy databases, server errors) is `Unavailable` and may be retried.
pub(crate) fn db(e: sqlx::Error) -> Error {
    match e {
        sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::ColumnNotFound(_) => Error::Corrupt(e.to_string()),
        other => Error::Unavailable(Box::new(other)),
    }
}

/// A stored value the domain refuses (an unknown state name, an invalid id).
pub(crate) fn corrupt(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Corrupt(format!("{what}: {e}"))
}
