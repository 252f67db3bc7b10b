//! Ready-made valid orders.

use orderly_core::store::NewOrder;
use orderly_core::{Currency, OrderDetails, OrderId, OrderLine};

/// Valid details for sample order number `n` (amounts vary with `n`).
pub fn details(n: u64) -> OrderDetails {
    let lines = (0..1 + n % 3)
        .map(|i| OrderLine {
            sku: format!("SKU-{:04}", (n * 7 + i) % 1000),
            quantity: 1 + ((n + i) % 5) as u32,
            unit_price_minor: 199 + ((n * 31 + i * 17) % 10_000) as i64,
        })
        .collect();
    OrderDetails::new(
        format!("customer-{}", n % 97),
        Currency::parse("EUR").expect("valid code"),
        lines,
    )
    .expect("sample details are valid")
}

/// A valid new order with a random id.
pub fn order(n: u64) -> NewOrder {
    NewOrder {
        workflow: None,
        order_id: OrderId::random(),
        details: details(n),
        reply_to: None,
    }
}

/// A valid new order with the given id.
pub fn order_with_id(id: &str, n: u64) -> NewOrder {
    NewOrder {
        workflow: None,
        order_id: OrderId::parse(id).expect("valid test id"),
        details: details(n),
        reply_to: None,
    }
}

/// The actor tests submit orders as.
pub fn submitter() -> orderly_core::Actor {
    orderly_core::Actor::instance(
        &orderly_core::InstanceId::parse("submitter@test").expect("valid id"),
    )
}
