//! Concurrency: a limit on requests in flight, not on a rate. A request holds `cost` units
//! from admission until it is released; the quota's `limit` is the most held at once and its
//! period is `hold_ttl`, after which a hold nobody renewed is dropped.
//!
//! Holds are counted in time buckets of width `W = hold_ttl / 8`, not per request, so a
//! shared store keeps no record that can leak: a hold is counted in the bucket of the instant
//! it was taken or last renewed, and a bucket starting at `s` is dropped at
//! `s + 2W + hold_ttl`. A live holder renews its holds (moves them to the current bucket)
//! every `W`; a holder that died stops renewing, so its holds are dropped between `hold_ttl`
//! and `hold_ttl + 2W` after its death, never before `hold_ttl` (its last renewal was at most
//! `W` before it died, and the bucket lives `2W + hold_ttl` from its start). At most eleven
//! buckets are live at once.

use crate::{Decision, Micros, Quota};

/// The retry time of a denial: a hold is released when some request ends, which no state
/// predicts, so a denied client is told to come back in a second (`Retry-After: 1`), or when
/// enough holds expire, if sooner.
pub const RETRY_AFTER: Micros = 1_000_000;

/// Holds per bucket, oldest first: (bucket start, units).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ConcurrencyState {
    /// Live buckets in ascending start order, each with a nonzero count.
    pub buckets: Vec<(Micros, u64)>,
}

/// The bucket width: `hold_ttl / 8` (at least 1 us).
pub fn width(q: &Quota) -> Micros {
    (q.period_micros() / 8).max(1)
}

/// When the bucket starting at `start` is dropped.
pub fn expires(q: &Quota, start: Micros) -> Micros {
    start
        .saturating_add(2 * width(q))
        .saturating_add(q.period_micros())
}

/// The start of the bucket `at` falls in.
pub fn bucket(q: &Quota, at: Micros) -> Micros {
    at - at % width(q)
}

/// Drops the buckets that expired by `now`.
fn prune(q: &Quota, state: &mut ConcurrencyState, now: Micros) {
    state
        .buckets
        .retain(|&(start, n)| n > 0 && expires(q, start) > now);
}

fn held(state: &ConcurrencyState) -> u64 {
    state
        .buckets
        .iter()
        .fold(0u64, |a, &(_, n)| a.saturating_add(n))
}

fn add(q: &Quota, state: &mut ConcurrencyState, now: Micros, units: u64) {
    let b = bucket(q, now);
    match state.buckets.iter_mut().find(|(s, _)| *s == b) {
        Some((_, n)) => *n = n.saturating_add(units),
        None => {
            let i = state.buckets.partition_point(|&(s, _)| s < b);
            state.buckets.insert(i, (b, units));
        }
    }
}

/// Takes `units` out of the bucket `at` fell in, if it is still live; returns how many.
fn take(q: &Quota, state: &mut ConcurrencyState, now: Micros, units: u64, at: Micros) -> u64 {
    prune(q, state, now);
    let b = bucket(q, at);
    let Some(i) = state.buckets.iter().position(|(s, _)| *s == b) else {
        return 0;
    };
    let out = units.min(state.buckets[i].1);
    state.buckets[i].1 -= out;
    if state.buckets[i].1 == 0 {
        state.buckets.remove(i);
    }
    out
}

/// Decides one request: admitted while the holds plus `cost` stay within the limit; with
/// `commit`, an admitted request's `cost` is held in the bucket of `now`.
pub fn check(
    q: &Quota,
    state: &mut ConcurrencyState,
    now: Micros,
    cost: u64,
    commit: bool,
) -> Decision {
    let limit = q.limit();
    let mut live = state.clone();
    prune(q, &mut live, now);
    let holding = held(&live);
    let reset = |holding: u64, live: &ConcurrencyState| {
        if holding == 0 {
            0
        } else {
            let last = live.buckets.last().map_or(now, |&(s, _)| expires(q, s));
            RETRY_AFTER.min(last.saturating_sub(now))
        }
    };
    let mut d = Decision {
        allowed: false,
        limit,
        remaining: limit.saturating_sub(holding),
        reset_after: reset(holding, &live),
        retry_after: None,
    };
    if cost > limit {
        return d;
    }
    if holding <= limit && cost <= limit - holding {
        d.allowed = true;
        d.remaining = limit - holding - cost;
        if cost > 0 {
            add(q, &mut live, now, cost);
            d.reset_after = reset(holding + cost, &live);
            if commit {
                *state = live;
            }
        }
    } else {
        // Enough holds expire (if nothing renews them) when the oldest buckets go.
        let mut need = holding + cost - limit;
        let mut at = u64::MAX;
        for &(s, n) in &live.buckets {
            at = expires(q, s);
            if n >= need {
                break;
            }
            need -= n;
        }
        d.retry_after = Some(RETRY_AFTER.min(at.saturating_sub(now)).max(1));
    }
    d
}

