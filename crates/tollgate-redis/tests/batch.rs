//! Coalesced store calls (`store.max_batch`): plans that arrive while a call is in flight
//! leave together in the next call, decided in arrival order and all-or-nothing each, exactly
//! as if sent one by one; against real redis-server processes and a real Cluster.

mod common;
#[path = "common/monitor.rs"]
mod monitor;

use common::{client, rule, script_calls};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tollgate_core::{Algorithm, Charge, Check, Mode, Rule, State};
use tollgate_redis::{
    LeaseRequest, RedisConfig, RedisStore, SettleItem, StoreClock, MAX_INLINE_RULES,
};
use tollgate_testkit::{RedisCluster, RedisServer};

const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(86_400);
/// Only a guard against a hung test; nothing asserts on time.
const HANG: Duration = Duration::from_secs(30);

async fn store(config: RedisConfig) -> RedisStore {
    match RedisStore::connect(config.with_key_prefix("test")).await {
        Ok(s) => s,
        Err(e) => panic!("cannot connect: {e}"),
    }
}

/// `n` checks of `rule` for client `who`, all started at once; how many were allowed.
async fn concurrent(store: &RedisStore, rule: &Arc<Rule>, who: u128, n: usize) -> usize {
    concurrent_plans(store, std::slice::from_ref(rule), &[who], n).await[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_plans_on_one_key_admit_exactly_the_limit_in_fewer_script_calls() {
    let server = RedisServer::start();
    // The gateway clock keeps every fixed window of the test inside one window.
    let config = RedisConfig::standalone(server.url()).with_clock(StoreClock::Local);
    let store = store(config).await;
    for algorithm in Algorithm::ALL {
        let r = Arc::new(rule(&format!("hot-{algorithm}"), algorithm, 100, HOUR));
        // Load the plan's script first, so the calls counted are the plans'.
        store
            .check(&[Check::new(client(1), &r, 0)], common::EPOCH_2026)
            .await
            .expect("check");
        server.cli(&["config", "resetstat"]);
        let allowed = concurrent(&store, &r, 7 + algorithm as u128, 400).await;
        assert_eq!(allowed, 100, "{algorithm}");
        let calls = script_calls(|a| server.cli(a));
        assert!(
            calls < 400 / 2,
            "{algorithm}: 400 concurrent plans took {calls} script calls"
        );
    }
}

/// A small `max_batch` makes rounds of several batches out of a long queue (written together:
/// the relay tests below watch that): the limit holds exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_long_queue_at_a_small_max_batch_admits_exactly_the_limit() {
    // Fixed windows of an hour on Redis's clock: an hour turning mid-race admits twice.
    tollgate_testkit::clear_of_window_end(HOUR);
    let server = RedisServer::start();
    for max_batch in [2, 3] {
        let config = RedisConfig::standalone(server.url()).with_max_batch(max_batch);
        let store = store(config).await;
        for algorithm in Algorithm::ALL {
            let r = Arc::new(rule(
                &format!("small-{algorithm}-{max_batch}"),
                algorithm,
                100,
                HOUR,
            ));
            let allowed = concurrent(&store, &r, 40 + algorithm as u128, 400).await;
            assert_eq!(allowed, 100, "{algorithm}, max_batch {max_batch}");
        }
    }
}

/// `n` plans of every rule of `rules`, for the clients `who` in turn, all started at once;
/// how many each client was allowed.
async fn concurrent_plans(
    store: &RedisStore,
    rules: &[Arc<Rule>],
    who: &[u128],
    n: usize,
) -> Vec<usize> {
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let mut tasks = Vec::with_capacity(n);
    for j in 0..n {
        let (store, rules, barrier) = (store.clone(), rules.to_vec(), barrier.clone());
        let c = who[j % who.len()];
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let checks: Vec<Check<'_>> =
                rules.iter().map(|r| Check::new(client(c), r, 1)).collect();
            store.check(&checks, common::EPOCH_2026).await
        }));
    }
    let mut allowed = vec![0; who.len()];
    for (j, t) in tasks.into_iter().enumerate() {
        match tokio::time::timeout(HANG, t).await {
            Ok(Ok(Ok(v))) => allowed[j % who.len()] += usize::from(v.allowed),
            other => panic!("a plan failed: {other:?}"),
        }
    }
    allowed
}

/// A key of another type under the store's prefix (a stray `LPUSH`, another application's
/// key) reads as absent and is written over by the plan scripts (one rule reads with GET,
/// several with MGET) and by the batch script alike: no plan fails, and none is charged in
/// part. Before, `SET ... GET` answered WRONGTYPE after the earlier writes of the call had
/// landed: a two-rule plan failed with its first rule charged, a batch failed every plan in it
/// with those before charged, and that client's calls kept failing until the key went.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_of_another_type_is_written_over_and_fails_no_plan() {
    let server = RedisServer::start();
    let config = RedisConfig::standalone(server.url()).with_clock(StoreClock::Local);
    let store = store(config).await;
    let bucket = Arc::new(rule("wt-b", Algorithm::TokenBucket, 50, HOUR));
    let window = Arc::new(rule("wt-w", Algorithm::FixedWindow, 50, HOUR));
    let stray = |who: u128, rule: &str, how: &str| {
        let key = store.key(&client(who), rule);
        server.cli(&[how, &key, "stray"]);
        key
    };
    let kind = |key: &str| server.cli(&["type", key]).trim().to_string();
    let now = common::EPOCH_2026;
    // One rule (GET).
    let key = stray(70, "wt-b", "LPUSH");
    let v = store
        .check(&[Check::new(client(70), &bucket, 1)], now)
        .await;
    assert_eq!(v.expect("one rule").decisions[0].remaining, 49);
    assert_eq!(kind(&key), "string");
    // Two rules (MGET), the first with a state, the second a set.
    let plan = [
        Check::new(client(71), &bucket, 1),
        Check::new(client(71), &window, 1),
    ];
    assert!(store.check(&plan, now).await.expect("first").allowed);
    let key = store.key(&client(71), "wt-w");
    server.cli(&["DEL", &key]);
    server.cli(&["SADD", &key, "stray"]);
    let v = store.check(&plan, now).await.expect("two rules");
    let left: Vec<u64> = v.decisions.iter().map(|d| d.remaining).collect();
    assert_eq!(
        left,
        [48, 49],
        "the bucket charged once more, the window anew"
    );
    assert_eq!(kind(&key), "string");
    // Batches: ten clients' plans at once, two of them meeting a stray key.
    let who: Vec<u128> = (80..90).collect();
    let lists = [stray(82, "wt-b", "RPUSH"), stray(85, "wt-w", "LPUSH")];
    let allowed = concurrent_plans(&store, &[bucket.clone(), window.clone()], &who, 200).await;
    assert_eq!(allowed, vec![20; 10]);
    for key in &lists {
        assert_eq!(kind(key), "string");
    }
    for &w in &who {
        let plan = [
            Check::new(client(w), &bucket, 1),
            Check::new(client(w), &window, 1),
        ];
        let v = store.check(&plan, now).await.expect("after");
        let left: Vec<u64> = v.decisions.iter().map(|d| d.remaining).collect();
        assert_eq!(left, [29, 29], "client {w}: each plan charged once, whole");
    }
}

/// Loads `r`'s plan script with a check that charges nothing, so that the plans after it
/// find it on the server.
async fn load_script(store: &RedisStore, r: &Arc<Rule>) {
    store
        .check(&[Check::new(client(1), r, 0)], 0)
        .await
        .expect("check");
}

/// `n` rules of `algorithm` over `period`, rule i allowing `limit(i)`, named after `what`.
fn rules_of(
    what: &str,
    n: u64,
    algorithm: Algorithm,
    period: Duration,
    limit: impl Fn(u64) -> u64,
) -> Vec<Arc<Rule>> {
    (0..n)
        .map(|i| {
            let name = format!("{what}-{n}-{algorithm}-{i}");
            Arc::new(rule(&name, algorithm, limit(i), period))
        })
        .collect()
}

/// Plans all of one form, on one quotas string, at cost 1 and on Redis's clock leave in
/// uniform calls, which the batch script runs in a loop of the form's own (forms of up to
/// four rules; five: the general loop): each plan all or nothing, on its own client's keys,
/// exactly the tightest limit admitted a client, and the other rules charged for the admitted
/// plans only.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn uniform_batches_of_plans_of_several_rules_admit_exactly_the_tightest_limit() {
    // Fixed windows of an hour on Redis's clock, counted over two races.
    tollgate_testkit::clear_of_window_end(HOUR);
    let server = RedisServer::start();
    let store = store(RedisConfig::standalone(server.url())).await;
    for n in 1..=5u64 {
        for algorithm in Algorithm::ALL {
            // Rule i allows 100 - 10 i an hour: the last is the tightest.
            let rules = rules_of("uniform", n, algorithm, HOUR, |i| 100 - 10 * i);
            let base = 1000 + u128::from(n) * 64 + algorithm as u128 * 4;
            let who = [base, base + 1, base + 2];
            let tightest = 100 - 10 * (n - 1) as usize;
            let allowed = concurrent_plans(&store, &rules, &who, 3 * 150).await;
            assert_eq!(allowed, vec![tightest; 3], "{n} rules, {algorithm}");
            // The first rule was charged for the admitted plans alone.
            let first = std::slice::from_ref(&rules[0]);
            let more = concurrent_plans(&store, first, &who, 3 * 120).await;
            assert_eq!(
                more,
                vec![100 - tightest; 3],
                "{n} rules, {algorithm}: the first rule"
            );
        }
    }
}

/// A uniform call's plans that find no state are decided once for the call (the same quotas,
/// cost and clock make the same decision): for a plan of one rule its whole answer and write,
/// for a plan of several each rule's decision on a missing key. Each new client of a batch is
/// answered and written as one checked alone, then its next plans, found in the same batch or
/// the next, refill from what that write left. Clients new and known take turns, so the plans
/// that decide and the ones that do not share calls; with two and three rules a known client
/// has some rules' keys and not others.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn new_clients_of_a_uniform_batch_are_answered_and_written_as_one_alone() {
    // Windows of a day on Redis's clock, answers compared with ones given before.
    tollgate_testkit::clear_of_window_end(DAY);
    let server = RedisServer::start();
    let store = store(RedisConfig::standalone(server.url())).await;
    for n in 1..=3u64 {
        for algorithm in Algorithm::ALL {
            // Rule i allows 5 + 2 i a day: the first is the tightest.
            let rules = rules_of("fresh", n, algorithm, DAY, |i| 5 + 2 * i);
            let base = 5000 + u128::from(n) * 10_000 + algorithm as u128 * 1000;
            fresh_clients_decide_as_alone(&store, &rules, base, &format!("{n} rules, {algorithm}"))
                .await;
        }
    }
}

/// Plans of a few limits in one call (tiers: one form, other quotas, so the general loop):
/// each limit's plans that find no state decide as one alone of that limit, the first of
/// them for the others; each client's next plan alone shows what its batched plans left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn new_clients_of_a_few_limits_in_one_batch_are_answered_and_written_as_one_alone() {
    // Windows of a day on Redis's clock, answers compared with ones given before (and the
    // PX of a window's write is the time left of it).
    tollgate_testkit::clear_of_window_end(DAY);
    let server = RedisServer::start();
    let store = store(RedisConfig::standalone(server.url())).await;
    for algorithm in Algorithm::ALL {
        let tiers = rules_of("tiers", 3, algorithm, DAY, |i| 5 + 2 * i);
        let base = 90_000 + algorithm as u128 * 1000;
        // Each tier's answers alone, plan after plan.
        let mut lone = Vec::new();
        for (t, r) in tiers.iter().enumerate() {
            let mut answers = Vec::new();
            for _ in 0..4 {
                answers.push(alone(&store, std::slice::from_ref(r), base + t as u128).await);
            }
            lone.push(answers);
        }
        // Client c of tier c % 3, two plans each, all at once; then a third plan alone.
        let who: Vec<u128> = (10..100).map(|i| base + i).collect();
        let tier = |c: u128| tiers[(c % 3) as usize].clone();
        let twice: Vec<(u128, Arc<Rule>)> = who.iter().chain(&who).map(|&c| (c, tier(c))).collect();
        for (c, answer) in all_at_once(&store, &twice).await {
            assert!(answer.0, "{algorithm}: client {c}: {answer:?}");
        }
        for &c in &who {
            let got = alone(&store, &[tier(c)], c).await;
            assert_eq!(got, lone[(c % 3) as usize][2], "{algorithm}: client {c}");
        }
        // A new client's first answer in a batch of the three limits is its limit's own.
        let fresh: Vec<u128> = (500..560).map(|i| base + i).collect();
        let once: Vec<(u128, Arc<Rule>)> = fresh.iter().map(|&c| (c, tier(c))).collect();
        for (c, answer) in all_at_once(&store, &once).await {
            assert_eq!(answer, lone[(c % 3) as usize][0], "{algorithm}: client {c}");
        }
        // And writes its limit's PX: within a limit, every new client's key lives as long as
        // the others' (all written within the test's second).
        for (t, r) in tiers.iter().enumerate() {
            let pttls: Vec<i64> = fresh
                .iter()
                .filter(|&&c| (c % 3) as usize == t)
                .map(|&c| {
                    let key = store.key(&client(c), r.name());
                    server.cli(&["pttl", &key]).trim().parse().expect("pttl")
                })
                .collect();
            let longest = pttls.iter().copied().max().unwrap_or(0);
            assert!(
                pttls.iter().all(|&p| p > 0 && p + 1_000 > longest),
                "{algorithm}, limit {t}: {pttls:?}"
            );
        }
    }
}

/// One plan of a rule for each (client, rule) of `plans`, all started at once: each one's
/// client and answer ([`alone`]'s), in order.
async fn all_at_once(
    store: &RedisStore,
    plans: &[(u128, Arc<Rule>)],
) -> Vec<(u128, (bool, Vec<u64>))> {
    let barrier = Arc::new(tokio::sync::Barrier::new(plans.len()));
    let tasks: Vec<_> = plans
        .iter()
        .map(|(c, r)| {
            let (store, r, barrier, c) = (store.clone(), r.clone(), barrier.clone(), *c);
            tokio::spawn(async move {
                barrier.wait().await;
                (c, alone(&store, &[r], c).await)
            })
        })
        .collect();
    let mut answers = Vec::new();
    for t in tasks {
        match tokio::time::timeout(HANG, t).await {
            Ok(Ok(answer)) => answers.push(answer),
            other => panic!("a plan failed: {other:?}"),
        }
    }
    answers
}

