//! Property tests: every algorithm, random quotas, random traces of (time step, cost).
//!
//! Each property is one of the shared rules from the crate docs, checked on traces that include
//! simultaneous requests (time steps of 0), bursts, long idle gaps and oversized costs.

use proptest::prelude::*;
use tollgate_core::{
    decide, Algorithm, Check, ClientKey, Decision, Limit, Micros, Mode, Quota, Rule, State,
};

/// A random quota: limit 1..=50, period 1ms..=10s in whole micros, burst 1..=2*limit.
fn quota() -> impl Strategy<Value = Quota> {
    (1u64..=50, 1_000u64..=10_000_000)
        .prop_flat_map(|(limit, period)| (Just(limit), Just(period), 1..=2 * limit))
        .prop_map(|(limit, period, burst)| {
            Quota::new(limit, std::time::Duration::from_micros(period))
                .and_then(|q| q.with_burst(burst))
                .expect("the strategy only builds valid quotas")
        })
}

/// Where a trace starts: the epoch, small times, realistic wall-clock times, aligned windows.
fn start(q: &Quota) -> BoxedStrategy<Micros> {
    let p = q.period_micros();
    prop_oneof![
        Just(0u64),
        0u64..10_000_000,
        1_600_000_000_000_000u64..1_900_000_000_000_000,
        (1_600_000_000_000u64..1_900_000_000_000).prop_map(move |k| k * 1_000 / p * p),
    ]
    .boxed()
}

/// One event: a time step, a cost, and how many times it repeats at the same instant.
fn event(q: &Quota) -> BoxedStrategy<(Micros, u64, usize)> {
    let p = q.period_micros();
    let t = q.emission_interval_micros();
    let cap = q.limit().max(q.burst());
    let delta = prop_oneof![
        4 => Just(0u64),
        3 => 0..=2 * t,
        2 => 0..=2 * p,
        1 => 0..=20 * p,
        1 => Just(p),
        1 => Just(t),
    ];
    let cost = prop_oneof![
        6 => Just(1u64),
        2 => Just(0u64),
        2 => 0u64..=3,
        1 => 0..=2 * cap + 1,
    ];
    let repeat = prop_oneof![
        6 => 1usize..=3,
        1 => 1..=usize::try_from(cap + 2).unwrap_or(3),
    ];
    (delta, cost, repeat).boxed()
}

/// A quota, a start time and a trace of (time step, cost), repeats expanded.
#[derive(Debug, Clone)]
struct Case {
    quota: Quota,
    start: Micros,
    trace: Vec<(Micros, u64)>,
}

fn case() -> impl Strategy<Value = Case> {
    quota()
        .prop_flat_map(|q| (Just(q), start(&q), prop::collection::vec(event(&q), 1..50)))
        .prop_map(|(quota, start, events)| {
            let mut trace = Vec::new();
            for (delta, cost, repeat) in events {
                trace.push((delta, cost));
                trace.extend(std::iter::repeat_n((0, cost), repeat - 1));
            }
            Case {
                quota,
                start,
                trace,
            }
        })
}

/// One request of a trace as it was decided.
#[derive(Debug, Clone)]
struct Step {
    now: Micros,
    cost: u64,
    before: State,
    after: State,
    decision: Decision,
}

fn run(limit: &Limit, case: &Case) -> Vec<Step> {
    let mut state = limit.fresh();
    let mut now = case.start;
    let mut steps = Vec::with_capacity(case.trace.len());
    for &(delta, cost) in &case.trace {
        now += delta;
        let before = state.clone();
        let decision = limit.check(&mut state, now, cost, true);
        steps.push(Step {
            now,
            cost,
            before,
            after: state.clone(),
            decision,
        });
    }
    steps
}

fn limits(q: Quota) -> impl Iterator<Item = Limit> {
    Algorithm::ALL
        .into_iter()
        .map(move |a| Limit::new(a, q).expect("test quotas are valid for every algorithm"))
}

