//! The edges: the first request, gaps of years, clocks that go backwards, and quotas and
//! times at the ends of `u64`. Tests run with overflow checks on, so any arithmetic overflow
//! in the algorithms is a panic here.

use proptest::prelude::*;
use std::collections::VecDeque;
use std::time::Duration;
use tollgate_core::algorithms::{
    sliding_window_log::LogEntry, FixedWindowState, GcraState, LeakyBucketState,
    SlidingWindowCounterState, SlidingWindowLogState, TokenBucketState, MAX_LOG_LIMIT,
};
use tollgate_core::{Algorithm, Limit, Micros, Quota, State, MAX_LIMIT, MAX_PERIOD};

const YEAR: Micros = 365 * 24 * 3_600 * 1_000_000;
const WALL: Micros = 1_700_000_000_000_000;

fn quota(limit: u64, period: Duration, burst: u64) -> Quota {
    Quota::new(limit, period)
        .and_then(|q| q.with_burst(burst))
        .expect("a valid quota")
}

/// Quotas at the edges of what `Quota` accepts.
fn extreme_quotas() -> Vec<Quota> {
    let one_per_max = Quota::new(1, MAX_PERIOD).expect("valid");
    let max_burst_for_slow = (1u64 << 52) / one_per_max.emission_interval_micros();
    vec![
        quota(1, Duration::from_micros(1), 1),
        quota(1, Duration::from_micros(1), MAX_LIMIT),
        quota(1, MAX_PERIOD, 1),
        quota(1, MAX_PERIOD, max_burst_for_slow),
        quota(MAX_LIMIT, MAX_PERIOD, MAX_LIMIT),
        quota(MAX_LIMIT, MAX_PERIOD, 1),
        quota(MAX_LOG_LIMIT, Duration::from_secs(1), MAX_LOG_LIMIT),
        quota(100, Duration::from_secs(60), 100),
    ]
}

/// Every algorithm that accepts `q` (a `Limit` exists only for quotas its algorithm can run).
fn all(q: Quota) -> impl Iterator<Item = Limit> {
    Algorithm::ALL
        .into_iter()
        .filter_map(move |algorithm| Limit::new(algorithm, q).ok())
}

fn capacity(l: &Limit) -> u64 {
    match l.algorithm() {
        Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Gcra => l.quota().burst(),
        _ => l.quota().limit(),
    }
}

/// Admits cost-1 requests at `now` until one is denied (at most `max`); returns how many.
fn drain(l: &Limit, state: &mut State, now: Micros, max: u64) -> u64 {
    let mut n = 0;
    while n < max && l.check(state, now, 1, true).allowed {
        n += 1;
    }
    n
}

#[test]
fn the_first_request_is_admitted_at_any_time() {
    for q in extreme_quotas() {
        for l in all(q) {
            for now in [0, 1, WALL, u64::MAX / 2, u64::MAX - 1, u64::MAX] {
                let mut s = l.fresh();
                let d = l.check(&mut s, now, 1, true);
                assert!(d.allowed, "{} {q:?} at {now}", l.algorithm());
                assert_eq!(d.remaining, capacity(&l) - 1, "{} at {now}", l.algorithm());
                assert_ne!(s, l.fresh(), "{} did not charge", l.algorithm());
            }
        }
    }
}

#[test]
fn a_gap_of_years_brings_back_exactly_the_full_capacity() {
    for q in [
        quota(100, Duration::from_secs(60), 100),
        quota(7, Duration::from_millis(1_500), 3),
        quota(50, Duration::from_secs(10), 100),
    ] {
        for l in all(q) {
            let cap = capacity(&l);
            let mut s = l.fresh();
            assert_eq!(drain(&l, &mut s, WALL, 10 * cap), cap, "{}", l.algorithm());
            for gap in [YEAR, 100 * YEAR] {
                let mut s = s.clone();
                assert_eq!(
                    drain(&l, &mut s, WALL + gap, 10 * cap),
                    cap,
                    "{}",
                    l.algorithm()
                );
            }
        }
    }
}

