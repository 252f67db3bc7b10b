//! `Ts`: a UTC timestamp as each dialect stores it. PostgreSQL keeps `timestamptz`;
//! SQLite keeps text in one fixed format with microseconds, so that comparing the
//! text compares the times and indexes on it work.
//!
//! Every SQLite statement binds and most return such texts, so the form is written and
//! read by hand at fixed positions: chrono's `format` and `parse_from_str` interpret
//! their format string anew on every call. chrono still reads any text the fast path
//! does not take (and says what is wrong with it).

use chrono::{DateTime, Datelike, NaiveDate, NaiveDateTime, NaiveTime, Timelike, Utc};
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArgumentBuffer, PgTypeInfo, PgValueRef};
use sqlx::sqlite::{SqliteArgumentsBuffer, SqliteTypeInfo, SqliteValueRef};
use sqlx::{Decode, Encode, Postgres, Sqlite, Type};

const TEXT_FORMAT: &str = "%Y-%m-%dT%H:%M:%S%.6fZ";
/// The same form at its fixed positions: a `0` where a digit goes.
const TEXT_TEMPLATE: &[u8; 27] = b"0000-00-00T00:00:00.000000Z";

/// A timestamp column or parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Ts(pub DateTime<Utc>);

impl Ts {
    /// The SQLite text form.
    pub fn to_text(self) -> String {
        let year = self.0.year();
        if !(0..=9999).contains(&year) {
            // Outside four digits chrono writes a sign; rare enough to let it.
            return self.0.format(TEXT_FORMAT).to_string();
        }
        // As chrono's `%S%.6f`: a leap second is second 60 with the fraction beyond it.
        let nanos = self.0.nanosecond();
        let second = self.0.second() + nanos / 1_000_000_000;
        let micros = nanos % 1_000_000_000 / 1_000;
        let mut out = *TEXT_TEMPLATE;
        put_digits(&mut out[0..4], year.unsigned_abs());
        put_digits(&mut out[5..7], self.0.month());
        put_digits(&mut out[8..10], self.0.day());
        put_digits(&mut out[11..13], self.0.hour());
        put_digits(&mut out[14..16], self.0.minute());
        put_digits(&mut out[17..19], second);
        put_digits(&mut out[20..26], micros);
        // Only ASCII digits were written over an ASCII template.
        String::from_utf8(out.to_vec()).expect("the text form is ASCII")
    }

    fn from_text(s: &str) -> Result<Self, BoxDynError> {
        if let Some(ts) = Self::from_fixed_text(s.as_bytes()) {
            return Ok(ts);
        }
        let naive = NaiveDateTime::parse_from_str(s, TEXT_FORMAT).map_err(|e| {
            format!("timestamp {s:?} is not in the form 2026-01-31T12:00:00.000000Z: {e}")
        })?;
        Ok(Ts(naive.and_utc()))
    }

    /// The text form read at its fixed positions; `None` for anything else (second 60,
    /// a leap second, included: chrono's constructor refuses it), which chrono then
    /// reads.
    fn from_fixed_text(s: &[u8]) -> Option<Self> {
        if s.len() != TEXT_TEMPLATE.len() {
            return None;
        }
        for (&c, &f) in s.iter().zip(TEXT_TEMPLATE) {
            if (f == b'0' && !c.is_ascii_digit()) || (f != b'0' && c != f) {
                return None;
            }
        }
        let year = i32::try_from(digits(&s[0..4])).ok()?;
        let date = NaiveDate::from_ymd_opt(year, digits(&s[5..7]), digits(&s[8..10]))?;
        let time = NaiveTime::from_hms_micro_opt(
            digits(&s[11..13]),
            digits(&s[14..16]),
            digits(&s[17..19]),
            digits(&s[20..26]),
        )?;
        Some(Ts(NaiveDateTime::new(date, time).and_utc()))
    }
}

/// Writes `value` into `out` as decimal digits, zero-padded to its length.
fn put_digits(out: &mut [u8], mut value: u32) {
    for d in out.iter_mut().rev() {
        *d = b'0' + (value % 10) as u8;
        value /= 10;
    }
}

/// The number ASCII digits spell (checked to be digits by the caller).
fn digits(s: &[u8]) -> u32 {
    s.iter().fold(0, |n, &d| n * 10 + u32::from(d - b'0'))
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

    /// The hand-written form is chrono's, written and read, over times spread across
    /// the years with every kind of digit in every field, and the edges.
    #[test]
    fn text_form_is_chronos_own() {
        let mut times = vec![
            DateTime::<Utc>::MIN_UTC,
            DateTime::<Utc>::MAX_UTC,
            DateTime::<Utc>::UNIX_EPOCH,
            DateTime::parse_from_rfc3339("0000-01-01T00:00:00Z")
                .unwrap()
                .to_utc(),
            DateTime::parse_from_rfc3339("9999-12-31T23:59:59.999999Z")
                .unwrap()
                .to_utc(),
            DateTime::parse_from_rfc3339("2024-02-29T12:00:00.5Z")
                .unwrap()
                .to_utc(),
            // A leap second: chrono writes second 60.
            NaiveDate::from_ymd_opt(2016, 12, 31)
                .unwrap()
                .and_hms_micro_opt(23, 59, 59, 1_500_000)
                .unwrap()
                .and_utc(),
        ];
        // About 3,600 times from the year 1 to about 9000, a step that is no multiple of
        // any field's period.
        let mut secs = -62_135_596_800_i64;
        while secs < 221_845_392_000 {
            let micros = u32::try_from(secs.rem_euclid(1_000_000)).unwrap();
            times.push(DateTime::from_timestamp(secs, micros * 1_000).unwrap());
            secs += 77_777_777 + 13;
        }
        for t in times {
            let chrono = t.format(TEXT_FORMAT).to_string();
            assert_eq!(Ts(t).to_text(), chrono, "{t:?}");
            let read = NaiveDateTime::parse_from_str(&chrono, TEXT_FORMAT)
                .unwrap()
                .and_utc();
            assert_eq!(Ts::from_text(&chrono).unwrap(), Ts(read), "{chrono}");
        }
    }

    #[test]
    fn text_that_is_not_the_form_is_refused_by_name() {
        for bad in [
            "",
            "2026-01-02 03:04:05.000001Z",
            "2026-13-02T03:04:05.000001Z",
            "2026-02-30T03:04:05.000001Z",
            "2026-01-02T24:04:05.000001Z",
            "2026-01-02T03:04:05.00000aZ",
            "2026-01-02T03:04:05.000001",
        ] {
            let e = Ts::from_text(bad).unwrap_err().to_string();
            assert!(e.contains("is not in the form"), "{bad:?}: {e}");
        }
    }
}
