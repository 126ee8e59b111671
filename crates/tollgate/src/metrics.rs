//! Counters the limiter keeps for operators, rendered in the Prometheus text format. Plain
//! atomics, no registry crate: the hot path pays one relaxed increment per counter it touches.
//!
//! Only the limiter writes them. Programs read them as values: a [`Snapshot`] from
//! [`crate::Limiter::metrics`] (what `/metrics` renders, for rates and quantiles of their own),
//! and the most limited clients from [`crate::Limiter::top_limited`].

use crate::outcome::Outcome;
pub use crate::top_limited::LimitedClient;
use crate::top_limited::TopLimited;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tollgate_core::{ClientKey, Micros};

/// Upper bounds of the store latency histogram, in microseconds (what the hot path compares
/// against). Steps of 10 us up to 100 us then widening, so p50/p99/p999 of a loopback Redis
/// (tens of microseconds) are resolved.
const LATENCY_BUCKETS_US: [u64; 30] = [
    10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 125, 150, 200, 250, 300, 400, 500, 750, 1_000, 1_500,
    2_000, 3_000, 5_000, 10_000, 20_000, 50_000, 100_000, 250_000, 500_000, 1_000_000,
];

/// Upper bounds of the store latency histogram (`tollgate_store_duration_seconds`), one per
/// bucket of [`Snapshot::store_latency`]. Steps of 10 us up to 100 us then widening, so
/// p50/p99/p999 of a loopback Redis (tens of microseconds) are resolved.
pub const LATENCY_BUCKETS: [Duration; LATENCY_BUCKETS_US.len()] = {
    let mut out = [Duration::ZERO; LATENCY_BUCKETS_US.len()];
    let mut i = 0;
    while i < out.len() {
        out[i] = Duration::from_micros(LATENCY_BUCKETS_US[i]);
        i += 1;
    }
    out
};

/// Kinds of lease unit movements (`tollgate_lease_units_total{kind}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaseKind {
    /// Units taken from the shared store.
    Granted,
    /// Units spent on requests.
    Used,
    /// Units given back unused.
    Returned,
}

impl LeaseKind {
    /// Every kind, in metric order.
    pub const ALL: [LeaseKind; 3] = [LeaseKind::Granted, LeaseKind::Used, LeaseKind::Returned];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseKind::Granted => "granted",
            LeaseKind::Used => "used",
            LeaseKind::Returned => "returned",
        }
    }
}

/// Per-policy counters.
#[derive(Debug)]
pub(crate) struct PolicyStats {
    name: Arc<str>,
    decisions: [AtomicU64; Outcome::ALL.len()],
    deny_cache_hits: AtomicU64,
    lease: [AtomicU64; 3],
    /// Units settled after the response: [refunded, charged].
    settled: [AtomicU64; 2],
    /// Holds of this gateway now (`tollgate_in_flight`).
    in_flight: AtomicU64,
    /// Holds dropped by the store after `hold_ttl` without a renewal.
    holds_expired: AtomicU64,
    /// Settles not applied, by [`SettleError`].
    settle_errors: [AtomicU64; SettleError::ALL.len()],
    /// The configured quota (`tollgate_limit`): limit, period in microseconds, burst. The
    /// last policy registered under this name sets it, so after a reload it is the new quota.
    quota: [AtomicU64; 3],
    /// The limiter's summary of limited clients, shared by all its policies.
    top_limited: Arc<TopLimited>,
}

impl PolicyStats {
    pub(crate) fn new(name: &str, top_limited: Arc<TopLimited>) -> Self {
        Self {
            name: name.into(),
            decisions: Default::default(),
            deny_cache_hits: AtomicU64::new(0),
            lease: Default::default(),
            settled: Default::default(),
            in_flight: AtomicU64::new(0),
            holds_expired: AtomicU64::new(0),
            settle_errors: Default::default(),
            quota: Default::default(),
            top_limited,
        }
    }

