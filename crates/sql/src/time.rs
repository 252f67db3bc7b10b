//! `Ts`: a UTC timestamp as each dialect stores it. PostgreSQL keeps `timestamptz`;
//! SQLite keeps text in one fixed format with microseconds, so that comparing the
//! text compares the times and indexes on it work.

use chrono::{DateTime, NaiveDateTime, Utc};
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArgumentBuffer, PgTypeInfo, PgValueRef};
use sqlx::sqlite::{SqliteArgumentsBuffer, SqliteTypeInfo, SqliteValueRef};
use sqlx::{Decode, Encode, Postgres, Sqlite, Type};

const TEXT_FORMAT: &str = "%Y-%m-%dT%H:%M:%S%.6fZ";

/// A timestamp column or parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Ts(pub DateTime<Utc>);

impl Ts {
    /// The SQLite text form.
    pub fn to_text(self) -> String {
        self.0.format(TEXT_FORMAT).to_string()
    }

    fn from_text(s: &str) -> Result<Self, BoxDynError> {
        let naive = NaiveDateTime::parse_from_str(s, TEXT_FORMAT).map_err(|e| {
            format!("timestamp {s:?} is not in the form 2026-01-31T12:00:00.000000Z: {e}")
        })?;
        Ok(Ts(naive.and_utc()))
    }
}

impl Type<Sqlite> for Ts {
    fn type_info() -> SqliteTypeInfo {
        <String as Type<Sqlite>>::type_info()
    }
    fn compatible(ty: &SqliteTypeInfo) -> bool {
        <String as Type<Sqlite>>::compatible(ty)
    }
}

impl Encode<'_, Sqlite> for Ts {
    fn encode_by_ref(&self, buf: &mut SqliteArgumentsBuffer) -> Result<IsNull, BoxDynError> {
        <String as Encode<Sqlite>>::encode(self.to_text(), buf)
    }
}

impl<'r> Decode<'r, Sqlite> for Ts {
    fn decode(value: SqliteValueRef<'r>) -> Result<Self, BoxDynError> {
        Ts::from_text(<&str as Decode<Sqlite>>::decode(value)?)
    }
}

impl Type<Postgres> for Ts {
    fn type_info() -> PgTypeInfo {
        <DateTime<Utc> as Type<Postgres>>::type_info()
    }
    fn compatible(ty: &PgTypeInfo) -> bool {
        <DateTime<Utc> as Type<Postgres>>::compatible(ty)
    }
}

impl Encode<'_, Postgres> for Ts {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        <DateTime<Utc> as Encode<Postgres>>::encode_by_ref(&self.0, buf)
    }
}

impl<'r> Decode<'r, Postgres> for Ts {
    fn decode(value: PgValueRef<'r>) -> Result<Self, BoxDynError> {
        Ok(Ts(<DateTime<Utc> as Decode<Postgres>>::decode(value)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_form_orders_like_time_and_round_trips() {
        let a = Ts(DateTime::parse_from_rfc3339("2026-01-02T03:04:05.000001Z")
            .unwrap()
            .to_utc());
        let b = Ts(DateTime::parse_from_rfc3339("2026-01-02T03:04:05.1Z")
            .unwrap()
            .to_utc());
        let c = Ts(DateTime::parse_from_rfc3339("2026-01-02T03:04:06Z")
            .unwrap()
            .to_utc());
        assert!(a.to_text() < b.to_text() && b.to_text() < c.to_text());
        assert_eq!(a.to_text(), "2026-01-02T03:04:05.000001Z");
        for t in [a, b, c] {
            assert_eq!(Ts::from_text(&t.to_text()).unwrap(), t);
        }
    }
}
