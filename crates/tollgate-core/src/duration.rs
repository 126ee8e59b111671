//! Durations as the gateway's config and the command line write them: an integer and a unit,
//! `500us`, `20ms`, `30s`, `1m`, `1h`, `1d`. No floats, no compound forms: one obvious spelling
//! each. It lives here, at the bottom of the workspace, so that the gateway's config and
//! `tollgate-bench`'s flags share one parser.

use std::time::Duration;

/// What a duration string may look like, for error messages.
pub const DURATION_HELP: &str =
    "expected an integer with a unit: us, ms, s, m, h or d (e.g. \"20ms\", \"1m\")";

/// Parses `"20ms"`-style durations.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    if num.is_empty() {
        return Err(format!("is not a duration; {DURATION_HELP}"));
    }
    let n: u64 = num
        .parse()
        .map_err(|_| format!("is too large; {DURATION_HELP}"))?;
    let micros_per = match unit {
        "us" => 1,
        "ms" => 1_000,
        "s" => 1_000_000,
        "m" => 60_000_000,
        "h" => 3_600_000_000,
        "d" => 86_400_000_000,
        _ => return Err(format!("has no valid unit; {DURATION_HELP}")),
    };
    n.checked_mul(micros_per)
        .map(Duration::from_micros)
        .ok_or_else(|| format!("is too large; {DURATION_HELP}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units_only() {
        assert_eq!(parse_duration("20ms"), Ok(Duration::from_millis(20)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("500us"), Ok(Duration::from_micros(500)));
        assert!(parse_duration("20").is_err());
        assert!(parse_duration("1.5s").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("ms").is_err());
        assert!(parse_duration("99999999999999999999s").is_err());
    }
}
