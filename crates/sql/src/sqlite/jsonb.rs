//! Batches written in SQLite's binary JSON (JSONB), bound as a blob.
//!
//! A batch is an array with a row (an array of fields) per item, read by the
//! statements with `jsonb_each` and `value ->> n` (see `statements.rs`). Sent as JSON
//! text, SQLite parsed the whole text into its binary form first, inside the writer's
//! turn, and the text had been written with every string escaped. Sent in the binary
//! form, SQLite reads it as it is: strings go in raw (no escaping either way), numbers
//! as their decimal digits.
//!
//! The form (<https://sqlite.org/jsonb.html>): each element is a header and a payload.
//! The header's first byte holds the element's type in its low four bits and, in its
//! high four, the payload's size (0 to 11) or how many bytes after it hold the size
//! (12: one, 13: two, 14: four, big-endian). A size need not be written in its fewest
//! bytes: an array's is written in four, once its elements are in.

use std::borrow::Cow;
use std::io::Write as _;

/// Element types used here.
const NULL: u8 = 0;
const TRUE: u8 = 1;
const FALSE: u8 = 2;
/// An integer as its decimal digits.
const INT: u8 = 3;
/// Text with no character JSON would have to escape.
const TEXT: u8 = 7;
/// Any text, escaped only when written out as JSON.
const TEXTRAW: u8 = 10;
const ARRAY: u8 = 11;

/// A field of a row.
pub(crate) trait Field {
    fn put(&self, out: &mut Vec<u8>);
}

/// The row of a batch being written: its fields in order ([`RowWriter::field`]).
pub(crate) struct RowWriter<'o>(&'o mut Vec<u8>);

impl RowWriter<'_> {
    /// Appends `value` as the row's next field.
    pub fn field(&mut self, value: impl Field) -> &mut Self {
        value.put(self.0);
        self
    }
}

/// The header of an element of type `kind` whose payload is `size` bytes.
fn header(out: &mut Vec<u8>, kind: u8, size: usize) {
    match size {
        0..=11 => out.push(((size as u8) << 4) | kind),
        12..=0xff => out.extend_from_slice(&[(12 << 4) | kind, size as u8]),
        0x100..=0xffff => {
            out.push((13 << 4) | kind);
            out.extend_from_slice(&(size as u16).to_be_bytes());
        }
        _ => {
            out.push((14 << 4) | kind);
            out.extend_from_slice(&size_u32(size).to_be_bytes());
        }
    }
}

fn size_u32(size: usize) -> u32 {
    u32::try_from(size).expect("a batch is well under 4 GiB")
}

/// An array of whatever `elements` writes: its size is written once they are in.
fn array(out: &mut Vec<u8>, elements: impl FnOnce(&mut Vec<u8>)) {
    let at = out.len();
    out.extend_from_slice(&[(14 << 4) | ARRAY, 0, 0, 0, 0]);
    elements(out);
    let size = size_u32(out.len() - at - 5);
    out[at + 1..at + 5].copy_from_slice(&size.to_be_bytes());
}

/// A batch: an array with a row per item, whose fields `row` writes.
pub(crate) fn rows<T>(
    items: impl IntoIterator<Item = T>,
    mut row: impl FnMut(T, &mut RowWriter<'_>),
) -> Vec<u8> {
    let mut out = Vec::with_capacity(1024);
    array(&mut out, |out| {
        for item in items {
            array(out, |out| row(item, &mut RowWriter(out)));
        }
    });
    out
}

impl Field for str {
    fn put(&self, out: &mut Vec<u8>) {
        header(out, TEXTRAW, self.len());
        out.extend_from_slice(self.as_bytes());
    }
}

impl Field for String {
    fn put(&self, out: &mut Vec<u8>) {
        self.as_str().put(out);
    }
}

impl Field for Cow<'_, str> {
    fn put(&self, out: &mut Vec<u8>) {
        self.as_ref().put(out);
    }
}

impl<T: Field + ?Sized> Field for &T {
    fn put(&self, out: &mut Vec<u8>) {
        (**self).put(out);
    }
}

impl<T: Field> Field for Option<T> {
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            Some(v) => v.put(out),
            None => out.push(NULL),
        }
    }
}

impl Field for bool {
    fn put(&self, out: &mut Vec<u8>) {
        out.push(if *self { TRUE } else { FALSE });
    }
}

/// An integer as its decimal digits.
fn put_integer(value: i64, out: &mut Vec<u8>) {
    // At most 20 characters: "-9223372036854775808".
    let mut digits = [0u8; 20];
    let mut cursor = std::io::Cursor::new(&mut digits[..]);
    write!(cursor, "{value}").expect("an integer fits in 20 characters");
    let len = cursor.position() as usize;
    header(out, INT, len);
    out.extend_from_slice(&digits[..len]);
}

impl Field for i32 {
    fn put(&self, out: &mut Vec<u8>) {
        put_integer(i64::from(*self), out);
    }
}

impl Field for i64 {
    fn put(&self, out: &mut Vec<u8>) {
        put_integer(*self, out);
    }
}

/// Bytes as lowercase hex text, for `unhex()` in the statement.
pub(crate) struct Hex<'a>(pub &'a [u8]);

impl Field for Hex<'_> {
    fn put(&self, out: &mut Vec<u8>) {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        header(out, TEXT, self.0.len() * 2);
        let at = out.len();
        out.resize(at + self.0.len() * 2, 0);
        for (pair, b) in out[at..].chunks_exact_mut(2).zip(self.0) {
            pair[0] = DIGITS[usize::from(b >> 4)];
            pair[1] = DIGITS[usize::from(b & 0xf)];
        }
    }
}

