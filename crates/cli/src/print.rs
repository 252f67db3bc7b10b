//! Output for people (tables) and for tools (JSON).

use orderly_core::StateRow;
use orderly_core::store::OrderView;
use serde_json::json;

fn time(t: Option<chrono::DateTime<chrono::Utc>>) -> String {
    t.map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_else(|| "-".into())
}

/// A table (or JSON lines) of state rows.
pub fn orders(rows: &[StateRow], json: bool) -> anyhow::Result<()> {
    if json {
        for r in rows {
            println!("{}", serde_json::to_string(r)?);
        }
        return Ok(());
    }
    println!(
        "{:<36}  {:<10}  {:>4}  {:>5}  {:<19}  {:<24}  last error",
        "order_id", "state", "step", "fails", "created", "locked_by"
    );
    for r in rows {
        println!(
            "{:<36}  {:<10}  {:>4}  {:>5}  {:<19}  {:<24}  {}",
            r.order_id.as_str(),
            r.process_state.as_str(),
            r.current_step,
            r.failure_count,
            time(Some(r.created_at)),
            r.locked_by.as_ref().map(|l| l.as_str()).unwrap_or("-"),
            r.last_error.as_deref().unwrap_or("")
        );
    }
    println!("{} orders", rows.len());
    Ok(())
}

/// One order in full.
pub fn order(view: &OrderView, as_json: bool) -> anyhow::Result<()> {
    if as_json {
        let v = json!({
            "state": view.state,
            "details": view.details,
            "steps": view.steps,
            "history": view.history,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let s = &view.state;
    println!("order        {}", s.order_id);
    println!(
        "state        {}  (epoch {}, step {}, failures {})",
        s.process_state, s.lock_epoch, s.current_step, s.failure_count
    );
    println!(
        "locked_by    {}",
        s.locked_by.as_ref().map(|l| l.as_str()).unwrap_or("-")
    );
    println!("complete_by  {}", time(s.complete_by));
    println!("next attempt {}", time(Some(s.next_attempt_at)));
    println!("last error   {}", s.last_error.as_deref().unwrap_or("-"));
    println!(
        "customer     {}  total {} {:.2}",
        view.details.customer_id(),
        view.details.currency().as_str(),
        view.details.total_minor() as f64 / 100.0
    );
    for l in view.details.lines() {
        println!(
            "  {} x {} at {:.2}",
            l.quantity,
            l.sku,
            l.unit_price_minor as f64 / 100.0
        );
    }
    if !view.steps.is_empty() {
        println!("steps");
        for st in &view.steps {
            println!(
                "  {} {:<20} {:<11} attempts {}  key {}",
                st.index,
                st.name,
                st.status.as_str(),
                st.attempts,
                st.idempotency_key
            );
        }
    }
    println!("history");
    for h in &view.history {
        let from = h.from_state.map(|f| f.as_str()).unwrap_or("-");
        let step = h.step.map(|s| format!(" step {s}")).unwrap_or_default();
        let reason = h
            .reason
            .as_deref()
            .map(|r| format!(": {r}"))
            .unwrap_or_default();
        println!(
            "  {}  {:<15} {from} -> {}{step}  by {}{reason}",
            time(Some(h.at)),
            h.kind.as_str(),
            h.to_state,
            h.actor
        );
    }
    Ok(())
}
