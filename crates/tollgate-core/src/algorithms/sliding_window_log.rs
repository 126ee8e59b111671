//! Sliding window log: exact. It remembers when every admitted unit arrived and admits while
//! the units in `(now - period, now]` plus the cost stay within the limit. Its memory is
//! O(limit) per client, which is why its quotas are capped at [`MAX_LOG_LIMIT`].
//!
//! Entries with the same timestamp are merged, so a burst of cost `n` at one instant is one
//! entry.

use crate::{Decision, Micros, Quota};
use std::collections::VecDeque;

/// The largest limit a sliding log accepts: each admitted unit may need an entry.
pub const MAX_LOG_LIMIT: u64 = 100_000;

/// One timestamp with the units admitted at it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LogEntry {
    /// When the units were admitted.
    pub at: Micros,
    /// How many units were admitted then.
    pub units: u64,
}

/// The admitted units still inside the window, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct SlidingWindowLogState {
    /// Admitted units, oldest first, timestamps strictly increasing.
    pub entries: VecDeque<LogEntry>,
}

impl SlidingWindowLogState {
    fn newest(&self) -> Micros {
        self.entries.back().map_or(0, |e| e.at)
    }
}

/// Decides one request; writes the state only when `commit` and the request is allowed with a
/// nonzero cost. Expired entries are pruned on commit.
pub fn check(
    q: &Quota,
    state: &mut SlidingWindowLogState,
    now: Micros,
    cost: u64,
    commit: bool,
) -> Decision {
    let p = q.period_micros();
    let limit = q.limit();
    let now = now.max(state.newest());
    // Entries at or before `horizon` are out of the window (now - period, now].
    let horizon = now.saturating_sub(p);
    // Timestamps are increasing: a binary search finds the first live entry, and the sum
    // runs over plain slices (the only O(entries) part of a decision).
    let first_live = state
        .entries
        .partition_point(|e| now >= p && e.at <= horizon);
    let live = state.entries.range(first_live..);
    let (front, back) = state.entries.as_slices();
    // Summed in u128 (no overflow for any count of u64 entries), saturated back to u64.
    let units = |s: &[LogEntry]| s.iter().map(|e| u128::from(e.units)).sum::<u128>();
    let total = if first_live <= front.len() {
        units(&front[first_live..]) + units(back)
    } else {
        units(&back[first_live - front.len()..])
    };
    let in_window = u64::try_from(total).unwrap_or(u64::MAX);
    let mut d = Decision {
        allowed: false,
        limit,
        remaining: limit.saturating_sub(in_window),
        reset_after: if in_window == 0 {
            0
        } else {
            state.newest().saturating_add(p) - now
        },
        retry_after: None,
    };
    if cost > limit {
        return d;
    }
    if in_window <= limit && cost <= limit - in_window {
        d.allowed = true;
        d.remaining = limit - in_window - cost;
        if cost > 0 {
            d.reset_after = p;
        }
        if commit && cost > 0 {
            while state
                .entries
                .front()
                .is_some_and(|e| now >= p && e.at <= horizon)
            {
                state.entries.pop_front();
            }
            match state.entries.back_mut() {
                Some(last) if last.at == now => last.units = last.units.saturating_add(cost),
                _ => state.entries.push_back(LogEntry {
                    at: now,
                    units: cost,
                }),
            }
        }
        return d;
    }
    // Drop the oldest live entries until the request fits; the last one dropped decides.
    let mut excess = in_window.saturating_add(cost) - limit;
    let mut at = now;
    for e in live {
        at = e.at;
        if e.units >= excess {
            break;
        }
        excess -= e.units;
    }
    // `at` is live: now - period < at <= now, so this is positive and cannot overflow.
    d.retry_after = Some(p - (now - at));
    d
}

/// The instant from which the state equals a fresh one.
pub fn idle_at(q: &Quota, state: &SlidingWindowLogState) -> Micros {
    match state.entries.back() {
        Some(e) => e.at.saturating_add(q.period_micros()),
        None => 0,
    }
}

/// Removes up to `units` of the entry admitted at `at` (a later entry at the same instant is
/// the same entry: the log merges them); none once it left the window. Returns how many.
pub fn refund(
    q: &Quota,
    state: &mut SlidingWindowLogState,
    now: Micros,
    units: u64,
    at: Micros,
) -> u64 {
    let p = q.period_micros();
    let now = now.max(state.newest());
    if now >= p && at <= now - p {
        return 0;
    }
    let Some(i) = state.entries.iter().position(|e| e.at == at) else {
        return 0;
    };
    let back = units.min(state.entries[i].units);
    state.entries[i].units -= back;
    if state.entries[i].units == 0 {
        state.entries.remove(i);
    }
    back
}

/// Logs `units` more at `now`, past the limit (a debt that leaves the window with them), up
/// to [`crate::settle::MAX_COUNT`] in the window; returns how many.
pub fn owe(q: &Quota, state: &mut SlidingWindowLogState, now: Micros, units: u64) -> u64 {
    let p = q.period_micros();
    let now = now.max(state.newest());
    let horizon = now.saturating_sub(p);
    while state
        .entries
        .front()
        .is_some_and(|e| now >= p && e.at <= horizon)
    {
        state.entries.pop_front();
    }
    let live: u64 = state
        .entries
        .iter()
        .fold(0u64, |a, e| a.saturating_add(e.units));
    let take = units.min(crate::settle::MAX_COUNT.saturating_sub(live));
    if take > 0 {
        match state.entries.back_mut() {
            Some(last) if last.at == now => last.units += take,
            _ => state.entries.push_back(LogEntry {
                at: now,
                units: take,
            }),
        }
    }
    take
}

/// Gives back up to `units` of a charge nothing recorded (see [`crate::Limit::give_back`]):
/// the newest live entries shrink first (an entry out of the window no longer counts);
/// returns how many.
pub fn give_back(q: &Quota, state: &mut SlidingWindowLogState, now: Micros, units: u64) -> u64 {
    let p = q.period_micros();
    let now = now.max(state.newest());
    let mut back = 0u64;
    // Each pass takes a whole entry or ends: at most one pass per entry.
    while back < units {
        let Some(last) = state.entries.back_mut() else {
            break;
        };
        if now >= p && last.at <= now - p {
            break;
        }
        let take = (units - back).min(last.units);
        last.units -= take;
        back += take;
        if last.units == 0 {
            state.entries.pop_back();
        } else {
            break;
        }
    }
    back
}