/// One plan of `rules` for client `c`, alone: whether it was allowed, and each rule's remaining.
async fn alone(store: &RedisStore, rules: &[Arc<Rule>], c: u128) -> (bool, Vec<u64>) {
    let checks: Vec<Check<'_>> = rules.iter().map(|r| Check::new(client(c), r, 1)).collect();
    let v = store.check(&checks, 0).await.expect("check");
    (v.allowed, v.decisions.iter().map(|d| d.remaining).collect())
}

async fn fresh_clients_decide_as_alone(
    store: &RedisStore,
    rules: &[Arc<Rule>],
    base: u128,
    what: &str,
) {
    // A client's answers alone, plan after plan: what each plan of a client leaves.
    let mut lone = Vec::new();
    for _ in 0..5 {
        lone.push(alone(store, rules, base).await);
    }
    assert!(lone.iter().all(|a| a.0), "{what}: {lone:?}");
    // Even clients are known (one plan each already), odd ones new, and ten more known by
    // their first rule only; three plans each, all at once: most leave in uniform calls of
    // many clients.
    let known: Vec<u128> = (1..=40).map(|i| base + 2 * i).collect();
    for &c in &known {
        alone(store, rules, c).await;
    }
    let partly: Vec<u128> = (1..=10).map(|i| base + 100 + i).collect();
    for &c in &partly {
        alone(store, &rules[..1], c).await;
    }
    let who: Vec<u128> = (1..=80).map(|i| base + i).chain(partly.clone()).collect();
    let allowed = concurrent_plans(store, rules, &who, who.len() * 3).await;
    for (c, n) in who.iter().zip(&allowed) {
        assert_eq!(*n, 3, "{what}: client {c} was allowed {n} of 3");
    }
    // Each client's state is what its plans left, whatever the call its first plan went in:
    // a new one's next plan is answered as a lone client's fourth, a known one's as the fifth,
    // and one known by its first rule alone as the fifth there and the fourth elsewhere.
    for &c in &who {
        let got = alone(store, rules, c).await;
        if partly.contains(&c) {
            assert!(got.0, "{what}: client {c}");
            assert_eq!(got.1[0], lone[4].1[0], "{what}: client {c}");
            assert_eq!(got.1[1..], lone[3].1[1..], "{what}: client {c}");
        } else {
            let nth = if known.contains(&c) { 4 } else { 3 };
            assert_eq!(got, lone[nth], "{what}: client {c}");
        }
    }
    // A new client's first answer in a batch is a lone one's.
    let fresh: Vec<u128> = (1..=30).map(|i| base + 500 + i).collect();
    let barrier = Arc::new(tokio::sync::Barrier::new(fresh.len()));
    let tasks: Vec<_> = fresh
        .iter()
        .map(|&c| {
            let (store, rules, barrier) = (store.clone(), rules.to_vec(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                alone(&store, &rules, c).await
            })
        })
        .collect();
    for (c, t) in fresh.iter().zip(tasks) {
        match tokio::time::timeout(HANG, t).await {
            Ok(Ok(answer)) => assert_eq!(answer, lone[0], "{what}: client {c}"),
            other => panic!("{what}: a plan failed: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_max_batch_1_every_plan_is_a_call_of_its_own() {
    let server = RedisServer::start();
    let store = store(RedisConfig::standalone(server.url()).with_max_batch(1)).await;
    let r = Arc::new(rule("one", Algorithm::TokenBucket, 50, HOUR));
    load_script(&store, &r).await;
    server.cli(&["config", "resetstat"]);
    assert_eq!(concurrent(&store, &r, 2, 200).await, 50);
    assert_eq!(script_calls(|a| server.cli(a)), 200);
}

/// On one thread, tasks run in the order they were spawned: the first finds the connection
/// idle and leaves at once, the rest queue behind it in that order.
#[tokio::test(flavor = "current_thread")]
async fn plans_of_a_batch_are_decided_in_arrival_order() {
    let server = RedisServer::start();
    let store = store(RedisConfig::standalone(server.url())).await;
    let r = Arc::new(rule("order", Algorithm::TokenBucket, 5, DAY));
    load_script(&store, &r).await;
    server.cli(&["config", "resetstat"]);
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let (store, r) = (store.clone(), r.clone());
        tasks.push(tokio::spawn(async move {
            store.check(&[Check::new(client(3), &r, 1)], 0).await
        }));
    }
    let mut seen = Vec::new();
    for t in tasks {
        let v = t.await.expect("task").expect("check");
        seen.push((v.allowed, v.decisions[0].remaining));
    }
    let expected: Vec<(bool, u64)> = (0..20u64)
        .map(|i| if i < 5 { (true, 4 - i) } else { (false, 0) })
        .collect();
    assert_eq!(seen, expected);
    assert!(script_calls(|a| server.cli(a)) < 20);
}

/// A plan of a form whose script the store has not loaded yet keeps its place in the queue:
/// it is decided before the plans that arrived after it, whose scripts were loaded (its
/// lane's call loads its script; a SCRIPT LOAD awaited first let them overtake it). Here the
/// new form's plan takes a client's whole limit, and the plan after it, of a loaded form,
/// must be the one denied; both ways of handing a plan over (`check`, `check_begin`).
#[tokio::test(flavor = "current_thread")]
async fn a_plan_of_a_form_not_loaded_yet_keeps_its_place_in_the_queue() {
    let server = RedisServer::start();
    let store = store(RedisConfig::standalone(server.url())).await;
    for begun in [false, true] {
        let x = Arc::new(rule(&format!("x-{begun}"), Algorithm::FixedWindow, 10, DAY));
        // Another algorithm for the second rule: a form no plan of this store has had.
        let algorithm = if begun {
            Algorithm::Gcra
        } else {
            Algorithm::LeakyBucket
        };
        let y = Arc::new(rule(&format!("y-{begun}"), algorithm, 10, DAY));
        // The one-rule fixed window's script is loaded; the new form's is not.
        load_script(&store, &x).await;
        let check = |plan: Vec<(Arc<Rule>, u128, u64)>| {
            let store = store.clone();
            tokio::spawn(async move {
                let checks: Vec<Check<'_>> = plan
                    .iter()
                    .map(|(r, c, cost)| Check::new(client(*c), r, *cost))
                    .collect();
                if begun {
                    match store.check_begin(&checks, 0) {
                        Some(pending) => pending.await.and_then(|r| r.verdict(&checks)),
                        None => panic!("a plan of one server's client is begun"),
                    }
                } else {
                    store.check(&checks, 0).await
                }
            })
        };
        // The first finds the lane idle and leads it; the other two queue behind it.
        let lead = check(vec![(x.clone(), 90, 1)]);
        let new_form = check(vec![(x.clone(), 91, 10), (y.clone(), 91, 1)]);
        let after = check(vec![(x.clone(), 91, 1)]);
        let lead = lead.await.expect("task").expect("check");
        let new_form = new_form.await.expect("task").expect("check");
        let after = after.await.expect("task").expect("check");
        assert!(lead.allowed, "begun: {begun}");
        assert!(new_form.allowed, "begun: {begun}: {new_form:?}");
        assert!(!after.allowed, "begun: {begun}: {after:?}");
    }
}

/// Checks begun (`check_begin`: handed to the lane before it returns) and given up before
/// anyone polls them: the one that found the lane idle held it, and gives it back with what
/// queued behind it sent; one given up in the queue is never sent. Nothing of either is
/// charged, and the lane serves again.
#[tokio::test(flavor = "current_thread")]
async fn checks_begun_and_given_up_unpolled_free_the_lane_and_charge_nothing() {
    let server = RedisServer::start();
    let store = store(RedisConfig::standalone(server.url())).await;
    let r = Arc::new(rule("given-up", Algorithm::TokenBucket, 5, DAY));
    // Loads the plan's script, so that the leader's call below is one round trip.
    store
        .check(&[Check::new(client(1), &r, 0)], 0)
        .await
        .expect("check");
    let mine = [Check::new(client(2), &r, 1)];
    let leader = store.check_begin(&mine, 0).expect("begun");
    let queued = store.check_begin(&mine, 0).expect("begun");
    let kept = store.check_begin(&mine, 0).expect("begun");
    assert!(format!("{leader:?}").contains("leading"), "{leader:?}");
    assert!(format!("{kept:?}").contains("queued"), "{kept:?}");
    drop(leader);
    drop(queued);
    let answered = |reply: Result<tollgate_redis::CheckReply, tollgate_redis::RedisStoreError>| {
        let v = reply.expect("answered").verdict(&mine).expect("verdict");
        (v.allowed, v.decisions[0].remaining)
    };
    let reply = tokio::time::timeout(HANG, kept)
        .await
        .expect("the lane was given back");
    assert_eq!(answered(reply), (true, 4), "only the kept plan is charged");
    let next = store.check_begin(&mine, 0).expect("begun");
    assert!(
        format!("{next:?}").contains("leading"),
        "the lane is idle again: {next:?}"
    );
    let reply = tokio::time::timeout(HANG, next).await.expect("not hung");
    assert_eq!(answered(reply), (true, 3));
}

/// Plans of three shapes over the same keys, all at once: each shape's all-or-nothing rule
/// holds inside the batch, and the shared rule admits exactly its limit over all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_mixing_plan_shapes_decides_each_plan_all_or_nothing() {
    let server = RedisServer::start();
    let store = store(RedisConfig::standalone(server.url())).await;
    let shared = Arc::new(rule("shared", Algorithm::Gcra, 30, HOUR));
    let wide = Arc::new(rule("wide", Algorithm::TokenBucket, 1000, DAY));
    let watch = Arc::new(rule("watch", Algorithm::SlidingWindowLog, 1000, DAY));
    let who = client(11);
    let barrier = Arc::new(tokio::sync::Barrier::new(300));
    let mut tasks = Vec::new();
    for i in 0..300usize {
        let (store, shared, wide, watch, barrier) = (
            store.clone(),
            shared.clone(),
            wide.clone(),
            watch.clone(),
            barrier.clone(),
        );
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let plan: Vec<Check<'_>> = match i % 3 {
                0 => vec![Check::new(who, &shared, 1)],
                1 => vec![Check::new(who, &shared, 1), Check::new(who, &wide, 2)],
                _ => vec![
                    Check::new(who, &wide, 1),
                    Check::new(who, &shared, 1),
                    Check::new(who, &watch, 1).shadow(),
                ],
            };
            let v = store.check(&plan, 0).await.expect("check");
            (i % 3, v.allowed)
        }));
    }
    let mut allowed = [0u64; 3];
    for t in tasks {
        let (kind, ok) = tokio::time::timeout(HANG, t)
            .await
            .expect("no hang")
            .expect("task");
        allowed[kind] += u64::from(ok);
    }
    assert_eq!(allowed.iter().sum::<u64>(), 30, "{allowed:?}");
    // What the other rules were charged is exactly what the allowed plans charged.
    let v = store
        .check(&[Check::new(who, &wide, 0), Check::new(who, &watch, 0)], 0)
        .await
        .expect("query");
    assert_eq!(v.decisions[0].remaining, 1000 - 2 * allowed[1] - allowed[2]);
    assert_eq!(v.decisions[1].remaining, 1000 - allowed[2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flushed_script_cache_is_refilled_by_the_batch_without_failing_a_plan() {
    // With `max_batch = 2` the queue leaves in calls written together, each answered
    // NOSCRIPT after a flush.
    for max_batch in [64, 2] {
        let server = RedisServer::start();
        let store = store(RedisConfig::standalone(server.url()).with_max_batch(max_batch)).await;
        // A token a day's thousandth (86.4 s): none comes back before the count is read.
        let r = Arc::new(rule("flush", Algorithm::TokenBucket, 1000, DAY));
        assert_eq!(concurrent(&store, &r, 20, 100).await, 100, "{max_batch}");
        server.cli(&["script", "flush"]);
        assert_eq!(concurrent(&store, &r, 20, 100).await, 100, "{max_batch}");
        server.cli(&["script", "flush"]);
        assert_eq!(concurrent(&store, &r, 20, 100).await, 100, "{max_batch}");
        assert_eq!(
            remaining_after_one(&store, &r, 20).await,
            1000 - 301,
            "{max_batch}"
        );
    }
}

/// The store loads its scripts with SCRIPT LOAD, never EVAL: Redis 7.4 and later delete the
/// scripts EVAL loaded, least recently used first, past 500 of them, and another
/// application's EVALs count toward them. Plans of forms the store has not loaded run at
/// once, mixing in batches of new lists of forms, on a fresh server and again after a
/// flush; another client then EVALs 600 scripts of its own, and the same plans run once
/// more. The server ran no EVAL but that client's, and after them answered no call NOSCRIPT
/// (on Redis 7.4 and later, a script the store had loaded with EVAL would be gone). Every
/// plan is decided (a thousand a day, none refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scripts_are_loaded_by_script_load_and_outlive_another_clients_evals() {
    for max_batch in [1, 64] {
        let server = RedisServer::start();
        let store = store(RedisConfig::standalone(server.url()).with_max_batch(max_batch)).await;
        let rules: Vec<Arc<Rule>> = Algorithm::ALL
            .iter()
            .map(|&a| Arc::new(rule(&format!("evict-{}", a.name()), a, 1000, DAY)))
            .collect();
        // Four forms: one rule, one rule of another algorithm, two and three rules.
        let sets = [
            vec![rules[0].clone()],
            vec![rules[1].clone()],
            vec![rules[2].clone(), rules[3].clone()],
            vec![rules[4].clone(), rules[0].clone(), rules[1].clone()],
        ];
        // Each form's 40 plans for a client of its own, the four forms' plans at once.
        let round = |who: u128| {
            let runs: Vec<_> = sets
                .iter()
                .enumerate()
                .map(|(i, set)| {
                    let (store, set) = (store.clone(), set.clone());
                    tokio::spawn(async move {
                        concurrent_plans(&store, &set, &[who + i as u128], 40).await
                    })
                })
                .collect();
            async move {
                for run in runs {
                    assert_eq!(run.await.expect("task"), [40], "max_batch {max_batch}");
                }
            }
        };
        round(100).await;
        server.cli(&["script", "flush"]);
        round(200).await;
        let client = redis::Client::open(server.url()).expect("url");
        let mut other = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        for i in 0..600 {
            let _: i64 = redis::cmd("EVAL")
                .arg(format!("return {i}"))
                .arg(0)
                .query_async(&mut other)
                .await
                .expect("eval");
        }
        let noscript = common::errors_of(|a| server.cli(a), "NOSCRIPT");
        round(300).await;
        assert_eq!(
            common::errors_of(|a| server.cli(a), "NOSCRIPT"),
            noscript,
            "max_batch {max_batch}: a script of the store's was gone"
        );
        assert_eq!(
            common::calls_of(|a| server.cli(a), &["eval"]),
            600,
            "max_batch {max_batch}: the store sent EVAL"
        );
        assert!(common::calls_of(|a| server.cli(a), &["script|load"]) > 0);
    }
}

/// `n` checks started at once, each with its own client; every answer (or failure).
async fn answers(
    store: &RedisStore,
    rule: &Arc<Rule>,
    n: usize,
) -> Vec<Result<bool, tollgate_redis::RedisStoreError>> {
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let (store, rule) = (store.clone(), rule.clone());
        tasks.push(tokio::spawn(async move {
            let checks = [Check::new(client(100 + i as u128), &rule, 1)];
            store.check(&checks, 0).await.map(|v| v.allowed)
        }));
    }
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(
            tokio::time::timeout(HANG, t)
                .await
                .expect("a stuck server must not hang a plan")
                .expect("task"),
        );
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_server_fails_every_plan_of_a_batch_with_a_timeout_and_serves_again() {
    let server = RedisServer::start();
    let config =
        RedisConfig::standalone(server.url()).with_call_timeout(Duration::from_millis(200));
    let store = store(config).await;
    let r = Arc::new(rule("frozen", Algorithm::Gcra, 100, HOUR));
    assert!(answers(&store, &r, 10).await.iter().all(|a| a.is_ok()));
    server.pause();
    let frozen = answers(&store, &r, 100).await;
    server.resume();
    for a in &frozen {
        let e = a.as_ref().expect_err("frozen");
        assert!(e.is_transient(), "{e}");
    }
    let mut recovered = false;
    for _ in 0..100 {
        if answers(&store, &r, 50).await.iter().all(|a| a.is_ok()) {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(recovered, "the store did not serve again after the thaw");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn check_bounded_answers_plans_queued_behind_a_frozen_call_by_their_own_deadline() {
    // `check_bounded` puts no timer on a plan that coalesces: the call it leads or the batch it
    // leaves in bounds it. A plan queued behind a call the server never answers must still be
    // answered `store.timeout` after it began, not that call's timeout and then its batch's.
    const T: Duration = Duration::from_secs(2);
    let server = RedisServer::start();
    let store = store(RedisConfig::standalone(server.url()).with_call_timeout(T)).await;
    assert_eq!(store.call_timeout(), T);
    let r = Arc::new(rule("bounded", Algorithm::Gcra, 100, HOUR));
    let warm = [Check::new(client(1), &r, 1)];
    assert!(store.check_bounded(&warm, 0).await.expect("warm").allowed);
    server.pause();
    let queued: Vec<u128> = (10..30).collect();
    each_answered_by_its_own_deadline(&store, &r, T, 2, &queued).await;
    server.resume();
    served_again(&store, &warm).await;
}

/// Sends a leader plan (client `leader`), then 200 ms later one plan per client of `queued`,
/// through `check_bounded` while their server does not answer (the caller froze it), and
/// requires each answered with a timeout by its own deadline: never cut short, and within a
/// second of `t` after it began (a loaded machine), where the leader's timeout and then a
/// batch's of its own would be nearly `2 t`.
async fn each_answered_by_its_own_deadline(
    store: &RedisStore,
    r: &Arc<Rule>,
    t: Duration,
    leader: u128,
    queued: &[u128],
) {
    let timed = |who: u128| {
        let (store, r) = (store.clone(), r.clone());
        tokio::spawn(async move {
            let start = std::time::Instant::now();
            let checks = [Check::new(client(who), &r, 1)];
            let answer = store.check_bounded(&checks, 0).await;
            (answer.map(|v| v.allowed), start.elapsed())
        })
    };
    let leader = timed(leader);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let queued: Vec<_> = queued.iter().map(|&w| timed(w)).collect();
    let mut all = vec![tokio::time::timeout(HANG, leader)
        .await
        .expect("no hang")
        .expect("task")];
    for q in queued {
        all.push(
            tokio::time::timeout(HANG, q)
                .await
                .expect("no hang")
                .expect("task"),
        );
    }
    for (answer, took) in &all {
        let e = answer.as_ref().expect_err("frozen");
        assert_eq!(e.kind(), tollgate_redis::ErrorKind::Timeout, "{e}");
        assert!(
            *took >= t - Duration::from_millis(50),
            "answered after {took:?}"
        );
        assert!(
            *took < t + Duration::from_secs(1),
            "answered after {took:?}"
        );
    }
}

/// The store serves `warm` again within a bounded while (100 tries, 100 ms apart).
async fn served_again(store: &RedisStore, warm: &[Check<'_>]) {
    let mut served = false;
    for _ in 0..100 {
        if store.check_bounded(warm, 0).await.is_ok() {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(served, "the store did not serve again after the thaw");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_cluster_plans_behind_a_frozen_node_are_answered_by_their_own_deadline() {
    const T: Duration = Duration::from_secs(2);
    let cluster = RedisCluster::start(3, 0);
    let store = store(RedisConfig::cluster(cluster.seed_urls()).with_call_timeout(T)).await;
    let r = Arc::new(rule("bounded-c", Algorithm::Gcra, 100, HOUR));
    let node = cluster.master_indices()[0];
    let of_node: Vec<u128> = common::clients_of(&cluster, node, 1).take(22).collect();
    let warm = [Check::new(client(of_node[0]), &r, 1)];
    assert!(store.check_bounded(&warm, 0).await.expect("warm").allowed);
    for n in cluster.nodes() {
        n.cli(&["config", "resetstat"]);
    }
    cluster.nodes()[node].pause();
    each_answered_by_its_own_deadline(&store, &r, T, of_node[1], &of_node[2..]).await;
    cluster.nodes()[node].resume();
    served_again(&store, &warm).await;
    // A node that stops answering (a failover under way, a host that drops packets) never
    // says MOVED: its calls' deadlines passing made the store read the node table again.
    let slots_reads: u64 = cluster
        .nodes()
        .iter()
        .map(|n| {
            n.cli(&["info", "commandstats"])
                .lines()
                .find_map(|l| l.strip_prefix("cmdstat_cluster|slots:calls="))
                .and_then(|rest| rest.split(',').next())
                .and_then(|c| c.parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum();
    assert!(slots_reads >= 1, "the node table was not read again");
}

/// A server past its `maxmemory` with nothing it may evict (`noeviction`, Redis's default
/// policy) refuses a script's first write with OOM, and Redis stops a script at its first
/// write or never, so the whole call fails with nothing of it written: every plan of a batch
/// fails with the kind `oom` (not `script`, which points at a bug), none is charged, and the
/// store serves again, every limit whole, once the server has room. At `max_batch` 1 (a call
/// a plan) and 64 (the first plan alone, the others in batches: fewer OOM answers than plans).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_server_fails_each_plan_of_a_batch_as_oom_and_charges_none() {
    for max_batch in [1, 64] {
        let server = RedisServer::start();
        let store = store(RedisConfig::standalone(server.url()).with_max_batch(max_batch)).await;
        let r = Arc::new(rule("full", Algorithm::TokenBucket, 5, HOUR));
        // The scripts loaded while there is room; then none.
        assert!(store
            .check(&[Check::new(client(1), &r, 0)], 0)
            .await
            .is_ok());
        server.cli(&["config", "resetstat"]);
        server.cli(&["config", "set", "maxmemory", "1"]);
        let who: Vec<u128> = (20..24).collect();
        let tasks = who
            .iter()
            .flat_map(|&w| spawn_checks(&store, &r, w, 10))
            .collect();
        for result in joined(tasks).await {
            match result {
                Err(e) => {
                    assert_eq!(e.kind(), tollgate_redis::ErrorKind::Oom, "{e}");
                    assert!(!e.is_transient(), "{e}");
                }
                Ok(v) => {
                    panic!("max_batch {max_batch}: a plan was decided on a full server: {v:?}")
                }
            }
        }
        let ooms = common::errors_of(|a| server.cli(a), "OOM");
        match max_batch {
            1 => assert_eq!(ooms, 40),
            _ => assert!((1..40).contains(&ooms), "{ooms} OOM answers for 40 plans"),
        }
        server.cli(&["config", "set", "maxmemory", "0"]);
        for &w in &who {
            assert_eq!(remaining_after_one(&store, &r, w).await, 4, "client {w}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_killed_under_a_batch_fails_each_of_its_plans() {
    for max_batch in [64, 2] {
        killed_under_a_batch(max_batch).await;
    }
}

/// With `max_batch = 2`, the hundred plans queued leave in calls written together.
async fn killed_under_a_batch(max_batch: usize) {
    let mut server = RedisServer::start();
    let config = RedisConfig::standalone(server.url())
        .with_call_timeout(Duration::from_secs(5))
        .with_max_batch(max_batch);
    let store = store(config).await;
    let r = Arc::new(rule("killed", Algorithm::Gcra, 100, HOUR));
    assert!(answers(&store, &r, 10).await.iter().all(|a| a.is_ok()));
    // Frozen first, so the plans are in flight or queued when it dies.
    server.pause();
    let pending = {
        let (store, r) = (store.clone(), r.clone());
        tokio::spawn(async move { answers(&store, &r, 100).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.kill();
    let killed = tokio::time::timeout(HANG, pending)
        .await
        .expect("no hang")
        .expect("task");
    for a in &killed {
        let e = a.as_ref().expect_err("killed");
        assert!(e.is_transient(), "{e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_cluster_plans_of_one_slot_coalesce_and_admit_exactly_the_limit() {
    let cluster = RedisCluster::start(3, 0);
    let store = store(RedisConfig::cluster(cluster.seed_urls())).await;
    let r = Arc::new(rule("hot", Algorithm::TokenBucket, 100, HOUR));
    let shadow = Arc::new(rule("seen", Algorithm::TokenBucket, 1000, DAY));
    for who in 0..3u128 {
        store
            .check(&[Check::new(client(who), &r, 0)], 0)
            .await
            .expect("check");
    }
    for n in cluster.nodes() {
        n.cli(&["config", "resetstat"]);
    }
    // A hot client, and many others spread over every master, at once.
    let hot = concurrent(&store, &r, 5000, 300);
    let spread = answers(&store, &r, 300);
    let (hot, spread) = tokio::join!(hot, spread);
    assert_eq!(hot, 100);
    assert!(spread.iter().all(|a| matches!(a, Ok(true))));
    let calls: u64 = cluster
        .nodes()
        .iter()
        .map(|n| script_calls(|a| n.cli(a)))
        .sum();
    assert!(calls < 600, "600 plans took {calls} script calls");
    // Plans of two rules in one slot coalesce too, all-or-nothing each.
    let barrier = Arc::new(tokio::sync::Barrier::new(200));
    let mut tasks = Vec::new();
    for _ in 0..200 {
        let (store, r, shadow, barrier) =
            (store.clone(), r.clone(), shadow.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let who = client(6000);
            let plan = [
                Check::new(who, &r, 1),
                Check {
                    mode: Mode::Shadow,
                    ..Check::new(who, &shadow, 1)
                },
            ];
            store.check(&plan, 0).await.expect("check").allowed
        }));
    }
    let mut allowed = 0u64;
    for t in tasks {
        allowed += u64::from(t.await.expect("task"));
    }
    assert_eq!(allowed, 100);
    let v = store
        .check(&[Check::new(client(6000), &shadow, 0)], 0)
        .await
        .expect("query");
    assert_eq!(v.decisions[0].remaining, 1000 - 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_local_clock_and_costs_travel_with_each_plan_of_a_batch() {
    let server = RedisServer::start();
    let config = RedisConfig::standalone(server.url()).with_clock(StoreClock::Local);
    let store = store(config).await;
    let r = Arc::new(rule("costs", Algorithm::FixedWindow, 90, HOUR));
    let now = common::EPOCH_2026;
    let barrier = Arc::new(tokio::sync::Barrier::new(100));
    let mut tasks = Vec::new();
    for i in 0..100u64 {
        let (store, r, barrier) = (store.clone(), r.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            // Costs 1 to 3 (100 demanded of each client); the second client an hour later.
            let at = now + (i % 2) * 3_600_000_000;
            let who = client(40 + u128::from(i % 2));
            let v = store
                .check(&[Check::new(who, &r, 1 + i % 3)], at)
                .await
                .expect("check");
            (i % 2, if v.allowed { 1 + i % 3 } else { 0 })
        }));
    }
    let mut charged = [0u64; 2];
    for t in tasks {
        let (window, cost) = t.await.expect("task");
        charged[window as usize] += cost;
    }
    for (w, c) in charged.iter().enumerate() {
        let at = now + w as u64 * 3_600_000_000;
        let v = store
            .check(&[Check::new(client(40 + w as u128), &r, 0)], at)
            .await
            .expect("query");
        assert_eq!(v.decisions[0].remaining, 90 - c, "window {w}");
        // Denied only when the cost no longer fits: at most 2 units left over.
        assert!(*c <= 90 && *c >= 88, "window {w}: {c}");
    }
}

/// `n` lease calls (or, with `checks`, every other call a check of cost 1) on one key, all
/// at once; the units they took.
async fn take_all(store: &RedisStore, r: &Arc<Rule>, who: u128, n: u64, checks: bool) -> u64 {
    let barrier = Arc::new(tokio::sync::Barrier::new(n as usize));
    let mut tasks = Vec::new();
    for i in 0..n {
        let (store, r, barrier) = (store.clone(), r.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let who = client(who);
            if checks && i % 2 == 1 {
                let v = store.check(&[Check::new(who, &r, 1)], 0).await;
                u64::from(v.expect("check").allowed)
            } else {
                let req = tollgate_redis::LeaseRequest {
                    want: 3,
                    need: 1,
                    give_back: 0,
                    give_back_window: 0,
                };
                store.lease(&who, &r, req, 0).await.expect("lease").granted
            }
        }));
    }
    let mut taken = 0;
    for t in tasks {
        taken += tokio::time::timeout(HANG, t)
            .await
            .expect("no hang")
            .expect("task");
    }
    taken
}

/// Lease refills coalesce, and share a key's limit exactly with the checks they queue with
/// (a batch holds calls of one kind: a check after a lease leaves in the next call).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lease_calls_coalesce_and_share_the_limit_exactly_with_checks() {
    let server = RedisServer::start();
    let store = store(RedisConfig::standalone(server.url())).await;
    let r = Arc::new(rule("leased", Algorithm::TokenBucket, 600, DAY));
    load_script(&store, &r).await;
    assert_eq!(take_all(&store, &r, 77, 1, false).await, 3);
    server.cli(&["config", "resetstat"]);
    // 200 leases of 3 units want all of the 597 left.
    assert_eq!(take_all(&store, &r, 77, 200, false).await, 597);
    let calls = script_calls(|a| server.cli(a));
    assert!(calls < 100, "200 lease calls took {calls} script calls");
    // Leases and checks of another client at once: exactly its limit between them.
    assert_eq!(take_all(&store, &r, 78, 400, true).await, 600);
}

/// A template of a plan: its rules (indices) and their modes; the plans of a trace are a few
/// templates with random costs, clients and times, so their batches hold a few shapes.
type Template = Vec<(usize, Mode)>;

/// A plan of a trace: (client, rule, cost, mode) per check, and its `now`.
type TracePlan = (Vec<(u128, usize, u64, Mode)>, u64);

/// `plans` spawned at once on this thread, so that they queue in that order, each at its
/// `now`; their verdicts, in order.
async fn spawned_in_order(
    store: &RedisStore,
    rules: &Arc<Vec<Rule>>,
    plans: &[TracePlan],
) -> Vec<tollgate_core::Verdict> {
    let mut tasks = Vec::new();
    for (plan, now) in plans.iter().cloned() {
        let (store, rules) = (store.clone(), rules.clone());
        tasks.push(tokio::spawn(async move {
            let checks: Vec<Check<'_>> = plan
                .iter()
                .map(|&(c, r, cost, mode)| Check {
                    client: client(c),
                    rule: &rules[r],
                    cost,
                    mode,
                })
                .collect();
            store.check(&checks, now).await
        }));
    }
    let mut got = Vec::new();
    for t in tasks {
        got.push(t.await.expect("task").expect("check"));
    }
    got
}

/// What `tollgate_core::decide` decides for `plan` at `now` on `states` (each client's state
/// under each rule, fresh where missing), which it leaves as the plan left them.
fn core_decides(
    states: &mut HashMap<(tollgate_core::ClientKey, usize), State>,
    rules: &[Rule],
    plan: &[(u128, usize, u64, Mode)],
    now: tollgate_core::Micros,
) -> tollgate_core::Verdict {
    let mut taken: Vec<State> = plan
        .iter()
        .map(|&(c, r, _, _)| {
            states
                .remove(&(client(c), r))
                .unwrap_or_else(|| rules[r].limit().fresh())
        })
        .collect();
    let verdict = tollgate_core::decide(
        plan.iter()
            .zip(taken.iter_mut())
            .map(|(&(_, r, cost, mode), s)| (rules[r].limit(), s, cost, mode)),
        now,
    );
    for (&(c, r, _, _), s) in plan.iter().zip(taken) {
        states.insert((client(c), r), s);
    }
    verdict
}

/// The batch decides what tollgate-core decides plan after plan: random traces of plans of
/// three shapes (every algorithm, shadow and quota rules, costs 0 to over capacity, time
/// forwards and backwards), all spawned at once on one thread so they queue in spawn order,
/// against `tollgate_core::decide` in that order.
#[tokio::test(flavor = "current_thread")]
async fn batched_plans_match_core_decided_one_after_another() {
    let server = RedisServer::start();
    let (batched, _) = local_clock_traces(Servers::One(&server), 64, false).await;
    // Most plans left in batches (fewer script calls than plans).
    assert!(batched > TRACES * 150, "{batched}");
}

/// The same while another client flushes the server's scripts every 200 µs, whatever the
/// store is doing then: between two calls of a round, between a script's load and its call,
/// in the middle of a reload. Every plan is still decided, and decided as core decides it in
/// arrival order: a call answered NOSCRIPT is sent again before any call that arrived after
/// it. At the default `max_batch` and at 2, where a long queue leaves in rounds of many calls
/// written together. Scratch soaks of 100 traces failed on two earlier versions: a round that
/// loaded its new scripts in front of its calls (a flush between two loads left a later
/// call's script loaded and an earlier one's not), and a lane that, after a flush it never saw
/// answered NOSCRIPT, counted as loaded the scripts it had loaded before it (at `max_batch =
/// 2`: a round of them and of one loaded since ran that one's calls only). The same traces as
/// the test above, so no batch script is new.
#[tokio::test(flavor = "current_thread")]
async fn with_the_scripts_flushed_under_them_batched_plans_match_core() {
    for max_batch in [64, 2] {
        let server = RedisServer::start();
        let (_, flushes) = local_clock_traces(Servers::One(&server), max_batch, true).await;
        assert!(flushes >= TRACES, "{flushes} flushes");
        // The flushes met the store's calls: some were answered NOSCRIPT, and loaded again.
        assert!(common::errors_of(|a| server.cli(a), "NOSCRIPT") > 0);
    }
}

/// The same on a Cluster of three masters, each flushed every 200 µs by a client of its own:
/// each node's lane runs the across-slots batch script on the node's own connection, and its
/// rounds and reloads keep every client's plans in arrival order there too. Each plan is of
/// one client (a plan across slots is not one atomic call on a Cluster), among eight clients
/// of the trace spread over the nodes.
#[tokio::test(flavor = "current_thread")]
async fn on_a_cluster_with_the_scripts_flushed_under_them_batched_plans_match_core() {
    for max_batch in [64, 2] {
        let cluster = RedisCluster::start(3, 0);
        let (batched, flushes) =
            local_clock_traces(Servers::Cluster(&cluster), max_batch, true).await;
        assert!(flushes >= TRACES, "{flushes} flushes");
        assert!(batched > 0, "no plan left in a batch");
        let noscripts: u64 = cluster
            .nodes()
            .iter()
            .map(|n| common::errors_of(|a| n.cli(a), "NOSCRIPT"))
            .sum();
        assert!(noscripts > 0);
    }
}

/// Where traces run: one server, or every master of a Cluster.
#[derive(Clone, Copy)]
enum Servers<'a> {
    One(&'a RedisServer),
    Cluster(&'a RedisCluster),
}

impl<'a> Servers<'a> {
    fn config(self) -> RedisConfig {
        match self {
            Servers::One(server) => RedisConfig::standalone(server.url()),
            Servers::Cluster(cluster) => RedisConfig::cluster(cluster.seed_urls()),
        }
    }

    /// The servers that run scripts (a Cluster's masters).
    fn masters(self) -> Vec<&'a RedisServer> {
        match self {
            Servers::One(server) => vec![server],
            Servers::Cluster(cluster) => cluster
                .master_indices()
                .into_iter()
                .map(|i| &cluster.nodes()[i])
                .collect(),
        }
    }

    /// Script calls run, on all of them.
    fn script_calls(self) -> u64 {
        self.masters()
            .iter()
            .map(|m| script_calls(|a| m.cli(a)))
            .sum()
    }
}

/// The traces of the two tests above, on `server` at `max_batch`: how many plans left in
/// batches (fewer script calls than plans), and how many flushes were sent (with `flush`,
/// during each trace).
async fn local_clock_traces(servers: Servers<'_>, max_batch: usize, flush: bool) -> (u64, u64) {
    use common::Rng;
    let cluster = matches!(servers, Servers::Cluster(_));
    // Calls bounded by the hang guard, not the default second: under a flush storm every call
    // may reload scripts of hundreds of kilobytes, and with both flush tests at once on a
    // loaded 2-core machine a call took longer than a second (a timeout is not what these
    // tests look at: nothing here asserts on time).
    let config = servers
        .config()
        .with_call_timeout(HANG)
        .with_clock(StoreClock::Local)
        .with_max_batch(max_batch);
    // Virtual time: keys must not expire in real time.
    let store = store(config).await.with_ttl_floor(HOUR);
    let mut batched = 0u64;
    let mut flushes = 0u64;
    for seed in 0..TRACES {
        let mut rng = Rng::new(900 + seed);
        let rules: Arc<Vec<Rule>> = Arc::new(
            (0..tollgate_redis::MAX_INLINE_RULES)
                .map(|i| {
                    let a = Algorithm::ALL[(i + seed as usize) % Algorithm::ALL.len()];
                    Rule::new(format!("bd-{seed}-{i}"), coalescing_limit(&mut rng, a))
                })
                .collect(),
        );
        let modes = [Mode::Enforce, Mode::Enforce, Mode::Shadow, Mode::Quota];
        // Four forms (a batch script's most), one of them the most rules a generated script
        // holds: its branch has the most Lua locals a batch script can.
        let templates: Vec<Template> = vec![
            vec![(0, Mode::Enforce)],
            vec![(1, *rng.pick(&modes)), (2, *rng.pick(&modes))],
            vec![
                (3, *rng.pick(&modes)),
                (0, *rng.pick(&modes)),
                (1, *rng.pick(&modes)),
            ],
            (0..tollgate_redis::MAX_INLINE_RULES)
                .rev()
                .map(|r| (r, *rng.pick(&modes)))
                .collect(),
        ];
        let clients: Vec<u128> = (0..if cluster { 8 } else { 2 })
            .map(|i| u128::from(seed) << 8 | i)
            .collect();
        let mut now = common::EPOCH_2026;
        let mut plans: Vec<TracePlan> = Vec::new();
        for _ in 0..300 {
            let t = rng.pick(&templates);
            // On a Cluster every check of a plan is its one client's.
            let one = cluster.then(|| *rng.pick(&clients));
            let q = rules[t[0].0].limit().quota();
            now = match rng.range(0, 5) {
                0 => now,
                1 => now.saturating_sub(rng.range(1, q.period_micros())),
                2 => now + q.period_micros(),
                _ => now + rng.range(0, q.emission_interval_micros().max(1) * 2),
            };
            let checks = t
                .iter()
                .map(|&(r, mode)| {
                    let q = rules[r].limit().quota();
                    let cap = q.limit().max(q.burst());
                    let cost = match rng.range(0, 9) {
                        0 => 0,
                        1 => cap + 1,
                        2 => rng.range(1, cap),
                        _ => rng.range(1, (cap / 4).max(1)),
                    };
                    let who = match one {
                        Some(who) => who,
                        None => *rng.pick(&clients),
                    };
                    (who, r, cost, mode)
                })
                .collect();
            plans.push((checks, now));
        }
        let before = servers.script_calls();
        let flushers: Vec<Flusher> = if flush {
            servers
                .masters()
                .iter()
                .map(|m| Flusher::start(&m.url()))
                .collect()
        } else {
            Vec::new()
        };
        let got = spawned_in_order(&store, &rules, &plans).await;
        flushes += flushers.into_iter().map(Flusher::stop).sum::<u64>();
        batched += 300 - (servers.script_calls() - before).min(300);
        let mut states = HashMap::new();
        for (i, ((plan, now), got)) in plans.iter().zip(got).enumerate() {
            let expected = core_decides(&mut states, &rules, plan, *now);
            assert_eq!(got, expected, "seed {seed}, plan {i}: {plan:?} at {now}");
        }
    }
    (batched, flushes)
}

/// A random limit (`random_limit`'s, with its draws) of a plan that coalesces: a sliding log
/// longer than [`tollgate_redis::IN_PLACE_LOG_LIMIT`] is cut to it. A longer log's plan runs
/// the generic script, sent at once rather than queued in its lane (tests/long_log.rs), so
/// it is not decided in arrival order with the lane's plans, which these traces hold to.
fn coalescing_limit(rng: &mut common::Rng, a: Algorithm) -> tollgate_core::Limit {
    let limit = common::random_limit(rng, a);
    let q = limit.quota();
    if a != Algorithm::SlidingWindowLog || q.limit() <= tollgate_redis::IN_PLACE_LOG_LIMIT {
        return limit;
    }
    let period = Duration::from_micros(q.period_micros());
    let q = tollgate_core::Quota::new(tollgate_redis::IN_PLACE_LOG_LIMIT, period).expect("quota");
    tollgate_core::Limit::new(a, q).expect("a shorter log of the same period")
}

/// The traces of [`local_clock_traces`]: sixteen, each one's forms new to the store. The
/// seventh was the first whose later plans on the same keys showed a plan of a form not loaded
/// yet decided after the plans behind it (see
/// `a_plan_of_a_form_not_loaded_yet_keeps_its_place_in_the_queue`).
const TRACES: u64 = 16;

/// `SCRIPT FLUSH` sent to a server every 200 µs, on a connection and a thread of their own,
/// until stopped (at most 100,000 of them).
struct Flusher {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
}

impl Flusher {
    fn start(url: &str) -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let client = redis::Client::open(url).expect("url");
        let mut conn = client.get_connection().expect("the flusher's connection");
        let thread = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut sent = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) && sent < 100_000 {
                    let _: () = redis::cmd("SCRIPT")
                        .arg("FLUSH")
                        .query(&mut conn)
                        .expect("SCRIPT FLUSH");
                    sent += 1;
                    std::thread::sleep(Duration::from_micros(200));
                }
                sent
            })
        };
        Flusher { stop, thread }
    }

    /// Stops the flushes; how many were sent.
    fn stop(self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().expect("the flusher")
    }
}

/// The same on Redis's own clock, where a batch takes the paths the local clock never does (a
/// uniform call's loop, its new clients decided once, a plan of one rule that finds no state
/// answered as the first such plan was): waves of plans of one to four rules, one wave of one
/// form at cost 1, then mixed, for a few dozen clients, against `tollgate_core::decide`.
/// Every rule has a day's period and a limit below 20, so nothing refills or turns over
/// during the test, and whatever instant Redis reads decides the same `allowed` and
/// `remaining` as the model's.
#[tokio::test(flavor = "current_thread")]
async fn on_the_store_clock_batched_plans_match_core_decided_one_after_another() {
    use common::Rng;
    const SEEDS: u64 = 10;
    tollgate_testkit::clear_of_window_end(DAY);
    let server = RedisServer::start();
    let store = store(RedisConfig::standalone(server.url())).await;
    let before = script_calls(|a| server.cli(a));
    let mut plans_sent = 0u64;
    // One set of forms for every trace (each rule's algorithm and mode; the quotas vary): ten,
    // which the store's list holds, so that the batch scripts stay few. The scripts a process
    // generates are bounded (`BATCH_SCRIPTS`), and tests in one process share them: forms new
    // in every trace made hundreds, and the tests beside this one ran past the bound.
    let mut rng = Rng::new(7000);
    let modes = [Mode::Enforce, Mode::Enforce, Mode::Shadow, Mode::Quota];
    // A plan of each algorithm's rule alone (most plans), then two of two rules, one of three
    // and one of four.
    let mut templates: Vec<Template> = (0..Algorithm::ALL.len())
        .map(|r| vec![(r, Mode::Enforce)])
        .collect();
    for n in [2usize, 2, 3, 4] {
        let mut t: Template = Vec::new();
        while t.len() < n {
            let r = rng.range(0, Algorithm::ALL.len() as u64 - 1) as usize;
            if t.iter().all(|&(u, _)| u != r) {
                t.push((r, *rng.pick(&modes)));
            }
        }
        templates.push(t);
    }
    for seed in 0..SEEDS {
        let mut rng = Rng::new(7000 + seed);
        let rules: Arc<Vec<Rule>> = Arc::new(
            Algorithm::ALL
                .iter()
                .map(|&a| rule(&format!("sc-{seed}-{a}"), a, rng.range(1, 19), DAY))
                .collect(),
        );
        let clients: Vec<u128> = (0..rng.range(5, 60))
            .map(|i| u128::from(seed) << 16 | u128::from(i))
            .collect();
        let mut model = HashMap::new();
        // The first wave is of one form at cost 1 (a uniform call: its own loop, the clients
        // with no state decided once), the next two of every form at mixed costs.
        let uniform = templates[seed as usize % templates.len()].clone();
        for wave in 0..3 {
            let plans: Vec<TracePlan> = (0..200)
                .map(|_| {
                    let who = *rng.pick(&clients);
                    let template = match wave {
                        0 => uniform.clone(),
                        _ => rng.pick(&templates).clone(),
                    };
                    let plan = template
                        .into_iter()
                        .map(|(r, mode)| {
                            let cost = match (wave, rng.range(0, 11)) {
                                (0, _) => 1,
                                (_, 0) => 0,
                                (_, 1) => 2,
                                (_, 2) => 25,
                                _ => 1,
                            };
                            (who, r, cost, mode)
                        })
                        .collect();
                    // `now` is not sent: Redis reads its own.
                    (plan, 0)
                })
                .collect();
            let got = spawned_in_order(&store, &rules, &plans).await;
            plans_sent += plans.len() as u64;
            let now = tollgate_core::Clock::now(&tollgate_core::SystemClock);
            for (i, ((plan, _), got)) in plans.iter().zip(got).enumerate() {
                let expected = core_decides(&mut model, &rules, plan, now);
                let seen = |v: &tollgate_core::Verdict| {
                    let each: Vec<(bool, u64)> = v
                        .decisions
                        .iter()
                        .map(|d| (d.allowed, d.remaining))
                        .collect();
                    (v.allowed, each)
                };
                assert_eq!(
                    seen(&got),
                    seen(&expected),
                    "seed {seed}, wave {wave}, plan {i}: {plan:?}"
                );
            }
        }
    }
    // Most plans left in batches.
    let calls = script_calls(|a| server.cli(a)) - before;
    assert!(calls < plans_sent / 4, "{plans_sent} plans, {calls} calls");
}

/// Plans of many clients in many slots: on a Cluster they queue per node and leave in one
/// across-slots batch call each, decided exactly as alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_cluster_plans_of_many_slots_coalesce_per_node_and_decide_exactly() {
    many_slots(None).await;
}

/// The same with `max_batch = 3`: each node's long queue leaves in rounds of several batches
/// on the node's own connection; every plan decides exactly (this test does not see how the
/// calls are written).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_cluster_a_long_queue_per_node_at_a_small_max_batch_decides_exactly() {
    many_slots(Some(3)).await;
}

/// 400 clients' plans over many slots, all at once; with `max_batch` unset (the default), in
/// few calls.
async fn many_slots(max_batch: Option<usize>) {
    let cluster = RedisCluster::start(3, 0);
    let config = RedisConfig::cluster(cluster.seed_urls());
    let store = store(match max_batch {
        Some(m) => config.with_max_batch(m),
        None => config,
    })
    .await;
    let buckets = Arc::new(rule("tb", Algorithm::TokenBucket, 5, HOUR));
    let windows = Arc::new(rule("fw", Algorithm::FixedWindow, 3, HOUR));
    // Load the plans' scripts first, so every call counted below is a decision (and no
    // burst of first uses loads one script hundreds of times).
    let c = client(1);
    store
        .check(&[Check::new(c, &buckets, 0)], 0)
        .await
        .expect("check");
    store
        .check(&[Check::new(c, &windows, 0), Check::new(c, &buckets, 0)], 0)
        .await
        .expect("check");
    for n in cluster.nodes() {
        n.cli(&["config", "resetstat"]);
    }
    // 400 clients, each with 8 plans of one rule and 4 of two, all at once.
    let clients: Vec<u128> = (10_000..10_400).collect();
    let slots: std::collections::HashSet<u16> =
        clients.iter().map(|&w| client(w).cluster_slot()).collect();
    let mut tasks = Vec::new();
    let barrier = Arc::new(tokio::sync::Barrier::new(clients.len() * 12));
    for &who in &clients {
        for j in 0..12 {
            let (store, b, w, barrier) = (
                store.clone(),
                buckets.clone(),
                windows.clone(),
                barrier.clone(),
            );
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let c = client(who);
                let v = if j < 8 {
                    store.check(&[Check::new(c, &b, 1)], 0).await
                } else {
                    store
                        .check(&[Check::new(c, &w, 1), Check::new(c, &b, 1)], 0)
                        .await
                };
                (who, j < 8, v.map(|v| v.allowed))
            }));
        }
    }
    let mut admitted: std::collections::HashMap<u128, u64> = std::collections::HashMap::new();
    for t in tasks {
        let (who, _, v) = tokio::time::timeout(HANG, t)
            .await
            .expect("hung")
            .expect("task");
        match v {
            Ok(true) => *admitted.entry(who).or_default() += 1,
            Ok(false) => {}
            Err(e) => panic!("a plan failed: {e}"),
        }
    }
    let calls: u64 = cluster
        .nodes()
        .iter()
        .map(|n| script_calls(|a| n.cli(a)))
        .sum();
    // Per slot, each slot's plans take a call of their own at least (one per slot touched);
    // per node, a few dozen calls carry them all.
    let plans = clients.len() * 12;
    assert!(
        max_batch.is_some() || calls < slots.len() as u64 / 2,
        "{plans} plans over {} slots took {calls} script calls",
        slots.len()
    );
    // Each client's bucket holds 5: every admitted plan took one token, so exactly 5 were
    // admitted whatever the order; none of its window's 3 was taken past the limit.
    for &who in &clients {
        assert_eq!(admitted.get(&who).copied(), Some(5), "client {who}");
        let b = store
            .check(&[Check::new(client(who), &buckets, 0)], 0)
            .await
            .expect("query");
        assert_eq!(b.decisions[0].remaining, 0, "client {who}");
        let w = store
            .check(&[Check::new(client(who), &windows, 0)], 0)
            .await
            .expect("query");
        assert!(w.decisions[0].remaining <= 3, "client {who}");
    }
}

/// A node table gone stale (a slot handed to another node after the store read it) costs no
/// decision: the batch answers that slot's plans ELSEWHERE, they run alone (the client follows
/// the redirection) and the store reads the table again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stale_node_table_sends_moved_plans_alone_and_decides_them_exactly() {
    let cluster = RedisCluster::start(3, 0);
    let r = Arc::new(rule("moved", Algorithm::TokenBucket, 5, HOUR));
    // A client whose slot nothing has written yet, and the node that serves it.
    let who = 77_777u128;
    let slot = u32::from(client(who).cluster_slot());
    let (from, to) = cluster.owner_and_other(slot);
    // Clients served by the same node, to keep its lane busy.
    let neighbours: Vec<u128> = (200_000..)
        .filter(|&w| {
            let s = u32::from(client(w).cluster_slot());
            s != slot && cluster.master_of_slot(s) == Some(from)
        })
        .take(60)
        .collect();
    let store = store(RedisConfig::cluster(cluster.seed_urls())).await;
    store
        .check(&[Check::new(client(neighbours[0]), &r, 0)], 0)
        .await
        .expect("warm");
    assert!(cluster.move_empty_slot(slot, to), "the slot did not move");
    for round in 0..3 {
        let mut tasks = Vec::new();
        let barrier = Arc::new(tokio::sync::Barrier::new(20 + neighbours.len()));
        for i in 0..(20 + neighbours.len()) {
            let (store, r, barrier) = (store.clone(), r.clone(), barrier.clone());
            let w = if i < 20 { who } else { neighbours[i - 20] };
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                (w, store.check(&[Check::new(client(w), &r, 1)], 0).await)
            }));
        }
        let mut mine = 0;
        for t in tasks {
            let (w, v) = tokio::time::timeout(HANG, t)
                .await
                .expect("hung")
                .expect("task");
            let allowed = match v {
                Ok(v) => v.allowed,
                Err(e) => panic!("round {round}: a plan failed: {e}"),
            };
            if w == who {
                mine += usize::from(allowed);
            }
        }
        // Five tokens in all, whatever the rounds: five in the first, none after.
        assert_eq!(mine, if round == 0 { 5 } else { 0 }, "round {round}");
    }
    // The state lives on the slot's new node, where the redirections sent it.
    let keys_there: u64 = cluster.nodes()[to]
        .cli(&["cluster", "countkeysinslot", &slot.to_string()])
        .trim()
        .parse()
        .unwrap_or(0);
    assert_eq!(keys_there, 1);
}