#[test]
fn an_exhausted_limit_stays_exhausted_when_the_clock_steps_back() {
    let q = quota(100, Duration::from_secs(60), 100);
    for l in all(q) {
        let mut s = l.fresh();
        drain(&l, &mut s, WALL, 1_000);
        for back in [1, 1_000_000, 59_999_999, 60_000_000, WALL - 1, WALL] {
            let before = s.clone();
            assert_eq!(
                drain(&l, &mut s, WALL - back, 10),
                0,
                "{} back {back}",
                l.algorithm()
            );
            assert_eq!(s, before, "{}", l.algorithm());
        }
    }
}

#[test]
fn huge_quotas_and_times_never_overflow() {
    let times = [
        0,
        1,
        WALL,
        u64::MAX / 2 - 1,
        u64::MAX / 2,
        u64::MAX / 2 + 1,
        u64::MAX - 1_000_000,
        u64::MAX - 1,
        u64::MAX,
    ];
    for q in extreme_quotas() {
        for l in all(q) {
            let costs = [0, 1, 2, q.limit(), q.burst(), MAX_LIMIT, u64::MAX];
            // Forwards, then backwards over the same instants, on one state.
            let mut s = l.fresh();
            for &now in times.iter().chain(times.iter().rev()) {
                for &cost in &costs {
                    let before = s.clone();
                    let d = l.check(&mut s, now, cost, true);
                    let _ = s.idle_at(&q);
                    if !d.allowed {
                        assert_eq!(s, before, "{} denial changed state", l.algorithm());
                    }
                    if cost > capacity(&l) {
                        assert!(d.exceeds_capacity(), "{} cost {cost}", l.algorithm());
                    }
                }
            }
        }
    }
}

#[test]
fn retry_after_stays_exact_far_in_the_future() {
    for q in extreme_quotas() {
        for l in all(q) {
            for now in [u64::MAX / 2, u64::MAX / 4 + 12_345] {
                let mut s = l.fresh();
                drain(&l, &mut s, now, 1_000);
                let d = l.check(&mut s.clone(), now, 1, false);
                let Some(r) = d.retry_after else {
                    // A quota too large to exhaust in 1000 requests.
                    assert!(d.allowed, "{}", l.algorithm());
                    continue;
                };
                assert!(l.check(&mut s.clone(), now + r, 1, false).allowed);
                assert!(!l.check(&mut s.clone(), now + r - 1, 1, false).allowed);
            }
        }
    }
}

/// A state of any algorithm with arbitrary fields (a log keeps its ordering invariant).
fn any_state() -> impl Strategy<Value = State> {
    let t = any::<u64>();
    prop_oneof![
        (t, any::<u64>()).prop_map(
            |(window_start, count)| State::FixedWindow(FixedWindowState {
                window_start,
                count
            })
        ),
        prop::collection::vec((any::<u64>(), 1..=u64::MAX), 0..4).prop_map(|mut v| {
            v.sort_unstable();
            v.dedup_by_key(|e| e.0);
            let entries: VecDeque<_> = v
                .into_iter()
                .map(|(at, units)| LogEntry { at, units })
                .collect();
            State::SlidingWindowLog(SlidingWindowLogState::from_entries(entries))
        }),
        (t, any::<u64>(), any::<u64>()).prop_map(|(window_start, current, previous)| {
            State::SlidingWindowCounter(SlidingWindowCounterState {
                window_start,
                current,
                previous,
            })
        }),
        (any::<u64>(), t, prop_oneof![Just(0u64), any::<u64>()]).prop_map(
            |(tokens, last, debt)| { State::TokenBucket(TokenBucketState { tokens, last, debt }) }
        ),
        (any::<u64>(), t)
            .prop_map(|(level, last)| State::LeakyBucket(LeakyBucketState { level, last })),
        t.prop_map(|tat| State::Gcra(GcraState { tat })),
    ]
}