/// Releases up to `units` held since `at` (the instant they were taken or last renewed);
/// returns how many were still held (the rest expired).
pub fn release(
    q: &Quota,
    state: &mut ConcurrencyState,
    now: Micros,
    units: u64,
    at: Micros,
) -> u64 {
    take(q, state, now, units, at)
}

/// Renews up to `units` held since `at`: they move to the bucket of `now`. Returns how many
/// were still held (a hold that expired is not taken again).
pub fn renew(q: &Quota, state: &mut ConcurrencyState, now: Micros, units: u64, at: Micros) -> u64 {
    let moved = take(q, state, now, units, at);
    if moved > 0 {
        add(q, state, now, moved);
    }
    moved
}

/// Gives back up to `units` holds that nothing identifies (Envoy's negative hits, see
/// [`crate::Limit::give_back`]): the oldest live bucket first, as those expire first anyway.
/// Returns how many were still held.
pub fn give_back(q: &Quota, state: &mut ConcurrencyState, now: Micros, units: u64) -> u64 {
    prune(q, state, now);
    let mut back = 0u64;
    for (_, n) in state.buckets.iter_mut() {
        let take = (units - back).min(*n);
        *n -= take;
        back += take;
        if back == units {
            break;
        }
    }
    state.buckets.retain(|&(_, n)| n > 0);
    back
}

/// The instant from which the state equals a fresh one: when its newest bucket expires.
pub fn idle_at(q: &Quota, state: &ConcurrencyState) -> Micros {
    state
        .buckets
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|&(s, _)| expires(q, s))
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn q(limit: u64, ttl_ms: u64) -> Quota {
        Quota::new(limit, Duration::from_millis(ttl_ms)).unwrap()
    }

    #[test]
    fn holds_count_until_released_and_never_past_the_limit() {
        let q = q(3, 8_000);
        let mut s = ConcurrencyState::default();
        let t0 = 1_700_000_000_000_000;
        for i in 0..3 {
            let d = check(&q, &mut s, t0 + i, 1, true);
            assert!(d.allowed && d.remaining == 2 - i, "{i}: {d:?}");
        }
        let d = check(&q, &mut s, t0 + 5, 1, true);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(RETRY_AFTER));
        assert_eq!(release(&q, &mut s, t0 + 6, 1, t0), 1);
        assert!(check(&q, &mut s, t0 + 7, 1, true).allowed);
        // Released twice: the second finds nothing more than what is held.
        assert_eq!(release(&q, &mut s, t0 + 8, 5, t0), 3);
        assert_eq!(held(&s), 0);
    }

    #[test]
    fn an_unrenewed_hold_expires_after_hold_ttl_not_before_and_a_renewed_one_stays() {
        let q = q(1, 8_000);
        let w = width(&q);
        assert_eq!(w, 1_000_000);
        let t0 = 1_700_000_000_000_000 + 123_456; // not aligned to a bucket
        let mut dead = ConcurrencyState::default();
        assert!(check(&q, &mut dead, t0, 1, true).allowed);
        // The holder "dies" right after a renewal at t0: never dropped before t0 + ttl.
        let ttl = q.period_micros();
        assert!(!check(&q, &mut dead, t0 + ttl - 1, 1, false).allowed);
        assert!(check(&q, &mut dead, t0 + ttl + 2 * w, 1, false).allowed);
        // A live holder renewing every W keeps its hold for ten hold_ttls.
        let mut live = ConcurrencyState::default();
        assert!(check(&q, &mut live, t0, 1, true).allowed);
        let mut at = t0;
        for k in 1..=80 {
            let now = t0 + k * w;
            assert_eq!(renew(&q, &mut live, now, 1, at), 1, "renewal {k}");
            at = now;
            assert!(!check(&q, &mut live, now + 1, 1, false).allowed, "{k}");
        }
        assert!(live.buckets.len() <= 11);
    }
}