/// A slot in the middle of a resharding (its owner migrating it, the new node importing):
/// the owner answers ASK for a key it does not hold, on the node's own connection too; the
/// plan is then sent where the client follows the redirection (ASKING), once, and decided
/// exactly: five of eight admitted, the state on the importing node only.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slot_being_migrated_sends_its_new_keys_to_the_importing_node_once() {
    let cluster = RedisCluster::start(3, 0);
    let r = Arc::new(rule("ask", Algorithm::TokenBucket, 5, HOUR));
    let who = 88_888u128;
    let slot = u32::from(client(who).cluster_slot());
    let (from, to) = cluster.owner_and_other(slot);
    let store = store(RedisConfig::cluster(cluster.seed_urls())).await;
    // The plan's script loaded (on every master) before the migration begins.
    let other = common::clients_of(&cluster, from, 1)
        .next()
        .expect("a client of the same node");
    store
        .check(&[Check::new(client(other), &r, 0)], 0)
        .await
        .expect("warm");
    assert!(
        cluster.begin_migration(slot, to),
        "the migration did not begin"
    );
    let mut admitted = 0;
    for i in 0..8 {
        let v = tokio::time::timeout(HANG, store.check(&[Check::new(client(who), &r, 1)], 0))
            .await
            .expect("hung")
            .unwrap_or_else(|e| panic!("check {i} failed: {e}"));
        admitted += usize::from(v.allowed);
    }
    assert_eq!(admitted, 5);
    let keys_in_slot = |node: usize| -> u64 {
        cluster.nodes()[node]
            .cli(&["cluster", "countkeysinslot", &slot.to_string()])
            .trim()
            .parse()
            .unwrap_or(u64::MAX)
    };
    assert_eq!(keys_in_slot(to), 1, "the state is on the importing node");
    assert_eq!(
        keys_in_slot(from),
        0,
        "and nothing was written on the owner"
    );
}

