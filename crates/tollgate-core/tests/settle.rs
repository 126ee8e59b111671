//! Property tests of settling (costs known later): a refund is exactly as if the real cost had
//! been charged, and a debt keeps every retry time exact; a give-back of a charge nothing
//! recorded (Envoy's negative hits) never leaves a state fresher than a fresh one, and right
//! after a charge of the same units it undoes that charge. Every rate algorithm (and the
//! concurrency limit for give-backs), random quotas, random histories before the charge.

use proptest::prelude::*;
use tollgate_core::{Algorithm, Charge, Limit, Micros, Quota, State};

fn quota() -> impl Strategy<Value = Quota> {
    (1u64..=40, 1_000u64..=5_000_000)
        .prop_flat_map(|(limit, period)| (Just(limit), Just(period), 1..=2 * limit))
        .prop_map(|(limit, period, burst)| {
            Quota::new(limit, std::time::Duration::from_micros(period))
                .and_then(|q| q.with_burst(burst))
                .expect("valid quota")
        })
}

#[derive(Debug, Clone)]
struct Case {
    quota: Quota,
    start: Micros,
    /// (time step, cost) before the charge.
    history: Vec<(Micros, u64)>,
    /// The estimate, the real cost, the time from charge to settle, and the probe steps.
    estimate: u64,
    real: u64,
    wait: Micros,
    probes: Vec<Micros>,
}

fn case() -> impl Strategy<Value = Case> {
    quota().prop_flat_map(|q| {
        let p = q.period_micros();
        let cap = q.limit().max(q.burst());
        let step = prop_oneof![3 => Just(0u64), 2 => 0..=p / 4, 1 => 0..=2 * p];
        (
            Just(q),
            prop_oneof![Just(0u64), 1_600_000_000_000_000u64..1_700_000_000_000_000],
            prop::collection::vec((step.clone(), 0..=3u64), 0..30),
            0..=cap,
            0..=2 * cap + 3,
            step.clone(),
            prop::collection::vec(step, 1..6),
        )
            .prop_map(
                |(quota, start, history, estimate, real, wait, probes)| Case {
                    quota,
                    start,
                    history,
                    estimate,
                    real,
                    wait,
                    probes,
                },
            )
    })
}

fn limits(q: Quota) -> impl Iterator<Item = Limit> {
    Algorithm::ALL
        .into_iter()
        .map(move |a| Limit::new(a, q).expect("valid for every algorithm"))
}

/// The state after the history, and the instant of its last event.
fn history(limit: &Limit, case: &Case) -> (State, Micros) {
    let mut state = limit.fresh();
    let mut now = case.start;
    for &(dt, cost) in &case.history {
        now += dt;
        limit.check(&mut state, now, cost, true);
    }
    (state, now)
}

