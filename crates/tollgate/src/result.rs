//! What the limiter decided for one request, per policy and as a whole.

use crate::outcome::Outcome;
use crate::policy::Policy;
use std::time::Duration;
use tollgate_core::{micros_to_duration, Decision, Micros};

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
        /// Microseconds until the same request would pass.
        retry_after: Option<Micros>,
    },
    /// Reject with 503: the store failed and a policy fails closed.
    Unavailable {
        /// Microseconds after which trying again makes sense (the breaker's next probe).
        retry_after: Micros,
    },
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
        self.results
            .iter()
            .filter(|r| !r.policy.is_shadow())
            .filter_map(|r| Some((r, r.decision?)))
            .max_by_key(|(_, d)| d.constraint())
            .map(|(r, _)| r)
    }

    /// How long until the request would pass: `Some` for a 429 with a retry time (a 503's
    /// wait included), `None` when allowed or when retrying never helps.
    pub fn retry_after(&self) -> Option<Duration> {
        match self.action {
            Action::Allow => None,
            Action::Limit { retry_after } => retry_after.map(micros_to_duration),
            Action::Unavailable { retry_after } => Some(micros_to_duration(retry_after)),
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