    pub(crate) fn record(&self, outcome: Outcome) {
        self.decisions[outcome.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts `client` among the most limited clients of the last minutes when `outcome` is
    /// [`Outcome::Limited`] (any other outcome costs one comparison). The only per-request
    /// work the status page adds, and only on the rejecting path.
    pub(crate) fn record_limited(&self, client: &ClientKey, outcome: Outcome, now: Micros) {
        if outcome == Outcome::Limited {
            self.top_limited.record(client, &self.name, now);
        }
    }

    /// Sets the configured quota that `tollgate_limit` reports.
    pub(crate) fn set_quota(&self, quota: &tollgate_core::Quota) {
        let values = [quota.limit(), quota.period_micros(), quota.burst()];
        for (slot, v) in self.quota.iter().zip(values) {
            slot.store(v, Ordering::Relaxed);
        }
    }

    /// The configured quota: (limit, period in microseconds, burst); zeros before one is set.
    pub fn quota(&self) -> (u64, u64, u64) {
        let [l, p, b] = &self.quota;
        (
            l.load(Ordering::Relaxed),
            p.load(Ordering::Relaxed),
            b.load(Ordering::Relaxed),
        )
    }

    pub(crate) fn deny_cache_hit(&self) {
        self.deny_cache_hits.fetch_add(1, Ordering::Relaxed);
    }

    /// Adds `units` to a lease counter.
    pub(crate) fn lease(&self, kind: LeaseKind, units: u64) {
        self.lease[kind as usize].fetch_add(units, Ordering::Relaxed);
    }

    /// Counts units settled: given back (`refunded`) or charged past the estimate.
    pub(crate) fn settled(&self, refunded: u64, charged: u64) {
        self.settled[0].fetch_add(refunded, Ordering::Relaxed);
        self.settled[1].fetch_add(charged, Ordering::Relaxed);
    }

    /// A hold taken (`+units`) or gone (`-units`).
    pub(crate) fn hold(&self, units: u64, taken: bool) {
        if taken {
            self.in_flight.fetch_add(units, Ordering::Relaxed);
        } else {
            // Never below zero, even if a release raced a renewal's count.
            let _ = self
                .in_flight
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                    Some(v.saturating_sub(units))
                });
        }
    }

    /// Holds the store had dropped (not renewed within `hold_ttl`).
    pub(crate) fn holds_expired(&self, units: u64) {
        self.holds_expired.fetch_add(units, Ordering::Relaxed);
    }

    /// A settle not applied.
    pub(crate) fn settle_error(&self, reason: SettleError) {
        self.settle_errors[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// The count of decisions with `outcome`.
    pub(crate) fn decisions(&self, outcome: Outcome) -> u64 {
        self.decisions[outcome.index()].load(Ordering::Relaxed)
    }

    /// Requests rejected by the deny cache without a store call.
    pub(crate) fn deny_cache_hits(&self) -> u64 {
        self.deny_cache_hits.load(Ordering::Relaxed)
    }

    /// Lease units of a kind.
    pub(crate) fn lease_units(&self, kind: LeaseKind) -> u64 {
        self.lease[kind as usize].load(Ordering::Relaxed)
    }

    fn counts(&self) -> PolicyCounts {
        PolicyCounts {
            name: Arc::clone(&self.name),
            decisions: Outcome::ALL.map(|o| self.decisions(o)),
            deny_cache_hits: self.deny_cache_hits(),
            lease: LeaseKind::ALL.map(|k| self.lease_units(k)),
            settled: [0, 1].map(|i| self.settled[i].load(Ordering::Relaxed)),
            in_flight: self.in_flight.load(Ordering::Relaxed),
            holds_expired: self.holds_expired.load(Ordering::Relaxed),
            settle_errors: SettleError::ALL
                .map(|r| self.settle_errors[r as usize].load(Ordering::Relaxed)),
        }
    }
}

/// Why a store call did not answer: the `kind` label of `tollgate_store_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreErrorKind {
    /// No answer within `store.timeout`.
    Timeout,
    /// The store cannot be reached.
    Connection,
    /// The store refused the script's call.
    Script,
    /// A reply the client does not understand.
    Protocol,
    /// A Redis Cluster moving slots, failing over or down.
    Cluster,
    /// The store refused the credentials.
    Auth,
    /// The store is full: Redis past its `maxmemory` refuses writes (`noeviction`).
    Oom,
    /// The circuit breaker is open: the store was not called.
    BreakerOpen,
    /// Anything else (busy, configuration, a refused call).
    Other,
}

impl StoreErrorKind {
    /// Every kind, in metric order.
    pub const ALL: [StoreErrorKind; 9] = [
        StoreErrorKind::Timeout,
        StoreErrorKind::Connection,
        StoreErrorKind::Script,
        StoreErrorKind::Protocol,
        StoreErrorKind::Cluster,
        StoreErrorKind::Auth,
        StoreErrorKind::Oom,
        StoreErrorKind::BreakerOpen,
        StoreErrorKind::Other,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreErrorKind::Timeout => "timeout",
            StoreErrorKind::Connection => "connection",
            StoreErrorKind::Script => "script",
            StoreErrorKind::Protocol => "protocol",
            StoreErrorKind::Cluster => "cluster",
            StoreErrorKind::Auth => "auth",
            StoreErrorKind::Oom => "oom",
            StoreErrorKind::BreakerOpen => "breaker_open",
            StoreErrorKind::Other => "other",
        }
    }
}

