//! Output for people (tables) and for tools (`--json`: one JSON object a line).

use orderly_cli::out::json_line;
use orderly_cli::outln;
use orderly_core::StateRow;
use orderly_core::service::ServiceHealth;
use orderly_core::store::OrderView;
use serde_json::json;

fn time(t: Option<chrono::DateTime<chrono::Utc>>) -> String {
    t.map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_else(|| "-".into())
}

/// A table (or JSON lines) of state rows; an order waiting for a service that is down
/// says so (`services`: the services' health) where others show their last error.
pub fn orders(
    rows: &[StateRow],
    services: &std::collections::HashMap<String, ServiceHealth>,
    json: bool,
) -> anyhow::Result<()> {
    if json {
        for r in rows {
            json_line(&orderly_cli::shapes::state_row(r, services)?)?;
        }
        return Ok(());
    }
    outln!(
        "{:<36}  {:<10}  {:>4}  {:>5}  {:<19}  {:<24}  last error / waiting",
        "order_id",
        "state",
        "step",
        "fails",
        "created",
        "locked_by"
    );
    for r in rows {
        let note = r
            .waiting_note(services)
            .or_else(|| r.error_note())
            .unwrap_or_default();
        outln!(
            "{:<36}  {:<10}  {:>4}  {:>5}  {:<19}  {:<24}  {}",
            r.order_id.as_str(),
            r.process_state.as_str(),
            r.current_step,
            r.failure_count,
            time(Some(r.created_at)),
            r.locked_by.as_ref().map(|l| l.as_str()).unwrap_or("-"),
            note
        );
    }
    outln!("{} orders", rows.len());
    Ok(())
}

/// The remote services as the fleet sees them.
pub fn services(services: &[ServiceHealth], json: bool) -> anyhow::Result<()> {
    if json {
        for h in services {
            json_line(h)?;
        }
        return Ok(());
    }
    if services.is_empty() {
        outln!("no service has been reported down: all are taken as up");
        return Ok(());
    }
    outln!(
        "{:<24} {:<8} {:<19} {:<19} {:>7} {:>8}  last error",
        "SERVICE",
        "STATE",
        "DOWN SINCE",
        "NEXT PROBE",
        "WAITING",
        "OUTAGES"
    );
    for h in services {
        let probe = match h.state {
            orderly_core::service::ServiceState::Up => "-".to_owned(),
            _ => time(h.retry_at),
        };
        let since = match h.state {
            orderly_core::service::ServiceState::Up => "-".to_owned(),
            _ => time(h.down_since),
        };
        outln!(
            "{:<24} {:<8} {:<19} {:<19} {:>7} {:>8}  {}",
            h.service,
            h.state.as_str(),
            since,
            probe,
            h.waiting,
            h.outage,
            h.last_error.as_deref().unwrap_or("-")
        );
    }
    Ok(())
}

