//! The six algorithms, one module each, and the enums that select one at run time.
//!
//! Every module exposes the same shape: a state type, `check(quota, &mut state, now, cost,
//! commit) -> Decision` and `idle_at`. `check` never writes the state of a denied request (a
//! denial consumes nothing) nor of a zero-cost one (a pure query), and clamps time that goes
//! backwards to the latest instant the state has seen (no refund, no panic).

pub mod fixed_window;
pub mod gcra;
pub mod leaky_bucket;
pub mod sliding_window_counter;
pub mod sliding_window_log;
pub mod token_bucket;

use crate::{Decision, Micros, Quota, Verdict};
use std::fmt;
use std::str::FromStr;

pub use fixed_window::FixedWindowState;
pub use gcra::GcraState;
pub use leaky_bucket::LeakyBucketState;
pub use sliding_window_counter::SlidingWindowCounterState;
pub use sliding_window_log::{SlidingWindowLogState, MAX_LOG_LIMIT};
pub use token_bucket::TokenBucketState;

/// Which algorithm a policy uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Counts per window aligned to the epoch; lets 2x through around a boundary.
    FixedWindow,
    /// Exact sliding window over timestamps; O(limit) memory.
    SlidingWindowLog,
    /// Two fixed windows, the previous one weighted by its overlap.
    SlidingWindowCounter,
    /// Capacity `burst`, refilled at `limit / period`.
    TokenBucket,
    /// A meter draining at `limit / period` with capacity `burst`; overflow is rejected.
    LeakyBucket,
    /// Generic cell rate algorithm: one integer of state.
    Gcra,
}

impl Algorithm {
    /// Every algorithm, in the order `tollgate simulate` prints them.
    pub const ALL: [Algorithm; 6] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowLog,
        Algorithm::SlidingWindowCounter,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::Gcra,
    ];

    /// The name used in configuration, metrics and Redis script names.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindowLog => "sliding_window_log",
            Algorithm::SlidingWindowCounter => "sliding_window_counter",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::LeakyBucket => "leaky_bucket",
            Algorithm::Gcra => "gcra",
        }
    }

    /// Checks the quota against this algorithm's own bounds: the sliding log keeps one entry
    /// per unit (limit at most [`MAX_LOG_LIMIT`]); the sliding counter multiplies
    /// `limit x period`, which must stay exact as a double in Redis (at most 2^53).
    pub fn validate(self, q: &Quota) -> Result<(), String> {
        match self {
            Algorithm::SlidingWindowLog if q.limit() > MAX_LOG_LIMIT => Err(format!(
                "sliding_window_log keeps one entry per admitted unit: limit must be at most {MAX_LOG_LIMIT}"
            )),
            Algorithm::SlidingWindowCounter
                if u128::from(q.limit()) * u128::from(q.period_micros()) > 1u128 << 53 =>
            {
                Err("sliding_window_counter needs limit x period (in us) <= 2^53".to_string())
            }
            _ => Ok(()),
        }
    }

    /// The state of a client never seen before.
    pub fn fresh(self, q: &Quota) -> State {
        match self {
            Algorithm::FixedWindow => State::FixedWindow(FixedWindowState::default()),
            Algorithm::SlidingWindowLog => {
                State::SlidingWindowLog(SlidingWindowLogState::default())
            }
            Algorithm::SlidingWindowCounter => {
                State::SlidingWindowCounter(SlidingWindowCounterState::default())
            }
            Algorithm::TokenBucket => State::TokenBucket(TokenBucketState::full(q)),
            Algorithm::LeakyBucket => State::LeakyBucket(LeakyBucketState::default()),
            Algorithm::Gcra => State::Gcra(GcraState::default()),
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An algorithm name that is not one of the six.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownAlgorithm(pub String);

impl fmt::Display for UnknownAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<_> = Algorithm::ALL.iter().map(|a| a.name()).collect();
        write!(
            f,
            "unknown algorithm {:?}; expected one of {}",
            self.0,
            names.join(", ")
        )
    }
}

impl std::error::Error for UnknownAlgorithm {}

impl FromStr for Algorithm {
    type Err = UnknownAlgorithm;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| UnknownAlgorithm(s.to_string()))
    }
}

