//! Sliding window counter: the approximation of a sliding window from two fixed windows. The
//! previous window's count is weighted by the part of it still inside the sliding window:
//! `previous * (period - elapsed) / period + current + cost <= limit`, where `elapsed` is the
//! time since the current window began.
//!
//! It is evaluated exactly in integers, multiplied through by `period`:
//! `previous * (period - elapsed) + (current + cost) * period <= limit * period`.
//! It assumes the previous window's requests were spread evenly; when they all came at its
//! end, it under-admits for a while (it never admits more than `limit` in one window).

use crate::{Decision, Micros, Quota};

/// Counts of the current and the previous aligned window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct SlidingWindowCounterState {
    /// Start of the current window (a multiple of the period).
    pub window_start: Micros,
    /// Units admitted in the current window.
    pub current: u64,
    /// Units admitted in the window before it.
    pub previous: u64,
}

/// Decides one request; writes the state only when `commit` and the request is allowed with a
/// nonzero cost.
pub fn check(
    q: &Quota,
    state: &mut SlidingWindowCounterState,
    now: Micros,
    cost: u64,
    commit: bool,
) -> Decision {
    let p = q.period_micros();
    let limit = q.limit();
    let now = now.max(state.window_start);
    let SlidingWindowCounterState {
        window_start: ws,
        current,
        previous,
    } = roll(q, state, now);
    let elapsed = now - ws;
    let p128 = u128::from(p);
    // previous * (p - elapsed): the weighted previous count, scaled by p.
    let weighted = u128::from(previous) * u128::from(p - elapsed);
    let budget = u128::from(limit) * p128;
    let used = |current: u64| weighted + u128::from(current) * p128;
    let remaining = |current: u64| {
        let left = budget.saturating_sub(used(current)) / p128;
        u64::try_from(left).unwrap_or(limit)
    };
    let reset = |current: u64| {
        if current > 0 {
            ws.saturating_add(2 * p) - now
        } else if previous > 0 {
            ws.saturating_add(p) - now
        } else {
            0
        }
    };
    let mut d = Decision {
        allowed: false,
        limit,
        remaining: remaining(current),
        reset_after: reset(current),
        retry_after: None,
    };
    if cost > limit {
        return d;
    }
    let fits_count = current <= limit && cost <= limit - current;
    if fits_count && used(current + cost) <= budget {
        d.allowed = true;
        d.remaining = remaining(current + cost);
        d.reset_after = reset(current + cost);
        if commit && cost > 0 {
            *state = SlidingWindowCounterState {
                window_start: ws,
                current: current + cost,
                previous,
            };
        }
        return d;
    }
    // The earliest elapsed time e (in some window) at which weight * (p - e) <= room * p.
    let earliest = |weight: u64, room: u64| -> Micros {
        if weight == 0 {
            return 0;
        }
        let fits = u128::from(room) * p128 / u128::from(weight);
        p - u64::try_from(fits.min(p128)).unwrap_or(p)
    };
    let at = if !fits_count {
        // Only the next window can take it; there the current count becomes the previous.
        // Saturates only in the last window before u64::MAX.
        ws.saturating_add(p)
            .saturating_add(earliest(current, limit - cost))
    } else {
        ws.saturating_add(earliest(previous, limit - current - cost))
    };
    d.retry_after = Some(at - now);
    d
}

/// The instant from which the state equals a fresh one.
pub fn idle_at(q: &Quota, state: &SlidingWindowCounterState) -> Micros {
    let p = q.period_micros();
    if state.current > 0 {
        state.window_start.saturating_add(2 * p)
    } else if state.previous > 0 {
        state.window_start.saturating_add(p)
    } else {
        0
    }
}

/// The state rolled to the window of `now` (clamped): window start, current, previous.
fn roll(q: &Quota, state: &SlidingWindowCounterState, now: Micros) -> SlidingWindowCounterState {
    let p = q.period_micros();
    let now = now.max(state.window_start);
    let ws = now - now % p;
    let (previous, current) = if ws == state.window_start {
        (state.previous, state.current)
    } else if ws == state.window_start.saturating_add(p) {
        (state.current, 0)
    } else {
        (0, 0)
    };
    SlidingWindowCounterState {
        window_start: ws,
        current,
        previous,
    }
}

/// Gives back up to `units` charged at `at` from the window they were counted in: the
/// current one, or the previous one (where they still weigh); none once that window is gone.
pub fn refund(
    q: &Quota,
    state: &mut SlidingWindowCounterState,
    now: Micros,
    units: u64,
    at: Micros,
) -> u64 {
    let p = q.period_micros();
    let mut s = roll(q, state, now);
    let charged = at - at % p;
    let back = if charged == s.window_start {
        let b = units.min(s.current);
        s.current -= b;
        b
    } else if charged.saturating_add(p) == s.window_start {
        let b = units.min(s.previous);
        s.previous -= b;
        b
    } else {
        0
    };
    if back > 0 {
        *state = s;
    }
    back
}

/// Charges `units` more in the current window, past the limit (a debt that weighs on the
/// next window too), up to [`crate::settle::max_level`] of the period; returns how many.
pub fn owe(q: &Quota, state: &mut SlidingWindowCounterState, now: Micros, units: u64) -> u64 {
    let mut s = roll(q, state, now);
    let cap = crate::settle::max_level(q, q.period_micros());
    let take = units.min(cap.saturating_sub(s.current));
    if take > 0 {
        s.current += take;
        *state = s;
    }
    take
}

/// Gives back up to `units` of a charge nothing recorded (see [`crate::Limit::give_back`]):
/// from the current window first, then from the previous one; returns how many.
pub fn give_back(q: &Quota, state: &mut SlidingWindowCounterState, now: Micros, units: u64) -> u64 {
    let mut s = roll(q, state, now);
    let from_current = units.min(s.current);
    s.current -= from_current;
    let from_previous = (units - from_current).min(s.previous);
    s.previous -= from_previous;
    let back = from_current + from_previous;
    if back > 0 {
        *state = s;
    }
    back
}
