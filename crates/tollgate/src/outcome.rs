//! What the limiter decided for one request, per policy and as a whole.

use crate::policy::Policy;
use tollgate_core::{Decision, Micros};

/// The outcome of one policy for one request: the `outcome` label of
/// `tollgate_decisions_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The store admitted it.
    Allowed,
    /// The store (or the deny cache) rejected it.
    Limited,
    /// A shadow policy would have rejected it; it was not rejected.
    ShadowLimited,
    /// The store failed and the policy fails open.
    FailedOpen,
    /// The store failed and the policy fails closed.
    FailedClosed,
    /// The store failed and the local fallback admitted it.
    FallbackAllowed,
    /// The store failed and the local fallback rejected it.
    FallbackLimited,
}

impl Outcome {
    /// Every outcome, in metric order.
    pub const ALL: [Outcome; 7] = [
        Outcome::Allowed,
        Outcome::Limited,
        Outcome::ShadowLimited,
        Outcome::FailedOpen,
        Outcome::FailedClosed,
        Outcome::FallbackAllowed,
        Outcome::FallbackLimited,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Limited => "limited",
            Outcome::ShadowLimited => "shadow_limited",
            Outcome::FailedOpen => "failed_open",
            Outcome::FailedClosed => "failed_closed",
            Outcome::FallbackAllowed => "fallback_allowed",
            Outcome::FallbackLimited => "fallback_limited",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
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

    /// The names of the policies that rejected the request.
    pub fn violated(&self) -> impl Iterator<Item = &str> {
        self.results
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Limited | Outcome::FallbackLimited))
            .map(|r| r.policy.name())
    }
}