/// The state of any algorithm, as the memory store keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum State {
    /// See [`fixed_window`].
    FixedWindow(FixedWindowState),
    /// See [`sliding_window_log`].
    SlidingWindowLog(SlidingWindowLogState),
    /// See [`sliding_window_counter`].
    SlidingWindowCounter(SlidingWindowCounterState),
    /// See [`token_bucket`].
    TokenBucket(TokenBucketState),
    /// See [`leaky_bucket`].
    LeakyBucket(LeakyBucketState),
    /// See [`gcra`].
    Gcra(GcraState),
}

impl State {
    /// The algorithm this state belongs to.
    pub fn algorithm(&self) -> Algorithm {
        match self {
            State::FixedWindow(_) => Algorithm::FixedWindow,
            State::SlidingWindowLog(_) => Algorithm::SlidingWindowLog,
            State::SlidingWindowCounter(_) => Algorithm::SlidingWindowCounter,
            State::TokenBucket(_) => Algorithm::TokenBucket,
            State::LeakyBucket(_) => Algorithm::LeakyBucket,
            State::Gcra(_) => Algorithm::Gcra,
        }
    }

    /// The instant (microseconds since the epoch) from which this state equals a fresh one:
    /// a store may forget it then without changing any decision.
    pub fn idle_at(&self, q: &Quota) -> Micros {
        match self {
            State::FixedWindow(s) => fixed_window::idle_at(q, s),
            State::SlidingWindowLog(s) => sliding_window_log::idle_at(q, s),
            State::SlidingWindowCounter(s) => sliding_window_counter::idle_at(q, s),
            State::TokenBucket(s) => token_bucket::idle_at(q, s),
            State::LeakyBucket(s) => leaky_bucket::idle_at(q, s),
            State::Gcra(s) => gcra::idle_at(s),
        }
    }
}

/// An algorithm with its quota: what one policy enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limit {
    /// The algorithm.
    pub algorithm: Algorithm,
    /// Its quota.
    pub quota: Quota,
}

impl Limit {
    /// A limit, checked against the algorithm's own bounds (see [`Algorithm::validate`]).
    pub fn new(algorithm: Algorithm, quota: Quota) -> Result<Self, String> {
        algorithm.validate(&quota)?;
        Ok(Self { algorithm, quota })
    }

    /// The state of a client never seen before.
    pub fn fresh(&self) -> State {
        self.algorithm.fresh(&self.quota)
    }

    /// Decides one request against `state`. With `commit`, an allowed request with a nonzero
    /// cost is charged. A state of another algorithm (the policy changed) starts fresh.
    pub fn check(&self, state: &mut State, now: Micros, cost: u64, commit: bool) -> Decision {
        if state.algorithm() != self.algorithm {
            *state = self.fresh();
        }
        let q = &self.quota;
        match state {
            State::FixedWindow(s) => fixed_window::check(q, s, now, cost, commit),
            State::SlidingWindowLog(s) => sliding_window_log::check(q, s, now, cost, commit),
            State::SlidingWindowCounter(s) => {
                sliding_window_counter::check(q, s, now, cost, commit)
            }
            State::TokenBucket(s) => token_bucket::check(q, s, now, cost, commit),
            State::LeakyBucket(s) => leaky_bucket::check(q, s, now, cost, commit),
            State::Gcra(s) => gcra::check(q, s, now, cost, commit),
        }
    }
}

/// Decides several limits for one request all-or-nothing: when every one allows, all are
/// charged; otherwise none is, and the decisions of those that would have allowed describe
/// their uncharged state.
pub fn check_all<'a, I>(items: I, now: Micros) -> Verdict
where
    I: IntoIterator<Item = (&'a Limit, &'a mut State, u64)>,
{
    let mut items: Vec<_> = items.into_iter().collect();
    let mut decisions: Vec<Decision> = items
        .iter_mut()
        .map(|(limit, state, cost)| limit.check(state, now, *cost, false))
        .collect();
    let allowed = decisions.iter().all(|d| d.allowed);
    if allowed {
        for ((limit, state, cost), d) in items.iter_mut().zip(decisions.iter_mut()) {
            *d = limit.check(state, now, *cost, true);
        }
    } else {
        for ((limit, state, _), d) in items.iter_mut().zip(decisions.iter_mut()) {
            if d.allowed {
                *d = limit.check(state, now, 0, false);
            }
        }
    }
    Verdict { allowed, decisions }
}