fn is_bucket(a: Algorithm) -> bool {
    matches!(
        a,
        Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Gcra
    )
}

/// The largest cost the algorithm can ever admit.
fn capacity(limit: &Limit) -> u64 {
    if is_bucket(limit.algorithm()) {
        limit.quota().burst()
    } else {
        limit.quota().limit()
    }
}

fn admitted(steps: &[Step]) -> Vec<(Micros, u64)> {
    steps
        .iter()
        .filter(|s| s.decision.allowed && s.cost > 0)
        .map(|s| (s.now, s.cost))
        .collect()
}

/// Bucket algorithms: in any closed interval [a, b], at most burst + floor((b - a) / T).
fn assert_bucket_bound(q: &Quota, adm: &[(Micros, u64)]) -> Result<(), TestCaseError> {
    let t = q.emission_interval_micros();
    for (i, &(a, _)) in adm.iter().enumerate() {
        let mut units = 0;
        for &(b, c) in &adm[i..] {
            units += c;
            prop_assert!(
                units <= q.burst() + (b - a) / t,
                "{units} units admitted in [{a}, {b}] with burst {} and T {t}",
                q.burst()
            );
        }
    }
    Ok(())
}

/// Sliding log: at most `limit` in any window (x - period, x]; the worst window ends at an
/// admission, so checking those is enough.
fn assert_sliding_bound(q: &Quota, adm: &[(Micros, u64)]) -> Result<(), TestCaseError> {
    let p = q.period_micros();
    for (j, &(b, _)) in adm.iter().enumerate() {
        let units: u64 = adm[..=j]
            .iter()
            .filter(|&&(a, _)| a + p > b)
            .map(|&(_, c)| c)
            .sum();
        prop_assert!(
            units <= q.limit(),
            "{units} units in the window ending at {b}"
        );
    }
    Ok(())
}

/// Fixed window and sliding counter: at most `limit` per window aligned to the epoch.
fn assert_aligned_bound(q: &Quota, adm: &[(Micros, u64)]) -> Result<(), TestCaseError> {
    let p = q.period_micros();
    let mut per_window = std::collections::BTreeMap::<Micros, u64>::new();
    for &(at, c) in adm {
        *per_window.entry(at / p).or_default() += c;
    }
    for (w, units) in per_window {
        prop_assert!(units <= q.limit(), "{units} units in window {w}");
    }
    Ok(())
}

