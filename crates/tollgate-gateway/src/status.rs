//! The data behind the status page (`GET /status.json` on the admin port).
//!
//! Rates need two readings of the same counters, so a task reads the limiter's counters once a
//! second into a ring of [`RING`] snapshots (five minutes); the JSON endpoint turns the ring
//! into per-second rates and latency quantiles, and adds the counters as they are at the time
//! of the request. Nothing here runs per request of the gateway: the counters are the ones
//! `/metrics` shows, and the most limited clients come from the limiter's bounded summary
//! (keyed hashes only, never identities).

mod quantile;

use crate::metrics::HttpMetrics;
use quantile::quantile_ms;
use serde::Serialize;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;
use tollgate::{LeaseKind, Limiter, Metrics, Outcome, LATENCY_BUCKETS_US};

/// Snapshots kept: one a second for five minutes.
pub const RING: usize = 301;
/// How often the sampler reads the counters.
pub const INTERVAL: Duration = Duration::from_secs(1);
/// The headline rates average over this many seconds.
const RATE_WINDOW_S: u64 = 5;
/// The headline latency quantiles are over this many seconds.
const LATENCY_WINDOW_S: u64 = 10;
/// Rows of the most limited clients.
const TOP_K: usize = 10;
/// The window of the most limited clients: the current minute and the four before it (see
/// `Metrics::top_limited`), so between four and five minutes.
const TOP_WINDOW_S: u64 = 300;

const LEASE_KINDS: [LeaseKind; 3] = [LeaseKind::Granted, LeaseKind::Used, LeaseKind::Returned];

/// One reading of one policy's counters.
#[derive(Debug, Clone)]
struct PolicyCounts {
    name: String,
    decisions: [u64; 7],
    deny_cache_hits: u64,
    lease: [u64; 3],
}

/// One reading of every counter the page shows.
#[derive(Debug, Clone)]
struct Snapshot {
    at_ms: u64,
    policies: Vec<PolicyCounts>,
    latency: [u64; LATENCY_BUCKETS_US.len()],
    latency_count: u64,
    store_calls: u64,
    errors: Vec<(&'static str, u64)>,
    breaker_open: bool,
    memory_keys: u64,
}

impl Snapshot {
    fn take(limiter: &Limiter, at_ms: u64) -> Self {
        let m: &Metrics = limiter.metrics();
        let policies = m
            .policies()
            .iter()
            .map(|p| PolicyCounts {
                name: p.name().to_string(),
                decisions: Outcome::ALL.map(|o| p.decisions(o)),
                deny_cache_hits: p.deny_cache_hits(),
                lease: LEASE_KINDS.map(|k| p.lease_units(k)),
            })
            .collect();
        let (latency, latency_count) = m.store_latency();
        let (breaker_open, memory_keys) = gauges(limiter);
        Self {
            at_ms,
            policies,
            latency,
            latency_count,
            store_calls: m.store_calls(),
            errors: m.store_errors_by_kind().collect(),
            breaker_open,
            memory_keys,
        }
    }

    fn policy(&self, name: &str) -> Option<&PolicyCounts> {
        self.policies.iter().find(|p| p.name == name)
    }
}

/// The two gauges the limiter exposes only in its metrics text, `tollgate_breaker_open` and
/// `tollgate_memory_keys`, read from there (once a second and per page refresh: cheap).
fn gauges(limiter: &Limiter) -> (bool, u64) {
    let mut text = String::with_capacity(8 * 1024);
    limiter.render_metrics(&mut text);
    let value = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (
        value("tollgate_breaker_open") == 1,
        value("tollgate_memory_keys"),
    )
}

/// Milliseconds since the Unix epoch.
fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The ring of snapshots, shared by the sampler and the admin server.
#[derive(Debug)]
pub struct History {
    started_ms: u64,
    ring: Mutex<VecDeque<Snapshot>>,
}

impl Default for History {
    fn default() -> Self {
        Self {
            started_ms: unix_ms(SystemTime::now()),
            ring: Mutex::new(VecDeque::with_capacity(RING)),
        }
    }
}

impl History {
    /// Reads the counters of `limiter` now into the ring (dropping the oldest when full).
    pub fn sample(&self, limiter: &Limiter) {
        let snap = Snapshot::take(limiter, unix_ms(SystemTime::now()));
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        if ring.len() == RING {
            ring.pop_front();
        }
        ring.push_back(snap);
    }

    /// The status document: counters as of now, rates and quantiles from the ring.
    pub fn status(&self, limiter: &Limiter, http: &HttpMetrics) -> Status {
        let now = SystemTime::now();
        let now_ms = unix_ms(now);
        let live = Snapshot::take(limiter, now_ms);
        let ring: Vec<Snapshot> = self
            .ring
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect();
        let rates = Rates::over(&ring, RATE_WINDOW_S);
        let now_us = now_ms.saturating_mul(1_000);
        let (top, limited) = limiter.metrics().top_limited(TOP_K, now_us);
        Status {
            version: env!("CARGO_PKG_VERSION"),
            now_ms,
            uptime_s: now_ms.saturating_sub(self.started_ms) / 1_000,
            breaker_open: live.breaker_open,
            outcomes: Outcome::ALL.map(Outcome::as_str),
            rate_window_s: RATE_WINDOW_S,
            policies: live
                .policies
                .iter()
                .map(|p| policy_status(p, &rates))
                .collect(),
            store: store_status(&live, &ring, &rates),
            responses: ResponseCounts {
                limited_429: http.count(429),
                unavailable_503: http.count(503),
            },
            series: series(&ring),
            top_limited: TopLimited {
                window_s: TOP_WINDOW_S,
                limited,
                clients: top
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
}

/// Reads the counters into `history` every [`INTERVAL`] until `stop` changes.
pub async fn run_sampler(history: Arc<History>, limiter: Limiter, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => history.sample(&limiter),
            _ = stop.changed() => break,
        }
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
    outcomes: [&'static str; 7],
    rate_window_s: u64,
    policies: Vec<PolicyStatus>,
    store: StoreStatus,
    responses: ResponseCounts,
    series: Series,
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
}

fn policy_status(p: &PolicyCounts, rates: &Rates<'_>) -> PolicyStatus {
    let counter = |total: u64, f: &dyn Fn(&PolicyCounts) -> u64| Counter {
        total,
        rate: rates.rate(|s| s.policy(&p.name).map(f)),
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

fn bucket_delta(new: &Snapshot, old: &Snapshot) -> [u64; LATENCY_BUCKETS_US.len()] {
    let mut d = [0; LATENCY_BUCKETS_US.len()];
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
                .map(|p| {
                    let before = o.policy(&p.name).map_or(0, |q| q.decisions[i]);
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
