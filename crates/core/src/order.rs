//! Order details: who ordered what, validated when constructed or deserialized, so
//! that no invalid order ever reaches the state store.

use serde::{Deserialize, Serialize};

use crate::validation::ValidationError;

/// Most lines one order may carry.
pub const MAX_LINES: usize = 100;
/// Largest quantity of one line.
pub const MAX_QUANTITY: u32 = 10_000;
/// Largest unit price, in minor units (1,000,000.00 in a two-decimal currency).
pub const MAX_UNIT_PRICE_MINOR: i64 = 100_000_000;
/// Largest order total, in minor units (10,000,000.00 in a two-decimal currency).
pub const MAX_TOTAL_MINOR: i64 = 1_000_000_000;
/// Longest customer id or SKU.
pub const MAX_CODE_LEN: usize = 64;

/// ISO 4217 alphabetic currency code, e.g. `EUR`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Currency(String);

impl Currency {
    /// Parses a three-letter upper-case code.
    pub fn parse(raw: impl Into<String>) -> Result<Self, ValidationError> {
        let raw = raw.into();
        if raw.len() == 3 && raw.bytes().all(|b| b.is_ascii_uppercase()) {
            Ok(Self(raw))
        } else {
            Err(ValidationError::new(
                "currency",
                format!("{raw:?} is not a three-letter ISO 4217 code"),
            ))
        }
    }

    /// The code as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Currency {
    type Error = ValidationError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(value)
    }
}

impl From<Currency> for String {
    fn from(c: Currency) -> Self {
        c.0
    }
}

/// One line of an order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrderLine {
    /// The product's stock-keeping unit.
    pub sku: String,
    /// How many, at least 1.
    pub quantity: u32,
    /// Price of one unit in the currency's minor unit (cents).
    pub unit_price_minor: i64,
}