fn uncommitted(limit: &Limit, state: &State, now: Micros, cost: u64) -> Decision {
    let mut s = state.clone();
    let d = limit.check(&mut s, now, cost, false);
    assert_eq!(&s, state, "an uncommitted check changed the state");
    d
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, max_shrink_iters: 512, ..ProptestConfig::default() })]

    #[test]
    fn admitted_units_never_exceed_the_bound(case in case()) {
        for limit in limits(case.quota) {
            let adm = admitted(&run(&limit, &case));
            match limit.algorithm() {
                Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Gcra => {
                    assert_bucket_bound(&case.quota, &adm)?
                }
                Algorithm::SlidingWindowLog => assert_sliding_bound(&case.quota, &adm)?,
                Algorithm::FixedWindow | Algorithm::SlidingWindowCounter => {
                    assert_aligned_bound(&case.quota, &adm)?
                }
                Algorithm::Concurrency => unreachable!("not a rate algorithm: not in ALL"),
            }
        }
    }

    #[test]
    fn denied_requests_and_zero_cost_queries_change_nothing(case in case()) {
        for limit in limits(case.quota) {
            for s in run(&limit, &case) {
                if !s.decision.allowed {
                    prop_assert_eq!(&s.after, &s.before, "{} denial changed state", limit.algorithm());
                }
                if s.cost == 0 {
                    prop_assert!(s.decision.allowed, "{} denied a zero-cost query", limit.algorithm());
                    prop_assert_eq!(&s.after, &s.before, "{} query changed state", limit.algorithm());
                }
            }
        }
    }

    #[test]
    fn retry_after_is_the_exact_earliest_time(case in case()) {
        for limit in limits(case.quota) {
            for s in run(&limit, &case) {
                let Some(r) = s.decision.retry_after else { continue };
                prop_assert!(!s.decision.allowed);
                prop_assert!(r > 0, "{} denied with retry_after 0", limit.algorithm());
                let later = uncommitted(&limit, &s.after, s.now + r, s.cost);
                prop_assert!(later.allowed, "{} still denied at now + retry_after ({r})", limit.algorithm());
                let early = uncommitted(&limit, &s.after, s.now + r - 1, s.cost);
                prop_assert!(!early.allowed, "{} allowed before now + retry_after ({r})", limit.algorithm());
            }
        }
    }

    #[test]
    fn costs_beyond_capacity_are_denied_without_retry(case in case()) {
        for limit in limits(case.quota) {
            let cap = capacity(&limit);
            for s in run(&limit, &case) {
                if s.cost > cap {
                    prop_assert!(s.decision.exceeds_capacity(), "{} cost {} > {cap}", limit.algorithm(), s.cost);
                } else if !s.decision.allowed {
                    prop_assert!(s.decision.retry_after.is_some(), "{} cost {} <= {cap} with no retry", limit.algorithm(), s.cost);
                }
                for extra in [1, 2, u64::MAX - cap] {
                    let d = uncommitted(&limit, &s.after, s.now, cap + extra);
                    prop_assert!(d.exceeds_capacity());
                }
            }
        }
    }

    #[test]
    fn remaining_is_exactly_what_the_next_request_may_cost(case in case()) {
        for limit in limits(case.quota) {
            for s in run(&limit, &case) {
                let r = s.decision.remaining;
                prop_assert!(uncommitted(&limit, &s.after, s.now, r).allowed,
                    "{} remaining {r} but a request of that cost is denied", limit.algorithm());
                prop_assert!(!uncommitted(&limit, &s.after, s.now, r + 1).allowed,
                    "{} remaining {r} but a request of cost {} passes", limit.algorithm(), r + 1);
            }
        }
    }

    #[test]
    fn token_bucket_leaky_bucket_and_gcra_decide_identically(case in case()) {
        let q = case.quota;
        let tb = run(&Limit::new(Algorithm::TokenBucket, q).expect("valid"), &case);
        let lb = run(&Limit::new(Algorithm::LeakyBucket, q).expect("valid"), &case);
        let gc = run(&Limit::new(Algorithm::Gcra, q).expect("valid"), &case);
        for ((t, l), g) in tb.iter().zip(&lb).zip(&gc) {
            prop_assert_eq!(t.decision, l.decision, "token vs leaky at {} cost {}", t.now, t.cost);
            prop_assert_eq!(t.decision, g.decision, "token vs gcra at {} cost {}", t.now, t.cost);
        }
    }

    #[test]
    fn idle_states_decide_like_fresh_ones(case in case(), offset in prop_oneof![Just(0u64), 0u64..1_000_000_000]) {
        for limit in limits(case.quota) {
            let fresh = limit.fresh();
            let cap = capacity(&limit);
            for s in run(&limit, &case) {
                let idle = s.after.idle_at(limit.quota());
                let at = idle.max(s.now) + offset;
                for cost in [0, 1, s.cost, cap, cap + 1] {
                    prop_assert_eq!(
                        uncommitted(&limit, &s.after, at, cost),
                        uncommitted(&limit, &fresh, at, cost),
                        "{} at idle_at {} + {} cost {}", limit.algorithm(), idle, offset, cost
                    );
                }
            }
        }
    }

    #[test]
    fn reset_after_points_at_idle_at(case in case()) {
        for limit in limits(case.quota) {
            for s in run(&limit, &case) {
                let idle = s.after.idle_at(limit.quota());
                prop_assert_eq!(idle.max(s.now), s.now + s.decision.reset_after,
                    "{} reset_after {} disagrees with idle_at {}", limit.algorithm(), s.decision.reset_after, idle);
            }
        }
    }
}

