//! Statements and their parameters, bound the same way on every dialect (lists as
//! each dialect binds lists).

use super::Driver;
use crate::time::Ts;
use orderly_core::Result;
use std::borrow::Cow;

/// A value bound to a statement parameter.
#[derive(Debug, Clone)]
pub(crate) enum Param<'a> {
    Text(Cow<'a, str>),
    OptText(Option<Cow<'a, str>>),
    I64(i64),
    OptI64(Option<i64>),
    I32(i32),
    OptI32(Option<i32>),
    Bool(bool),
    Ts(Ts),
    OptTs(Option<Ts>),
    Bytes(&'a [u8]),
    /// Bytes the statement takes over (a batch built for it), bound without a copy.
    OwnedBytes(Vec<u8>),
    /// A list: bound as the dialect binds lists (see [`prepare`]).
    List(List),
}

/// A list parameter: an array on PostgreSQL, a JSON array on SQLite (read there with
/// `json_each`).
#[derive(Debug, Clone)]
pub(crate) enum List {
    I64s(Vec<i64>),
    Texts(Vec<String>),
}

/// A statement ready to run on a dialect.
pub(crate) type Query<DB> = sqlx::query::Query<'static, DB, <DB as sqlx::Database>::Arguments>;

/// `q` as a statement of `DB`: scalars bound the same way in every dialect (borrowed
/// text and bytes are encoded straight from the borrow), lists by `bind_list`.
pub(crate) fn prepare<DB>(q: Q<'_>, bind_list: fn(Query<DB>, List) -> Query<DB>) -> Query<DB>
where
    DB: sqlx::Database,
    for<'e> &'e str: sqlx::Encode<'e, DB> + sqlx::Type<DB>,
    for<'e> Option<&'e str>: sqlx::Encode<'e, DB> + sqlx::Type<DB>,
    for<'e> &'e [u8]: sqlx::Encode<'e, DB> + sqlx::Type<DB>,
    for<'e> Vec<u8>: sqlx::Encode<'e, DB> + sqlx::Type<DB>,
    for<'e> i64: sqlx::Encode<'e, DB> + sqlx::Type<DB>,
    for<'e> Option<i64>: sqlx::Encode<'e, DB> + sqlx::Type<DB>,
    for<'e> i32: sqlx::Encode<'e, DB> + sqlx::Type<DB>,
    for<'e> Option<i32>: sqlx::Encode<'e, DB> + sqlx::Type<DB>,
    for<'e> bool: sqlx::Encode<'e, DB> + sqlx::Type<DB>,
    for<'e> Ts: sqlx::Encode<'e, DB> + sqlx::Type<DB>,
    for<'e> Option<Ts>: sqlx::Encode<'e, DB> + sqlx::Type<DB>,
{
    let query = match q.sql {
        Cow::Borrowed(sql) => sqlx::query(sql),
        Cow::Owned(sql) => sqlx::query(sqlx::AssertSqlSafe(sql)),
    };
    q.params
        .into_iter()
        .fold(query, |query, param| match param {
            Param::Text(v) => query.bind(&*v),
            Param::OptText(v) => query.bind(v.as_deref()),
            Param::I64(v) => query.bind(v),
            Param::OptI64(v) => query.bind(v),
            Param::I32(v) => query.bind(v),
            Param::OptI32(v) => query.bind(v),
            Param::Bool(v) => query.bind(v),
            Param::Ts(v) => query.bind(v),
            Param::OptTs(v) => query.bind(v),
            Param::Bytes(v) => query.bind(v),
            Param::OwnedBytes(v) => query.bind(v),
            Param::List(list) => bind_list(query, list),
        })
}

impl<'a> From<&'a str> for Param<'a> {
    fn from(v: &'a str) -> Self {
        Param::Text(Cow::Borrowed(v))
    }
}
impl<'a> From<&'a String> for Param<'a> {
    fn from(v: &'a String) -> Self {
        Param::Text(Cow::Borrowed(v))
    }
}
impl From<String> for Param<'_> {
    fn from(v: String) -> Self {
        Param::Text(Cow::Owned(v))
    }
}
impl<'a> From<Option<&'a str>> for Param<'a> {
    fn from(v: Option<&'a str>) -> Self {
        Param::OptText(v.map(Cow::Borrowed))
    }
}
impl From<Option<String>> for Param<'_> {
    fn from(v: Option<String>) -> Self {
        Param::OptText(v.map(Cow::Owned))
    }
}
impl From<i64> for Param<'_> {
    fn from(v: i64) -> Self {
        Param::I64(v)
    }
}
impl From<Option<i64>> for Param<'_> {
    fn from(v: Option<i64>) -> Self {
        Param::OptI64(v)
    }
}
impl From<i32> for Param<'_> {
    fn from(v: i32) -> Self {
        Param::I32(v)
    }
}
impl From<Option<i32>> for Param<'_> {
    fn from(v: Option<i32>) -> Self {
        Param::OptI32(v)
    }
}
impl From<bool> for Param<'_> {
    fn from(v: bool) -> Self {
        Param::Bool(v)
    }
}
impl From<Ts> for Param<'_> {
    fn from(v: Ts) -> Self {
        Param::Ts(v)
    }
}
impl From<Option<Ts>> for Param<'_> {
    fn from(v: Option<Ts>) -> Self {
        Param::OptTs(v)
    }
}
impl<'a> From<&'a [u8]> for Param<'a> {
    fn from(v: &'a [u8]) -> Self {
        Param::Bytes(v)
    }
}
impl<'a> From<&'a Vec<u8>> for Param<'a> {
    fn from(v: &'a Vec<u8>) -> Self {
        Param::Bytes(v)
    }
}
impl From<Vec<u8>> for Param<'_> {
    fn from(v: Vec<u8>) -> Self {
        Param::OwnedBytes(v)
    }
}
impl From<Vec<i64>> for Param<'_> {
    fn from(v: Vec<i64>) -> Self {
        Param::List(List::I64s(v))
    }
}
impl From<Vec<String>> for Param<'_> {
    fn from(v: Vec<String>) -> Self {
        Param::List(List::Texts(v))
    }
}