impl std::fmt::Display for StoreErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The limiter's counters.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    /// Each policy's stats, held by its [`crate::Policy`] values: a rule that no policy holds
    /// any more (an override or a tier removed by a reload, once the requests still under the
    /// old config are done) has its series dropped, so reloads of changing rules do not
    /// grow `/metrics` and the status page without bound.
    policies: Mutex<Vec<Weak<PolicyStats>>>,
    latency_buckets: [AtomicU64; LATENCY_BUCKETS_US.len()],
    /// Store calls timed: the latency histogram's count, and the calls made (each observed
    /// once), in one counter (one atomic add a call fewer).
    latency_count: AtomicU64,
    latency_sum_us: AtomicU64,
    errors: [AtomicU64; StoreErrorKind::ALL.len()],
    /// The most limited clients, recorded through each policy's stats.
    top_limited: Arc<TopLimited>,
}

impl Metrics {
    /// The stats of the policy named `name`, created on first use (two policies with one name
    /// share counters).
    pub(crate) fn policy(&self, name: &str) -> Arc<PolicyStats> {
        let mut list = self.policies.lock().unwrap_or_else(|e| e.into_inner());
        let mut found = None;
        list.retain(|w| match w.upgrade() {
            Some(s) => {
                if found.is_none() && &*s.name == name {
                    found = Some(s);
                }
                true
            }
            None => false,
        });
        if let Some(s) = found {
            return s;
        }
        let s = Arc::new(PolicyStats::new(name, self.top_limited.clone()));
        list.push(Arc::downgrade(&s));
        s
    }

    /// The most limited (client, policy) pairs of the five minutes up to `now` (see
    /// [`crate::Limiter::top_limited`]).
    pub(crate) fn top_limited(&self, k: usize, now: Micros) -> MostLimited {
        let (clients, limited) = self.top_limited.top(k, now);
        MostLimited { clients, limited }
    }

    /// Every counter as it is now, with the two gauges the limiter knows.
    pub(crate) fn snapshot(&self, breaker_open: bool, memory_keys: usize) -> Snapshot {
        let mut latency = [0; LATENCY_BUCKETS_US.len()];
        for (b, c) in latency.iter_mut().zip(&self.latency_buckets) {
            *b = c.load(Ordering::Relaxed);
        }
        Snapshot {
            policies: self.policies().iter().map(|p| p.counts()).collect(),
            latency,
            latency_count: self.latency_count.load(Ordering::Relaxed),
            store_calls: self.store_calls(),
            errors: StoreErrorKind::ALL.map(|k| self.store_errors(k)),
            breaker_open,
            memory_keys,
        }
    }

