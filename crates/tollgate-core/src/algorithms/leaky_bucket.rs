//! Leaky bucket as a meter: every admitted unit raises the level by one, the level drains by
//! one unit every emission interval `T`, and a request that would overflow the capacity
//! `burst` is rejected (not queued).
//!
//! As with the token bucket, draining is lazy and integer: `floor((now - last) / T)` units
//! drain and `last` moves by exactly that many intervals; an empty bucket stops draining.

use crate::{Decision, Micros, Quota};

/// The level of the bucket and the start of the partial unit being drained.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct LeakyBucketState {
    /// Units in the bucket at `last`.
    pub level: u64,
    /// When the partial unit being drained started.
    pub last: Micros,
}

/// Decides one request; writes the state only when `commit` and the request is allowed with a
/// nonzero cost.
pub fn check(
    q: &Quota,
    state: &mut LeakyBucketState,
    now: Micros,
    cost: u64,
    commit: bool,
) -> Decision {
    let t = q.emission_interval_micros();
    let burst = q.burst();
    let now = now.max(state.last);
    let drained = (now - state.last) / t;
    let (level, last) = if drained >= state.level {
        (0, now)
    } else {
        (state.level - drained, state.last + drained * t)
    };
    // `now - last` is the partial unit drained so far (less than `t`; 0 when empty). The level
    // may exceed `burst` when the quota shrank since it was stored, hence the saturation.
    let partial = now - last;
    let empty_after = |level: u64| {
        if level == 0 {
            0
        } else {
            level.saturating_mul(t) - partial
        }
    };
    let mut d = Decision {
        allowed: false,
        limit: q.limit(),
        remaining: burst.saturating_sub(level),
        reset_after: empty_after(level),
        retry_after: None,
    };
    if cost > burst {
        return d;
    }
    if level <= burst && cost <= burst - level {
        let new_level = level + cost;
        d.allowed = true;
        d.remaining = burst - new_level;
        d.reset_after = empty_after(new_level);
        if commit && cost > 0 {
            *state = LeakyBucketState {
                level: new_level,
                last,
            };
        }
    } else {
        let overflow = level.saturating_add(cost) - burst;
        d.retry_after = Some(overflow.saturating_mul(t) - partial);
    }
    d
}

/// The instant from which the state equals a fresh (empty) bucket.
pub fn idle_at(q: &Quota, state: &LeakyBucketState) -> Micros {
    state
        .last
        .saturating_add(state.level.saturating_mul(q.emission_interval_micros()))
}

/// The bucket drained up to `now` (clamped to `last`): level and the new `last`.
fn drain(q: &Quota, state: &LeakyBucketState, now: Micros) -> (u64, Micros) {
    let t = q.emission_interval_micros();
    let now = now.max(state.last);
    let drained = (now - state.last) / t;
    if drained >= state.level {
        (0, now)
    } else {
        (state.level - drained, state.last + drained * t)
    }
}

/// Takes up to `units` out of the bucket (never below empty); returns how many.
pub fn refund(q: &Quota, state: &mut LeakyBucketState, now: Micros, units: u64) -> u64 {
    let (level, last) = drain(q, state, now);
    let back = units.min(level);
    if back > 0 {
        *state = LeakyBucketState {
            level: level - back,
            last,
        };
    }
    back
}

/// Pours `units` more in, past the capacity (a debt the bucket drains before it admits
/// again), up to [`crate::settle::max_level`]; returns how many.
pub fn owe(q: &Quota, state: &mut LeakyBucketState, now: Micros, units: u64) -> u64 {
    let (level, last) = drain(q, state, now);
    let cap = crate::settle::max_level(q, q.emission_interval_micros());
    let take = units.min(cap.saturating_sub(level));
    if take > 0 {
        *state = LeakyBucketState {
            level: level + take,
            last,
        };
    }
    take
}
