//! The six rate algorithms and the concurrency limit, one module each, and the enums that
//! select one at run time.
//!
//! Every module exposes the same shape: a state type, `check(quota, &mut state, now, cost,
//! commit) -> Decision` and `idle_at`. `check` never writes the state of a denied request (a
//! denial consumes nothing) nor of a zero-cost one (a pure query), and clamps time that goes
//! backwards to the latest instant the state has seen (no refund, no panic).

pub mod concurrency;
pub mod fixed_window;
pub mod gcra;
pub mod leaky_bucket;
pub mod sliding_window_counter;
pub mod sliding_window_log;
pub mod token_bucket;

use crate::{Decision, Micros, Mode, Quota, Verdict};
use std::fmt;
use std::str::FromStr;

pub use concurrency::ConcurrencyState;
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
    /// Requests in flight, not a rate: `limit` held at once, a hold dropped after the
    /// quota's period (`hold_ttl`) unless renewed. Not in [`Algorithm::ALL`] (the rate
    /// algorithms); in [`Algorithm::EVERY`].
    Concurrency,
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

    /// Every algorithm a policy can name: the six rate algorithms and `concurrency`.
    pub const EVERY: [Algorithm; 7] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowLog,
        Algorithm::SlidingWindowCounter,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::Gcra,
        Algorithm::Concurrency,
    ];

    /// Whether this limits requests in flight (`concurrency`) rather than a rate.
    pub fn is_concurrency(self) -> bool {
        self == Algorithm::Concurrency
    }

    /// The name used in configuration, metrics and Redis script names.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindowLog => "sliding_window_log",
            Algorithm::SlidingWindowCounter => "sliding_window_counter",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::LeakyBucket => "leaky_bucket",
            Algorithm::Gcra => "gcra",
            Algorithm::Concurrency => "concurrency",
        }
    }

    /// Checks the quota against this algorithm's own bounds: the sliding log keeps one entry
    /// per unit (limit at most [`MAX_LOG_LIMIT`]); the sliding counter multiplies
    /// `limit x period`, which must stay exact as a double in Redis (at most 2^53).
    fn validate(self, q: &Quota) -> Result<(), LimitError> {
        match self {
            Algorithm::SlidingWindowLog if q.limit() > MAX_LOG_LIMIT => Err(LimitError::LogTooLong),
            Algorithm::SlidingWindowCounter
                if u128::from(q.limit()) * u128::from(q.period_micros()) > 1u128 << 53 =>
            {
                Err(LimitError::CounterInexact)
            }
            Algorithm::Concurrency if q.period_micros() < 8 => Err(LimitError::HoldTooShort),
            _ => Ok(()),
        }
    }

    /// Whether units of this algorithm can be leased and given back exactly: its state is a
    /// count of units that a give-back can decrement (token and leaky bucket, GCRA, and the
    /// fixed window inside the window they were taken in). The sliding algorithms cannot: a
    /// sliding log would have to forget timestamps, and the sliding counter's weighted
    /// previous window cannot be decremented exactly.
    pub fn is_leasable(self) -> bool {
        matches!(
            self,
            Algorithm::FixedWindow
                | Algorithm::TokenBucket
                | Algorithm::LeakyBucket
                | Algorithm::Gcra
        )
    }

    /// The largest cost this algorithm can ever admit under `q`: the burst of the bucket
    /// algorithms, the limit of the window algorithms. A larger cost is denied with no retry
    /// time.
    pub fn max_cost(self, q: &Quota) -> u64 {
        match self {
            Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Gcra => q.burst(),
            Algorithm::FixedWindow
            | Algorithm::SlidingWindowLog
            | Algorithm::SlidingWindowCounter
            | Algorithm::Concurrency => q.limit(),
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
            Algorithm::Concurrency => State::Concurrency(ConcurrencyState::default()),
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
        let names: Vec<_> = Algorithm::EVERY.iter().map(|a| a.name()).collect();
        // The name written is not repeated: an error never echoes what a key held.
        write!(
            f,
            "is not an algorithm; expected one of {}",
            names.join(", ")
        )
    }
}

