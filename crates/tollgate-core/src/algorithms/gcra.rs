//! GCRA, the generic cell rate algorithm in its virtual-scheduling form. The whole state is
//! one integer, the theoretical arrival time (TAT): the instant at which the bucket would be
//! full again. That is why the memory store keeps it in one `AtomicU64` and the Redis script
//! in one string key.
//!
//! With emission interval `T` and capacity `B`, a request of cost `c` at `now` passes when
//! `max(TAT, now) + c*T - now <= B*T`; it then sets `TAT = max(TAT, now) + c*T`.

use crate::{Decision, Micros, Quota};

/// The theoretical arrival time in microseconds since the epoch; 0 (or any past time) is fresh.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct GcraState {
    /// Theoretical arrival time.
    pub tat: Micros,
}

/// Decides one request; writes the state only when `commit` and the request is allowed with a
/// nonzero cost.
pub fn check(q: &Quota, state: &mut GcraState, now: Micros, cost: u64, commit: bool) -> Decision {
    let t = q.emission_interval_micros();
    let capacity = q.burst() * t;
    let tat = state.tat.max(now);
    let used = tat - now;
    let remaining_before = capacity.saturating_sub(used) / t;
    let mut d = Decision {
        allowed: false,
        limit: q.limit(),
        remaining: remaining_before,
        reset_after: used,
        retry_after: None,
    };
    if cost > q.burst() {
        return d;
    }
    let need = cost * t;
    // `used` is unbounded when the clock stepped far back; saturate rather than overflow.
    let new_used = used.saturating_add(need);
    if new_used <= capacity {
        d.allowed = true;
        d.remaining = (capacity - new_used) / t;
        d.reset_after = new_used;
        if commit && cost > 0 {
            // Saturates only within 2^52 us of u64::MAX (half a million years from now).
            state.tat = now.saturating_add(new_used);
        }
    } else {
        d.retry_after = Some(new_used - capacity);
    }
    d
}

/// The instant from which the state equals a fresh one.
pub fn idle_at(state: &GcraState) -> Micros {
    state.tat
}

/// Moves the TAT back by `units` emission intervals, never before `now` (a fresh state);
/// returns how many units went back (a partial interval counts as one).
pub fn refund(q: &Quota, state: &mut GcraState, now: Micros, units: u64) -> u64 {
    let t = q.emission_interval_micros();
    if state.tat <= now {
        return 0;
    }
    let tat = state.tat.saturating_sub(units.saturating_mul(t)).max(now);
    let back = (state.tat - tat).div_ceil(t);
    state.tat = tat;
    back
}

/// Moves the TAT further by `units` emission intervals, past the capacity (a debt), up to
/// [`crate::settle::max_level`]; returns how many units.
pub fn owe(q: &Quota, state: &mut GcraState, now: Micros, units: u64) -> u64 {
    let t = q.emission_interval_micros();
    let tat = state.tat.max(now);
    let used = tat - now;
    let cap = crate::settle::max_level(q, t).saturating_mul(t);
    let take = units.min(cap.saturating_sub(used) / t);
    if take > 0 {
        state.tat = tat.saturating_add(take * t);
    }
    take
}