/// A plan the script refuses (here a local clock past 2^53 us) fails alone: the other plans
/// of its batch are decided and charged as if it had not been there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plan_refused_inside_a_batch_fails_alone() {
    let server = RedisServer::start();
    let config = RedisConfig::standalone(server.url()).with_clock(StoreClock::Local);
    let store = store(config).await;
    let r = Arc::new(rule("alone", Algorithm::FixedWindow, 1000, HOUR));
    store
        .check(&[Check::new(client(1), &r, 0)], common::EPOCH_2026)
        .await
        .expect("warm");
    server.cli(&["config", "resetstat"]);
    let barrier = Arc::new(tokio::sync::Barrier::new(200));
    let mut tasks = Vec::new();
    for i in 0..200u64 {
        let (store, r, barrier) = (store.clone(), r.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let bad = i % 10 == 7;
            let now = if bad { 1u64 << 53 } else { common::EPOCH_2026 };
            (
                bad,
                store.check(&[Check::new(client(50), &r, 1)], now).await,
            )
        }));
    }
    let (mut ok, mut refused) = (0u64, 0u64);
    for t in tasks {
        let (bad, v) = tokio::time::timeout(HANG, t)
            .await
            .expect("hung")
            .expect("task");
        match (bad, v) {
            (false, Ok(v)) => ok += u64::from(v.allowed),
            (true, Err(_)) => refused += 1,
            (bad, v) => panic!("bad={bad}: {v:?}"),
        }
    }
    assert_eq!((ok, refused), (180, 20));
    let left = store
        .check(&[Check::new(client(50), &r, 0)], common::EPOCH_2026)
        .await
        .expect("query");
    assert_eq!(left.decisions[0].remaining, 1000 - 180);
    // They did share calls: the refusals were inside batches, not each a call of its own.
    assert!(script_calls(|a| server.cli(a)) < 200);
}

