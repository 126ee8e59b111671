//! Sliding window log: exact. It remembers when every admitted unit arrived and admits while
//! the units in `(now - period, now]` plus the cost stay within the limit. Its memory is
//! O(limit) per client, which is why its quotas are capped at [`MAX_LOG_LIMIT`].
//!
//! Entries with the same timestamp are merged, so a burst of cost `n` at one instant is one
//! entry. The state keeps the sum of its entries' units, so a decision sums only the entries
//! that left the window since the last admission (pruned then): an admission costs the same
//! at any length of log (`cargo bench -p tollgate-core --bench algorithms -- long_log`).

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
#[derive(Debug, Clone, Default)]
pub struct SlidingWindowLogState {
    /// Admitted units, oldest first, timestamps strictly increasing.
    entries: VecDeque<LogEntry>,
    /// The units of `entries`, summed; `u64::MAX` once the sum reaches it (then summed anew
    /// where needed: no limit or debt comes near, only states made up by tests).
    units: u64,
}

/// Two states are equal when their entries are (the sum follows from them).
impl PartialEq for SlidingWindowLogState {
    fn eq(&self, other: &Self) -> bool {
        self.entries == other.entries
    }
}

impl Eq for SlidingWindowLogState {}

impl std::hash::Hash for SlidingWindowLogState {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.entries.hash(h);
    }
}

impl SlidingWindowLogState {
    /// A log of `entries`: oldest first, timestamps strictly increasing (not checked; a log
    /// out of order decides as its order says).
    pub fn from_entries(entries: VecDeque<LogEntry>) -> Self {
        let units = sum(entries.iter());
        Self { entries, units }
    }

    /// Admitted units, oldest first.
    pub fn entries(&self) -> &VecDeque<LogEntry> {
        &self.entries
    }

    fn newest(&self) -> Micros {
        self.entries.back().map_or(0, |e| e.at)
    }

    /// The units of entries `from..`.
    fn units_from(&self, from: usize) -> u64 {
        if self.units == u64::MAX {
            return sum(self.entries.range(from..));
        }
        // The entries before `from` are those that left the window since the last admission.
        self.units - sum(self.entries.range(..from))
    }

    /// `units` more at `now` (merged into the newest entry when it is at `now`).
    fn push(&mut self, now: Micros, units: u64) {
        match self.entries.back_mut() {
            Some(last) if last.at == now => last.units = last.units.saturating_add(units),
            _ => self.entries.push_back(LogEntry { at: now, units }),
        }
        self.units = self.units.saturating_add(units);
    }

    /// Drops the entries at or before `horizon` (none while `now < p`).
    fn prune(&mut self, now: Micros, p: Micros, horizon: Micros) {
        let mut dropped = 0u64;
        while let Some(e) = self.entries.front() {
            if !(now >= p && e.at <= horizon) {
                break;
            }
            dropped = dropped.saturating_add(e.units);
            self.entries.pop_front();
        }
        self.forget(dropped);
    }

    /// `units` fewer in the sum (once the entries no longer hold them; a saturated sum is
    /// made anew from what they hold).
    fn forget(&mut self, units: u64) {
        if self.units == u64::MAX {
            self.units = sum(self.entries.iter());
        } else {
            self.units -= units;
        }
    }
}

/// The units of `entries`, summed, saturated at `u64::MAX`.
fn sum<'a>(entries: impl Iterator<Item = &'a LogEntry>) -> u64 {
    entries.fold(0u64, |a, e| a.saturating_add(e.units))
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
    // Timestamps are increasing: a binary search finds the first live entry.
    let first_live = state
        .entries
        .partition_point(|e| now >= p && e.at <= horizon);
    let in_window = state.units_from(first_live);
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
            state.prune(now, p, horizon);
            state.push(now, cost);
        }
        return d;
    }
    // Drop the oldest live entries until the request fits; the last one dropped decides.
    let mut excess = in_window.saturating_add(cost) - limit;
    let mut at = now;
    for e in state.entries.range(first_live..) {
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
    let Ok(i) = state.entries.binary_search_by_key(&at, |e| e.at) else {
        return 0;
    };
    let back = units.min(state.entries[i].units);
    state.entries[i].units -= back;
    if state.entries[i].units == 0 {
        state.entries.remove(i);
    }
    state.forget(back);
    back
}

