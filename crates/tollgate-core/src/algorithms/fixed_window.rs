//! Fixed window: windows are aligned to multiples of `period` since the Unix epoch (so every
//! gateway agrees on them), and a window admits while `count + cost <= limit`.
//!
//! Its known flaw is the boundary: a client can spend a full window at the end of one and
//! another at the start of the next, twice the limit within a short interval. `tollgate
//! simulate` shows it. The burst setting does not apply.

use crate::{Decision, Micros, Quota};

/// The start of the window being counted and the units admitted in it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct FixedWindowState {
    /// Start of the counted window (a multiple of the period).
    pub window_start: Micros,
    /// Units admitted in that window.
    pub count: u64,
}

/// Decides one request; writes the state only when `commit` and the request is allowed with a
/// nonzero cost.
pub fn check(
    q: &Quota,
    state: &mut FixedWindowState,
    now: Micros,
    cost: u64,
    commit: bool,
) -> Decision {
    let period = q.period_micros();
    let limit = q.limit();
    // A clock that went back into an earlier window keeps counting the stored one.
    let now = now.max(state.window_start);
    let window_start = now - now % period;
    let count = if window_start == state.window_start {
        state.count
    } else {
        0
    };
    let window_end = window_start.saturating_add(period);
    let reset = |count: u64| if count == 0 { 0 } else { window_end - now };
    let mut d = Decision {
        allowed: false,
        limit,
        remaining: limit.saturating_sub(count),
        reset_after: reset(count),
        retry_after: None,
    };
    if cost > limit {
        return d;
    }
    // `count + cost <= limit`, without overflow when the stored count is out of range.
    if count <= limit && cost <= limit - count {
        d.allowed = true;
        d.remaining = limit - count - cost;
        d.reset_after = reset(count + cost);
        if commit && cost > 0 {
            *state = FixedWindowState {
                window_start,
                count: count + cost,
            };
        }
    } else {
        d.retry_after = Some(window_end - now);
    }
    d
}

/// The instant from which the state equals a fresh one.
pub fn idle_at(q: &Quota, state: &FixedWindowState) -> Micros {
    if state.count == 0 {
        0
    } else {
        state.window_start.saturating_add(q.period_micros())
    }
}

/// Gives back up to `units` charged at `at`: only while `now` is still in the window `at`
/// fell in (a later window never saw them); returns how many.
pub fn refund(q: &Quota, state: &mut FixedWindowState, now: Micros, units: u64, at: Micros) -> u64 {
    let p = q.period_micros();
    let now = now.max(state.window_start);
    let window = now - now % p;
    if window != at - at % p || state.window_start != window {
        return 0;
    }
    let back = units.min(state.count);
    state.count -= back;
    back
}

/// Charges `units` more in the current window, past the limit (a debt the window's end
/// clears), up to [`crate::settle::MAX_COUNT`]; returns how many.
pub fn owe(q: &Quota, state: &mut FixedWindowState, now: Micros, units: u64) -> u64 {
    let p = q.period_micros();
    let now = now.max(state.window_start);
    let window = now - now % p;
    let count = if state.window_start == window {
        state.count
    } else {
        0
    };
    let take = units.min(crate::settle::MAX_COUNT.saturating_sub(count));
    if take > 0 {
        *state = FixedWindowState {
            window_start: window,
            count: count + take,
        };
    }
    take
}

/// Gives back up to `units` of a charge nothing recorded (a give-back, see
/// [`crate::Limit::give_back`]): from the current window only (an earlier one no longer
/// counts); returns how many.
pub fn give_back(q: &Quota, state: &mut FixedWindowState, now: Micros, units: u64) -> u64 {
    let p = q.period_micros();
    let now = now.max(state.window_start);
    if state.window_start != now - now % p {
        return 0;
    }
    let back = units.min(state.count);
    state.count -= back;
    back
}