impl std::error::Error for UnknownAlgorithm {}

impl FromStr for Algorithm {
    type Err = UnknownAlgorithm;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Algorithm::EVERY
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
    /// See [`concurrency`].
    Concurrency(ConcurrencyState),
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
            State::Concurrency(_) => Algorithm::Concurrency,
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
            State::Concurrency(s) => concurrency::idle_at(q, s),
        }
    }
}

/// Why an algorithm cannot enforce a quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitError {
    /// The sliding log keeps one entry per admitted unit.
    LogTooLong,
    /// The sliding counter's `limit x period` must stay exact as a double (Redis' Lua).
    CounterInexact,
    /// A concurrency limit's `hold_ttl` is cut in eight buckets of whole microseconds.
    HoldTooShort,
}

impl fmt::Display for LimitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LimitError::LogTooLong => write!(
                f,
                "sliding_window_log keeps one entry per admitted unit: limit must be at most {MAX_LOG_LIMIT}"
            ),
            LimitError::CounterInexact => {
                f.write_str("sliding_window_counter needs limit x period (in us) <= 2^53")
            }
            LimitError::HoldTooShort => f.write_str("concurrency needs hold_ttl >= 8us"),
        }
    }
}

impl std::error::Error for LimitError {}

/// An algorithm with its quota: what one policy enforces. Built only by [`Limit::new`], which
/// checks the quota against the algorithm's own bounds, so every `Limit` a store receives is
/// one it can run (the Redis scripts take its numbers as constants without checking again).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limit {
    algorithm: Algorithm,
    quota: Quota,
}

impl Limit {
    /// A limit, checked against the algorithm's own bounds.
    pub fn new(algorithm: Algorithm, quota: Quota) -> Result<Self, LimitError> {
        algorithm.validate(&quota)?;
        Ok(Self { algorithm, quota })
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The quota.
    pub fn quota(&self) -> &Quota {
        &self.quota
    }

    /// The largest cost this limit can ever admit (see [`Algorithm::max_cost`]).
    pub fn max_cost(&self) -> u64 {
        self.algorithm.max_cost(&self.quota)
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
            State::Concurrency(s) => concurrency::check(q, s, now, cost, commit),
        }
    }
}

/// Decides the rules of one request's plan together, as every store must:
/// - every rule is decided as if it were charged alone, in order;
/// - the request is allowed when every **enforced** rule allows and, if the plan has quota
///   rules, one of them allows ([`crate::plan_allows`]); shadow rules never deny;
/// - allowed: every rule that allowed is charged (enforced, shadow and quota alike); a shadow
///   or quota rule that would have denied is charged nothing;
/// - denied: nothing is charged, and the rules that would have allowed report their
///   uncharged state.
///
/// Each item is (limit, state, cost, mode); the states are updated in place.
pub fn decide<'a, I>(items: I, now: Micros) -> Verdict
where
    I: IntoIterator<Item = (&'a Limit, &'a mut State, u64, Mode)>,
{
    let mut items: Vec<_> = items.into_iter().collect();
    let mut decisions: crate::Decisions = items
        .iter_mut()
        .map(|(limit, state, cost, _)| limit.check(state, now, *cost, false))
        .collect();
    let allowed = crate::plan_allows(
        items
            .iter()
            .zip(&decisions)
            .map(|(it, d)| (it.3, d.allowed)),
    );
    if allowed {
        for ((limit, state, cost, _), d) in items.iter_mut().zip(decisions.iter_mut()) {
            if d.allowed {
                *d = limit.check(state, now, *cost, true);
            }
        }
    } else {
        for ((limit, state, _, _), d) in items.iter_mut().zip(decisions.iter_mut()) {
            if d.allowed {
                *d = limit.check(state, now, 0, false);
            }
        }
    }
    Verdict { allowed, decisions }
}