/// On a Cluster, lease refills of many clients coalesce per node too, each client's leases
/// taking its limit exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_cluster_lease_calls_of_many_slots_coalesce_per_node() {
    let cluster = RedisCluster::start(3, 0);
    let store = store(RedisConfig::cluster(cluster.seed_urls())).await;
    let r = Arc::new(rule("leased-nodes", Algorithm::TokenBucket, 30, DAY));
    // Load the scripts first (the lease script and the plan's).
    load_script(&store, &r).await;
    assert_eq!(take_all(&store, &r, 2, 1, false).await, 3);
    for n in cluster.nodes() {
        n.cli(&["config", "resetstat"]);
    }
    // 200 clients, each with 20 leases of 3 at once: 30 units each, no more.
    let clients: Vec<u128> = (50_000..50_200).collect();
    let slots: std::collections::HashSet<u16> =
        clients.iter().map(|&w| client(w).cluster_slot()).collect();
    let runs = clients.iter().map(|&w| {
        let (store, r) = (store.clone(), r.clone());
        async move { (w, take_all(&store, &r, w, 20, false).await) }
    });
    let taken = futures_join_all(runs).await;
    for (w, units) in taken {
        assert_eq!(units, 30, "client {w}");
    }
    let calls: u64 = cluster
        .nodes()
        .iter()
        .map(|n| script_calls(|a| n.cli(a)))
        .sum();
    assert!(
        calls < slots.len() as u64,
        "4000 leases of {} clients over {} slots took {calls} script calls",
        clients.len(),
        slots.len()
    );
}

/// Runs the futures concurrently (each on a task of its own) and returns their outputs in
/// order.
async fn futures_join_all<F, T>(futures: impl Iterator<Item = F>) -> Vec<T>
where
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    joined(futures.map(tokio::spawn).collect()).await
}

/// What spawned `tasks` returned, in order; none may take longer than [`HANG`].
async fn joined<T>(tasks: Vec<tokio::task::JoinHandle<T>>) -> Vec<T> {
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(
            tokio::time::timeout(HANG, t)
                .await
                .expect("no hang")
                .expect("task"),
        );
    }
    out
}

