//! The data behind the status page (`GET /status.json` on the admin port).
//!
//! Rates need two readings of the same counters, so a task reads the limiter's counters once a
//! second into a ring of [`RING`] snapshots (five minutes); the JSON endpoint turns the ring
//! into per-second rates and latency quantiles, and adds the counters as they are at the time
//! of the request. Nothing here runs per request of the gateway: the counters are the ones
//! `/metrics` shows, and the most limited clients come from the limiter's bounded summary
//! (keyed hashes only, never identities).

mod document;
mod quantile;

pub use document::Status;

use crate::http::metrics::HttpMetrics;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;
use tollgate::metrics::{LeaseKind, LATENCY_BUCKETS};
use tollgate::{Limiter, Outcome};

/// Snapshots kept: one a second for five minutes.
pub const RING: usize = 301;
/// How often the sampler reads the counters.
pub const INTERVAL: Duration = Duration::from_secs(1);
/// Rows of the most limited clients.
const TOP_K: usize = 10;

/// One reading of one policy's counters.
#[derive(Debug, Clone)]
struct PolicyCounts {
    name: String,
    decisions: [u64; Outcome::ALL.len()],
    deny_cache_hits: u64,
    lease: [u64; 3],
    /// Settled after the response: [refunded, charged] units.
    settled: [u64; 2],
    /// Holds in flight now (a gauge) and holds the store dropped.
    in_flight: u64,
    holds_expired: u64,
}

/// One reading of every counter the page shows.
#[derive(Debug, Clone)]
struct Snapshot {
    at_ms: u64,
    policies: Vec<PolicyCounts>,
    latency: [u64; LATENCY_BUCKETS.len()],
    latency_count: u64,
    store_calls: u64,
    errors: Vec<(&'static str, u64)>,
    breaker_open: bool,
    memory_keys: u64,
}

impl Snapshot {
    fn take(limiter: &Limiter, at_ms: u64) -> Self {
        let m = limiter.metrics();
        // Every override of a policy is one row, the policy's `overrides`: the page (kept for
        // minutes, served to anyone on the admin port) stays the size of the config's
        // policies, not of its overrides file. /metrics keeps one series per override.
        let mut policies: Vec<PolicyCounts> = Vec::new();
        for p in m.policies() {
            let name = match p.name().split_once(".override-") {
                Some((policy, _)) => format!("{policy}.overrides"),
                None => p.name().to_string(),
            };
            let row = match policies.iter().position(|r| r.name == name) {
                Some(i) => &mut policies[i],
                None => {
                    policies.push(PolicyCounts {
                        name,
                        decisions: [0; Outcome::ALL.len()],
                        deny_cache_hits: 0,
                        lease: [0; 3],
                        settled: [0; 2],
                        in_flight: 0,
                        holds_expired: 0,
                    });
                    let last = policies.len() - 1;
                    &mut policies[last]
                }
            };
            for (slot, o) in row.decisions.iter_mut().zip(Outcome::ALL) {
                *slot += p.decisions(o);
            }
            row.deny_cache_hits += p.deny_cache_hits();
            for (slot, k) in row.lease.iter_mut().zip(LeaseKind::ALL) {
                *slot += p.lease_units(k);
            }
            let (refunded, charged) = p.settled_units();
            row.settled[0] += refunded;
            row.settled[1] += charged;
            row.in_flight += p.in_flight();
            row.holds_expired += p.holds_expired();
        }
        let (latency, latency_count) = m.store_latency();
        Self {
            at_ms,
            policies,
            latency,
            latency_count,
            store_calls: m.store_calls(),
            errors: m
                .store_errors_by_kind()
                .map(|(kind, n)| (kind.as_str(), n))
                .collect(),
            breaker_open: m.breaker_open(),
            memory_keys: m.memory_keys() as u64,
        }
    }

    /// The policy `name`, which is the `i`-th of a newer reading: the limiter only ever adds
    /// policies, so an older reading's list is a prefix of a newer one's and the index finds
    /// it at once (the scan is for a reading that does not share the order).
    fn policy(&self, i: usize, name: &str) -> Option<&PolicyCounts> {
        match self.policies.get(i) {
            Some(p) if p.name == name => Some(p),
            _ => self.policies.iter().find(|p| p.name == name),
        }
    }
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
    pub fn status(
        &self,
        limiter: &Limiter,
        http: &HttpMetrics,
        config: crate::live::ConfigStatus,
    ) -> Status {
        let now_ms = unix_ms(SystemTime::now());
        let live = Snapshot::take(limiter, now_ms);
        let ring: Vec<Snapshot> = self
            .ring
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect();
        let top = limiter.top_limited(TOP_K);
        document::build(&live, &ring, self.started_ms, top, http, config)
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
