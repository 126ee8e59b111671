//! Property tests of settling (costs known later): a refund is exactly as if the real cost had
//! been charged, and a debt keeps every retry time exact. Every rate algorithm, random
//! quotas, random histories before the charge.

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
