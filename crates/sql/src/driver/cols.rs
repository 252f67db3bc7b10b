//! Rows read column by column, by name, whichever dialect they came from.

use crate::time::Ts;
use orderly_core::Result;

/// A row, read column by column (by name). Implemented for the rows of every dialect.
pub(crate) trait SqlRow: Send + Sync {
    fn text(&self, col: &str) -> Result<Option<String>, sqlx::Error>;
    fn int64(&self, col: &str) -> Result<Option<i64>, sqlx::Error>;
    fn int32(&self, col: &str) -> Result<Option<i32>, sqlx::Error>;
    fn boolean(&self, col: &str) -> Result<Option<bool>, sqlx::Error>;
    fn bytes(&self, col: &str) -> Result<Option<Vec<u8>>, sqlx::Error>;
    fn ts(&self, col: &str) -> Result<Option<Ts>, sqlx::Error>;
}

impl<R> SqlRow for R
where
    R: sqlx::Row + Send + Sync,
    for<'c> &'c str: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i32: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> bool: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Ts: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    fn text(&self, col: &str) -> Result<Option<String>, sqlx::Error> {
        self.try_get(col)
    }
    fn int64(&self, col: &str) -> Result<Option<i64>, sqlx::Error> {
        self.try_get(col)
    }
    fn int32(&self, col: &str) -> Result<Option<i32>, sqlx::Error> {
        self.try_get(col)
    }
    fn boolean(&self, col: &str) -> Result<Option<bool>, sqlx::Error> {
        self.try_get(col)
    }
    fn bytes(&self, col: &str) -> Result<Option<Vec<u8>>, sqlx::Error> {
        self.try_get(col)
    }
    fn ts(&self, col: &str) -> Result<Option<Ts>, sqlx::Error> {
        self.try_get(col)
    }
}

/// A column type a [`SqlRow`] can be read as.
pub(crate) trait FromCol: Sized {
    fn from_col<R: SqlRow + ?Sized>(row: &R, col: &str) -> Result<Self, sqlx::Error>;
}

fn required<T>(value: Option<T>, col: &str) -> Result<T, sqlx::Error> {
    value.ok_or_else(|| sqlx::Error::ColumnDecode {
        index: col.to_owned(),
        source: "unexpected NULL".into(),
    })
}

/// A column type [`SqlRow`] reads directly.
pub(crate) trait ColType: Sized {
    fn read<R: SqlRow + ?Sized>(row: &R, col: &str) -> Result<Option<Self>, sqlx::Error>;
}

impl<T: ColType> FromCol for Option<T> {
    fn from_col<R: SqlRow + ?Sized>(row: &R, col: &str) -> Result<Self, sqlx::Error> {
        T::read(row, col)
    }
}

impl ColType for String {
    fn read<R: SqlRow + ?Sized>(row: &R, col: &str) -> Result<Option<Self>, sqlx::Error> {
        row.text(col)
    }
}

impl FromCol for String {
    fn from_col<R: SqlRow + ?Sized>(row: &R, col: &str) -> Result<Self, sqlx::Error> {
        required(row.text(col)?, col)
    }
}

impl ColType for i64 {
    fn read<R: SqlRow + ?Sized>(row: &R, col: &str) -> Result<Option<Self>, sqlx::Error> {
        row.int64(col)
    }
}

impl FromCol for i64 {
    fn from_col<R: SqlRow + ?Sized>(row: &R, col: &str) -> Result<Self, sqlx::Error> {
        required(row.int64(col)?, col)
    }
}

impl ColType for i32 {
    fn read<R: SqlRow + ?Sized>(row: &R, col: &str) -> Result<Option<Self>, sqlx::Error> {
        row.int32(col)
    }
}

impl FromCol for i32 {
    fn from_col<R: SqlRow + ?Sized>(row: &R, col: &str) -> Result<Self, sqlx::Error> {
        required(row.int32(col)?, col)
    }
}

impl ColType for bool {
    fn read<R: SqlRow + ?Sized>(row: &R, col: &str) -> Result<Option<Self>, sqlx::Error> {
        row.boolean(col)
    }
}

impl FromCol for bool {
    fn from_col<R: SqlRow + ?Sized>(row: &R, col: &str) -> Result<Self, sqlx::Error> {
        required(row.boolean(col)?, col)
    }
}

impl ColType for Vec<u8> {
    fn read<R: SqlRow + ?Sized>(row: &R, col: &str) -> Result<Option<Self>, sqlx::Error> {
        row.bytes(col)
    }
}

impl FromCol for Vec<u8> {
    fn from_col<R: SqlRow + ?Sized>(row: &R, col: &str) -> Result<Self, sqlx::Error> {
        required(row.bytes(col)?, col)
    }
}

impl ColType for Ts {
    fn read<R: SqlRow + ?Sized>(row: &R, col: &str) -> Result<Option<Self>, sqlx::Error> {
        row.ts(col)
    }
}

impl FromCol for Ts {
    fn from_col<R: SqlRow + ?Sized>(row: &R, col: &str) -> Result<Self, sqlx::Error> {
        required(row.ts(col)?, col)
    }
}
