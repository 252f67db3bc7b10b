//! Reading a ledger: the keys undone, the effects still in force, and the effects
//! applied twice (which must never happen).

use super::Effect;
use std::collections::HashMap;

/// How many times each effect's key was undone (by compensations naming it).
pub fn undone_keys(effects: &[Effect]) -> HashMap<&str, usize> {
    let mut undone: HashMap<&str, usize> = HashMap::new();
    for e in effects {
        if let Some(key) = &e.compensates {
            *undone.entry(key.as_str()).or_default() += 1;
        }
    }
    undone
}

/// The `do` effects of `action` for `order` that are in effect: applied and not undone.
pub fn in_force<'a>(effects: &'a [Effect], order: &str, action: &str) -> Vec<&'a Effect> {
    let undone = undone_keys(effects);
    effects
        .iter()
        .filter(|e| e.order_id == order && e.action == action && e.kind == "do")
        .filter(|e| !undone.contains_key(e.key.as_str()))
        .collect()
}

/// Effects that break "no step takes visible effect twice": an action of an order in
/// effect under more than one key (an effect that a compensation undid no longer
/// counts, so a fresh run after an undo is not a double), or one effect undone more
/// than once. Empty when all is well.
pub fn double_effects(effects: &[Effect]) -> Vec<(String, String, usize)> {
    let undone = undone_keys(effects);
    let mut seen: HashMap<(&str, &str), usize> = HashMap::new();
    for e in effects {
        if e.kind == "do" && !undone.contains_key(e.key.as_str()) {
            *seen.entry((&e.order_id, &e.action)).or_default() += e.applied as usize;
        }
    }
    for e in effects {
        if let Some(key) = &e.compensates
            && undone.get(key.as_str()).copied().unwrap_or(0) > 1
        {
            seen.insert((&e.order_id, &e.action), undone[key.as_str()]);
        }
    }
    let mut doubles: Vec<_> = seen
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|((o, a), n)| (o.to_owned(), a.to_owned(), n))
        .collect();
    doubles.sort();
    doubles
}
