//! The Lua scripts make exactly tollgate-core's decisions: random plans (times, costs, rules,
//! a client per rule, enforced or shadow) run through `tollgate_core::decide` in Rust and
//! through the Redis store with the local clock, and every verdict must be identical. Every
//! plan shape the generator makes (one to sixteen rules, every algorithm) and the generic
//! script (seventeen rules) are covered.

mod common;

use common::{random_limit, Rng, EPOCH_2026};
use std::collections::HashMap;
use tollgate_core::{decide, Algorithm, Check, ClientKey, Micros, Mode, Rule, State, Verdict};
use tollgate_redis::RedisStore;
use tollgate_testkit::RedisServer;

/// The next `now`: mostly forward by amounts around the period (including exactly at window
/// boundaries), sometimes standing still, sometimes backwards (a clock step).
fn step(rng: &mut Rng, now: Micros, period: Micros, interval: Micros) -> Micros {
    match rng.range(0, 11) {
        0 => now,
        9 => now + interval.saturating_sub(1),
        10 => now + 1,
        1 => now + rng.range(1, interval.max(2)),
        2 => now + rng.range(0, period),
        3 => now + period,
        4 => now - now % period + period, // the next window boundary exactly
        5 => now + rng.range(period, 3 * period),
        6 => now.saturating_sub(rng.range(1, period)),
        7 => now + interval,
        _ => now + rng.range(0, interval.max(1) * 3),
    }
}

struct Model {
    states: HashMap<(ClientKey, String), State>,
}