/// Several limits with their own quotas, and a trace where each step has a cost per limit.
#[derive(Debug, Clone)]
struct MultiCase {
    limits: Vec<Limit>,
    start: Micros,
    trace: Vec<(Micros, [u64; 3])>,
}

fn multi_case() -> impl Strategy<Value = MultiCase> {
    let limit = (0usize..6, quota()).prop_map(|(i, q)| {
        Limit::new(Algorithm::ALL[i], q).expect("test quotas are valid for every algorithm")
    });
    let step = (
        prop_oneof![3 => Just(0u64), 3 => 0u64..200_000, 1 => 0u64..20_000_000],
        [0u64..=3, 0u64..=3, 0u64..=3],
    );
    (
        prop::collection::vec(limit, 1..=3),
        0u64..1_000_000_000_000,
        prop::collection::vec(step, 1..120),
    )
        .prop_map(|(limits, start, trace)| MultiCase {
            limits,
            start,
            trace,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, max_shrink_iters: 512, ..ProptestConfig::default() })]

    #[test]
    fn decide_charges_all_or_nothing(case in multi_case(), shadow_mask in any::<u8>()) {
        // Some rules in shadow mode: they never deny, and a would-be denial charges them nothing.
        let modes: Vec<Mode> = (0..case.limits.len())
            .map(|i| if shadow_mask >> i & 1 == 1 { Mode::Shadow } else { Mode::Enforce })
            .collect();
        let rules: Vec<Rule> = case.limits.iter().enumerate().map(|(i, l)| Rule::new(format!("r{i}"), *l)).collect();
        let mut states: Vec<State> = case.limits.iter().map(Limit::fresh).collect();
        let mut now = case.start;
        for (delta, costs) in &case.trace {
            now += delta;
            let before = states.clone();
            // What each limit would say alone, and the state it would leave when charged.
            let alone: Vec<(Decision, State)> = case
                .limits
                .iter()
                .zip(&before)
                .zip(costs)
                .map(|((l, s), &c)| {
                    let mut s = s.clone();
                    let d = l.check(&mut s, now, c, true);
                    (d, s)
                })
                .collect();
            let verdict = decide(
                case.limits.iter().zip(states.iter_mut()).zip(costs).zip(&modes).map(|(((l, s), &c), &m)| (l, s, c, m)),
                now,
            );
            let all_allow = alone.iter().zip(&modes).all(|((d, _), m)| d.allowed || *m == Mode::Shadow);
            prop_assert_eq!(verdict.allowed, all_allow);
            prop_assert_eq!(verdict.decisions.len(), case.limits.len());
            if all_allow {
                for (i, (d, s)) in alone.iter().enumerate() {
                    prop_assert_eq!(&verdict.decisions[i], d);
                    if d.allowed {
                        prop_assert_eq!(&states[i], s, "limit {} charged differently", i);
                    } else {
                        prop_assert_eq!(&states[i], &before[i], "a shadow denial charged limit {}", i);
                    }
                }
            } else {
                prop_assert_eq!(&states, &before, "a denied verdict charged something");
                for (i, (d, _)) in alone.iter().enumerate() {
                    let got = &verdict.decisions[i];
                    prop_assert_eq!(got.allowed, d.allowed);
                    if !d.allowed {
                        prop_assert_eq!(got, d);
                    } else {
                        // Uncharged: it reports the state as it is, like a zero-cost query.
                        let q = uncommitted(&case.limits[i], &before[i], now, 0);
                        prop_assert_eq!(got, &q);
                    }
                }
                let checks: Vec<Check<'_>> = rules.iter().zip(&modes).map(|(r, &mode)| Check { client: ClientKey([0; 16]), rule: r, cost: 1, mode }).collect();
                let enforced_never = alone.iter().zip(&modes).any(|((d, _), m)| *m == Mode::Enforce && d.exceeds_capacity());
                prop_assert!(verdict.retry_after(&checks).is_some() || enforced_never);
            }
        }
    }
}