fn any_time() -> impl Strategy<Value = Micros> {
    prop_oneof![
        any::<u64>(),
        Just(0u64),
        Just(u64::MAX),
        (u64::MAX - 1_000_000_000_000)..=u64::MAX,
        0u64..1_000_000_000,
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, max_shrink_iters: 512, ..ProptestConfig::default() })]

    /// States come from stores and outlive quota changes: whatever they hold, deciding on them
    /// never panics, and a denial still writes nothing.
    #[test]
    fn arbitrary_states_times_and_costs_never_panic(
        qi in 0usize..8,
        state in any_state(),
        now in any_time(),
        cost in prop_oneof![Just(0u64), Just(1u64), any::<u64>()],
    ) {
        let q = extreme_quotas()[qi];
        let algorithm = state.algorithm();
        let Ok(l) = Limit::new(algorithm, q) else {
            return Ok(());
        };
        let mut s = state.clone();
        let d = l.check(&mut s, now, cost, true);
        let _ = s.idle_at(&q);
        let _ = state.idle_at(&q);
        if !d.allowed {
            prop_assert_eq!(&s, &state);
        }
    }

    /// After the clock steps back from the last admission, the requests at the earlier time
    /// and then at a later one admit no more than the same requests at the last admission's
    /// time would: going back never refunds.
    #[test]
    fn a_clock_stepping_back_never_refunds(
        ai in 0usize..6,
        limit in 1u64..=20,
        period in 1_000u64..=1_000_000,
        spread in prop::collection::vec(0u64..200_000, 1..30),
        back in prop_oneof![Just(1u64), 1u64..2_000_000, Just(u64::MAX)],
        k in 1u64..25,
        later in 0u64..3_000_000,
    ) {
        let q = quota(limit, Duration::from_micros(period), limit);
        let l = Limit::new(Algorithm::ALL[ai], q).expect("valid");
        let mut s = l.fresh();
        let mut now = WALL;
        let mut last_admit = None;
        for d in spread {
            now += d;
            if l.check(&mut s, now, 1, true).allowed {
                last_admit = Some(now);
            }
        }
        let Some(at) = last_admit else { return Ok(()) };
        let mut behind = s.clone();
        let mut level = s;
        let back_to = at.saturating_sub(back);
        let stepped_back = drain(&l, &mut behind, back_to, k) + drain(&l, &mut behind, at + later, k);
        let steady = drain(&l, &mut level, at, k) + drain(&l, &mut level, at + later, k);
        prop_assert!(stepped_back <= steady, "{}: {stepped_back} > {steady}", l.algorithm());
    }
}

#[test]
fn states_left_by_a_larger_quota_are_decided_without_overflow() {
    // A quota that shrank (or a state written by another version) can leave counts far above
    // the limit: they deny, with a retry time, and never overflow.
    let q = quota(10, Duration::from_secs(1), 10);
    let states = [
        State::LeakyBucket(LeakyBucketState {
            level: u64::MAX,
            last: WALL,
        }),
        State::FixedWindow(FixedWindowState {
            window_start: WALL,
            count: u64::MAX,
        }),
        State::SlidingWindowCounter(SlidingWindowCounterState {
            window_start: WALL,
            current: u64::MAX,
            previous: u64::MAX,
        }),
        State::SlidingWindowLog(SlidingWindowLogState::from_entries(
            [LogEntry {
                at: WALL,
                units: u64::MAX,
            }]
            .into(),
        )),
        State::Gcra(GcraState { tat: u64::MAX }),
    ];
    for state in states {
        let Ok(l) = Limit::new(state.algorithm(), q) else {
            continue;
        };
        for cost in [1, 10] {
            let mut s = state.clone();
            let d = l.check(&mut s, WALL, cost, true);
            assert!(!d.allowed, "{}", l.algorithm());
            assert!(d.retry_after.is_some(), "{}", l.algorithm());
            assert_eq!(s, state);
        }
    }
}