    /// Records one store call's latency.
    pub(crate) fn observe_store(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.latency_count.fetch_add(1, Ordering::Relaxed);
        self.latency_sum_us.fetch_add(us, Ordering::Relaxed);
        if let Some(i) = LATENCY_BUCKETS_US.iter().position(|&b| us <= b) {
            self.latency_buckets[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts one store error of `kind`.
    pub(crate) fn store_error(&self, kind: StoreErrorKind) {
        self.errors[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Store errors of `kind` so far.
    pub(crate) fn store_errors(&self, kind: StoreErrorKind) -> u64 {
        self.errors[kind as usize].load(Ordering::Relaxed)
    }

    /// Store calls made so far (each a round trip for a remote store).
    pub(crate) fn store_calls(&self) -> u64 {
        self.latency_count.load(Ordering::Relaxed)
    }

    /// The stats of every policy still held (see [`Metrics::policies`]'s field).
    pub(crate) fn policies(&self) -> Vec<Arc<PolicyStats>> {
        let mut list = self.policies.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::with_capacity(list.len());
        list.retain(|w| match w.upgrade() {
            Some(s) => {
                out.push(s);
                true
            }
            None => false,
        });
        out
    }

    /// Appends every `tollgate_*` family in the Prometheus text format.
    pub(crate) fn render(&self, out: &mut String, breaker_open: bool, memory_keys: usize) {
        let policies = self.policies();
        family(
            out,
            "tollgate_decisions_total",
            "counter",
            "Decisions by policy and outcome.",
        );
        for p in &policies {
            for o in Outcome::ALL {
                let _ = writeln!(
                    out,
                    "tollgate_decisions_total{{policy=\"{}\",outcome=\"{}\"}} {}",
                    escape_label(&p.name),
                    o.as_str(),
                    p.decisions(o)
                );
            }
        }
        family(
            out,
            "tollgate_limit",
            "gauge",
            "The configured quota by policy: limit (units per period), period_seconds, burst.",
        );
        for p in &policies {
            let (limit, period_us, burst) = p.quota();
            let name = escape_label(&p.name);
            let _ = writeln!(
                out,
                "tollgate_limit{{policy=\"{name}\",kind=\"limit\"}} {limit}"
            );
            let _ = writeln!(
                out,
                "tollgate_limit{{policy=\"{name}\",kind=\"period_seconds\"}} {}",
                seconds(period_us)
            );
            let _ = writeln!(
                out,
                "tollgate_limit{{policy=\"{name}\",kind=\"burst\"}} {burst}"
            );
        }
        family(
            out,
            "tollgate_store_duration_seconds",
            "histogram",
            "Latency of store calls.",
        );
        let mut cumulative = 0;
        for (i, b) in LATENCY_BUCKETS_US.iter().enumerate() {
            cumulative += self.latency_buckets[i].load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "tollgate_store_duration_seconds_bucket{{le=\"{}\"}} {cumulative}",
                seconds(*b)
            );
        }
        let count = self.latency_count.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "tollgate_store_duration_seconds_bucket{{le=\"+Inf\"}} {count}"
        );
        let _ = writeln!(
            out,
            "tollgate_store_duration_seconds_sum {}",
            seconds(self.latency_sum_us.load(Ordering::Relaxed))
        );
        let _ = writeln!(out, "tollgate_store_duration_seconds_count {count}");
        family(
            out,
            "tollgate_store_errors_total",
            "counter",
            "Store errors by kind.",
        );
        for k in StoreErrorKind::ALL {
            let _ = writeln!(
                out,
                "tollgate_store_errors_total{{kind=\"{}\"}} {}",
                k.as_str(),
                self.store_errors(k)
            );
        }
        family(
            out,
            "tollgate_breaker_open",
            "gauge",
            "1 while the circuit breaker skips the store.",
        );
        let _ = writeln!(out, "tollgate_breaker_open {}", u8::from(breaker_open));
        family(
            out,
            "tollgate_deny_cache_hits_total",
            "counter",
            "Requests rejected locally until their retry time, without a store call.",
        );
        for p in &policies {
            let _ = writeln!(
                out,
                "tollgate_deny_cache_hits_total{{policy=\"{}\"}} {}",
                escape_label(&p.name),
                p.deny_cache_hits()
            );
        }
        family(
            out,
            "tollgate_memory_keys",
            "gauge",
            "Keys tracked by in-process stores (primary and fallback).",
        );
        let _ = writeln!(out, "tollgate_memory_keys {memory_keys}");
        family(
            out,
            "tollgate_lease_units_total",
            "counter",
            "Lease units granted by the store, used by requests and returned.",
        );
        for p in &policies {
            for kind in LeaseKind::ALL {
                let _ = writeln!(
                    out,
                    "tollgate_lease_units_total{{policy=\"{}\",kind=\"{}\"}} {}",
                    escape_label(&p.name),
                    kind.as_str(),
                    p.lease_units(kind)
                );
            }
        }
        family(
            out,
            "tollgate_settled_units_total",
            "counter",
            "Units settled after the response: refunded below the estimate, charged above it.",
        );
        for p in &policies {
            for (i, direction) in ["refunded", "charged"].iter().enumerate() {
                let _ = writeln!(
                    out,
                    "tollgate_settled_units_total{{policy=\"{}\",direction=\"{direction}\"}} {}",
                    escape_label(&p.name),
                    p.settled[i].load(Ordering::Relaxed)
                );
            }
        }
        family(
            out,
            "tollgate_settle_errors_total",
            "counter",
            "Settles not applied (the estimate stands; a hold expires after hold_ttl), by reason.",
        );
        for p in &policies {
            for r in SettleError::ALL {
                let _ = writeln!(
                    out,
                    "tollgate_settle_errors_total{{policy=\"{}\",reason=\"{}\"}} {}",
                    escape_label(&p.name),
                    r.as_str(),
                    p.settle_errors[r as usize].load(Ordering::Relaxed)
                );
            }
        }
        family(
            out,
            "tollgate_in_flight",
            "gauge",
            "Requests this gateway holds in flight under a concurrency policy.",
        );
        for p in &policies {
            let _ = writeln!(
                out,
                "tollgate_in_flight{{policy=\"{}\"}} {}",
                escape_label(&p.name),
                p.in_flight.load(Ordering::Relaxed)
            );
        }
        family(
            out,
            "tollgate_holds_expired_total",
            "counter",
            "Holds the store dropped after hold_ttl without a renewal (their holder died or could not reach it).",
        );
        for p in &policies {
            let _ = writeln!(
                out,
                "tollgate_holds_expired_total{{policy=\"{}\"}} {}",
                escape_label(&p.name),
                p.holds_expired.load(Ordering::Relaxed)
            );
        }
        family(
            out,
            "tollgate_store_calls_total",
            "counter",
            "Store calls made (divide by decisions for calls per request).",
        );
        let _ = writeln!(out, "tollgate_store_calls_total {}", self.store_calls());
    }
}

/// Why a settle was not applied (`tollgate_settle_errors_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleError {
    /// No real cost was given (the response carried no cost header or trailer).
    Missing,
    /// The real cost given was not a positive integer (a bad response header).
    Invalid,
    /// The real cost was above what the policy can ever admit: not trusted.
    TooLarge,
    /// The store call failed or timed out (or the breaker was open).
    Store,
    /// Too many settles waited for the store: this one was dropped.
    Dropped,
}

impl SettleError {
    /// Every reason, in label order.
    pub const ALL: [SettleError; 5] = [
        SettleError::Missing,
        SettleError::Invalid,
        SettleError::TooLarge,
        SettleError::Store,
        SettleError::Dropped,
    ];

    /// The `reason` label.
    pub fn as_str(self) -> &'static str {
        match self {
            SettleError::Missing => "missing",
            SettleError::Invalid => "invalid",
            SettleError::TooLarge => "too_large",
            SettleError::Store => "store",
            SettleError::Dropped => "dropped",
        }
    }
}

/// Every counter of a limiter at one instant (each read on its own: a snapshot taken while
/// requests run may count a request in one family and not yet in another).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    policies: Vec<PolicyCounts>,
    latency: [u64; LATENCY_BUCKETS_US.len()],
    latency_count: u64,
    store_calls: u64,
    errors: [u64; StoreErrorKind::ALL.len()],
    breaker_open: bool,
    memory_keys: usize,
}