/// Redis keeps every script it is sent until it restarts. Plans under many overrides, each
/// its own limit (the soak's 300 per reload), alone and in batches, one rule and two: a
/// handful of scripts whatever the number of limits, every plan decided with its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn plans_of_many_limits_share_their_scripts_and_each_keeps_its_limit() {
    let server = RedisServer::start();
    let config = RedisConfig::standalone(server.url()).with_clock(StoreClock::Local);
    let store = store(config).await;
    let cached = || common::cached_scripts(|a| server.cli(a));
    let before = cached();
    let per_ip = Arc::new(rule("per-ip", Algorithm::TokenBucket, 1_000_000, HOUR));
    let limits: Vec<u64> = (0..200).map(|i| 200 + i).collect();
    let rules: Vec<Arc<Rule>> = limits
        .iter()
        .map(|&l| Arc::new(rule("per-key", Algorithm::TokenBucket, l, HOUR)))
        .collect();
    for round in 0..3u64 {
        let plans = rules.iter().enumerate().map(|(i, r)| {
            let (store, r, per_ip) = (store.clone(), r.clone(), per_ip.clone());
            async move {
                let who = client(1_000 + i as u128);
                // Odd clients also pass a per-IP rule: a two-rule plan.
                let mut checks = vec![Check::new(who, &r, 1)];
                if i % 2 == 1 {
                    checks.push(Check::new(client(7), &per_ip, 1));
                }
                store.check(&checks, common::EPOCH_2026 + round).await
            }
        });
        let answers = futures_join_all(plans).await;
        for (i, answer) in answers.into_iter().enumerate() {
            let v = answer.expect("check");
            assert!(v.allowed, "plan {i}");
            // Its own limit: remaining is that limit less the rounds so far.
            assert_eq!(v.decisions[0].limit, limits[i], "plan {i}");
            assert_eq!(v.decisions[0].remaining, limits[i] - round - 1, "plan {i}");
        }
    }
    let added = cached() - before;
    assert!(
        added <= 8,
        "200 limits in plans of one and two rules left {added} scripts in Redis"
    );
}

/// A Lua function holds at most 200 locals, and a batch script is one function: the scripts
/// with the most (a branch of the most rules a script holds, every algorithm, one slot and
/// across slots) and the one with the most branches (fifteen forms, a store's list at its
/// bound) must compile on a real redis-server, with room to spare for the next change (ten
/// more locals at the top still compile).
#[tokio::test]
async fn the_batch_scripts_with_the_most_locals_compile() {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).expect("url");
    let mut con = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let texts = tollgate_redis::largest_batch_scripts();
    assert_eq!(texts.len(), 2 * Algorithm::ALL.len() + 2);
    let spare = format!(
        "local {} = 0\n",
        (0..10)
            .map(|i| format!("spare_{i}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for text in texts {
        // After the flags line of an across-slots script, which must stay first.
        let (head, rest) = match text.split_once('\n') {
            Some((head, rest)) if head.starts_with("#!") => (format!("{head}\n"), rest),
            _ => (String::new(), text.as_str()),
        };
        for padded in [text.clone(), format!("{head}{spare}{rest}")] {
            let loaded: Result<String, _> = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(&padded)
                .query_async(&mut con)
                .await;
            assert!(
                loaded.is_ok(),
                "{loaded:?} for the script beginning {:?}",
                &padded[..padded.len().min(300)]
            );
        }
    }
}

/// Each plan of a batch writes its key with its own PX (the batch script keeps the last PX's
/// text and formats it again only for other milliseconds): fresh token buckets charged 1, 50,
/// 100 or 7 of 100 a minute expire when each is full again, 0.6 s a token, whatever the plan
/// before them wrote.
#[tokio::test(flavor = "current_thread")]
async fn each_plan_of_a_batch_expires_when_its_own_state_is_fresh_again() {
    let server = RedisServer::start();
    let store = store(RedisConfig::standalone(server.url())).await;
    let r = px_rule(&store, "px").await;
    let plans: Vec<(u128, u64)> = (500u128..).zip(PX_COSTS).collect();
    let done = batched_with_pttls(&server, &store, &r, &plans, common::EPOCH_2026).await;
    each_expires_when_full_again(&done);
}

/// The costs of [`px_rule`]'s plans: 1, 50, 100 or 7 tokens of 100.
const PX_COSTS: [u64; 8] = [1, 1, 50, 50, 1, 100, 7, 1];

/// A token bucket of 100 a minute (0.6 s a token) named `name`, its plan's script loaded (a
/// cost of 0 writes nothing), so the plans that follow coalesce.
async fn px_rule(store: &RedisStore, name: &str) -> Arc<Rule> {
    let r = Arc::new(rule(
        name,
        Algorithm::TokenBucket,
        100,
        Duration::from_secs(60),
    ));
    store
        .check(&[Check::new(client(499), &r, 0)], common::EPOCH_2026)
        .await
        .expect("check");
    r
}

/// Each of [`PX_COSTS`]' plans allowed, its key expiring when its bucket is full again.
fn each_expires_when_full_again(done: &[(tollgate_core::Verdict, i64)]) {
    assert_eq!(done.len(), PX_COSTS.len());
    for (&cost, (verdict, pttl)) in PX_COSTS.iter().zip(done) {
        assert!(verdict.allowed);
        let want = i64::try_from(cost * 600).expect("small");
        // At most its idle time, and not much less (the test's own seconds).
        assert!(
            *pttl <= want && pttl + 5_000 > want,
            "cost {cost}: pttl {pttl}, want {want}"
        );
    }
}

/// Across slots, as on one server: a Cluster node's plans of many slots leave in one call of
/// the across-slots script, and each writes its key with its own PX. Fresh token buckets of
/// 100 a minute charged 1, 50, 100 or 7, each client of a slot of its own on one master,
/// expire when each is full again, 0.6 s a token.
#[tokio::test(flavor = "current_thread")]
async fn on_a_cluster_each_plan_of_a_batch_across_slots_expires_when_its_own_state_is_fresh_again()
{
    let cluster = RedisCluster::start(3, 0);
    let store = store(RedisConfig::cluster(cluster.seed_urls())).await;
    let r = px_rule(&store, "px-across").await;
    // Clients of distinct slots served by the first client's master: their plans can share a
    // call only across slots.
    let master = |who: u128| {
        cluster
            .master_of_key(&store.key(&client(who), r.name()))
            .expect("a master serves every slot")
    };
    let node = master(600);
    let mut slots = std::collections::HashSet::new();
    let plans: Vec<(u128, u64)> = (600u128..)
        .filter(|&who| master(who) == node && slots.insert(client(who).cluster_slot()))
        .zip(PX_COSTS)
        .collect();
    let done = batched_with_pttls(
        &cluster.nodes()[node],
        &store,
        &r,
        &plans,
        common::EPOCH_2026,
    )
    .await;
    each_expires_when_full_again(&done);
}

/// `plans` (client, cost) of `r` spawned at once on one thread (the first leaves alone, the
/// rest queue behind it), checked to have coalesced on `server`, which holds every key: each
/// one's verdict, then its key's PTTL.
async fn batched_with_pttls(
    server: &RedisServer,
    store: &RedisStore,
    r: &Arc<Rule>,
    plans: &[(u128, u64)],
    now: u64,
) -> Vec<(tollgate_core::Verdict, i64)> {
    let before = script_calls(|a| server.cli(a));
    let tasks: Vec<_> = plans
        .iter()
        .map(|&(who, cost)| {
            let (store, r) = (store.clone(), r.clone());
            tokio::spawn(
                async move { store.check(&[Check::new(client(who), &r, cost)], now).await },
            )
        })
        .collect();
    let mut verdicts = Vec::new();
    for t in tasks {
        let verdict = tokio::time::timeout(HANG, t)
            .await
            .expect("in time")
            .expect("join")
            .expect("check");
        verdicts.push(verdict);
    }
    let calls = script_calls(|a| server.cli(a)) - before;
    assert!(calls < plans.len() as u64, "{calls} script calls: no batch");
    verdicts
        .into_iter()
        .zip(plans)
        .map(|(v, &(who, _))| {
            let key = store.key(&client(who), r.name());
            let pttl: i64 = server.cli(&["pttl", &key]).trim().parse().expect("pttl");
            (v, pttl)
        })
        .collect()
}

/// New clients of a uniform call (cost 1, the store's clock: the new ones decided once for
/// the call) each write their own key with the PX a lone new client's write has: a token
/// bucket of 10 an hour charged 1 is full again in 360 s.
#[tokio::test(flavor = "current_thread")]
async fn new_clients_of_a_uniform_batch_expire_when_full_again() {
    let server = RedisServer::start();
    let store = store(RedisConfig::standalone(server.url())).await;
    let r = Arc::new(rule("fresh-px", Algorithm::TokenBucket, 10, HOUR));
    load_script(&store, &r).await;
    let plans: Vec<(u128, u64)> = (900..916).map(|c| (c, 1)).collect();
    let done = batched_with_pttls(&server, &store, &r, &plans, 0).await;
    for ((c, _), (verdict, pttl)) in plans.iter().zip(done) {
        assert!(verdict.allowed);
        assert_eq!(verdict.decisions[0].remaining, 9);
        // At most its idle time, and no less than the test's own seconds take from it.
        assert!(
            pttl <= 360_000 && pttl > 350_000,
            "client {c}: pttl {pttl}, want 360000"
        );
    }
}

/// `n` checks of `rule` for client `who`, each its own task, started now.
fn spawn_checks(
    store: &RedisStore,
    rule: &Arc<Rule>,
    who: u128,
    n: usize,
) -> Vec<tokio::task::JoinHandle<Result<tollgate_core::Verdict, tollgate_redis::RedisStoreError>>> {
    (0..n)
        .map(|_| {
            let (store, rule) = (store.clone(), rule.clone());
            tokio::spawn(async move {
                let checks = [Check::new(client(who), &rule, 1)];
                store.check(&checks, 0).await
            })
        })
        .collect()
}

/// What remains of `rule` for `who` after one more check.
async fn remaining_after_one(store: &RedisStore, rule: &Arc<Rule>, who: u128) -> u64 {
    let v = joined(spawn_checks(store, rule, who, 1)).await;
    match &v[..] {
        [Ok(v)] => v.decisions[0].remaining,
        other => panic!("a check failed: {other:?}"),
    }
}

/// A redis-server, a relay in front of it, and a store of `max_batch` through the relay.
async fn relayed(
    max_batch: usize,
    timeout: Duration,
) -> (RedisServer, common::relay::Relay, RedisStore) {
    let server = RedisServer::start();
    let relay = common::relay::Relay::start(server.port()).await;
    let config = RedisConfig::standalone(relay.url())
        .with_max_batch(max_batch)
        .with_call_timeout(timeout);
    let store = store(config).await;
    (server, relay, store)
}

/// A redis-server behind a relay, a store at `max_batch = 2` with `timeout`, and a token
/// bucket of 1,000 named `name`, its scripts loaded and the own connection open (50 plans of
/// client 1).
async fn behind_a_relay(
    timeout: Duration,
    name: &str,
) -> (RedisServer, common::relay::Relay, RedisStore, Arc<Rule>) {
    let (server, relay, store) = relayed(2, timeout).await;
    let r = Arc::new(rule(name, Algorithm::TokenBucket, 1000, HOUR));
    assert_eq!(concurrent(&store, &r, 1, 50).await, 50);
    (server, relay, store, r)
}

/// A check of `r` for `who` whose call the relay holds (the lane busy behind it).
async fn held_lead(
    relay: &common::relay::Relay,
    store: &RedisStore,
    r: &Arc<Rule>,
    who: u128,
) -> Vec<tokio::task::JoinHandle<Result<tollgate_core::Verdict, tollgate_redis::RedisStoreError>>> {
    relay.hold();
    let before = relay.calls();
    let lead = spawn_checks(store, r, who, 1);
    relay.wait_for_calls(before + 1).await;
    lead
}

/// A queue longer than `max_batch` leaves in one round trip: its batch calls are written
/// together on the store's own connection (before the bug this guards against, one batch
/// left per round trip, so a lane passed at most `max_batch` plans a round trip however
/// many waited and however far the server was), and every plan is decided as alone.
// One thread: the plans spawned run, and queue, in spawn order as soon as the test waits.
#[tokio::test(flavor = "current_thread")]
async fn a_queue_longer_than_max_batch_leaves_in_calls_written_together() {
    let (_server, relay, store, r) = behind_a_relay(Duration::from_secs(10), "together").await;
    let lead = held_lead(&relay, &store, &r, 2).await;
    // Ten plans queue behind the call the relay holds: five batches of two.
    let queued = spawn_checks(&store, &r, 2, 10);
    tokio::time::sleep(Duration::from_millis(200)).await;
    relay.release();
    let answers = joined(lead.into_iter().chain(queued).collect()).await;
    assert!(
        answers.iter().all(|a| a.as_ref().is_ok_and(|v| v.allowed)),
        "{answers:?}"
    );
    let together = relay.most_calls_written_together();
    assert!(
        together >= 2,
        "the queued batches left one a round trip ({together} calls written together at most)"
    );
    // Eleven charged, then this one.
    assert_eq!(remaining_after_one(&store, &r, 2).await, 1000 - 12);
}

/// Batch calls written together and given up (their deadline passed while the server's
/// replies were held) leave their replies owed on the socket: the next call skips them all
/// and reads its own, on the same connection, and what the given-up plans charged (they ran)
/// shows in the next answer.
// One thread: the plans spawned run, and queue, in spawn order as soon as the test waits.
#[tokio::test(flavor = "current_thread")]
async fn calls_written_together_and_given_up_leave_no_reply_to_another_call() {
    let (server, relay, store, r) = behind_a_relay(Duration::from_millis(500), "given-up").await;
    let batch_clients = || {
        server
            .cli(&["client", "list"])
            .matches("tollgate-batch")
            .count()
    };
    assert_eq!(batch_clients(), 1);
    let before = relay.calls();
    let lead = held_lead(&relay, &store, &r, 3).await;
    let queued = spawn_checks(&store, &r, 3, 10);
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The lead's reply goes through; the five calls written together after it are held.
    relay.pass_one();
    relay.wait_for_calls(before + 6).await;
    let lead = joined(lead).await;
    assert!(
        lead.iter().all(|a| a.as_ref().is_ok_and(|v| v.allowed)),
        "{lead:?}"
    );
    for a in joined(queued).await {
        let e = a.expect_err("held past the deadline");
        assert!(e.is_transient(), "{e}");
    }
    relay.release();
    // They ran (the server answered; the store stopped waiting): 1 + 10 charged, then one.
    assert_eq!(remaining_after_one(&store, &r, 3).await, 1000 - 12);
    assert_eq!(remaining_after_one(&store, &r, 3).await, 1000 - 13);
    assert_eq!(batch_clients(), 1, "the socket owing the replies was kept");
}

/// Through Sentinel, the master's long queue at `max_batch = 2` leaves in rounds of several
/// batches on the master's own connection, and the limit holds exactly (this test does not
/// see how the calls are written).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn through_sentinel_a_long_queue_at_a_small_max_batch_admits_exactly_the_limit() {
    let set = tokio::task::spawn_blocking(tollgate_testkit::RedisSentinels::start)
        .await
        .expect("sentinels");
    let config = RedisConfig::sentinel(set.sentinel_urls(), set.master_name()).with_max_batch(2);
    let store = store(config).await;
    let r = Arc::new(rule("sentinel", Algorithm::TokenBucket, 100, HOUR));
    assert_eq!(concurrent(&store, &r, 60, 400).await, 100);
    assert_eq!(remaining_after_one(&store, &r, 61).await, 99);
}

