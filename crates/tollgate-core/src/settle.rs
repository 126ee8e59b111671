//! Costs known later: settling a charge once the real cost is known, renewing and releasing
//! holds (see shared/DESIGN.md "Costs known later").
//!
//! A request is charged an estimate on arrival (a [`Charge`]: units at an instant). When its
//! real cost is known, [`Limit::settle`] gives back the difference or charges the rest:
//!
//! | algorithm | below the estimate | above the estimate (a debt) |
//! |---|---|---|
//! | token bucket | tokens added back (at most to full) | tokens go below zero |
//! | leaky bucket | level lowered (at most to empty) | level rises past the capacity |
//! | GCRA | TAT moves back (never before now) | TAT moves further |
//! | fixed window | count lowered, only in the window charged | counted in the current window |
//! | sliding log | the charge's own entry shrinks, while in the window | logged now |
//! | sliding counter | from the window charged, current or previous | counted in the current window |
//! | concurrency | (a release: the hold goes) | (a release) |
//!
//! A settle never leaves a state "fresher" than a fresh one, and never touches what another
//! request charged. A debt is bounded ([`max_level`], [`MAX_COUNT`]) so every span a store
//! computes stays exact below 2^53 us; past it the rest is forgiven. Each algorithm's retry
//! time stays exact with a debt: the state simply holds more than the limit admits.

use crate::algorithms::{
    concurrency, fixed_window, gcra, leaky_bucket, sliding_window_counter, sliding_window_log,
    token_bucket,
};
use crate::{Algorithm, Limit, Micros, Quota, State};

/// The most units a count-based state (fixed window, sliding log) holds, charged and owed.
pub const MAX_COUNT: u64 = 1 << 50;

/// The most units a time-based state holds, charged and owed, when one unit is `unit` us
/// (the emission interval for the buckets and GCRA, the period for the sliding counter): so
/// that `units x unit` stays below 2^53, exact as a double in Redis' Lua.
pub fn max_level(q: &Quota, unit: Micros) -> u64 {
    let _ = q;
    ((1u64 << 53) / unit.max(1)).min(MAX_COUNT)
}

/// What a request was charged, or holds: `units` at the store's instant `at` (for a hold:
/// when it was taken or last renewed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Charge {
    /// Units charged (the estimate) or held.
    pub units: u64,
    /// When (microseconds since the epoch, the store's clock).
    pub at: Micros,
}

/// What a settle did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Settled {
    /// Units given back (less than asked when the window charged has passed, or the state
    /// refilled meanwhile).
    pub refunded: u64,
    /// Units charged on top of the estimate (less than asked past the debt bound).
    pub charged: u64,
}

impl Limit {
    /// Settles `charge` at its real cost `real`: gives back `charge.units - real`, or charges
    /// `real - charge.units` past the limit. For a concurrency limit, releases the hold (`real`
    /// is not read). A state of another algorithm (the policy changed) is left alone.
    pub fn settle(&self, state: &mut State, now: Micros, charge: Charge, real: u64) -> Settled {
        if state.algorithm() != self.algorithm() {
            return Settled::default();
        }
        let q = self.quota();
        let Charge { units, at } = charge;
        if let State::Concurrency(s) = state {
            return Settled {
                refunded: concurrency::release(q, s, now, units, at),
                charged: 0,
            };
        }
        if real < units {
            let back = units - real;
            let refunded = match state {
                State::TokenBucket(s) => token_bucket::refund(q, s, now, back),
                State::LeakyBucket(s) => leaky_bucket::refund(q, s, now, back),
                State::Gcra(s) => gcra::refund(q, s, now, back),
                State::FixedWindow(s) => fixed_window::refund(q, s, now, back, at),
                State::SlidingWindowLog(s) => sliding_window_log::refund(q, s, now, back, at),
                State::SlidingWindowCounter(s) => {
                    sliding_window_counter::refund(q, s, now, back, at)
                }
                State::Concurrency(_) => 0,
            };
            Settled {
                refunded,
                charged: 0,
            }
        } else if real > units {
            let more = real - units;
            let charged = match state {
                State::TokenBucket(s) => token_bucket::owe(q, s, now, more),
                State::LeakyBucket(s) => leaky_bucket::owe(q, s, now, more),
                State::Gcra(s) => gcra::owe(q, s, now, more),
                State::FixedWindow(s) => fixed_window::owe(q, s, now, more),
                State::SlidingWindowLog(s) => sliding_window_log::owe(q, s, now, more),
                State::SlidingWindowCounter(s) => sliding_window_counter::owe(q, s, now, more),
                State::Concurrency(_) => 0,
            };
            Settled {
                refunded: 0,
                charged,
            }
        } else {
            Settled::default()
        }
    }

    /// Gives back `units` of a charge nothing recorded: no instant, no estimate (Envoy's
    /// `is_negative_hits` holds no id of the request it undoes). Returns the units given back,
    /// never more than the state holds, so a give-back never leaves a state fresher than a
    /// fresh one:
    ///
    /// | algorithm | given back from |
    /// |---|---|
    /// | token bucket, leaky bucket, GCRA | as their refunds |
    /// | fixed window | the current window only |
    /// | sliding counter | the current window, then the previous |
    /// | sliding log | the newest live entries first |
    /// | concurrency | the oldest live bucket first (those expire first anyway) |
    ///
    /// A state of another algorithm (the policy changed) is left alone.
    pub fn give_back(&self, state: &mut State, now: Micros, units: u64) -> u64 {
        if state.algorithm() != self.algorithm() || units == 0 {
            return 0;
        }
        let q = self.quota();
        match state {
            State::TokenBucket(s) => token_bucket::refund(q, s, now, units),
            State::LeakyBucket(s) => leaky_bucket::refund(q, s, now, units),
            State::Gcra(s) => gcra::refund(q, s, now, units),
            State::FixedWindow(s) => fixed_window::give_back(q, s, now, units),
            State::SlidingWindowLog(s) => sliding_window_log::give_back(q, s, now, units),
            State::SlidingWindowCounter(s) => sliding_window_counter::give_back(q, s, now, units),
            State::Concurrency(s) => concurrency::give_back(q, s, now, units),
        }
    }

    /// Renews a concurrency hold: it moves to the bucket of `now`, so it outlives `hold_ttl`
    /// while its holder lives. Returns the hold as it is now (fewer units when some had
    /// expired). Other algorithms hold nothing: the charge is returned unchanged.
    pub fn renew(&self, state: &mut State, now: Micros, charge: Charge) -> Charge {
        match state {
            State::Concurrency(s) if self.algorithm() == Algorithm::Concurrency => Charge {
                units: concurrency::renew(self.quota(), s, now, charge.units, charge.at),
                at: now,
            },
            _ => charge,
        }
    }
}
