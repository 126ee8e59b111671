//! Accuracy: did each virtual client get what its limit allows, no more, no less?
//!
//! The bench cannot see when the gateway decided, only when a request left and when its answer
//! came back. So each bound uses the span that is kindest to the gateway: the most a client may
//! be admitted is computed over the widest span (first request sent to last response
//! received), and the least it must be admitted over the narrowest (first response received to
//! last request sent). Network latency therefore never shows up as inaccuracy.

use std::collections::BTreeMap;
use std::time::Duration;

use clap::ValueEnum;
use serde::Serialize;

/// The algorithm the gateway runs, which decides the formula for what a client may be admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum Algorithm {
    /// Capacity `burst`, refilled at limit/period.
    TokenBucket,
    /// GCRA with tolerance from `burst`: the same bound as a token bucket.
    Gcra,
    /// A meter draining at limit/period with capacity `burst`: the same bound.
    LeakyBucket,
    /// Exact: at most `limit` in any window of length `period`.
    SlidingWindowLog,
    /// At most `limit` per window aligned to the Unix epoch (the estimate never exceeds it).
    SlidingWindowCounter,
    /// At most `limit` per window aligned to the Unix epoch.
    FixedWindow,
}

impl Algorithm {
    /// The name used in flags, config and reports.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::Gcra => "gcra",
            Algorithm::LeakyBucket => "leaky_bucket",
            Algorithm::SlidingWindowLog => "sliding_window_log",
            Algorithm::SlidingWindowCounter => "sliding_window_counter",
            Algorithm::FixedWindow => "fixed_window",
        }
    }

    /// The formula, as printed in reports.
    pub fn formula(self) -> &'static str {
        match self {
            Algorithm::TokenBucket | Algorithm::Gcra | Algorithm::LeakyBucket => {
                "allowed = burst + floor(elapsed * limit / period)"
            }
            Algorithm::SlidingWindowLog => "allowed = limit * (floor(elapsed / period) + 1)",
            Algorithm::SlidingWindowCounter | Algorithm::FixedWindow => {
                "allowed = limit * (epoch-aligned windows touched by the span)"
            }
        }
    }
}

/// One limit a client is subject to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Limit {
    /// The policy name, when the gateway told it.
    pub name: Option<String>,
    /// Requests per period.
    pub limit: u64,
    /// The period, in milliseconds in reports.
    #[serde(rename = "period_ms", serialize_with = "serialize_millis")]
    pub period: Duration,
    /// Requests admitted at once from a fresh state.
    pub burst: u64,
}

fn serialize_millis<S: serde::Serializer>(value: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u128(value.as_millis())
}

/// A stretch of wall-clock time, in nanoseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// Start, inclusive.
    pub start_ns: u128,
    /// End, at least `start_ns`.
    pub end_ns: u128,
}

impl Span {
    /// The span's length.
    pub fn elapsed_ns(self) -> u128 {
        self.end_ns.saturating_sub(self.start_ns)
    }
}

/// What `limit` allows one client over `span` under `algorithm`.
pub fn allowed(algorithm: Algorithm, limit: &Limit, span: Span) -> u64 {
    let period = limit.period.as_nanos().max(1);
    let elapsed = span.elapsed_ns();
    let allowed: u128 = match algorithm {
        Algorithm::TokenBucket | Algorithm::Gcra | Algorithm::LeakyBucket => {
            u128::from(limit.burst) + elapsed.saturating_mul(u128::from(limit.limit)) / period
        }
        Algorithm::SlidingWindowLog => u128::from(limit.limit) * (elapsed / period + 1),
        Algorithm::SlidingWindowCounter | Algorithm::FixedWindow => {
            let windows = span.end_ns.max(span.start_ns) / period - span.start_ns / period + 1;
            u128::from(limit.limit) * windows
        }
    };
    u64::try_from(allowed).unwrap_or(u64::MAX)
}

/// The least of what every limit allows: a request must pass all of them.
pub fn allowed_by_all(algorithm: Algorithm, limits: &[Limit], span: Span) -> u64 {
    limits
        .iter()
        .map(|limit| allowed(algorithm, limit, span))
        .min()
        .unwrap_or(u64::MAX)
}