impl Snapshot {
    /// The counters of every registered policy, in registration order (a limiter only adds
    /// policies, so an older snapshot's list is a prefix of a newer one's).
    pub fn policies(&self) -> &[PolicyCounts] {
        &self.policies
    }

    /// The counters of the policy named `name`.
    pub fn policy(&self, name: &str) -> Option<&PolicyCounts> {
        self.policies.iter().find(|p| p.name() == name)
    }

    /// The store latency histogram: per-bucket (not cumulative) counts, one for each bound
    /// of [`LATENCY_BUCKETS`], and the count of all calls (those above the last bound too).
    pub fn store_latency(&self) -> ([u64; LATENCY_BUCKETS.len()], u64) {
        (self.latency, self.latency_count)
    }

    /// Store calls made (each a round trip for a remote store).
    pub fn store_calls(&self) -> u64 {
        self.store_calls
    }

    /// Store errors of `kind` (`tollgate_store_errors_total{kind}`).
    pub fn store_errors(&self, kind: StoreErrorKind) -> u64 {
        self.errors[kind as usize]
    }

    /// Store errors of every kind, in metric order.
    pub fn store_errors_by_kind(&self) -> impl Iterator<Item = (StoreErrorKind, u64)> + '_ {
        StoreErrorKind::ALL.into_iter().zip(self.errors)
    }

    /// Whether a circuit breaker was open (`tollgate_breaker_open`).
    pub fn breaker_open(&self) -> bool {
        self.breaker_open
    }

    /// Keys tracked in process, by the memory store and the local fallback
    /// (`tollgate_memory_keys`).
    pub fn memory_keys(&self) -> usize {
        self.memory_keys
    }
}