/// A statement and its parameters, `$1` first.
#[derive(Debug, Clone)]
pub(crate) struct Q<'a> {
    pub sql: Cow<'static, str>,
    pub params: Vec<Param<'a>>,
}

/// A statement to bind parameters to.
pub(crate) fn q<'a>(sql: &'static str) -> Q<'a> {
    Q {
        sql: Cow::Borrowed(sql),
        params: Vec::new(),
    }
}

impl<'a> Q<'a> {
    /// A statement built at run time (its values still bound as parameters).
    pub fn dynamic(sql: String) -> Self {
        Q {
            sql: Cow::Owned(sql),
            params: Vec::new(),
        }
    }

    /// Binds the next parameter.
    pub fn bind(mut self, value: impl Into<Param<'a>>) -> Self {
        self.params.push(value.into());
        self
    }

    /// Runs it; the number of rows it changed.
    pub async fn execute<D: Driver>(self, conn: &mut D::Conn) -> Result<u64, sqlx::Error> {
        D::execute(conn, self).await
    }

    /// Runs it; every row it returned.
    pub async fn fetch_all<D: Driver>(
        self,
        conn: &mut D::Conn,
    ) -> Result<Vec<D::Row>, sqlx::Error> {
        D::fetch_all(conn, self).await
    }

    /// Runs it; its first row, if any.
    pub async fn fetch_optional<D: Driver>(
        self,
        conn: &mut D::Conn,
    ) -> Result<Option<D::Row>, sqlx::Error> {
        D::fetch_optional(conn, self).await
    }

    /// Runs it; its one row.
    pub async fn fetch_one<D: Driver>(self, conn: &mut D::Conn) -> Result<D::Row, sqlx::Error> {
        D::fetch_optional(conn, self)
            .await?
            .ok_or(sqlx::Error::RowNotFound)
    }
}