/// Live orders by workflow version: which versions still have orders in flight.
pub fn workflows(
    counts: &[orderly_core::store::WorkflowCount],
    stored: &[orderly_core::store::StoredWorkflow],
    as_json: bool,
) -> anyhow::Result<()> {
    use orderly_core::ProcessState;
    // One row per stored version, then per version in flight that is not stored, then
    // per workflow asked for by orders not started yet.
    struct Row {
        label: String,
        stored: String,
        by: String,
        pending: i64,
        processing: i64,
        error: i64,
        json: serde_json::Value,
    }
    let live = |name: Option<&str>, version: Option<&str>, state: ProcessState| -> i64 {
        counts
            .iter()
            .filter(|c| {
                c.workflow.as_deref() == name && c.version.as_deref() == version && c.state == state
            })
            .map(|c| c.orders)
            .sum()
    };
    let mut rows: Vec<Row> = Vec::new();
    for s in stored {
        let (name, version) = (s.reference.name.as_str(), s.reference.version.as_str());
        let (p, r, e) = (
            live(Some(name), Some(version), ProcessState::Pending),
            live(Some(name), Some(version), ProcessState::Processing),
            live(Some(name), Some(version), ProcessState::Error),
        );
        let check = s.workflow().err().map(|e| e.to_string());
        rows.push(Row {
            label: s.reference.to_string(),
            stored: match &check {
                None => s.first_seen_at.format("%Y-%m-%d %H:%M:%S").to_string(),
                Some(_) => "INVALID".to_owned(),
            },
            by: s.first_seen_by.clone(),
            pending: p,
            processing: r,
            error: e,
            json: json!({
                "workflow": name, "version": version, "stored": true,
                "first_seen_at": s.first_seen_at, "first_seen_by": s.first_seen_by,
                "invalid": check, "pending": p, "processing": r, "error": e,
            }),
        });
    }
    let mut seen = std::collections::BTreeSet::new();
    for c in counts {
        if !seen.insert((c.workflow.clone(), c.version.clone())) {
            continue;
        }
        let is_stored = stored.iter().any(|s| {
            Some(s.reference.name.as_str()) == c.workflow.as_deref()
                && Some(s.reference.version.as_str()) == c.version.as_deref()
        });
        if is_stored {
            continue;
        }
        let (name, version) = (c.workflow.as_deref(), c.version.as_deref());
        let (p, r, e) = (
            live(name, version, ProcessState::Pending),
            live(name, version, ProcessState::Processing),
            live(name, version, ProcessState::Error),
        );
        let (label, state) = match version {
            Some(_) => (c.label(), "NOT STORED"),
            None => (format!("{} (not started)", c.label()), "-"),
        };
        rows.push(Row {
            label,
            stored: state.to_owned(),
            by: "-".to_owned(),
            pending: p,
            processing: r,
            error: e,
            json: json!({
                "workflow": name, "version": version, "stored": false,
                "pending": p, "processing": r, "error": e,
            }),
        });
    }
    if as_json {
        for r in &rows {
            json_line(&r.json)?;
        }
        return Ok(());
    }
    if rows.is_empty() {
        outln!("no workflow versions stored and no orders in flight");
        return Ok(());
    }
    outln!(
        "{:<40} {:<19} {:<28} {:>8} {:>10} {:>6}",
        "WORKFLOW",
        "STORED",
        "BY",
        "PENDING",
        "PROCESSING",
        "ERROR"
    );
    for r in &rows {
        outln!(
            "{:<40} {:<19} {:<28} {:>8} {:>10} {:>6}",
            r.label,
            r.stored,
            r.by,
            r.pending,
            r.processing,
            r.error
        );
    }
    Ok(())
}

/// One order in full.
pub fn order(view: &OrderView, as_json: bool) -> anyhow::Result<()> {
    if as_json {
        return json_line(&orderly_cli::shapes::order(view));
    }
    let s = &view.state;
    outln!("order        {}", s.order_id);
    outln!(
        "state        {}  (epoch {}, step {}, failures {}, run {})",
        s.process_state,
        s.lock_epoch,
        s.current_step,
        s.failure_count,
        s.generation
    );
    outln!("workflow     {}", s.workflow_label());
    outln!(
        "locked_by    {}",
        s.locked_by.as_ref().map(|l| l.as_str()).unwrap_or("-")
    );
    outln!("complete_by  {}", time(s.complete_by));
    if orderly_core::service::is_held(s.next_attempt_at) {
        outln!(
            "next attempt when {} is back",
            s.waiting_on.as_deref().unwrap_or("its service")
        );
    } else {
        outln!("next attempt {}", time(Some(s.next_attempt_at)));
    }
    if let Some(service) = &s.waiting_on {
        outln!("waited for   {service}");
    }
    outln!("last error   {}", s.error_note().as_deref().unwrap_or("-"));
    outln!(
        "customer     {}  total {} {:.2}",
        view.details.customer_id(),
        view.details.currency().as_str(),
        view.details.total_minor() as f64 / 100.0
    );
    for l in view.details.lines() {
        outln!(
            "  {} x {} at {:.2}",
            l.quantity,
            l.sku,
            l.unit_price_minor as f64 / 100.0
        );
    }
    if !view.steps.is_empty() {
        outln!("steps");
        for st in &view.steps {
            outln!(
                "  {} {:<20} {:<11} attempts {}  key {}",
                st.index,
                st.name,
                st.status.as_str(),
                st.attempts,
                st.idempotency_key
            );
        }
    }
    outln!("history");
    for h in &view.history {
        let from = h.from_state.map(|f| f.as_str()).unwrap_or("-");
        let step = h.step.map(|s| format!(" step {s}")).unwrap_or_default();
        let reason = h
            .reason
            .as_deref()
            .map(|r| format!(": {r}"))
            .unwrap_or_default();
        outln!(
            "  {}  {:<15} {from} -> {}{step}  by {}{reason}",
            time(Some(h.at)),
            h.kind.as_str(),
            h.to_state,
            h.actor
        );
    }
    Ok(())
}