/// Behind Sentinel too, a quiet spell longer than the master's idle `timeout` fails no call: the
/// store PINGs the master's shared connection twice a second (see the standalone and Cluster
/// tests). Before, the first plan after it failed with `broken pipe` at `max_batch = 1`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_sentinel_no_call_fails_after_a_quiet_spell_longer_than_the_idle_timeout() {
    let set = tokio::task::spawn_blocking(tollgate_testkit::RedisSentinels::start)
        .await
        .expect("sentinels");
    let master = set.master_port().expect("a master");
    tollgate_testkit::redis_cli(master, &["config", "set", "timeout", "1"]);
    let config = RedisConfig::sentinel(set.sentinel_urls(), set.master_name()).with_max_batch(1);
    let store = store(config).await;
    let r = Arc::new(rule("quiet", Algorithm::TokenBucket, 5, HOUR));
    assert_eq!(remaining_after_one(&store, &r, 62).await, 4);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(remaining_after_one(&store, &r, 62).await, 3);
}

/// Two of three sentinels paused (they accept a connection and answer nothing): the store
/// still finds its master through the third, at connect and again after the master restarted
/// under it (its connection broken, the master forgotten and looked up anew), within a bound.
/// Both stores connect before the restart: right after one, the third sentinel may still flag
/// the master down for a moment, and a lookup then finds none (a connect fails; a call fails
/// under its policy and the next looks again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_that_answer_nothing_do_not_keep_the_store_from_its_master() {
    let mut set = tokio::task::spawn_blocking(tollgate_testkit::RedisSentinels::start)
        .await
        .expect("sentinels");
    set.pause_sentinel(0);
    set.pause_sentinel(1);
    let r = Arc::new(rule("paused", Algorithm::TokenBucket, 10, HOUR));
    let mut stores = Vec::new();
    for (who, max_batch) in [(63, 1), (64, 64)] {
        let config = RedisConfig::sentinel(set.sentinel_urls(), set.master_name())
            .with_max_batch(max_batch)
            .with_call_timeout(Duration::from_millis(500));
        let connect = tokio::time::timeout(HANG, store(config));
        let store = connect.await.expect("connected within the bound");
        assert_eq!(remaining_after_one(&store, &r, who).await, 9, "{max_batch}");
        stores.push((who, max_batch, store));
    }
    set.master().restart();
    for (who, max_batch, store) in &stores {
        let plan = [Check::new(client(*who), &r, 1)];
        let began = std::time::Instant::now();
        let again = loop {
            match store.check_bounded(&plan, 0).await {
                Ok(v) => break v,
                Err(_) if began.elapsed() < HANG => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("max_batch {max_batch}: no master after {HANG:?}: {e}"),
            }
        };
        // The restarted master is empty: a new bucket, one taken.
        assert_eq!(again.decisions[0].remaining, 9, "max_batch {max_batch}");
    }
    set.resume_sentinel(0);
    set.resume_sentinel(1);
}

/// A round with a batch whose script the server has not run yet goes call after call, the new
/// script loaded in front of its call, so it is decided before the round's later calls, in
/// arrival order. Two plans of one client, six
/// tokens each of ten: the first in a batch of a new list of forms (the store's list grown by
/// GCRA), the second alone after it (its own script, which the server has). With the new
/// batch's call answered NOSCRIPT and sent again after the round, the second would take the
/// tokens and the first be refused.
// One thread: the plans spawned run, and queue, in spawn order as soon as the test waits.
#[tokio::test(flavor = "current_thread")]
async fn a_new_batch_script_in_a_round_is_decided_in_arrival_order() {
    // [903, 904] is a batch of a new list of forms (token bucket, GCRA); 903's second plan
    // leaves alone after it.
    let answered =
        queued_behind_a_held_call(false, &[(903, false, 6), (904, true, 1), (903, false, 6)]).await;
    assert_eq!(
        answered,
        [true, true, false],
        "decided out of arrival order"
    );
}

/// The same after the server lost its scripts (a failover, a flush) while the lane still
/// counts them as run: a round of a known batch script and a new one goes call after call, so
/// the known one's call is not answered NOSCRIPT and run again after the new one's, out of
/// arrival order. Client 903's first plan leaves in a batch of the store's list (token bucket), its
/// second in a batch of a new list (GCRA joins it), both in one round.
#[tokio::test(flavor = "current_thread")]
async fn after_the_server_lost_its_scripts_a_round_is_decided_in_arrival_order() {
    // Two batches of two: [903, 905] of the token bucket's list, [904 (GCRA), 903] of the new
    // list.
    let queued = [
        (903, false, 6),
        (905, false, 1),
        (904, true, 1),
        (903, false, 6),
    ];
    let answered = queued_behind_a_held_call(true, &queued).await;
    assert_eq!(
        answered,
        [true, true, true, false],
        "decided out of arrival order"
    );
}

/// After a flush the lane never saw answered NOSCRIPT, its first call loads a script new to
/// it (a plan of two rules, token bucket and GCRA), and the server then has that one only: the
/// lane counts as loaded only what the server says it has after that call, so the round
/// behind it (a batch of token-bucket plans, whose script was flushed, then a plan of the new
/// form) goes call after call, in arrival order. Counting the scripts it had loaded before the
/// flush, the lane wrote the round together: the batch answered NOSCRIPT, the plan after it
/// ran, and the batch ran again after it (client 903's first 6 of 10 refused, its last
/// allowed).
// One thread: the plans spawned run, and queue, in spawn order as soon as the test waits.
#[tokio::test(flavor = "current_thread")]
async fn after_an_unseen_flush_a_new_scripts_call_leaves_the_flushed_ones_unloaded() {
    let (server, relay, store) = relayed(2, Duration::from_secs(10)).await;
    let tb = Arc::new(rule("unseen-tb", Algorithm::TokenBucket, 10, HOUR));
    let gcra = Arc::new(rule("unseen-gcra", Algorithm::Gcra, 10, HOUR));
    // The token bucket's plan script and its batch script loaded, and counted by the lane.
    assert_eq!(concurrent(&store, &tb, 900, 10).await, 10);
    server.cli(&["script", "flush"]);
    let plan = |who: u128, both: bool, cost: u64| {
        let (store, tb, gcra) = (store.clone(), tb.clone(), gcra.clone());
        tokio::spawn(async move {
            let mut checks = vec![Check::new(client(who), &tb, cost)];
            if both {
                checks.push(Check::new(client(who), &gcra, 1));
            }
            store.check(&checks, 0).await.map(|v| v.allowed)
        })
    };
    relay.hold();
    let before = relay.calls();
    // The lead: the new form's first call (its script loaded with it).
    let lead = plan(950, true, 1);
    relay.wait_for_calls(before + 1).await;
    // A batch of two token-bucket plans, then the new form's plan alone.
    let queued = vec![plan(903, false, 6), plan(905, false, 1), plan(903, true, 6)];
    let allowed = released_in_order(&relay, lead, queued).await;
    assert_eq!(allowed, [true, true, false], "decided out of arrival order");
}

/// A check's task: whether it was allowed.
type Allowed = tokio::task::JoinHandle<Result<bool, tollgate_redis::RedisStoreError>>;

/// Lets the call the relay holds go, 100 ms after the checks behind it were spawned (so that
/// they queue); the held `lead` was allowed, and whether each of `queued` was, in order.
async fn released_in_order(
    relay: &common::relay::Relay,
    lead: Allowed,
    queued: Vec<Allowed>,
) -> Vec<bool> {
    tokio::time::sleep(Duration::from_millis(100)).await;
    relay.release();
    assert!(lead.await.expect("task").expect("lead"));
    let mut allowed = Vec::new();
    for t in queued {
        allowed.push(
            tokio::time::timeout(HANG, t)
                .await
                .expect("hung")
                .expect("task")
                .expect("check"),
        );
    }
    allowed
}

/// Checks queued on one thread behind a call the relay holds, on a store at `max_batch = 2`
/// whose lane has run the token bucket's batch script and whose GCRA plan ran alone, the
/// server's scripts flushed first when `flush`: each (client, GCRA rather than the token
/// bucket, cost), both rules 10 an hour. Whether each was allowed, in order; they left in
/// one round, call after call, as a round with a script new to its lane does.
async fn queued_behind_a_held_call(flush: bool, queued: &[(u128, bool, u64)]) -> Vec<bool> {
    let (server, relay, store) = relayed(2, Duration::from_secs(10)).await;
    let tb = Arc::new(rule("order-tb", Algorithm::TokenBucket, 10, HOUR));
    let gcra = Arc::new(rule("order-gcra", Algorithm::Gcra, 10, HOUR));
    // The plan scripts loaded, and batches of token-bucket plans run (their batch script).
    assert_eq!(concurrent(&store, &tb, 900, 10).await, 10);
    let one = |who: u128, gcra_rule: bool, cost: u64| {
        let r = if gcra_rule { gcra.clone() } else { tb.clone() };
        let store = store.clone();
        tokio::spawn(async move {
            let checks = [Check::new(client(who), &r, cost)];
            store.check(&checks, 0).await.map(|v| v.allowed)
        })
    };
    one(901, true, 1).await.expect("task").expect("gcra");

    relay.hold();
    let before = relay.calls();
    let lead = one(902, false, 1);
    relay.wait_for_calls(before + 1).await;
    if flush {
        server.cli(&["script", "flush"]);
    }
    let queued: Vec<_> = queued
        .iter()
        .map(|&(who, gcra_rule, cost)| one(who, gcra_rule, cost))
        .collect();
    let allowed = released_in_order(&relay, lead, queued).await;
    // Every round held a script new to the lane (the warm-up's batch script, then GCRA's
    // list): it went call after call.
    assert_eq!(relay.most_calls_written_together(), 1);
    allowed
}

/// Fills the list of forms (`lane.rs`) of a `behind_a_relay` store, whose list holds
/// its warm-up's one-rule form (`warm`): four forms of 16, 16, 16 and 15 rules, the most rules
/// one batch script holds in all (64), each first run alone (its plan script loaded), then
/// queued behind a held call of `warm` so that they leave in batches and join the list.
async fn fill_the_stores_forms(relay: &common::relay::Relay, store: &RedisStore, warm: &Arc<Rule>) {
    let rules: Arc<Vec<Rule>> = Arc::new(
        (0..tollgate_redis::MAX_INLINE_RULES)
            .map(|i| rule(&format!("fill-{i}"), Algorithm::ALL[i % 5], 1000, HOUR))
            .collect(),
    );
    // A form: how many rules, and which one (if any) is in shadow mode.
    let forms = [(16, None), (16, Some(0)), (16, Some(1)), (15, None)];
    let plan = |who: u128, (n, shadow): (usize, Option<usize>)| {
        let (store, rules) = (store.clone(), Arc::clone(&rules));
        tokio::spawn(async move {
            let checks: Vec<Check<'_>> = rules[..n]
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    let c = Check::new(client(who), r, 1);
                    if shadow == Some(i) {
                        c.shadow()
                    } else {
                        c
                    }
                })
                .collect();
            store.check(&checks, 0).await
        })
    };
    for (i, &form) in forms.iter().enumerate() {
        let alone = plan(1_000 + i as u128, form).await.expect("task");
        assert!(alone.expect("fill alone").allowed);
    }
    let lead = held_lead(relay, store, warm, 1_100).await;
    let queued: Vec<_> = forms
        .iter()
        .enumerate()
        .map(|(i, &form)| plan(1_200 + i as u128, form))
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    relay.release();
    for a in joined(lead).await.into_iter().chain(joined(queued).await) {
        assert!(a.expect("fill").allowed);
    }
}

/// Plans of more forms than a batch of its own forms holds (four) leave in one batch call
/// when they are all of the store's forms, which grow as plans arrive: ten two-rule forms (a
/// token bucket, then one of five algorithms, enforced or in shadow), twenty plans queued
/// behind a held call leave in one call of one new batch script (batches of their own forms
/// took at least three calls and three scripts), each decided by its own form's branch in
/// arrival order: every client's first plan (cost 6 of 10) allowed, its second refused where
/// the second rule is enforced and allowed where it is in shadow mode.
// One thread: the plans spawned run, and queue, in spawn order as soon as the test waits.
#[tokio::test(flavor = "current_thread")]
async fn plans_of_many_forms_leave_in_one_call_of_the_stores_script() {
    let (server, relay, store) = relayed(64, Duration::from_secs(10)).await;
    let first = Arc::new(rule("many-first", Algorithm::TokenBucket, 1000, HOUR));
    let seconds: Arc<Vec<Rule>> = Arc::new(
        Algorithm::ALL
            .iter()
            .map(|&a| rule(&format!("many-{}", a.name()), a, 10, HOUR))
            .collect(),
    );
    // Form f: the token bucket, then algorithm f % 5, in shadow mode from f = 5 on.
    let plan = |who: u128, f: usize| {
        let (store, first, seconds) = (store.clone(), first.clone(), Arc::clone(&seconds));
        tokio::spawn(async move {
            let second = Check::new(client(who), &seconds[f % 5], 6);
            let checks = [
                Check::new(client(who), &first, 6),
                if f >= 5 { second.shadow() } else { second },
            ];
            store.check(&checks, 0).await
        })
    };
    // Each form's plan script loaded, one plan at a time (each alone: the store's list stays
    // empty).
    for f in 0..10 {
        let alone = plan(1_000 + f as u128, f).await.expect("task");
        assert!(alone.expect("alone").allowed);
    }
    // And the held lead's.
    assert_eq!(concurrent(&store, &first, 1_999, 1).await, 1);
    let before = common::cached_scripts(|a| server.cli(a));
    // Twice: the first time the batch script is new (its call answered NOSCRIPT, then loaded
    // and sent again: two calls), the second time it is known (one call).
    for (round, calls_expected) in [(0u128, 1..=2), (1, 1..=1)] {
        let lead = held_lead(&relay, &store, &first, 2_000 + round).await;
        let calls = relay.calls();
        // Every client's first plan, then every client's second.
        let queued: Vec<_> = (0..20)
            .map(|i| plan(3_000 + round * 100 + (i % 10) as u128, i % 10))
            .collect();
        tokio::time::sleep(Duration::from_millis(100)).await;
        relay.release();
        assert!(joined(lead)
            .await
            .into_iter()
            .all(|a| a.expect("lead").allowed));
        let allowed: Vec<bool> = joined(queued)
            .await
            .into_iter()
            .map(|a| a.expect("check").allowed)
            .collect();
        let expected: Vec<bool> = (0..20).map(|i| i < 10 || i % 10 >= 5).collect();
        assert_eq!(
            allowed, expected,
            "decided by another branch or out of order"
        );
        let took = relay.calls() - calls;
        // At least one: plans that went another way than the lane's connection take none.
        assert!(
            calls_expected.contains(&took),
            "the twenty plans took {took} calls"
        );
    }
    assert_eq!(
        common::cached_scripts(|a| server.cli(a)) - before,
        1,
        "plans of the store's forms loaded more than one batch script"
    );
}