/// Parses a `RateLimit-Policy` header (`"api";q=100;w=60, "burst";q=10;w=1`). Items without
/// both `q` and `w` are skipped; `burst` is taken to equal `q`, the gateway's default.
pub fn parse_policy_header(value: &str) -> Vec<Limit> {
    split_outside_quotes(value, ',')
        .into_iter()
        .filter_map(|item| {
            let mut parts = split_outside_quotes(item, ';').into_iter();
            let name = parts.next()?.trim().trim_matches('"').to_owned();
            let (mut quota, mut window) = (None, None);
            for param in parts {
                let Some((key, val)) = param.split_once('=') else {
                    continue;
                };
                match key.trim() {
                    "q" => quota = val.trim().parse::<u64>().ok(),
                    "w" => window = val.trim().parse::<u64>().ok(),
                    _ => {}
                }
            }
            let (quota, window) = (quota?, window?);
            (quota > 0 && window > 0).then(|| Limit {
                name: (!name.is_empty()).then_some(name),
                limit: quota,
                period: Duration::from_secs(window),
                burst: quota,
            })
        })
        .collect()
}

fn split_outside_quotes(value: &str, separator: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (index, c) in value.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            c if c == separator && !quoted => {
                parts.push(&value[start..index]);
                start = index + c.len_utf8();
            }
            _ => {}
        }
    }
    parts.push(&value[start..]);
    parts
}

/// What one virtual client offered and got, with the spans its decisions fall in.
#[derive(Debug, Clone, Copy)]
pub struct ClientObservation {
    /// Answered 2xx.
    pub admitted: u64,
    /// Answered 429.
    pub limited: u64,
    /// The widest span the decisions can lie in: first sent to last received.
    pub widest: Span,
    /// The narrowest span the decisions must cover: first received to last sent (empty when
    /// the client's requests overlapped entirely).
    pub narrowest: Span,
}

/// One client's line in the accuracy report.
#[derive(Debug, Clone, Serialize)]
pub struct ClientAccuracy {
    /// The identity the client sent.
    pub client: String,
    /// Requests that got a decision: admitted + limited.
    pub offered: u64,
    /// Answered 2xx.
    pub admitted: u64,
    /// Answered 429.
    pub limited: u64,
    /// The most the limit allows over the widest span.
    pub allowed: u64,
    /// The least the limit guarantees over the narrowest span.
    pub allowed_at_least: u64,
    /// admitted - allowed, when positive.
    pub over: u64,
    /// min(offered, allowed_at_least) - admitted, when positive.
    pub under: u64,
    /// The widest span, in milliseconds.
    pub elapsed_ms: u128,
}

/// How over- or under-admission spreads across clients.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Spread {
    /// Clients with a non-zero amount.
    pub clients: u64,
    /// The largest amount for one client.
    pub max: u64,
    /// The sum over clients.
    pub total: u64,
    /// Amount -> number of clients with it (non-zero amounts only).
    pub distribution: BTreeMap<u64, u64>,
}

impl Spread {
    fn add(&mut self, amount: u64) {
        if amount == 0 {
            return;
        }
        self.clients += 1;
        self.max = self.max.max(amount);
        self.total += amount;
        *self.distribution.entry(amount).or_default() += 1;
    }
}

/// The accuracy section of a bench report.
#[derive(Debug, Clone, Serialize)]
pub struct AccuracyReport {
    /// The algorithm whose formula was used.
    pub algorithm: Algorithm,
    /// `flags` or `header` (RateLimit-Policy from the gateway).
    pub source: &'static str,
    /// The limits each client is subject to; allowed is the least over them.
    pub limits: Vec<Limit>,
    /// The formula, in words.
    pub formula: &'static str,
    /// Clients with at least one decision.
    pub clients: u64,
    /// Admitted beyond what the limit allows.
    pub over_admission: Spread,
    /// Denied although the limit allowed it.
    pub under_admission: Spread,
    /// One line per client, in client order.
    pub per_client: Vec<ClientAccuracy>,
}

