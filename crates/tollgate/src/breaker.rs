//! A circuit breaker in front of the store: after `failures` consecutive errors or timeouts it
//! opens and no request waits on the store; after `open_for` exactly one request probes
//! (half-open); its success closes the breaker, its failure opens it again.
//!
//! Consecutive means one after another: a failure counts only if its call began after the
//! last failure counted ([`Round`]). Calls in flight together that fail together (one stall
//! of the store, past the timeout) are one failure, not one each. Counted one each, a single
//! stall of a loaded gateway's store could open the breaker at once: in the Redis
//! benchmark (64 calls in flight, `max_batch = 1`) it refused 74,149 calls in one run, their
//! requests failed open; with this rule, ten runs had no refusal, one of them with 64
//! requests failed open (docs/benchmarks.md, forty-sixth session). A store that stays
//! down fails the calls begun after each counted failure too, and opens the breaker after
//! `failures` such rounds: a timeout each, where a burst of calls in flight opened it after
//! one.
//!
//! Lock-free: four atomics. State changes are logged once per change, never per request.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;
use tollgate_core::{duration_to_micros, Micros};

/// Breaker settings (`store.breaker`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Consecutive failures that open the breaker (at least 1).
    pub failures: u32,
    /// How long it stays open before one probe.
    pub open_for: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            failures: 5,
            open_for: Duration::from_secs(1),
        }
    }
}

/// Whether a request may call the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Permit {
    /// Closed: call.
    Call,
    /// Half-open: this request is the one probe.
    Probe,
    /// Open: skip the store; it may be tried again after this many microseconds.
    Skip(Micros),
}

/// The failures a breaker has counted when a call began: the call's failure counts only if no
/// other was counted since (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Round(u64);

#[derive(Debug)]
pub(crate) struct Breaker {
    threshold: u32,
    open_for: Micros,
    consecutive: AtomicU32,
    /// Failures counted since the breaker was made (the current [`Round`]).
    counted: AtomicU64,
    /// 0 while closed; otherwise when the next probe may go.
    open_until: AtomicU64,
    probing: AtomicBool,
}

impl Breaker {
    pub(crate) fn new(cfg: BreakerConfig) -> Self {
        Self {
            threshold: cfg.failures.max(1),
            open_for: duration_to_micros(cfg.open_for).max(1),
            consecutive: AtomicU32::new(0),
            counted: AtomicU64::new(0),
            open_until: AtomicU64::new(0),
            probing: AtomicBool::new(false),
        }
    }

    /// The round a call beginning now is in, for [`Breaker::on_failure`].
    pub(crate) fn round(&self) -> Round {
        Round(self.counted.load(Ordering::Acquire))
    }

    pub(crate) fn is_open(&self) -> bool {
        self.open_until.load(Ordering::Acquire) != 0
    }

    pub(crate) fn acquire(&self, now: Micros) -> Permit {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return Permit::Call;
        }
        if now < until {
            return Permit::Skip(until - now);
        }
        if self
            .probing
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            Permit::Probe
        } else {
            Permit::Skip(self.open_for)
        }
    }

    pub(crate) fn on_success(&self, permit: Permit) {
        self.consecutive.store(0, Ordering::Release);
        if permit == Permit::Probe || self.is_open() {
            if self.open_until.swap(0, Ordering::AcqRel) != 0 {
                tracing::info!(target: "tollgate::breaker", "store answered; circuit breaker closed");
            }
            self.probing.store(false, Ordering::Release);
        }
    }

    /// A failed call, begun in `began` ([`Breaker::round`]); `why` (the failure, bounded)
    /// goes with the log line of a state change, so that the one warning an operator sees says
    /// what the store answered.
    pub(crate) fn on_failure(
        &self,
        permit: Permit,
        began: Round,
        now: Micros,
        why: &dyn std::fmt::Display,
    ) {
        if permit != Permit::Probe
            && self
                .counted
                .compare_exchange(
                    began.0,
                    began.0.wrapping_add(1),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_err()
        {
            // Another failure was counted while this call was in flight: the same stall.
            return;
        }
        let n = self
            .consecutive
            .fetch_add(1, Ordering::AcqRel)
            .saturating_add(1);
        let until = now.saturating_add(self.open_for);
        if permit == Permit::Probe {
            self.open_until.store(until, Ordering::Release);
            self.probing.store(false, Ordering::Release);
            tracing::warn!(target: "tollgate::breaker", error = %why, "probe failed; circuit breaker open again");
        } else if n >= self.threshold
            && self
                .open_until
                .compare_exchange(0, until, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            tracing::warn!(
                target: "tollgate::breaker",
                failures = n,
                open_for_us = self.open_for,
                error = %why,
                "store failing; circuit breaker open"
            );
        }
    }
}

