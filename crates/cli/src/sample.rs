//! Sample orders for trying orderly out.

use orderly_core::store::NewOrder;
use orderly_core::{Currency, OrderDetails, OrderId, OrderLine};

const SKUS: [&str; 6] = [
    "KEYBOARD-01",
    "MOUSE-02",
    "MONITOR-27",
    "CABLE-USB-C",
    "DOCK-04",
    "HEADSET-09",
];

/// Sample order number `n`: 1 to 3 lines of desk gear, a random id.
pub fn order(n: u64) -> NewOrder {
    let lines = (0..1 + n % 3)
        .map(|i| {
            let k = ((n + i * 5) % SKUS.len() as u64) as usize;
            OrderLine {
                sku: SKUS[k].into(),
                quantity: 1 + ((n + i) % 3) as u32,
                unit_price_minor: 1_999 + 1_000 * k as i64,
            }
        })
        .collect();
    let details = OrderDetails::new(
        format!("customer-{:03}", n % 50),
        Currency::parse("EUR").expect("EUR"),
        lines,
    )
    .expect("sample orders are valid");
    NewOrder {
        workflow: None,
        order_id: OrderId::random(),
        details,
        reply_to: None,
    }
}