#[cfg(test)]
mod tests {
    use sqlx::{Connection, Row as _, SqliteConnection};

    use super::*;

    /// What SQLite makes of `blob` as JSON text (`json()`), or its error.
    async fn as_text(conn: &mut SqliteConnection, blob: Vec<u8>) -> Result<String, String> {
        sqlx::query("SELECT json($1) AS j")
            .bind(blob)
            .fetch_one(conn)
            .await
            .map(|r| r.get::<String, _>("j"))
            .map_err(|e| e.to_string())
    }

    /// Every size of header, every field type, and escapes: SQLite reads the batch as
    /// the JSON text serde_json writes for the same rows.
    #[tokio::test]
    async fn sqlite_reads_a_batch_as_the_json_of_its_rows() {
        let mut conn = SqliteConnection::connect("sqlite::memory:").await.unwrap();
        let long: String = "x".repeat(70_000);
        let texts = [
            "",
            "a",
            "eleven char",
            "twelve chars",
            &"y".repeat(255),
            &"z".repeat(256),
            &long,
            "quote \" backslash \\ slash / tab \t newline \n nul \u{0} bell \u{7}",
            "é ü 漢字 🦀 \u{2028}\u{2029}",
        ];
        for text in texts {
            let batch = [
                (text, Some(1i64), None::<&str>, true),
                ("", None, Some(text), false),
            ];
            let blob = rows(&batch, |r, row| {
                row.field(r.0).field(r.1).field(r.2).field(r.3);
            });
            let expected = serde_json::to_string(&batch).unwrap();
            let read = as_text(&mut conn, blob).await.unwrap();
            let read: serde_json::Value = serde_json::from_str(&read).unwrap();
            let expected: serde_json::Value = serde_json::from_str(&expected).unwrap();
            assert_eq!(read, expected, "text of {} bytes", text.len());
        }
        for n in [
            0i64,
            1,
            -1,
            9,
            10,
            42,
            i64::MAX,
            i64::MIN,
            i64::from(i32::MIN),
        ] {
            let blob = rows([n], |n, row| {
                row.field(n).field(n as i32);
            });
            let read = as_text(&mut conn, blob).await.unwrap();
            assert_eq!(read, format!("[[{n},{}]]", n as i32));
        }
        assert_eq!(
            as_text(
                &mut conn,
                rows(Vec::<i64>::new(), |n, row| {
                    row.field(n);
                })
            )
            .await
            .unwrap(),
            "[]"
        );
    }

    /// The statements read a batch's rows with `jsonb_each` and `value ->> n`: every
    /// field comes back as it was written (escapes, text beyond ASCII, numbers at the
    /// edges of 64 bits, nulls, booleans as 1 and 0).
    #[tokio::test]
    async fn rows_read_through_jsonb_each_come_back_as_written() {
        let mut conn = SqliteConnection::connect("sqlite::memory:").await.unwrap();
        let written: Vec<(&str, Option<i64>, Option<&str>, bool)> = vec![
            ("plain", Some(0), None, true),
            (
                "quote \" backslash \\ slash /",
                Some(i64::MAX),
                Some("{\"a\":[1,2]}"),
                false,
            ),
            (
                "tab\t newline\n nul\u{0} bell\u{7}",
                Some(i64::MIN),
                Some(""),
                true,
            ),
            ("é ü 漢字 🦀", Some(-1), Some("🦀\u{2028}\u{2029}"), false),
            ("", None, Some("null"), true),
        ];
        let read = sqlx::query(
            "SELECT value ->> 0 AS a, value ->> 1 AS b, value ->> 2 AS c, value ->> 3 AS d \
             FROM jsonb_each($1) ORDER BY key",
        )
        .bind(rows(&written, |r, row| {
            row.field(r.0).field(r.1).field(r.2).field(r.3);
        }))
        .fetch_all(&mut conn)
        .await
        .unwrap();
        assert_eq!(read.len(), written.len());
        for (row, (a, b, c, d)) in read.iter().zip(&written) {
            assert_eq!(row.get::<String, _>("a"), *a);
            assert_eq!(row.get::<Option<i64>, _>("b"), *b);
            assert_eq!(row.get::<Option<String>, _>("c").as_deref(), *c);
            assert_eq!(row.get::<i64, _>("d"), i64::from(*d));
        }
    }

    /// Bodies of any bytes and lengths come out as lowercase hex, and `unhex()` gives the
    /// bytes back.
    #[tokio::test]
    async fn hex_bodies_come_back_as_their_bytes() {
        let mut conn = SqliteConnection::connect("sqlite::memory:").await.unwrap();
        let bytes: Vec<u8> = (0..=255u8).chain(0..=255u8).collect();
        for len in (0..=20).chain([127, 128, 255, 256, 511, 512]) {
            let body = &bytes[..len];
            let expected: String = body.iter().map(|b| format!("{b:02x}")).collect();
            let blob = rows([body], |b, row| {
                row.field(Hex(b)).field(0i64);
            });
            let row = sqlx::query(
                "SELECT value ->> 0 AS hex, unhex(value ->> 0) AS body FROM jsonb_each($1)",
            )
            .bind(blob)
            .fetch_one(&mut conn)
            .await
            .unwrap();
            assert_eq!(row.get::<String, _>("hex"), expected, "{len} bytes");
            assert_eq!(row.get::<Vec<u8>, _>("body"), body, "{len} bytes");
        }
    }
}
