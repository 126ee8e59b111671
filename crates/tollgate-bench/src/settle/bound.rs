//! The bound on real units a client is admitted when its costs are known later.
//!
//! Why this bound: every request is charged the estimate `e` when it arrives and settled at
//! its real cost `r` later. A bucket (token bucket, GCRA, leaky bucket: the same bound) only
//! admits while it holds `e`, and a refund never fills it past full, so at the moment of any
//! admission the charges it has seen, with every settle that arrived so far, add up to at most
//! `burst + rate x elapsed`. What it has not seen yet are the settles of the requests still in
//! flight, at most `C` of them per client, each at most `max_real - e` above its estimate. So
//! from a fresh key, every prefix of a client's traffic is admitted at most
//!
//! `burst + floor(elapsed x limit / period) + C x max(0, max_real - e)` real units.
//!
//! The bench sees when a reserve call left and when it came back, not when the store decided,
//! so a prefix ends at an answer (requests answered later are left out) and its span starts
//! at the client's first call: both choices are the kindest to the limiter.

use serde::Serialize;

/// What the bound is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Terms {
    /// Per period.
    pub limit: u64,
    /// The period, in nanoseconds.
    pub period_ns: u128,
    /// Units admitted at once from a fresh key.
    pub burst: u64,
    /// Requests of one client in flight at once (`C`).
    pub in_flight: u64,
    /// The estimate charged on arrival.
    pub estimate: u64,
    /// The largest real cost.
    pub max_real: u64,
}

impl Terms {
    /// What the algorithm admits over `elapsed_ns` from a fresh key, costs known up front.
    pub fn algorithm_allows(&self, elapsed_ns: u128) -> u64 {
        let refilled = elapsed_ns.saturating_mul(u128::from(self.limit)) / self.period_ns.max(1);
        self.burst
            .saturating_add(u64::try_from(refilled).unwrap_or(u64::MAX))
    }

    /// The most settles can add on top: `C x max(0, max_real - estimate)`.
    pub fn settle_slack(&self) -> u64 {
        self.in_flight
            .saturating_mul(self.max_real.saturating_sub(self.estimate))
    }
}

/// One admitted request of a client, as the bench saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admitted {
    /// When its reserve call came back, in nanoseconds since the run started.
    pub answered_ns: u128,
    /// Its real cost.
    pub real: u64,
}

/// The prefix of one client's traffic with the least room under the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Window {
    /// From the client's first reserve call to the answer that ends the prefix.
    pub elapsed_ms: u64,
    /// Requests admitted in it.
    pub admitted_requests: u64,
    /// Their real units.
    pub admitted_real: u64,
    /// `burst + floor(elapsed x limit / period)`.
    pub algorithm_allows: u64,
    /// `max(0, admitted_real - algorithm_allows)`.
    pub over_algorithm: u64,
    /// `algorithm_allows + C x max(0, max_real - estimate)`.
    pub bound: u64,
    /// `bound - admitted_real`; negative when the bound is broken.
    pub headroom: i64,
}

/// The worst prefix of a client's traffic: `first_sent_ns` is when its first call left,
/// `admitted` its admissions in any order. `None` when nothing was admitted.
pub fn worst_window(terms: &Terms, first_sent_ns: u128, admitted: &[Admitted]) -> Option<Window> {
    let mut sorted = admitted.to_vec();
    sorted.sort_by_key(|a| a.answered_ns);
    let mut worst: Option<Window> = None;
    let (mut requests, mut real) = (0u64, 0u64);
    for (i, a) in sorted.iter().enumerate() {
        requests += 1;
        real = real.saturating_add(a.real);
        // Answers at the same instant end one prefix.
        if sorted
            .get(i + 1)
            .is_some_and(|b| b.answered_ns == a.answered_ns)
        {
            continue;
        }
        let elapsed = a.answered_ns.saturating_sub(first_sent_ns);
        let allows = terms.algorithm_allows(elapsed);
        let bound = allows.saturating_add(terms.settle_slack());
        let headroom = i128::from(bound) - i128::from(real);
        let window = Window {
            elapsed_ms: u64::try_from(elapsed / 1_000_000).unwrap_or(u64::MAX),
            admitted_requests: requests,
            admitted_real: real,
            algorithm_allows: allows,
            over_algorithm: real.saturating_sub(allows),
            bound,
            headroom: i64::try_from(headroom).unwrap_or(i64::MIN),
        };
        if worst.is_none_or(|w| window.headroom < w.headroom) {
            worst = Some(window);
        }
    }
    worst
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u128 = 1_000_000_000;

    fn terms() -> Terms {
        Terms {
            limit: 10,
            period_ns: SECOND,
            burst: 20,
            in_flight: 4,
            estimate: 5,
            max_real: 8,
        }
    }

    fn at(seconds_tenths: u128, real: u64) -> Admitted {
        Admitted {
            answered_ns: seconds_tenths * SECOND / 10,
            real,
        }
    }

    #[test]
    fn the_bound_is_the_bucket_plus_what_the_requests_in_flight_can_still_add() {
        let t = terms();
        assert_eq!(t.algorithm_allows(0), 20);
        assert_eq!(t.algorithm_allows(SECOND * 3 / 2), 35);
        assert_eq!(t.settle_slack(), 4 * 3);
        let under = Terms {
            max_real: 3,
            ..terms()
        };
        assert_eq!(
            under.settle_slack(),
            0,
            "real costs below the estimate add nothing"
        );
    }

    #[test]
    fn the_worst_prefix_is_the_one_with_the_least_headroom_and_may_break_the_bound() {
        let t = terms();
        // 30 units at once (burst 20 + slack 12 = 32: headroom 2), then a slow trickle.
        let admitted = [at(0, 8), at(0, 8), at(0, 8), at(0, 6), at(20, 1)];
        let w = worst_window(&t, 0, &admitted).expect("admitted");
        assert_eq!(
            (w.admitted_requests, w.admitted_real, w.bound, w.headroom),
            (4, 30, 32, 2)
        );
        assert_eq!(w.over_algorithm, 10);
        let broken = [at(0, 8), at(0, 8), at(0, 8), at(0, 8), at(0, 1), at(20, 8)];
        let w = worst_window(&t, 0, &broken).expect("admitted");
        assert_eq!((w.admitted_real, w.headroom), (33, -1));
        assert_eq!(worst_window(&t, 0, &[]), None);
    }
}
