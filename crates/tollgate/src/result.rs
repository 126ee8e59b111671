//! What the limiter decided for one request, per policy and as a whole.
//!
//! Times here are [`Duration`]s: the algorithms and stores count whole microseconds (so the
//! Rust and Lua definitions agree), and the limiter converts at this boundary, once, so users
//! never handle a raw microsecond count.

use crate::outcome::Outcome;
use crate::policy::Policy;
use std::time::Duration;
use tollgate_core::micros_to_duration;

/// The answer of one policy's algorithm for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request is admitted (and, when committed, charged).
    pub allowed: bool,
    /// The quota's limit (units per period), for `RateLimit-Policy: q=`.
    pub limit: u64,
    /// Units left after this request (after charging it when allowed).
    pub remaining: u64,
    /// How long until the state is back to fresh (a new client's).
    pub reset_after: Duration,
    /// When denied: how long until the same request would pass if nothing else happened.
    /// `None` when allowed, and when denied because the cost exceeds what the algorithm can
    /// ever admit (see [`Decision::exceeds_capacity`]).
    pub retry_after: Option<Duration>,
}

impl Decision {
    /// Denied because the cost is larger than anything this quota can ever admit: retrying
    /// never helps.
    pub fn exceeds_capacity(&self) -> bool {
        !self.allowed && self.retry_after.is_none()
    }

    /// How constrained this decision is, as an ordering key (greater = more constrained): a
    /// denial over an allowance, then the longer wait (never passing longest), then the
    /// fewer remaining units, then the later reset. What `RateLimit` reports is the maximum.
    pub fn constraint(&self) -> impl Ord {
        let wait = match (self.allowed, self.retry_after) {
            (true, _) => Duration::ZERO,
            (false, Some(r)) => r,
            (false, None) => Duration::MAX,
        };
        (
            !self.allowed,
            wait,
            u64::MAX - self.remaining,
            self.reset_after,
        )
    }
}

impl From<tollgate_core::Decision> for Decision {
    fn from(d: tollgate_core::Decision) -> Self {
        Self {
            allowed: d.allowed,
            limit: d.limit,
            remaining: d.remaining,
            reset_after: micros_to_duration(d.reset_after),
            retry_after: d.retry_after.map(micros_to_duration),
        }
    }
}

/// One policy's part of a [`LimitResult`].
#[derive(Debug, Clone)]
pub struct PolicyResult {
    /// The policy.
    pub policy: Policy,
    /// What happened.
    pub outcome: Outcome,
    /// The algorithm's decision, when one was made (not when the store failed open/closed).
    pub decision: Option<Decision>,
}

/// What to do with the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Let it through.
    Allow,
    /// Reject with 429. `retry_after` is `None` when the cost exceeds what a policy can ever
    /// admit.
    Limit {
        /// How long until the same request would pass.
        retry_after: Option<Duration>,
    },
    /// Reject with 503: the store failed and a policy fails closed.
    Unavailable {
        /// How long until trying again makes sense (the breaker's next probe).
        retry_after: Duration,
    },
}

impl Action {
    /// A 429 whose wait the limiter computed in microseconds.
    pub(crate) fn limit_micros(retry_after: Option<tollgate_core::Micros>) -> Self {
        Action::Limit {
            retry_after: retry_after.map(micros_to_duration),
        }
    }
}

/// The limiter's answer for one request.
#[derive(Debug, Clone)]
pub struct LimitResult {
    /// Allow, 429 or 503.
    pub action: Action,
    /// One entry per policy that was evaluated. Policies skipped because the deny cache
    /// already rejected the request are absent.
    pub results: Vec<PolicyResult>,
}

impl LimitResult {
    /// The most constrained evaluated policy with a decision, shadow policies aside (what the
    /// `RateLimit` header reports): a rejection with the longest wait first, else the least remaining.
    pub fn most_constrained(&self) -> Option<&PolicyResult> {
        // One pass keeping the greatest key so far, the last of equals (as `max_by_key`):
        // the iterator chain with its key of four fields cost 1,200 instructions for ten
        // results under callgrind, and an RLS answer asks twice.
        let mut best = None;
        for r in &self.results {
            let Some(d) = &r.decision else { continue };
            if r.policy.is_shadow() {
                continue;
            }
            let key = d.constraint();
            match &best {
                Some((_, b)) if key < *b => {}
                _ => best = Some((r, key)),
            }
        }
        best.map(|(r, _)| r)
    }

    /// How long until the request would pass: `Some` for a 429 with a retry time (a 503's
    /// wait included), `None` when allowed or when retrying never helps.
    pub fn retry_after(&self) -> Option<Duration> {
        match self.action {
            Action::Allow => None,
            Action::Limit { retry_after } => retry_after,
            Action::Unavailable { retry_after } => Some(retry_after),
        }
    }

    /// Whether the request may pass.
    pub fn is_allowed(&self) -> bool {
        self.action == Action::Allow
    }

    /// The names of the policies that rejected the request.
    pub fn violated(&self) -> impl Iterator<Item = &str> {
        self.results
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Limited | Outcome::FallbackLimited))
            .map(|r| r.policy.name())
    }
}
