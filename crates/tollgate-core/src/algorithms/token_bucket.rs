//! Token bucket with lazy refill: capacity `burst`, one token every emission interval `T`.
//!
//! The state is the whole tokens in hand and the instant `last` at which the next partial
//! token started to accrue. Refill adds `floor((now - last) / T)` tokens and moves `last` by
//! exactly that many intervals, so the fractional part is never lost (no drift) and nothing is
//! ever a float. A full bucket stops accruing: `last` jumps to `now`.

use crate::{Decision, Micros, Quota};

/// Tokens in hand and the start of the partial token being accrued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenBucketState {
    /// Whole tokens available at `last`.
    pub tokens: u64,
    /// When the partial token being accrued started.
    pub last: Micros,
}

impl TokenBucketState {
    /// A full bucket, as a new client sees it.
    pub fn full(q: &Quota) -> Self {
        Self {
            tokens: q.burst(),
            last: 0,
        }
    }
}

/// Decides one request; writes the state only when `commit` and the request is allowed with a
/// nonzero cost.
pub fn check(
    q: &Quota,
    state: &mut TokenBucketState,
    now: Micros,
    cost: u64,
    commit: bool,
) -> Decision {
    let t = q.emission_interval_micros();
    let burst = q.burst();
    let now = now.max(state.last);
    let n = (now - state.last) / t;
    let (tokens, last) = if state.tokens.min(burst) + n.min(burst) >= burst {
        (burst, now)
    } else {
        (state.tokens + n, state.last + n * t)
    };
    // `now - last` is the partial token accrued so far (less than `t`; 0 when full), so the
    // differences below never go negative, and nothing adds to `last` (no overflow near
    // u64::MAX). `burst * t` is bounded by the quota (MAX_BURST_SPAN).
    let partial = now - last;
    let full_after = |tokens: u64| {
        if tokens >= burst {
            0
        } else {
            (burst - tokens) * t - partial
        }
    };
    let mut d = Decision {
        allowed: false,
        limit: q.limit(),
        remaining: tokens,
        reset_after: full_after(tokens),
        retry_after: None,
    };
    if cost > burst {
        return d;
    }
    if tokens >= cost {
        let left = tokens - cost;
        d.allowed = true;
        d.remaining = left;
        d.reset_after = full_after(left);
        if commit && cost > 0 {
            *state = TokenBucketState { tokens: left, last };
        }
    } else {
        d.retry_after = Some((cost - tokens) * t - partial);
    }
    d
}

/// The instant from which the state equals a fresh (full) bucket.
pub fn idle_at(q: &Quota, state: &TokenBucketState) -> Micros {
    let missing = q.burst().saturating_sub(state.tokens);
    state
        .last
        .saturating_add(missing * q.emission_interval_micros())
}