/// Batches of their own forms (forms the lane's full list cannot take) in another arrival
/// order share one batch script (a batch's list of forms is put in one order, each plan naming
/// its form by its place in it), and every plan is still decided by its own form's branch, in
/// arrival order: a fixed window of 1,000 and a GCRA of 10, each client's second plan (in the
/// second batch, the forms the other way round) finding what its first took. With the list in
/// arrival order the second batch needs a script of its own; with a plan's number taken from
/// another order than its script's, the GCRA plans would run the fixed window's branch and the
/// other way round.
// One thread: the plans spawned run, and queue, in spawn order as soon as the test waits.
#[tokio::test(flavor = "current_thread")]
async fn batches_of_the_same_forms_in_another_order_share_one_script() {
    // A fixed window of an hour on Redis's clock: a client's second plan finds what its first
    // took only in the same hour.
    tollgate_testkit::clear_of_window_end(HOUR);
    let (server, relay, store, warm) = behind_a_relay(Duration::from_secs(10), "forms-warm").await;
    // Two forms outside the store's list: its forms (the warm-up's token bucket, then forms of
    // sixteen, sixteen, sixteen and fifteen rules) fill what one script holds, so batches of
    // these two are batches of their own forms.
    fill_the_stores_forms(&relay, &store, &warm).await;
    let tb = Arc::new(rule("forms-tb", Algorithm::FixedWindow, 1000, HOUR));
    let gcra = Arc::new(rule("forms-gcra", Algorithm::Gcra, 10, HOUR));
    let one = |who: u128, r: &Arc<Rule>, cost: u64| {
        let (store, r) = (store.clone(), r.clone());
        tokio::spawn(async move {
            let checks = [Check::new(client(who), &r, cost)];
            store.check(&checks, 0).await
        })
    };
    // The plan scripts loaded (a batch script is what this test counts).
    let first = one(960, &gcra, 1).await.expect("task").expect("gcra");
    assert!(first.allowed);
    assert!(one(959, &tb, 1).await.expect("task").expect("tb").allowed);
    let before = common::cached_scripts(|a| server.cli(a));
    let lead = held_lead(&relay, &store, &tb, 961).await;
    // At `max_batch = 2`: [token bucket, GCRA], then [GCRA, token bucket].
    let queued: Vec<_> = [
        (962, &tb, 600),
        (963, &gcra, 6),
        (963, &gcra, 6),
        (962, &tb, 600),
    ]
    .into_iter()
    .map(|(who, r, cost)| one(who, r, cost))
    .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    relay.release();
    let lead = joined(lead).await;
    assert!(
        lead.iter().all(|a| a.as_ref().is_ok_and(|v| v.allowed)),
        "{lead:?}"
    );
    let answers: Vec<(bool, u64)> = joined(queued)
        .await
        .into_iter()
        .map(|a| {
            let v = a.expect("check");
            (v.allowed, v.decisions[0].remaining)
        })
        .collect();
    assert_eq!(answers[0], (true, 400), "{answers:?}");
    assert!(answers[1].0 && answers[1].1 <= 4, "{answers:?}");
    assert!(!answers[2].0, "GCRA's second 6 of 10 allowed: {answers:?}");
    assert_eq!(answers[3], (false, 400), "{answers:?}");
    assert!(relay.most_calls_written_together() >= 2);
    assert_eq!(
        common::cached_scripts(|a| server.cli(a)) - before,
        1,
        "the two orders of the same forms loaded a script each"
    );
}

/// Every write's PX is its state's time to fresh, rounded up to the millisecond: the key
/// outlives its state by less than a millisecond and never vanishes before it (a client
/// whose key expired early would find a fresh state too soon). MONITOR shows the arguments
/// of every SET a script makes: plans alone, plans of one rule in uniform calls, plans of one
/// and two rules in calls together (the general loop), plans of seventeen rules (the generic
/// script), leases and settles. On the local clock a PX depends only on its plan's `now`:
/// each key's two writes, new and found, are exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_write_sets_px_to_its_states_time_to_fresh_rounded_up_to_the_millisecond() {
    writes_px_as_the_core_decides(StoreClock::Local).await;
}

/// On the store's clock, where a call's new keys are decided once for the call (the uniform
/// loop) or once for each limit (the general loop), each with its PX formatted once: a new
/// key's PX, for every algorithm whose time to fresh after one plan does not depend on when
/// it came (a fixed window's, and a sliding counter's, end with the window).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn new_keys_decided_once_a_call_write_the_px_of_one_alone() {
    writes_px_as_the_core_decides(StoreClock::Store).await;
}

async fn writes_px_as_the_core_decides(clock: StoreClock) {
    let server = RedisServer::start();
    let store = store(RedisConfig::standalone(server.url()).with_clock(clock)).await;
    let local = clock == StoreClock::Local;
    // 7 per 10 s (a token every 1,428,571.4 µs) and 5 per 7 s: times to fresh that are rarely
    // whole milliseconds. On the local clock each client's two plans come at odd
    // microseconds, 1.234567 s apart; on the store's, each key is written once (new).
    let other = Arc::new(rule(
        "px-other",
        Algorithm::TokenBucket,
        5,
        Duration::from_secs(7),
    ));
    let at: &[u64] = if local {
        &[common::EPOCH_2026 + 123_457, common::EPOCH_2026 + 1_358_024]
    } else {
        &[common::EPOCH_2026 + 123_457]
    };
    // The PX of `state` written at `now`: its time to fresh, rounded up to the millisecond.
    let px_at = |r: &Rule, state: &State, now: u64| -> u64 {
        let idle = state.idle_at(r.limit().quota()).saturating_sub(now);
        idle.div_ceil(1000).max(1)
    };
    // A rule's PX, write after write, as the core decides its plans (of `costs`, one an
    // instant) from `first` on.
    let px_of = |r: &Rule, first: u64, costs: &[u64]| -> Vec<u64> {
        let mut state = r.limit().fresh();
        at.iter()
            .zip(costs)
            .map(|(&now, &cost)| {
                let now = now - at[0] + first;
                assert!(r.limit().check(&mut state, now, cost, true).allowed);
                px_at(r, &state, now)
            })
            .collect()
    };
    let px_from = |r: &Rule, first: u64| px_of(r, first, &[1, 1]);
    let monitor = monitor::Monitor::start(server.port());
    let mut expected: HashMap<String, Vec<u64>> = HashMap::new();
    for algorithm in Algorithm::ALL {
        let r = Arc::new(rule(
            &format!("px-{algorithm}"),
            algorithm,
            7,
            Duration::from_secs(10),
        ));
        if !local && px_from(&r, at[0]) != px_from(&r, at[0] + 7_654_321) {
            continue;
        }
        let mut expect = |who: u128, rules: &[Arc<Rule>]| {
            for r in rules {
                expected.insert(store.key(&client(who), r.name()), px_from(r, at[0]));
            }
        };
        let one = vec![r.clone()];
        let two = vec![r.clone(), other.clone()];
        let base = 10_000 * (1 + algorithm as u128);
        // Alone, its key written at each instant.
        expect(base, &one);
        for &now in at {
            let v = store.check(&[Check::new(client(base), &r, 1)], now).await;
            assert!(v.expect("check").allowed, "{algorithm}");
        }
        // Forty clients of one rule, all at once (uniform calls); then, at once, twenty new
        // clients of two rules beside forty of one (on the local clock the first forty again,
        // found; on the store's forty more, new); on the local clock, the twenty again.
        let singles: Vec<(u128, &[Arc<Rule>])> =
            (1..=40).map(|i| (base + i, one.as_slice())).collect();
        let more: Vec<(u128, &[Arc<Rule>])> =
            (41..=80).map(|i| (base + i, one.as_slice())).collect();
        let doubles: Vec<(u128, &[Arc<Rule>])> =
            (101..=120).map(|i| (base + i, two.as_slice())).collect();
        let rounds = if local {
            vec![
                singles.iter().map(|p| (p, at[0])).collect::<Vec<_>>(),
                singles
                    .iter()
                    .map(|p| (p, at[1]))
                    .chain(doubles.iter().map(|p| (p, at[0])))
                    .collect(),
                doubles.iter().map(|p| (p, at[1])).collect(),
            ]
        } else {
            vec![
                singles.iter().map(|p| (p, at[0])).collect::<Vec<_>>(),
                more.iter().chain(&doubles).map(|p| (p, at[0])).collect(),
            ]
        };
        for (who, rules) in singles.iter().chain(&doubles) {
            expect(*who, rules);
        }
        if !local {
            for (who, rules) in &more {
                expect(*who, rules);
            }
        }
        for round in rounds {
            let barrier = Arc::new(tokio::sync::Barrier::new(round.len()));
            let tasks: Vec<_> = round
                .into_iter()
                .map(|(&(who, rules), now)| {
                    let (store, rules, barrier) = (store.clone(), rules.to_vec(), barrier.clone());
                    tokio::spawn(async move {
                        barrier.wait().await;
                        let checks: Vec<Check<'_>> = rules
                            .iter()
                            .map(|r| Check::new(client(who), r, 1))
                            .collect();
                        store.check(&checks, now).await.map(|v| v.allowed)
                    })
                })
                .collect();
            for t in tasks {
                match tokio::time::timeout(HANG, t).await {
                    Ok(Ok(Ok(true))) => {}
                    other => panic!("{algorithm}: a plan failed or was denied: {other:?}"),
                }
            }
        }
        if !local {
            continue;
        }
        // Seventeen rules a plan, past the sixteen a generated script holds: the generic
        // script's writes. And a lease of 3, then of 2 (lease.lua).
        let many: Vec<Rule> = (0..=MAX_INLINE_RULES)
            .map(|i| {
                rule(
                    &format!("px-{algorithm}-{i}"),
                    algorithm,
                    7,
                    Duration::from_secs(10),
                )
            })
            .collect();
        let who = base + 500;
        for r in &many {
            expected.insert(store.key(&client(who), r.name()), px_from(r, at[0]));
        }
        for &now in at {
            let checks: Vec<Check<'_>> =
                many.iter().map(|r| Check::new(client(who), r, 1)).collect();
            let v = store.check(&checks, now).await.expect("check");
            assert!(v.allowed, "{algorithm}: seventeen rules");
        }
        if algorithm.is_leasable() {
            let who = base + 600;
            let px = px_of(&r, at[0], &[3, 2]);
            expected.insert(store.key(&client(who), r.name()), px);
            for (&now, take) in at.iter().zip([3, 2]) {
                let ask = LeaseRequest {
                    want: take,
                    need: take,
                    give_back: 0,
                    give_back_window: 0,
                };
                let lease = store
                    .lease(&client(who), &r, ask, now)
                    .await
                    .expect("lease");
                assert_eq!(lease.granted, take, "{algorithm}: a lease");
            }
        }
        // A charge of 5 settled at a real cost of 2 (settle.lua's write).
        let who = base + 700;
        let mut state = r.limit().fresh();
        let mut px = px_of(&r, at[0], &[5]);
        assert!(r.limit().check(&mut state, at[0], 5, true).allowed);
        let charge = Charge {
            units: 5,
            at: at[0],
        };
        let settled = r.limit().settle(&mut state, at[1], charge, 2);
        assert_eq!(settled.refunded, 3, "{algorithm}");
        px.push(px_at(&r, &state, at[1]));
        expected.insert(store.key(&client(who), r.name()), px);
        let v = store.check(&[Check::new(client(who), &r, 5)], at[0]).await;
        assert!(v.expect("check").allowed, "{algorithm}: a charge of 5");
        let item = SettleItem {
            client: client(who),
            rule: &r,
            units: 5,
            at: at[0],
            real: Some(2),
        };
        let given = store.settle(&[item], at[1]).await.expect("settle");
        assert_eq!(given, vec![3], "{algorithm}: a settle");
    }
    // The store's clock skips the windows' algorithms, not the others.
    assert!(expected.len() >= 4 * 121, "{} keys", expected.len());
    // Each script's writes, in the order the server ran them, and the clients of each call
    // (a key names its client between braces).
    let mut written: HashMap<String, Vec<u64>> = HashMap::new();
    let mut clients_of_a_call = std::collections::HashSet::new();
    let mut most_clients_in_a_call = 0;
    for seen in monitor.seen("tollgate-px-test-end") {
        if seen.client != "lua" {
            clients_of_a_call.clear();
            continue;
        }
        // A write is a SET with its PX, or (a sliding log charged in place by the generic
        // script: APPEND or SETRANGE) a PEXPIRE.
        let ms_at = if seen.args[0].eq_ignore_ascii_case(b"SET") {
            seen.args
                .iter()
                .position(|a| a.eq_ignore_ascii_case(b"PX"))
                .map(|i| i + 1)
        } else if seen.args[0].eq_ignore_ascii_case(b"PEXPIRE") {
            Some(2)
        } else {
            continue;
        };
        let key = String::from_utf8_lossy(&seen.args[1]).into_owned();
        let tag = key.split(['{', '}']).nth(1).unwrap_or_default();
        clients_of_a_call.insert(tag.to_string());
        most_clients_in_a_call = most_clients_in_a_call.max(clients_of_a_call.len());
        let px = ms_at
            .and_then(|i| seen.args.get(i))
            .and_then(|ms| std::str::from_utf8(ms).ok()?.parse::<u64>().ok());
        let Some(px) = px else {
            panic!("{key}: a write without a PX in whole milliseconds: {seen:?}");
        };
        written.entry(key).or_default().push(px);
    }
    // A plan is one client's: a call that writes the keys of several is a batch.
    assert!(
        most_clients_in_a_call > 1,
        "no batch: one client's keys at most in a call"
    );
    let mut keys: Vec<&String> = expected.keys().collect();
    keys.sort();
    for key in keys {
        assert_eq!(written.get(key), expected.get(key), "{key}");
    }
    assert_eq!(written.len(), expected.len());
}