/// Judges every client; `observations` pairs each client's identity with what it saw.
pub fn assess<'a>(
    algorithm: Algorithm,
    source: &'static str,
    limits: Vec<Limit>,
    observations: impl IntoIterator<Item = (&'a str, ClientObservation)>,
) -> AccuracyReport {
    let mut report = AccuracyReport {
        algorithm,
        source,
        formula: algorithm.formula(),
        clients: 0,
        over_admission: Spread::default(),
        under_admission: Spread::default(),
        per_client: Vec::new(),
        limits,
    };
    for (client, seen) in observations {
        let offered = seen.admitted + seen.limited;
        if offered == 0 {
            continue;
        }
        let allowed = allowed_by_all(algorithm, &report.limits, seen.widest);
        let at_least = allowed_by_all(algorithm, &report.limits, seen.narrowest).min(allowed);
        let over = seen.admitted.saturating_sub(allowed);
        let under = offered.min(at_least).saturating_sub(seen.admitted);
        report.clients += 1;
        report.over_admission.add(over);
        report.under_admission.add(under);
        report.per_client.push(ClientAccuracy {
            client: client.to_owned(),
            offered,
            admitted: seen.admitted,
            limited: seen.limited,
            allowed,
            allowed_at_least: at_least,
            over,
            under,
            elapsed_ms: seen.widest.elapsed_ns() / 1_000_000,
        });
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u128 = 1_000_000_000;

    fn limit(limit: u64, period_s: u64, burst: u64) -> Limit {
        Limit {
            name: None,
            limit,
            period: Duration::from_secs(period_s),
            burst,
        }
    }

    fn span(start_s: f64, end_s: f64) -> Span {
        Span {
            start_ns: (start_s * SECOND as f64) as u128,
            end_ns: (end_s * SECOND as f64) as u128,
        }
    }

    #[test]
    fn a_bucket_allows_its_burst_plus_what_refilled() {
        let quota = limit(100, 60, 100);
        assert_eq!(allowed(Algorithm::TokenBucket, &quota, span(0.0, 0.0)), 100);
        assert_eq!(
            allowed(Algorithm::TokenBucket, &quota, span(0.0, 30.0)),
            150
        );
        // 0.59 s refills 0.98 of a token: not one yet.
        assert_eq!(allowed(Algorithm::Gcra, &quota, span(10.0, 10.59)), 100);
        assert_eq!(
            allowed(Algorithm::LeakyBucket, &quota, span(10.0, 10.6)),
            101
        );
        let bursty = limit(10, 1, 50);
        assert_eq!(allowed(Algorithm::TokenBucket, &bursty, span(0.0, 2.0)), 70);
    }

    #[test]
    fn the_boundary_scenario_bounds_fixed_window_at_two_windows() {
        // DESIGN.md: 100/min, requests at 59.9 s and 60.1 s: fixed_window admits 200.
        let quota = limit(100, 60, 100);
        let boundary = span(59.9, 60.1);
        assert_eq!(allowed(Algorithm::FixedWindow, &quota, boundary), 200);
        assert_eq!(
            allowed(Algorithm::SlidingWindowCounter, &quota, boundary),
            200
        );
        assert_eq!(allowed(Algorithm::TokenBucket, &quota, boundary), 100);
        assert_eq!(allowed(Algorithm::SlidingWindowLog, &quota, boundary), 100);
        assert_eq!(
            allowed(Algorithm::FixedWindow, &quota, span(0.5, 59.5)),
            100
        );
    }

    #[test]
    fn a_sliding_log_allows_one_limit_per_period_started() {
        let quota = limit(10, 1, 10);
        assert_eq!(
            allowed(Algorithm::SlidingWindowLog, &quota, span(3.0, 3.999)),
            10
        );
        assert_eq!(
            allowed(Algorithm::SlidingWindowLog, &quota, span(3.0, 4.0)),
            20
        );
        assert_eq!(
            allowed(Algorithm::SlidingWindowLog, &quota, span(3.0, 5.5)),
            30
        );
    }

    #[test]
    fn the_tightest_limit_wins() {
        let limits = [limit(100, 60, 100), limit(10, 1, 10)];
        assert_eq!(
            allowed_by_all(Algorithm::TokenBucket, &limits, span(0.0, 0.5)),
            15
        );
        assert_eq!(
            allowed_by_all(Algorithm::TokenBucket, &limits, span(0.0, 30.0)),
            150
        );
        assert_eq!(
            allowed_by_all(Algorithm::TokenBucket, &[], span(0.0, 1.0)),
            u64::MAX
        );
    }

    #[test]
    fn algorithm_names_agree_across_flags_reports_and_json() {
        for algorithm in Algorithm::value_variants() {
            let flag = algorithm
                .to_possible_value()
                .map(|v| v.get_name().to_owned());
            assert_eq!(flag.as_deref(), Some(algorithm.name()));
            let json = serde_json::to_string(algorithm).unwrap_or_default();
            assert_eq!(json, format!("\"{}\"", algorithm.name()));
        }
    }

    #[test]
    fn policy_headers_parse_into_limits() {
        let limits = parse_policy_header(r#""api";q=100;w=60, "per-second";q=5;w=1"#);
        assert_eq!(limits.len(), 2);
        assert_eq!(limits[0].name.as_deref(), Some("api"));
        assert_eq!(limits[0].limit, 100);
        assert_eq!(limits[0].burst, 100);
        assert_eq!(limits[0].period, Duration::from_secs(60));
        assert_eq!(limits[1].limit, 5);
        assert_eq!(limits[1].period, Duration::from_secs(1));
    }

    #[test]
    fn malformed_policy_items_are_skipped() {
        assert!(parse_policy_header("").is_empty());
        assert!(parse_policy_header(r#""a";q=10"#).is_empty());
        assert!(parse_policy_header(r#""a";q=x;w=1"#).is_empty());
        assert!(parse_policy_header(r#""a";q=0;w=1"#).is_empty());
        let limits = parse_policy_header(r#""odd,name";w=2;q=3;pk=:abc=:, junk"#);
        assert_eq!(limits.len(), 1);
        assert_eq!(limits[0].name.as_deref(), Some("odd,name"));
        assert_eq!(limits[0].limit, 3);
    }

    fn seen(admitted: u64, limited: u64, widest: Span, narrowest: Span) -> ClientObservation {
        ClientObservation {
            admitted,
            limited,
            widest,
            narrowest,
        }
    }

    /// The report of a token bucket of 5 an hour (burst 5) for `busy` clients, each
    /// `(name, admitted, limited)` over the same two seconds, then `idle` ones that sent nothing.
    fn assess_five_an_hour(
        source: &'static str,
        busy: &[(&str, u64, u64)],
        idle: &[&str],
    ) -> AccuracyReport {
        let busy = busy.iter().map(|&(name, admitted, limited)| {
            let observed = seen(admitted, limited, span(0.0, 2.0), span(0.01, 1.99));
            (name, observed)
        });
        let nothing = || seen(0, 0, span(0.0, 0.0), span(0.0, 0.0));
        let idle = idle.iter().map(|&name| (name, nothing()));
        let quota = vec![limit(5, 3600, 5)];
        assess(Algorithm::TokenBucket, source, quota, busy.chain(idle))
    }

    #[test]
    fn an_exact_limiter_shows_no_over_or_under_admission() {
        let report = assess_five_an_hour("flags", &[("a", 5, 40), ("b", 5, 0)], &["idle"]);
        assert_eq!(report.clients, 2);
        assert_eq!(report.over_admission.total, 0);
        assert_eq!(report.under_admission.total, 0);
        assert_eq!(report.per_client[0].allowed, 5);
        assert_eq!(report.per_client[0].offered, 45);
    }

    #[test]
    fn leaks_and_stinginess_are_measured_per_client() {
        let busy = [
            ("leaky", 8, 10),
            ("leakier", 9, 10),
            ("stingy", 2, 10),
            ("quiet", 1, 0),
        ];
        let report = assess_five_an_hour("header", &busy, &[]);
        assert_eq!(report.over_admission.clients, 2);
        assert_eq!(report.over_admission.max, 4);
        assert_eq!(report.over_admission.total, 7);
        assert_eq!(report.over_admission.distribution.get(&3), Some(&1));
        assert_eq!(report.over_admission.distribution.get(&4), Some(&1));
        assert_eq!(report.under_admission.clients, 1);
        assert_eq!(report.under_admission.total, 3);
        assert_eq!(report.per_client[3].under, 0, "offered less than allowed");
    }
}