/// Every decision a client could ask for, from `at` on over the probe steps (queries only).
fn answers(limit: &Limit, state: &State, at: Micros, probes: &[Micros]) -> Vec<String> {
    let cap = limit.quota().limit().max(limit.quota().burst());
    let mut out = Vec::new();
    let mut now = at;
    for &dt in probes {
        now += dt;
        for cost in [0, 1, 2, cap / 2, cap, cap + 1] {
            let mut s = state.clone();
            out.push(format!(
                "{now} {cost}: {:?}",
                limit.check(&mut s, now, cost, false)
            ));
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn a_refund_is_exactly_as_if_the_real_cost_had_been_charged(case in case()) {
        for limit in limits(case.quota) {
            let (before, t0) = history(&limit, &case);
            let real = case.real.min(case.estimate);
            let mut charged = before.clone();
            if !limit.check(&mut charged, t0, case.estimate, true).allowed {
                continue;
            }
            let t1 = t0 + case.wait;
            let mut settled = charged.clone();
            let s = limit.settle(&mut settled, t1, Charge { units: case.estimate, at: t0 }, real);
            prop_assert_eq!(s.charged, 0);
            prop_assert!(s.refunded <= case.estimate - real);
            let mut honest = before.clone();
            prop_assert!(limit.check(&mut honest, t0, real, true).allowed);
            prop_assert_eq!(
                answers(&limit, &settled, t1, &case.probes),
                answers(&limit, &honest, t1, &case.probes),
                "{} refund of {} at +{}", limit.algorithm(), case.estimate - real, case.wait
            );
        }
    }

    #[test]
    fn a_debt_is_charged_and_every_retry_time_stays_exact(case in case()) {
        for limit in limits(case.quota) {
            let (mut state, t0) = history(&limit, &case);
            if !limit.check(&mut state, t0, case.estimate, true).allowed {
                continue;
            }
            let t1 = t0 + case.wait;
            let real = case.estimate + case.real;
            let s = limit.settle(&mut state, t1, Charge { units: case.estimate, at: t0 }, real);
            prop_assert_eq!(s.refunded, 0);
            prop_assert_eq!(s.charged, case.real, "{} debt within its bound is charged whole", limit.algorithm());
            // Denied now: the next request waits the debt out, exactly.
            let cap = limit.max_cost();
            for cost in [1, cap] {
                let mut q = state.clone();
                let d = limit.check(&mut q, t1, cost, false);
                if let Some(wait) = d.retry_after {
                    let mut at = state.clone();
                    prop_assert!(limit.check(&mut at, t1 + wait, cost, false).allowed,
                        "{} cost {} not allowed after its retry time {}", limit.algorithm(), cost, wait);
                    if wait > 0 {
                        let mut early = state.clone();
                        prop_assert!(!limit.check(&mut early, t1 + wait - 1, cost, false).allowed,
                            "{} cost {} allowed before its retry time {}", limit.algorithm(), cost, wait);
                    }
                } else {
                    prop_assert!(d.allowed, "{} denied with no retry time for cost {}", limit.algorithm(), cost);
                }
            }
        }
    }

    #[test]
    fn a_settle_at_the_estimate_changes_nothing(case in case()) {
        for limit in limits(case.quota) {
            let (mut state, t0) = history(&limit, &case);
            if !limit.check(&mut state, t0, case.estimate, true).allowed {
                continue;
            }
            let before = state.clone();
            let s = limit.settle(&mut state, t0 + case.wait, Charge { units: case.estimate, at: t0 }, case.estimate);
            prop_assert_eq!(s, Default::default());
            prop_assert_eq!(state, before);
        }
    }
}

fn every_limit(q: Quota) -> impl Iterator<Item = Limit> {
    Algorithm::EVERY
        .into_iter()
        .map(move |a| Limit::new(a, q).expect("valid for every algorithm"))
}

/// Whether `state` admits nothing a fresh state would not: every probe's decision allows only
/// what a fresh state allows, and a query (cost 0) finds no more remaining.
fn no_fresher_than_fresh(limit: &Limit, state: &State, at: Micros, probes: &[Micros]) -> bool {
    let cap = limit.quota().limit().max(limit.quota().burst());
    let mut now = at;
    for &dt in probes {
        now += dt;
        for cost in [0, 1, 2, cap / 2, cap, cap + 1] {
            let d = limit.check(&mut state.clone(), now, cost, false);
            let f = limit.check(&mut limit.fresh(), now, cost, false);
            if (d.allowed && !f.allowed) || (cost == 0 && d.remaining > f.remaining) {
                return false;
            }
        }
    }
    true
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn a_give_back_never_leaves_a_state_fresher_than_fresh(case in case(), units in 0u64..=200) {
        for limit in every_limit(case.quota) {
            let (mut state, t0) = history(&limit, &case);
            let t1 = t0 + case.wait;
            let back = limit.give_back(&mut state, t1, units);
            prop_assert!(back <= units);
            prop_assert!(no_fresher_than_fresh(&limit, &state, t1, &case.probes),
                "{} give-back of {} at +{}", limit.algorithm(), units, case.wait);
            // Everything given back: exactly a fresh state's decisions, and nothing more to give.
            limit.give_back(&mut state, t1, u64::MAX);
            prop_assert_eq!(
                answers(&limit, &state, t1, &case.probes),
                answers(&limit, &limit.fresh(), t1, &case.probes),
                "{} after giving back everything", limit.algorithm()
            );
            prop_assert_eq!(limit.give_back(&mut state, t1, units), 0);
        }
    }

    #[test]
    fn a_give_back_right_after_a_charge_restores_the_decisions_before_it(case in case()) {
        for limit in limits(case.quota) {
            let (before, t0) = history(&limit, &case);
            let mut state = before.clone();
            if !limit.check(&mut state, t0, case.estimate, true).allowed {
                continue;
            }
            let back = limit.give_back(&mut state, t0, case.estimate);
            prop_assert_eq!(back, case.estimate, "{} gives back the whole charge", limit.algorithm());
            prop_assert_eq!(
                answers(&limit, &state, t0, &case.probes),
                answers(&limit, &before, t0, &case.probes),
                "{} charge and give-back of {}", limit.algorithm(), case.estimate
            );
        }
    }
}

#[test]
fn a_give_back_on_a_fresh_state_changes_nothing() {
    let q = Quota::new(5, std::time::Duration::from_secs(10)).expect("quota");
    let now = 1_700_000_000_000_000;
    for limit in every_limit(q) {
        let mut s = limit.fresh();
        assert_eq!(
            limit.give_back(&mut s, now, 1_000),
            0,
            "{}",
            limit.algorithm()
        );
        assert_eq!(s, limit.fresh(), "{}", limit.algorithm());
    }
}

#[test]
fn give_backs_take_the_newest_log_entries_and_the_oldest_holds_first() {
    let q = Quota::new(10, std::time::Duration::from_secs(8)).expect("quota");
    let t0 = 1_700_000_000_000_000;
    // Sliding log: 3 at t0, 4 at t0 + 1 s; giving back 5 leaves 2 at t0, which leave the
    // window at t0 + 8 s (the newest went first).
    let log = Limit::new(Algorithm::SlidingWindowLog, q).expect("limit");
    let mut s = log.fresh();
    assert!(log.check(&mut s, t0, 3, true).allowed);
    assert!(log.check(&mut s, t0 + 1_000_000, 4, true).allowed);
    assert_eq!(log.give_back(&mut s, t0 + 2_000_000, 5), 5);
    assert_eq!(
        log.check(&mut s.clone(), t0 + 2_000_000, 0, false)
            .remaining,
        8
    );
    assert_eq!(
        log.check(&mut s.clone(), t0 + 8_000_000, 0, false)
            .remaining,
        10
    );
    // Concurrency: 3 held at t0, 4 at t0 + 1 s; giving back 5 takes the 3 of t0 first, so
    // what stays (2 of t0 + 1 s) expires a bucket later than the t0 bucket would.
    let inflight = Limit::new(Algorithm::Concurrency, q).expect("limit");
    let mut s = inflight.fresh();
    assert!(inflight.check(&mut s, t0, 3, true).allowed);
    assert!(inflight.check(&mut s, t0 + 1_000_000, 4, true).allowed);
    assert_eq!(inflight.give_back(&mut s, t0 + 2_000_000, 5), 5);
    let State::Concurrency(c) = &s else {
        panic!("a concurrency state")
    };
    assert_eq!(c.buckets.len(), 1, "{c:?}");
    assert_eq!(c.buckets[0].1, 2);
    // Sliding counter: the current window first, then the previous.
    let counter = Limit::new(Algorithm::SlidingWindowCounter, q).expect("limit");
    let p = q.period_micros();
    let w0 = t0 - t0 % p;
    let mut s = counter.fresh();
    assert!(counter.check(&mut s, w0, 6, true).allowed);
    assert!(counter.check(&mut s, w0 + p + p / 2, 2, true).allowed);
    assert_eq!(counter.give_back(&mut s, w0 + p + p / 2, 5), 5);
    let State::SlidingWindowCounter(c) = &s else {
        panic!("a sliding counter state")
    };
    assert_eq!((c.current, c.previous), (0, 3));
}

#[test]
fn a_refund_in_a_later_window_gives_nothing_back_where_the_algorithm_cannot_tell() {
    let q = Quota::new(10, std::time::Duration::from_secs(60)).expect("quota");
    let t0 = 60_000_000 * 1_000 + 59_000_000; // one second before a window ends
    for a in [Algorithm::FixedWindow, Algorithm::SlidingWindowLog] {
        let limit = Limit::new(a, q).expect("limit");
        let mut s = limit.fresh();
        assert!(limit.check(&mut s, t0, 10, true).allowed);
        // Fixed window: the next window never saw the 10. Sliding log: still in the window.
        let back = limit.settle(&mut s, t0 + 2_000_000, Charge { units: 10, at: t0 }, 4);
        let expected = if a == Algorithm::FixedWindow { 0 } else { 6 };
        assert_eq!(back.refunded, expected, "{a}");
    }
}