impl Model {
    fn check(&mut self, checks: &[Check<'_>], now: Micros) -> Verdict {
        // decide needs every state mutably at once: take them out and put them back.
        let mut taken: Vec<State> = checks
            .iter()
            .map(|c| {
                self.states
                    .remove(&(c.client, c.rule.name().to_string()))
                    .unwrap_or_else(|| c.rule.limit().fresh())
            })
            .collect();
        let verdict = decide(
            checks
                .iter()
                .zip(taken.iter_mut())
                .map(|(c, s)| (c.rule.limit(), s, c.cost, c.mode)),
            now,
        );
        for (c, s) in checks.iter().zip(taken) {
            self.states.insert((c.client, c.rule.name().to_string()), s);
        }
        verdict
    }
}

/// How many verdicts were allowed, denied with a retry time, and denied for good.
#[derive(Debug, Default)]
struct Outcomes {
    allowed: u64,
    retry: u64,
    never: u64,
}

async fn run_trace(
    store: &RedisStore,
    rules: &[Rule],
    seed: u64,
    requests: usize,
    per_request: usize,
    outcomes: &mut Outcomes,
) {
    let mut rng = Rng::new(seed);
    let mut model = Model {
        states: HashMap::new(),
    };
    let mut now = EPOCH_2026 + rng.range(0, 10_000_000_000);
    let clients: Vec<u128> = (0..3).map(|i| u128::from(seed) << 8 | i).collect();
    for i in 0..requests {
        let first = &rules[rng.range(0, rules.len() as u64 - 1) as usize];
        let q = first.limit().quota();
        now = step(
            &mut rng,
            now,
            q.period_micros(),
            q.emission_interval_micros(),
        );
        // One to `per_request` distinct rules, each with its own cost (0 and over-capacity
        // included); every rule when per_request is the number of rules.
        let mut chosen: Vec<&Rule> = vec![first];
        for r in rules {
            let wanted = per_request >= rules.len() || rng.chance(25);
            if chosen.len() < per_request && r.name() != first.name() && wanted {
                chosen.push(r);
            }
        }
        let checks: Vec<Check<'_>> = chosen
            .iter()
            .map(|r| {
                let q = r.limit().quota();
                let cap = q.limit().max(q.burst());
                let cost = match rng.range(0, 9) {
                    0 => 0,
                    1 => cap + rng.range(1, 3),
                    2 => rng.range(1, cap),
                    _ => rng.range(1, (cap / 4).max(1)),
                };
                let client = common::client(*rng.pick(&clients));
                // A quarter shadow, a fifth quota (the plan's quota checks are alternatives).
                let mode = match rng.range(0, 19) {
                    0..=4 => Mode::Shadow,
                    5..=8 => Mode::Quota,
                    _ => Mode::Enforce,
                };
                Check {
                    client,
                    rule: r,
                    cost,
                    mode,
                }
            })
            .collect();
        let expected = model.check(&checks, now);
        let got = match store.check(&checks, now).await {
            Ok(v) => v,
            Err(e) => panic!("store error at request {i}: {e}"),
        };
        match (expected.allowed, expected.retry_after(&checks)) {
            (true, _) => outcomes.allowed += 1,
            (false, Some(_)) => outcomes.retry += 1,
            (false, None) => outcomes.never += 1,
        }
        assert_eq!(
            got, expected,
            "seed {seed}, request {i}, now {now}, checks {checks:?}"
        );
    }
}

async fn differential(algorithm: Algorithm, seeds: std::ops::Range<u64>) {
    let server = RedisServer::start();
    let store = common::local_store(&server).await;
    let mut outcomes = Outcomes::default();
    for seed in seeds {
        let mut rng = Rng::new(seed * 7919 + algorithm as u64);
        let rules: Vec<Rule> = (0..2)
            .map(|i| {
                Rule::new(
                    format!("{algorithm}-{seed}-{i}"),
                    random_limit(&mut rng, algorithm),
                )
            })
            .collect();
        run_trace(&store, &rules, seed, 300, 3, &mut outcomes).await;
    }
    assert_covers_every_outcome(&outcomes);
}

fn assert_covers_every_outcome(o: &Outcomes) {
    assert!(o.allowed > 100 && o.retry > 100 && o.never > 10, "{o:?}");
}

#[tokio::test]
async fn fixed_window_matches_core() {
    differential(Algorithm::FixedWindow, 0..12).await;
}

#[tokio::test]
async fn sliding_window_log_matches_core() {
    differential(Algorithm::SlidingWindowLog, 0..12).await;
}

#[tokio::test]
async fn sliding_window_counter_matches_core() {
    differential(Algorithm::SlidingWindowCounter, 0..12).await;
}

#[tokio::test]
async fn token_bucket_matches_core() {
    differential(Algorithm::TokenBucket, 0..12).await;
}

#[tokio::test]
async fn leaky_bucket_matches_core() {
    differential(Algorithm::LeakyBucket, 0..12).await;
}

#[tokio::test]
async fn gcra_matches_core() {
    differential(Algorithm::Gcra, 0..12).await;
}

#[tokio::test]
async fn mixed_policies_are_decided_all_or_nothing_like_core() {
    let server = RedisServer::start();
    let store = common::local_store(&server).await;
    let mut outcomes = Outcomes::default();
    for seed in 100..112 {
        let mut rng = Rng::new(seed);
        let rules: Vec<Rule> = Algorithm::ALL
            .iter()
            .map(|&a| Rule::new(format!("{a}-{seed}"), random_limit(&mut rng, a)))
            .collect();
        run_trace(&store, &rules, seed, 400, 3, &mut outcomes).await;
    }
    assert_covers_every_outcome(&outcomes);
}

/// Every plan shape the generator makes: one to sixteen rules (every rule in every plan), the
/// algorithms in turn, random modes and clients.
#[tokio::test]
async fn plans_of_one_to_sixteen_rules_match_core() {
    let server = RedisServer::start();
    let store = common::local_store(&server).await;
    let mut outcomes = Outcomes::default();
    for n in 1..=tollgate_redis::MAX_INLINE_RULES {
        for seed in 0..Algorithm::ALL.len() as u64 {
            let mut rng = Rng::new(300 + 10 * n as u64 + seed);
            let rules: Vec<Rule> = (0..n)
                .map(|i| {
                    let a = Algorithm::ALL[(i + seed as usize) % Algorithm::ALL.len()];
                    Rule::new(format!("{a}-n{n}-{seed}-{i}"), random_limit(&mut rng, a))
                })
                .collect();
            run_trace(&store, &rules, 300 + seed, 60, n, &mut outcomes).await;
        }
    }
    assert_covers_every_outcome(&outcomes);
}

/// Requests matched by more policies than a policy-set script takes (16) go through the
/// generic multi-policy script (check.lua): the same decisions.
#[tokio::test]
async fn requests_with_seventeen_policies_use_the_generic_script_and_match_core() {
    let server = RedisServer::start();
    let store = common::local_store(&server).await;
    let mut outcomes = Outcomes::default();
    for seed in 200..206 {
        let mut rng = Rng::new(seed);
        let rules: Vec<Rule> = (0..=tollgate_redis::MAX_INLINE_RULES)
            .map(|i| {
                let a = Algorithm::ALL[i % Algorithm::ALL.len()];
                Rule::new(format!("{a}-{seed}-{i}"), random_limit(&mut rng, a))
            })
            .collect();
        run_trace(&store, &rules, seed, 200, rules.len(), &mut outcomes).await;
    }
    assert!(outcomes.allowed > 50 && outcomes.retry > 50, "{outcomes:?}");
}
