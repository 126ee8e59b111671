//! The JSON document of `/status.json`: the counters of one reading, and from the ring of
//! readings the rates per second, the store latency quantiles and the per-second series the
//! page draws.

use super::quantile::quantile_ms;
use super::PolicyCounts;
use super::Snapshot;
use crate::http::metrics::HttpMetrics;
use crate::live::ConfigStatus;
use serde::Serialize;
use tollgate::metrics::{MostLimited, LATENCY_BUCKETS};
use tollgate::Outcome;

/// The headline rates average over this many seconds.
const RATE_WINDOW_S: u64 = 5;
/// The headline latency quantiles are over this many seconds.
const LATENCY_WINDOW_S: u64 = 10;
/// The window of the most limited clients: the current minute and the four before it (see
/// `Limiter::top_limited`), so between four and five minutes.
const TOP_WINDOW_S: u64 = 300;

/// The document from the counters as of now (`live`), the ring of readings, the process's
/// start, the most limited clients (and all limited requests of their window) and the HTTP
/// counters.
pub(super) fn build(
    live: &Snapshot,
    ring: &[Snapshot],
    started_ms: u64,
    top: MostLimited,
    http: &HttpMetrics,
    config: ConfigStatus,
) -> Status {
    let rates = Rates::over(ring, RATE_WINDOW_S);
    Status {
        version: env!("CARGO_PKG_VERSION"),
        now_ms: live.at_ms,
        uptime_s: live.at_ms.saturating_sub(started_ms) / 1_000,
        breaker_open: live.breaker_open,
        outcomes: Outcome::ALL.map(Outcome::as_str),
        rate_window_s: RATE_WINDOW_S,
        policies: live
            .policies
            .iter()
            .enumerate()
            .map(|(i, p)| policy_status(i, p, &rates))
            .collect(),
        store: store_status(live, ring, &rates),
        responses: ResponseCounts {
            limited_429: http.count(429),
            unavailable_503: http.count(503),
        },
        series: series(ring),
        config,
        top_limited: TopLimited {
            window_s: TOP_WINDOW_S,
            limited: top.limited,
            clients: top
                .clients
                .into_iter()
                .map(|c| LimitedRow {
                    client: c.client.to_string(),
                    policy: c.policy.to_string(),
                    count: c.count,
                    at_least: c.count - c.error,
                })
                .collect(),
        },
    }
}

/// Differences between the newest snapshot and one about `window` seconds older.
struct Rates<'a> {
    new: Option<&'a Snapshot>,
    old: Option<&'a Snapshot>,
}

impl<'a> Rates<'a> {
    fn over(ring: &'a [Snapshot], window_s: u64) -> Self {
        let new = ring.last();
        let old = new.and_then(|n| {
            let since = n.at_ms.saturating_sub(window_s * 1_000);
            ring.iter()
                .find(|s| s.at_ms >= since && s.at_ms < n.at_ms)
                .or_else(|| ring.iter().rev().nth(1))
        });
        Self { new, old }
    }

    fn seconds(&self) -> Option<f64> {
        match (self.new, self.old) {
            (Some(n), Some(o)) if n.at_ms > o.at_ms => Some((n.at_ms - o.at_ms) as f64 / 1e3),
            _ => None,
        }
    }