/// The business content of an order. Construct with [`OrderDetails::new`] (or
/// deserialize, which validates the same way).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawOrderDetails", into = "RawOrderDetails")]
pub struct OrderDetails {
    customer_id: String,
    currency: Currency,
    lines: Vec<OrderLine>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOrderDetails {
    customer_id: String,
    currency: Currency,
    lines: Vec<OrderLine>,
}

impl TryFrom<RawOrderDetails> for OrderDetails {
    type Error = ValidationError;
    fn try_from(raw: RawOrderDetails) -> Result<Self, Self::Error> {
        OrderDetails::new(raw.customer_id, raw.currency, raw.lines)
    }
}

impl From<OrderDetails> for RawOrderDetails {
    fn from(d: OrderDetails) -> Self {
        RawOrderDetails {
            customer_id: d.customer_id,
            currency: d.currency,
            lines: d.lines,
        }
    }
}

fn check_code(field: &str, value: &str) -> Result<(), ValidationError> {
    if value.trim().is_empty() {
        return Err(ValidationError::new(field, "must not be empty"));
    }
    if value.len() > MAX_CODE_LEN {
        return Err(ValidationError::new(
            field,
            format!("is longer than {MAX_CODE_LEN} characters"),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(ValidationError::new(field, "contains control characters"));
    }
    // Invisible characters that make a code read as another on every screen an
    // operator uses (bidi overrides reorder text; zero-width ones hide in it).
    if let Some(c) = value.chars().find(|c| invisible(*c)) {
        return Err(ValidationError::new(
            field,
            format!(
                "contains the invisible character U+{:04X} (bidi control or zero-width)",
                u32::from(c)
            ),
        ));
    }
    Ok(())
}

/// Bidirectional controls and zero-width characters.
fn invisible(c: char) -> bool {
    matches!(
        c,
        '\u{061C}'
            | '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{2069}'
            | '\u{FEFF}'
    )
}

impl OrderDetails {
    /// Validates and builds order details: a customer, a currency, 1 to 100 lines,
    /// each with a quantity of 1 to 10,000 and a unit price of 0 to 1,000,000.00,
    /// and a total no larger than 10,000,000.00.
    pub fn new(
        customer_id: impl Into<String>,
        currency: Currency,
        lines: Vec<OrderLine>,
    ) -> Result<Self, ValidationError> {
        let customer_id = customer_id.into();
        check_code("customer_id", &customer_id)?;
        if lines.is_empty() {
            return Err(ValidationError::new(
                "lines",
                "an order needs at least one line",
            ));
        }
        if lines.len() > MAX_LINES {
            return Err(ValidationError::new(
                "lines",
                format!("{} lines, the limit is {MAX_LINES}", lines.len()),
            ));
        }
        let mut total: i64 = 0;
        for (i, line) in lines.iter().enumerate() {
            check_code(&format!("lines[{i}].sku"), &line.sku)?;
            if line.quantity == 0 || line.quantity > MAX_QUANTITY {
                return Err(ValidationError::new(
                    format!("lines[{i}].quantity"),
                    format!("{} is outside 1..={MAX_QUANTITY}", line.quantity),
                ));
            }
            if !(0..=MAX_UNIT_PRICE_MINOR).contains(&line.unit_price_minor) {
                return Err(ValidationError::new(
                    format!("lines[{i}].unit_price_minor"),
                    format!(
                        "{} is outside 0..={MAX_UNIT_PRICE_MINOR}",
                        line.unit_price_minor
                    ),
                ));
            }
            // Both factors are bounded above, so neither product nor sum can overflow i64.
            total += line.unit_price_minor * i64::from(line.quantity);
        }
        if total > MAX_TOTAL_MINOR {
            return Err(ValidationError::new(
                "lines",
                format!("order total {total} exceeds the limit {MAX_TOTAL_MINOR}"),
            ));
        }
        Ok(Self {
            customer_id,
            currency,
            lines,
        })
    }

    /// Parses and validates order details from JSON, naming the faulty field.
    pub fn from_json(json: &str) -> Result<Self, ValidationError> {
        serde_json::from_str(json).map_err(|e| ValidationError::new("details", e.to_string()))
    }

    /// The details as canonical JSON (the stored form).
    pub fn to_json(&self) -> String {
        // Serializing plain strings and integers cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The customer who placed the order.
    pub fn customer_id(&self) -> &str {
        &self.customer_id
    }

    /// The currency of every amount.
    pub fn currency(&self) -> &Currency {
        &self.currency
    }

    /// The order lines.
    pub fn lines(&self) -> &[OrderLine] {
        &self.lines
    }

    /// The order total in minor units.
    pub fn total_minor(&self) -> i64 {
        self.lines
            .iter()
            .map(|l| l.unit_price_minor * i64::from(l.quantity))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eur() -> Currency {
        Currency::parse("EUR").unwrap()
    }

    fn line(qty: u32, price: i64) -> OrderLine {
        OrderLine {
            sku: "SKU-1".into(),
            quantity: qty,
            unit_price_minor: price,
        }
    }

    #[test]
    fn a_plain_order_is_valid_and_totals_its_lines() {
        let d = OrderDetails::new("c-1", eur(), vec![line(2, 1_250), line(1, 99)]).unwrap();
        assert_eq!(d.total_minor(), 2_599);
    }

    /// A customer id or SKU with a bidi override or a zero-width character reads as
    /// another on every screen: refused, naming the character.
    #[test]
    fn invisible_characters_in_codes_are_refused() {
        for bad in [
            "c-1\u{202E}evil",
            "c\u{200B}-1",
            "\u{FEFF}c-1",
            "c-1\u{2066}",
        ] {
            let e = OrderDetails::new(bad, eur(), vec![line(1, 100)]).unwrap_err();
            assert_eq!(e.field, "customer_id", "{bad:?}");
            assert!(e.to_string().contains("invisible character U+"), "{e}");
        }
        let mut l = line(1, 100);
        l.sku = "SKU\u{200D}1".into();
        assert!(OrderDetails::new("c-1", eur(), vec![l]).is_err());
        // Letters of any script are fine.
        OrderDetails::new("client-é-東京", eur(), vec![line(1, 100)]).unwrap();
    }

    #[test]
    fn empty_orders_are_refused() {
        assert_eq!(
            OrderDetails::new("c-1", eur(), vec![]).unwrap_err().field,
            "lines"
        );
    }

    #[test]
    fn negative_or_absurd_amounts_are_refused_naming_the_line() {
        let e = OrderDetails::new("c-1", eur(), vec![line(1, 5), line(1, -1)]).unwrap_err();
        assert_eq!(e.field, "lines[1].unit_price_minor");
        let e = OrderDetails::new("c-1", eur(), vec![line(0, 5)]).unwrap_err();
        assert_eq!(e.field, "lines[0].quantity");
        let e =
            OrderDetails::new("c-1", eur(), vec![line(10_000, MAX_UNIT_PRICE_MINOR)]).unwrap_err();
        assert!(e.reason.contains("exceeds"));
    }

    #[test]
    fn oversized_orders_are_refused() {
        let e = OrderDetails::new("c-1", eur(), vec![line(1, 1); MAX_LINES + 1]).unwrap_err();
        assert!(e.reason.contains("101 lines"));
        assert!(OrderDetails::new("c".repeat(65), eur(), vec![line(1, 1)]).is_err());
    }

    #[test]
    fn json_is_validated_like_construction() {
        let ok = r#"{"customer_id":"c","currency":"EUR","lines":[{"sku":"a","quantity":1,"unit_price_minor":5}]}"#;
        let d = OrderDetails::from_json(ok).unwrap();
        assert_eq!(OrderDetails::from_json(&d.to_json()).unwrap(), d);
        let bad = r#"{"customer_id":"c","currency":"euro","lines":[]}"#;
        assert!(
            OrderDetails::from_json(bad)
                .unwrap_err()
                .reason
                .contains("ISO 4217")
        );
        let unknown = r#"{"customer_id":"c","currency":"EUR","lines":[],"x":1}"#;
        assert!(
            OrderDetails::from_json(unknown)
                .unwrap_err()
                .reason
                .contains("unknown field")
        );
    }
}