/// Alerts, newest first.
pub fn alerts(alerts: &[orderly_core::store::Alert], json: bool) -> anyhow::Result<()> {
    if json {
        for a in alerts {
            json_line(a)?;
        }
        return Ok(());
    }
    for a in alerts {
        let ack = match (&a.acknowledged_by, a.acknowledged_at) {
            (Some(by), at) => format!("  [acknowledged by {by} at {}]", time(at)),
            _ => String::new(),
        };
        outln!(
            "#{:<6} {}  {:<40} step {:<18} failures {}  {}{ack}",
            a.alert_id,
            a.raised_at.format("%Y-%m-%d %H:%M:%S"),
            a.order_id,
            a.step.as_deref().unwrap_or("-"),
            a.failure_count,
            a.last_error.as_deref().unwrap_or("-")
        );
    }
    Ok(())
}

/// Alerts about the system (conditions), newest first.
pub fn system_alerts(
    alerts: &[orderly_core::conditions::SystemAlert],
    json: bool,
) -> anyhow::Result<()> {
    if json {
        for a in alerts {
            json_line(a)?;
        }
        return Ok(());
    }
    if alerts.is_empty() {
        outln!("no alerts about the system");
    }
    for a in alerts {
        let state = match a.resolved_at {
            Some(t) => format!("resolved {}", time(Some(t))),
            None => "OPEN".to_owned(),
        };
        outln!(
            "#{:<6} {}  {:<16} {:<20} {:<28} {}",
            a.alert_id,
            a.raised_at.format("%Y-%m-%d %H:%M:%S"),
            a.kind.as_str(),
            a.subject,
            state,
            a.detail
        );
    }
    Ok(())
}

/// The supervisors' current term.
pub fn leader(term: Option<&orderly_core::leader::Term>, json: bool) -> anyhow::Result<()> {
    if json {
        return json_line(&orderly_cli::shapes::leader(term));
    }
    let Some(t) = term else {
        outln!("no supervisor has led yet");
        return Ok(());
    };
    let live = t.lease_expires_at.is_none_or(|e| e > chrono::Utc::now());
    outln!("leader     {}", t.fence.holder);
    outln!("term       {} (epoch)", t.fence.epoch);
    outln!("since      {}", time(Some(t.started_at)));
    match t.lease_expires_at {
        Some(e) => outln!(
            "lease      SQL row, renewed {}, expires {}{}",
            time(Some(t.renewed_at)),
            time(Some(e)),
            if live {
                ""
            } else {
                " (EXPIRED: no leader now)"
            }
        ),
        None => outln!("lease      Azure blob (its expiry lives in the blob service)"),
    }
    Ok(())
}

/// Queue depths.
pub fn depths(depths: &[orderly_core::transport::QueueDepth], json: bool) -> anyhow::Result<()> {
    if json {
        for d in depths {
            json_line(d)?;
        }
        return Ok(());
    }
    outln!(
        "{:<28} {:>8} {:>8} {:>10} {:>14}",
        "queue",
        "ready",
        "locked",
        "scheduled",
        "dead-lettered"
    );
    for d in depths {
        outln!(
            "{:<28} {:>8} {:>8} {:>10} {:>14}",
            d.queue.as_str(),
            d.ready,
            d.locked,
            d.scheduled,
            d.dead_lettered
        );
    }
    Ok(())
}

/// Dead letters, oldest first.
pub fn dead_letters(
    letters: &[orderly_core::transport::DeadLetter],
    json: bool,
) -> anyhow::Result<()> {
    for d in letters {
        let m = &d.message;
        if json {
            json_line(&orderly_cli::shapes::dead_letter(d))?;
        } else {
            outln!(
                "{}  {:<40} {:<26} deliveries {}  {}",
                time(Some(d.dead_lettered_at)),
                m.message_id,
                d.reason,
                m.delivery_count,
                d.description
            );
        }
    }
    if !json {
        outln!("{} dead letters", letters.len());
    }
    Ok(())
}