    /// Per-second rate of the counter `f` reads, when two readings exist.
    fn rate(&self, f: impl Fn(&Snapshot) -> Option<u64>) -> Option<f64> {
        let (n, o, s) = (self.new?, self.old?, self.seconds()?);
        let delta = f(n)?.saturating_sub(f(o).unwrap_or(0));
        Some(round2(delta as f64 / s))
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// The page's whole document.
#[derive(Debug, Serialize)]
pub struct Status {
    version: &'static str,
    now_ms: u64,
    uptime_s: u64,
    breaker_open: bool,
    outcomes: [&'static str; Outcome::ALL.len()],
    rate_window_s: u64,
    policies: Vec<PolicyStatus>,
    store: StoreStatus,
    responses: ResponseCounts,
    series: Series,
    /// The config serving now and its reloads.
    config: ConfigStatus,
    top_limited: TopLimited,
}

/// A counter as of now and its recent rate per second (`null` until two readings exist).
#[derive(Debug, Serialize)]
struct Counter {
    total: u64,
    rate: Option<f64>,
}

#[derive(Debug, Serialize)]
struct PolicyStatus {
    name: String,
    /// By outcome, in the order of `outcomes`.
    decisions: Vec<Counter>,
    deny_cache_hits: Counter,
    lease_granted: Counter,
    lease_used: Counter,
    lease_returned: Counter,
    /// Costs known later: units given back and charged past the estimate.
    settled_refunded: Counter,
    settled_charged: Counter,
    /// Requests this gateway holds in flight now, and holds the store dropped after hold_ttl.
    in_flight: u64,
    holds_expired: Counter,
}

fn policy_status(index: usize, p: &PolicyCounts, rates: &Rates<'_>) -> PolicyStatus {
    let counter = |total: u64, f: &dyn Fn(&PolicyCounts) -> u64| Counter {
        total,
        rate: rates.rate(|s| s.policy(index, &p.name).map(f)),
    };
    let decisions = (0..Outcome::ALL.len())
        .map(|i| counter(p.decisions[i], &|c| c.decisions[i]))
        .collect();
    PolicyStatus {
        name: p.name.clone(),
        decisions,
        deny_cache_hits: counter(p.deny_cache_hits, &|c| c.deny_cache_hits),
        lease_granted: counter(p.lease[0], &|c| c.lease[0]),
        lease_used: counter(p.lease[1], &|c| c.lease[1]),
        lease_returned: counter(p.lease[2], &|c| c.lease[2]),
        settled_refunded: counter(p.settled[0], &|c| c.settled[0]),
        settled_charged: counter(p.settled[1], &|c| c.settled[1]),
        in_flight: p.in_flight,
        holds_expired: counter(p.holds_expired, &|c| c.holds_expired),
    }
}

#[derive(Debug, Serialize)]
struct StoreStatus {
    calls: Counter,
    /// Over the last `latency_window_s` seconds; `null` without store calls in that time.
    p50_ms: Option<f64>,
    p99_ms: Option<f64>,
    latency_window_s: u64,
    errors: Vec<ErrorCount>,
    /// Keys held by in-process stores (the memory store and the local fallback).
    memory_keys: u64,
}

#[derive(Debug, Serialize)]
struct ErrorCount {
    kind: &'static str,
    total: u64,
    rate: Option<f64>,
}

fn store_status(live: &Snapshot, ring: &[Snapshot], rates: &Rates<'_>) -> StoreStatus {
    let window = Rates::over(ring, LATENCY_WINDOW_S);
    let (p50_ms, p99_ms) = match (window.new, window.old) {
        (Some(n), Some(o)) => {
            let delta = bucket_delta(n, o);
            let count = n.latency_count.saturating_sub(o.latency_count);
            (
                quantile_ms(&delta, count, 0.50),
                quantile_ms(&delta, count, 0.99),
            )
        }
        _ => (None, None),
    };
    StoreStatus {
        calls: Counter {
            total: live.store_calls,
            rate: rates.rate(|s| Some(s.store_calls)),
        },
        p50_ms,
        p99_ms,
        latency_window_s: LATENCY_WINDOW_S,
        memory_keys: live.memory_keys,
        errors: live
            .errors
            .iter()
            .map(|&(kind, total)| ErrorCount {
                kind,
                total,
                rate: rates.rate(|s| s.errors.iter().find(|(k, _)| *k == kind).map(|(_, n)| *n)),
            })
            .collect(),
    }
}

fn bucket_delta(new: &Snapshot, old: &Snapshot) -> [u64; LATENCY_BUCKETS.len()] {
    let mut d = [0; LATENCY_BUCKETS.len()];
    for (i, v) in d.iter_mut().enumerate() {
        *v = new.latency[i].saturating_sub(old.latency[i]);
    }
    d
}

#[derive(Debug, Serialize)]
struct ResponseCounts {
    limited_429: u64,
    unavailable_503: u64,
}

/// Per-second values over the ring, one per pair of consecutive snapshots, for the charts.
#[derive(Debug, Serialize)]
struct Series {
    /// The end of each second, Unix milliseconds.
    t_ms: Vec<u64>,
    /// Decisions per second over all policies, by outcome (in the order of `outcomes`).
    decisions: Vec<Vec<f64>>,
    /// Store latency quantiles of each second (`null` in a second without store calls).
    p50_ms: Vec<Option<f64>>,
    p99_ms: Vec<Option<f64>>,
    /// 1 where the breaker was open.
    breaker_open: Vec<u8>,
}

fn series(ring: &[Snapshot]) -> Series {
    let mut s = Series {
        t_ms: Vec::new(),
        decisions: vec![Vec::new(); Outcome::ALL.len()],
        p50_ms: Vec::new(),
        p99_ms: Vec::new(),
        breaker_open: Vec::new(),
    };
    for pair in ring.windows(2) {
        let (o, n) = (&pair[0], &pair[1]);
        let secs = n.at_ms.saturating_sub(o.at_ms) as f64 / 1e3;
        if secs <= 0.0 {
            continue;
        }
        s.t_ms.push(n.at_ms);
        for (i, out) in s.decisions.iter_mut().enumerate() {
            // A policy registered between the two readings counts from zero.
            let delta: u64 = n
                .policies
                .iter()
                .enumerate()
                .map(|(j, p)| {
                    let before = o.policy(j, &p.name).map_or(0, |q| q.decisions[i]);
                    p.decisions[i].saturating_sub(before)
                })
                .sum();
            out.push(round2(delta as f64 / secs));
        }
        let delta = bucket_delta(n, o);
        let count = n.latency_count.saturating_sub(o.latency_count);
        s.p50_ms.push(quantile_ms(&delta, count, 0.50));
        s.p99_ms.push(quantile_ms(&delta, count, 0.99));
        s.breaker_open.push(u8::from(n.breaker_open));
    }
    s
}

#[derive(Debug, Serialize)]
struct TopLimited {
    window_s: u64,
    /// Limited requests in the window, all clients.
    limited: u64,
    clients: Vec<LimitedRow>,
}

#[derive(Debug, Serialize)]
struct LimitedRow {
    /// The client's keyed hash (32 hex digits, as in the store's keys).
    client: String,
    policy: String,
    /// Limited requests in the window; never below the true count.
    count: u64,
    /// A lower bound of the same (the summary's error taken off).
    at_least: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(at_ms: u64, policies: &[(&str, u64, u64)], calls_at_45us: u64) -> Snapshot {
        let mut latency = [0; LATENCY_BUCKETS.len()];
        // 45 us falls in the (40, 50] us bucket.
        latency[4] = calls_at_45us;
        Snapshot {
            at_ms,
            policies: policies
                .iter()
                .map(|&(name, allowed, limited)| PolicyCounts {
                    name: name.to_string(),
                    decisions: [allowed, limited, 0, 0, 0, 0, 0, 0],
                    deny_cache_hits: 0,
                    lease: [0; 3],
                    settled: [0; 2],
                    in_flight: 0,
                    holds_expired: 0,
                })
                .collect(),
            latency,
            latency_count: calls_at_45us,
            store_calls: calls_at_45us,
            errors: Vec::new(),
            breaker_open: false,
            memory_keys: 0,
        }
    }

    #[test]
    fn rates_are_differences_over_the_window_and_series_per_second() {
        let ring = [
            reading(10_000, &[("api", 0, 0)], 0),
            reading(11_000, &[("api", 10, 1)], 0),
            reading(12_000, &[("api", 30, 1), ("new", 4, 0)], 100),
        ];
        let rates = Rates::over(&ring, 5);
        assert_eq!(
            rates.rate(|s| s.policy(0, "api").map(|p| p.decisions[0])),
            Some(15.0)
        );
        // A policy absent from the older reading counts from zero.
        assert_eq!(
            rates.rate(|s| s.policy(1, "new").map(|p| p.decisions[0])),
            Some(2.0)
        );
        // The index is a hint: a wrong one still finds the policy by name, or nothing.
        assert_eq!(ring[1].policy(5, "api").map(|p| p.decisions[0]), Some(10));
        assert!(ring[1].policy(0, "new").is_none());
        let s = series(&ring);
        assert_eq!(s.t_ms, [11_000, 12_000]);
        assert_eq!(s.decisions[0], [10.0, 24.0]);
        assert_eq!(s.decisions[1], [1.0, 0.0]);
        assert_eq!(s.p50_ms, [None, Some(0.045)]);
    }

    #[test]
    fn one_reading_has_no_rate_yet() {
        let ring = [reading(10_000, &[("api", 5, 0)], 0)];
        let rates = Rates::over(&ring, 5);
        assert_eq!(
            rates.rate(|s| s.policy(0, "api").map(|p| p.decisions[0])),
            None
        );
        assert!(series(&ring).t_ms.is_empty());
    }
}