/// Logs `units` more at `now`, past the limit (a debt that leaves the window with them), up
/// to [`crate::settle::MAX_COUNT`] in the window; returns how many.
pub fn owe(q: &Quota, state: &mut SlidingWindowLogState, now: Micros, units: u64) -> u64 {
    let p = q.period_micros();
    let now = now.max(state.newest());
    let horizon = now.saturating_sub(p);
    state.prune(now, p, horizon);
    let live = state.units_from(0);
    let take = units.min(crate::settle::MAX_COUNT.saturating_sub(live));
    if take > 0 {
        state.push(now, take);
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
    state.forget(back);
    back
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::Duration;

    /// One operation on a log: a check (committed or not), a refund of an entry, a debt, a
    /// give-back; with how far the clock moves first (backwards too) and how many units.
    #[derive(Debug, Clone)]
    enum Op {
        Check { commit: bool },
        Refund { entry: usize },
        Owe,
        GiveBack,
    }

    fn op() -> impl Strategy<Value = (Op, i64, u64)> {
        let kind = prop_oneof![
            4 => any::<bool>().prop_map(|commit| Op::Check { commit }),
            1 => any::<usize>().prop_map(|entry| Op::Refund { entry }),
            1 => Just(Op::Owe),
            1 => Just(Op::GiveBack),
        ];
        (kind, -300i64..1_500, 0u64..12)
    }

    /// The units in the window as the log's entries say, summed from scratch.
    fn live(state: &SlidingWindowLogState, p: Micros, now: Micros) -> u64 {
        let now = now.max(state.newest());
        state
            .entries
            .iter()
            .filter(|e| !(now >= p && e.at <= now - p))
            .fold(0u64, |a, e| a.saturating_add(e.units))
    }

    proptest! {
        /// Whatever runs on a log, its kept sum is its entries' sum, and every decision's
        /// remaining count is the limit less the units its window holds, summed from scratch.
        #[test]
        fn the_kept_sum_is_the_entries_sum(ops in prop::collection::vec(op(), 1..200)) {
            let q = Quota::new(20, Duration::from_millis(5)).expect("a quota");
            let p = q.period_micros();
            let mut state = SlidingWindowLogState::default();
            let mut now: Micros = 1_000_000;
            for (op, step, units) in ops {
                now = now.saturating_add_signed(step);
                match op {
                    Op::Check { commit } => {
                        let expect = q.limit().saturating_sub(live(&state, p, now));
                        let d = check(&q, &mut state, now, units, commit);
                        if d.allowed {
                            prop_assert_eq!(d.remaining, expect - units);
                        } else {
                            prop_assert_eq!(d.remaining, expect);
                        }
                    }
                    Op::Refund { entry } => {
                        let at = match state.entries.len() {
                            0 => now,
                            n => state.entries[entry % n].at,
                        };
                        refund(&q, &mut state, now, units, at);
                    }
                    Op::Owe => {
                        owe(&q, &mut state, now, units);
                    }
                    Op::GiveBack => {
                        give_back(&q, &mut state, now, units);
                    }
                }
                prop_assert_eq!(state.units, sum(state.entries.iter()));
            }
        }
    }

    #[test]
    fn a_saturated_sum_is_summed_anew_once_it_falls() {
        let q = Quota::new(10, Duration::from_secs(1)).expect("a quota");
        let mut state = SlidingWindowLogState::from_entries(
            [
                LogEntry {
                    at: 1,
                    units: u64::MAX,
                },
                LogEntry { at: 2, units: 3 },
            ]
            .into(),
        );
        assert_eq!(state.units, u64::MAX);
        assert_eq!(check(&q, &mut state, 3, 1, true).remaining, 0);
        // The first entry leaves the window: the sum is exact again.
        let later = 1 + q.period_micros();
        let d = check(&q, &mut state, later, 1, true);
        assert!(d.allowed);
        assert_eq!(d.remaining, 10 - 3 - 1);
        assert_eq!(state.units, 4);
    }
}
