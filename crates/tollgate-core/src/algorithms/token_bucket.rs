//! Token bucket with lazy refill: capacity `burst`, one token every emission interval `T`.
//!
//! The state is the whole tokens in hand and the instant `last` at which the next partial
//! token started to accrue. Refill adds `floor((now - last) / T)` tokens and moves `last` by
//! exactly that many intervals, so the fractional part is never lost (no drift) and nothing is
//! ever a float. A full bucket stops accruing: `last` jumps to `now`.
//!
//! A settled debt (a request that cost more than its estimate, see `crate::settle`) takes the
//! bucket below empty: `debt` tokens are owed at `last`, and refill pays them off before the
//! bucket holds a token again, so every retry time stays exact.

use crate::{Decision, Micros, Quota};

/// Tokens in hand and the start of the partial token being accrued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenBucketState {
    /// Whole tokens available at `last`.
    pub tokens: u64,
    /// When the partial token being accrued started.
    pub last: Micros,
    /// Tokens owed below an empty bucket at `last` (a settled debt); `tokens` is 0 then.
    pub debt: u64,
}

impl TokenBucketState {
    /// A full bucket, as a new client sees it.
    pub fn full(q: &Quota) -> Self {
        Self {
            tokens: q.burst(),
            last: 0,
            debt: 0,
        }
    }

    /// Tokens in hand, signed: negative while a debt is owed.
    fn signed(&self) -> i128 {
        i128::from(self.tokens) - i128::from(self.debt)
    }
}

/// The bucket refilled up to `now` (clamped to `last`): signed tokens, the new `last`, and
/// `now` as clamped.
fn refill(q: &Quota, state: &TokenBucketState, now: Micros) -> (i128, Micros, Micros) {
    let t = q.emission_interval_micros();
    let burst = i128::from(q.burst());
    let now = now.max(state.last);
    let n = (now - state.last) / t;
    let s = state.signed();
    if s.min(burst) + i128::from(n) >= burst {
        (burst, now, now)
    } else {
        // `s + n < burst`, so `n * t` is below the debt and burst spans (no overflow).
        (s + i128::from(n), state.last + n * t, now)
    }
}

/// A state from signed tokens.
fn from_signed(s: i128, last: Micros) -> TokenBucketState {
    TokenBucketState {
        tokens: u64::try_from(s.max(0)).unwrap_or(u64::MAX),
        last,
        debt: u64::try_from((-s).max(0)).unwrap_or(u64::MAX),
    }
}

/// Micros from a signed count of emission intervals, saturating.
fn span(units: i128, t: Micros) -> Micros {
    u64::try_from((units.max(0)).saturating_mul(i128::from(t))).unwrap_or(u64::MAX)
}

/// Gives back up to `units` tokens (never above a full bucket); returns how many went back.
pub fn refund(q: &Quota, state: &mut TokenBucketState, now: Micros, units: u64) -> u64 {
    let (s, last, _) = refill(q, state, now);
    let burst = i128::from(q.burst());
    let back = i128::from(units).min((burst - s).max(0));
    if back > 0 {
        *state = from_signed(s + back, last);
    }
    u64::try_from(back).unwrap_or(0)
}

/// Charges `units` more tokens even past empty (a debt), up to the bucket's bound on what it
/// can owe ([`crate::settle::max_level`]); returns how many were charged.
pub fn owe(q: &Quota, state: &mut TokenBucketState, now: Micros, units: u64) -> u64 {
    let (s, last, _) = refill(q, state, now);
    let floor = -i128::from(crate::settle::max_level(q, q.emission_interval_micros()))
        + i128::from(q.burst());
    let take = i128::from(units).min((s - floor).max(0));
    if take > 0 {
        *state = from_signed(s - take, last);
    }
    u64::try_from(take).unwrap_or(0)
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
    let (s, last, now) = refill(q, state, now);
    // `now - last` is the partial token accrued so far (less than `t`; 0 when full), so the
    // differences below never go negative, and nothing adds to `last` (no overflow near
    // u64::MAX). `burst * t` is bounded by the quota (MAX_BURST_SPAN), a debt by max_level.
    let partial = now - last;
    let full_after = |s: i128| {
        if s >= i128::from(burst) {
            0
        } else {
            span(i128::from(burst) - s, t) - partial
        }
    };
    let mut d = Decision {
        allowed: false,
        limit: q.limit(),
        remaining: u64::try_from(s.max(0)).unwrap_or(0),
        reset_after: full_after(s),
        retry_after: None,
    };
    if cost > burst {
        return d;
    }
    if s >= i128::from(cost) {
        let left = s - i128::from(cost);
        d.allowed = true;
        d.remaining = u64::try_from(left).unwrap_or(0);
        d.reset_after = full_after(left);
        if commit && cost > 0 {
            *state = from_signed(left, last);
        }
    } else {
        d.retry_after = Some(span(i128::from(cost) - s, t) - partial);
    }
    d
}

/// The instant from which the state equals a fresh (full) bucket.
pub fn idle_at(q: &Quota, state: &TokenBucketState) -> Micros {
    let missing = i128::from(q.burst()) - state.signed();
    state
        .last
        .saturating_add(span(missing, q.emission_interval_micros()))
}
