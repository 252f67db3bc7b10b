//! One syntax for every span of time a setting or flag takes: a whole number and its
//! unit, `ms`, `s`, `m`, `h` or `d` (`250ms`, `30s`, `5m`, `7d`); `0` alone is zero.
//!
//! Settings that once took a bare number of milliseconds (`ORDERLY_CLAIM_POLL_MS=250`,
//! `--claim-poll-ms 250`) or seconds (`--timeout-secs 300`) are still read under their
//! old names, with a warning ([`legacy`]); a bare number under a new name is refused,
//! so no value is ever read in a unit its writer did not mean.

use std::time::Duration;

/// The units, longest first where one is the start of another (`ms` before `m`), with
/// their length in milliseconds.
const UNITS: &[(&str, u64)] = &[
    ("ms", 1),
    ("s", 1_000),
    ("m", 60_000),
    ("h", 3_600_000),
    ("d", 86_400_000),
];

/// Reads a span of time: `250ms`, `30s`, `5m`, `36h`, `7d`, or `0`.
pub fn parse(raw: &str) -> Result<Duration, String> {
    let text = raw.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?} needs a unit: ms, s, m, h or d (e.g. 30s)"))?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a whole number with a unit (e.g. 30s)"))?;
    let per = UNITS
        .iter()
        .find(|(name, _)| *name == unit)
        .map(|(_, ms)| *ms)
        .ok_or_else(|| format!("{text:?}: the unit is ms, s, m, h or d (e.g. 30s)"))?;
    n.checked_mul(per)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{text:?} is too long"))
}

/// Writes `d` in the syntax [`parse`] reads, in the largest unit that holds it
/// exactly (`30s`, not `30000ms`); below a millisecond it is rounded down.
pub fn format(d: Duration) -> String {
    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    if ms == 0 {
        return "0".to_owned();
    }
    let (unit, per) = UNITS
        .iter()
        .rev()
        .find(|(_, per)| ms % per == 0)
        .copied()
        .unwrap_or(("ms", 1));
    format!("{}{unit}", ms / per)
}

/// The value of a setting given in its old form, a bare whole number in `unit` (`ms`
/// or `s`), as [`parse`] reads it (`250` in ms: `250ms`). A value that already has a
/// unit is left as it is.
pub fn legacy(raw: &str, unit: &str) -> String {
    let text = raw.trim();
    if !text.is_empty() && text.chars().all(|c| c.is_ascii_digit()) {
        format!("{text}{unit}")
    } else {
        text.to_owned()
    }
}

/// Reads the duration setting `name` through `get` (the environment, in production),
/// or, where it is unset, its old form `{name}_MS` (a bare number of milliseconds),
/// with a warning that names both. `None` where neither is set; an error names the
/// variable that holds a value [`parse`] refuses.
pub fn from_env(
    get: impl Fn(&str) -> Option<String>,
    name: &str,
) -> Result<Option<Duration>, String> {
    if let Some(raw) = get(name) {
        return parse(&raw)
            .map(Some)
            .map_err(|e| format!("invalid {name}: {e}"));
    }
    let old = format!("{name}_MS");
    let Some(raw) = get(&old) else {
        return Ok(None);
    };
    let d = parse(&legacy(&raw, "ms")).map_err(|e| format!("invalid {old}: {e}"))?;
    tracing::warn!(
        setting = name,
        "{old} is the old name of {name} (a duration: {}); it is read for now",
        format(d)
    );
    Ok(Some(d))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_setting_is_read_under_its_name_or_its_old_one_and_errors_name_the_variable() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(from_env(env(&[]), "ORDERLY_X"), Ok(None));
        assert_eq!(
            from_env(env(&[("ORDERLY_X", "5s")]), "ORDERLY_X"),
            Ok(Some(Duration::from_secs(5)))
        );
        assert_eq!(
            from_env(env(&[("ORDERLY_X_MS", "250")]), "ORDERLY_X"),
            Ok(Some(Duration::from_millis(250)))
        );
        assert_eq!(
            from_env(
                env(&[("ORDERLY_X", "1s"), ("ORDERLY_X_MS", "250")]),
                "ORDERLY_X"
            ),
            Ok(Some(Duration::from_secs(1))),
            "the new name wins"
        );
        let e = from_env(env(&[("ORDERLY_X", "250")]), "ORDERLY_X").unwrap_err();
        assert!(
            e.contains("ORDERLY_X:") && e.contains("needs a unit"),
            "{e}"
        );
        let e = from_env(env(&[("ORDERLY_X_MS", "ten")]), "ORDERLY_X").unwrap_err();
        assert!(e.contains("ORDERLY_X_MS"), "{e}");
    }

    #[test]
    fn every_unit_reads_as_written() {
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse("36h"), Ok(Duration::from_secs(36 * 3_600)));
        assert_eq!(parse(" 7d "), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        assert_eq!(parse("0ms"), Ok(Duration::ZERO));
    }

    #[test]
    fn a_bare_number_a_unit_alone_or_an_unknown_unit_is_refused_with_an_example() {
        for bad in [
            "30",
            "s",
            "",
            "7w",
            "-1s",
            "1.5s",
            "30 s",
            "30S",
            "1m30s",
            "99999999999999999d",
        ] {
            let e = parse(bad).expect_err(bad);
            assert!(
                e.contains("e.g. 30s") || e.contains("too long"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn a_written_duration_reads_back_the_same() {
        for (d, text) in [
            (Duration::ZERO, "0"),
            (Duration::from_millis(250), "250ms"),
            (Duration::from_millis(1_500), "1500ms"),
            (Duration::from_secs(30), "30s"),
            (Duration::from_secs(300), "5m"),
            (Duration::from_secs(7 * 86_400), "7d"),
        ] {
            assert_eq!(format(d), text);
            assert_eq!(parse(text), Ok(d));
        }
    }

    #[test]
    fn an_old_bare_number_takes_its_old_unit_and_a_unit_stays() {
        assert_eq!(legacy("250", "ms"), "250ms");
        assert_eq!(legacy(" 300 ", "s"), "300s");
        assert_eq!(legacy("5m", "ms"), "5m");
        assert_eq!(parse(&legacy("30000", "ms")), Ok(Duration::from_secs(30)));
    }
}