/// One policy's counters in a [`Snapshot`]. Two policies with one name share counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyCounts {
    name: Arc<str>,
    decisions: [u64; Outcome::ALL.len()],
    deny_cache_hits: u64,
    lease: [u64; LeaseKind::ALL.len()],
    settled: [u64; 2],
    in_flight: u64,
    holds_expired: u64,
    settle_errors: [u64; SettleError::ALL.len()],
}

impl PolicyCounts {
    /// The policy's name (the `policy` label).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Decisions with `outcome` (`tollgate_decisions_total`).
    pub fn decisions(&self, outcome: Outcome) -> u64 {
        self.decisions[outcome.index()]
    }

    /// Requests rejected by the deny cache without a store call
    /// (`tollgate_deny_cache_hits_total`).
    pub fn deny_cache_hits(&self) -> u64 {
        self.deny_cache_hits
    }

    /// Lease units of `kind` (`tollgate_lease_units_total`).
    pub fn lease_units(&self, kind: LeaseKind) -> u64 {
        self.lease[kind as usize]
    }

    /// Units settled after the response: (refunded, charged) (`tollgate_settled_units_total`).
    pub fn settled_units(&self) -> (u64, u64) {
        (self.settled[0], self.settled[1])
    }

    /// Holds this limiter has in flight (`tollgate_in_flight`).
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// Holds the store dropped after `hold_ttl` (`tollgate_holds_expired_total`).
    pub fn holds_expired(&self) -> u64 {
        self.holds_expired
    }

    /// Settles not applied for `reason` (`tollgate_settle_errors_total`).
    pub fn settle_errors(&self, reason: SettleError) -> u64 {
        self.settle_errors[reason as usize]
    }
}

