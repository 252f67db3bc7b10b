//! The state store's tests: the shared conformance suite once per dialect, and the
//! tests that need SQL access (migrations, append-only history, the database clock).

mod fixtures;
mod postgres_only;
mod sql;

mod sqlite_conformance {
    orderly_testkit::store_conformance!(crate::fixtures::sqlite);
}

mod postgres_conformance {
    orderly_testkit::store_conformance!(crate::fixtures::postgres);
}