/// Breakers by store shard. A standalone store has one. A Redis Cluster gets one breaker per
/// range of 256 hash slots (64 in all), chosen by the slot of the client's hash tag: a dead
/// master opens only the breakers of the slots it served, so clients whose keys live on the
/// other masters never notice.
#[derive(Debug)]
pub(crate) struct Breakers {
    list: Vec<Breaker>,
}

/// Slots per breaker in cluster mode (16384 slots / 64 breakers).
const SLOTS_PER_BREAKER: u16 = 256;

impl Breakers {
    pub(crate) fn new(cfg: BreakerConfig, cluster: bool) -> Self {
        let n = if cluster {
            usize::from(16384 / SLOTS_PER_BREAKER)
        } else {
            1
        };
        Self {
            list: (0..n).map(|_| Breaker::new(cfg)).collect(),
        }
    }

    /// The breaker guarding the shard that holds `client`'s keys.
    pub(crate) fn for_client(&self, client: &tollgate_core::ClientKey) -> &Breaker {
        if self.list.len() == 1 {
            return &self.list[0];
        }
        &self.list[usize::from(client.cluster_slot() / SLOTS_PER_BREAKER)]
    }

    /// Whether any breaker is open.
    pub(crate) fn any_open(&self) -> bool {
        self.list.iter().any(Breaker::is_open)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn cluster_breakers_are_per_slot_range() {
        let b = super::Breakers::new(super::BreakerConfig::default(), true);
        let k1 = tollgate_core::ClientKey([1; 16]);
        let k2 = tollgate_core::ClientKey([2; 16]);
        for _ in 0..5 {
            b.for_client(&k1).on_failure(
                super::Permit::Call,
                b.for_client(&k1).round(),
                0,
                &"test",
            );
        }
        assert!(b.any_open());
        assert!(b.for_client(&k1).is_open());
        // Different slot ranges (checked, not assumed): the other client is unaffected.
        let slot = |k: &tollgate_core::ClientKey| k.cluster_slot() / 256;
        assert_ne!(slot(&k1), slot(&k2));
        assert!(!b.for_client(&k2).is_open());
    }

    use super::*;

    fn breaker() -> Breaker {
        Breaker::new(BreakerConfig {
            failures: 3,
            open_for: Duration::from_secs(1),
        })
    }

    #[test]
    fn opens_after_consecutive_failures_only() {
        let b = breaker();
        b.on_failure(Permit::Call, b.round(), 0, &"test");
        b.on_failure(Permit::Call, b.round(), 0, &"test");
        b.on_success(Permit::Call);
        b.on_failure(Permit::Call, b.round(), 0, &"test");
        b.on_failure(Permit::Call, b.round(), 0, &"test");
        assert_eq!(b.acquire(0), Permit::Call);
        b.on_failure(Permit::Call, b.round(), 0, &"test");
        assert_eq!(b.acquire(10), Permit::Skip(1_000_000 - 10));
        assert!(b.is_open());
    }

    #[test]
    fn calls_in_flight_together_that_fail_together_count_once() {
        let b = breaker();
        // Ten calls begun before a stall, all failing past their timeout: one failure.
        let began = b.round();
        for _ in 0..10 {
            b.on_failure(Permit::Call, began, 0, &"stall");
        }
        assert_eq!(b.acquire(0), Permit::Call, "one stall is one failure");
        // The store stays down: the calls begun after each counted failure fail too.
        for _ in 0..2 {
            let began = b.round();
            for _ in 0..10 {
                b.on_failure(Permit::Call, began, 0, &"down");
            }
        }
        assert!(
            b.is_open(),
            "three rounds of failures, as three failures one by one"
        );
        // A late failure of a call begun before the breaker opened changes nothing.
        b.on_failure(Permit::Call, began, 5, &"late");
        assert_eq!(b.acquire(10), Permit::Skip(1_000_000 - 10));
    }

    #[test]
    fn one_probe_after_open_for_then_closes_on_success() {
        let b = breaker();
        for _ in 0..3 {
            b.on_failure(Permit::Call, b.round(), 0, &"test");
        }
        assert_eq!(b.acquire(1_000_000), Permit::Probe);
        assert!(matches!(b.acquire(1_000_000), Permit::Skip(_)));
        b.on_success(Permit::Probe);
        assert!(!b.is_open());
        assert_eq!(b.acquire(1_000_001), Permit::Call);
    }

    #[test]
    fn failed_probe_reopens_for_another_period() {
        let b = breaker();
        for _ in 0..3 {
            b.on_failure(Permit::Call, b.round(), 0, &"test");
        }
        assert_eq!(b.acquire(2_000_000), Permit::Probe);
        b.on_failure(Permit::Probe, b.round(), 2_000_000, &"test");
        assert_eq!(b.acquire(2_500_000), Permit::Skip(500_000));
        assert_eq!(b.acquire(3_000_000), Permit::Probe);
    }
}