/// The most limited clients of the last minutes ([`crate::Limiter::top_limited`]).
#[derive(Debug, Clone)]
pub struct MostLimited {
    /// The most limited (client, policy) pairs, most limited first.
    pub clients: Vec<LimitedClient>,
    /// Limited requests in the window, all clients.
    pub limited: u64,
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn seconds(us: u64) -> String {
    format!("{}.{:06}", us / 1_000_000, us % 1_000_000)
}

/// Escapes a Prometheus label value (backslash, quote, newline): for every front end that
/// renders series of its own (the RLS's descriptor series).
pub fn escape_label(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => o.push_str("\\\\"),
            '"' => o.push_str("\\\""),
            '\n' => o.push_str("\\n"),
            c => o.push(c),
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative_and_counts_everything() {
        let m = Metrics::default();
        m.observe_store(Duration::from_micros(45));
        m.observe_store(Duration::from_micros(55));
        m.observe_store(Duration::from_secs(5));
        let mut s = String::new();
        m.render(&mut s, false, 0);
        assert!(s.contains("tollgate_store_duration_seconds_bucket{le=\"0.000050\"} 1\n"));
        assert!(s.contains("tollgate_store_duration_seconds_bucket{le=\"0.000060\"} 2\n"));
        assert!(s.contains("tollgate_store_duration_seconds_bucket{le=\"1.000000\"} 2\n"));
        assert!(s.contains("tollgate_store_duration_seconds_bucket{le=\"+Inf\"} 3\n"));
        assert!(s.contains("tollgate_store_duration_seconds_count 3\n"));
    }

    #[test]
    fn label_values_are_escaped() {
        let m = Metrics::default();
        let p = m.policy("a\"b");
        p.record(Outcome::Limited);
        let mut s = String::new();
        m.render(&mut s, true, 7);
        assert!(s.contains("tollgate_decisions_total{policy=\"a\\\"b\",outcome=\"limited\"} 1\n"));
        assert!(s.contains("tollgate_breaker_open 1\n"));
        assert!(s.contains("tollgate_memory_keys 7\n"));
    }

    #[test]
    fn the_configured_quota_is_a_gauge_per_policy_and_kind() {
        let m = Metrics::default();
        let quota = tollgate_core::Quota::new(100, Duration::from_secs(60))
            .and_then(|q| q.with_burst(150))
            .expect("quota");
        let api = m.policy("api");
        api.set_quota(&quota);
        let mut s = String::new();
        m.render(&mut s, false, 0);
        assert!(s.contains("# TYPE tollgate_limit gauge\n"), "{s}");
        assert!(
            s.contains("tollgate_limit{policy=\"api\",kind=\"limit\"} 100\n"),
            "{s}"
        );
        assert!(
            s.contains("tollgate_limit{policy=\"api\",kind=\"period_seconds\"} 60.000000\n"),
            "{s}"
        );
        assert!(
            s.contains("tollgate_limit{policy=\"api\",kind=\"burst\"} 150\n"),
            "{s}"
        );
    }

    #[test]
    fn a_series_is_dropped_once_no_policy_holds_its_rule() {
        let m = Metrics::default();
        let kept = m.policy("api");
        let removed = m.policy("api.override-1234");
        removed.record(Outcome::Allowed);
        // Registered again (a reload that keeps it): the same counters.
        assert_eq!(m.policy("api.override-1234").decisions(Outcome::Allowed), 1);
        drop(removed);
        let mut s = String::new();
        m.render(&mut s, false, 0);
        assert!(!s.contains("override-1234"), "{s}");
        assert!(s.contains("policy=\"api\""), "{s}");
        assert_eq!(m.snapshot(false, 0).policies().len(), 1);
        drop(kept);
    }

    #[test]
    fn a_snapshot_reads_the_counters_the_render_shows() {
        let m = Metrics::default();
        let p = m.policy("api");
        p.record(Outcome::Allowed);
        p.record(Outcome::Allowed);
        p.record(Outcome::Limited);
        p.deny_cache_hit();
        p.lease(LeaseKind::Granted, 10);
        p.lease(LeaseKind::Used, 4);
        m.store_error(StoreErrorKind::Auth);
        m.observe_store(Duration::from_micros(45));
        m.observe_store(Duration::from_secs(5));
        let s = m.snapshot(true, 3);
        let api = s.policy("api").expect("registered");
        assert_eq!(api.decisions(Outcome::Allowed), 2);
        assert_eq!(api.decisions(Outcome::Limited), 1);
        assert_eq!(api.deny_cache_hits(), 1);
        assert_eq!(api.lease_units(LeaseKind::Granted), 10);
        assert_eq!(api.lease_units(LeaseKind::Used), 4);
        assert_eq!(api.lease_units(LeaseKind::Returned), 0);
        assert_eq!(s.store_errors(StoreErrorKind::Auth), 1);
        assert_eq!(
            s.store_errors_by_kind().map(|(_, n)| n).sum::<u64>(),
            1,
            "every other kind is zero"
        );
        assert_eq!(s.store_calls(), 2);
        let (buckets, count) = s.store_latency();
        let i = LATENCY_BUCKETS
            .iter()
            .position(|b| *b == Duration::from_micros(50))
            .expect("a 50 us bound");
        assert_eq!((buckets[i], buckets.iter().sum::<u64>(), count), (1, 1, 2));
        assert!(s.breaker_open());
        assert_eq!(s.memory_keys(), 3);
    }

    #[test]
    fn the_duration_bounds_are_the_rendered_buckets() {
        for (d, us) in LATENCY_BUCKETS.iter().zip(LATENCY_BUCKETS_US) {
            assert_eq!(d.as_micros(), u128::from(us));
        }
        assert!(LATENCY_BUCKETS.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn every_error_kind_is_its_own_label() {
        let m = Metrics::default();
        m.store_error(StoreErrorKind::Other);
        m.store_error(StoreErrorKind::Timeout);
        m.store_error(StoreErrorKind::Timeout);
        assert_eq!(m.store_errors(StoreErrorKind::Other), 1);
        assert_eq!(m.store_errors(StoreErrorKind::Timeout), 2);
        let mut s = String::new();
        m.render(&mut s, false, 0);
        assert!(s.contains("tollgate_store_errors_total{kind=\"timeout\"} 2\n"));
        assert!(s.contains("tollgate_store_errors_total{kind=\"auth\"} 0\n"));
    }
}
