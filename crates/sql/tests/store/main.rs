//! The state store's and the SQL queue's tests: the shared conformance suites once per
//! dialect, and the tests that need SQL access (migrations, append-only history, the
//! database clock).

// Test code: a failed unwrap is a failed test, with its message.
#![allow(clippy::unwrap_used)]

mod atomic;
mod consume;
mod crash;
mod fixtures;
mod inspect;
mod outbox;
mod postgres_only;
mod prune;
mod sql;
mod tally;

mod sqlite_conformance {
    orderly_testkit::store_conformance!(crate::fixtures::sqlite);
}

mod postgres_conformance {
    orderly_testkit::store_conformance!(crate::fixtures::postgres);
}

mod sqlite_elector {
    orderly_testkit::elector_conformance!(crate::fixtures::sqlite_elector);
}

mod postgres_elector {
    orderly_testkit::elector_conformance!(crate::fixtures::postgres_elector);
}

mod sqlite_transport {
    orderly_testkit::transport_conformance!(crate::fixtures::sqlite_transport);
}

mod postgres_transport {
    orderly_testkit::transport_conformance!(crate::fixtures::postgres_transport);
}
