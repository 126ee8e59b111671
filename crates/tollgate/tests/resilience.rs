//! Fault tests of the limiter against real `redis-server` processes that the tests start, kill,
//! freeze and restart. Limiter time is a ManualClock (the store is told the same time), so the
//! breaker's schedule is driven, not waited for; only store timeouts use real time.
#![cfg(feature = "redis")]

use std::sync::Arc;
use std::time::{Duration, Instant};
use tollgate::clock::ManualClock;
use tollgate::policy::FailurePolicy;
use tollgate::quota::{Algorithm, Limit, Quota};
use tollgate::store::{BreakerConfig, RedisConfig, StoreClock};
use tollgate::{Action, Backend, ClientKey, Limiter, LimiterConfig, Outcome, Policy, PolicySpec};
use tollgate_testkit::RedisServer;

const T0: u64 = 1_800_000_000_000_000;
const TIMEOUT: Duration = Duration::from_millis(100);
const OPEN_FOR: Duration = Duration::from_secs(1);
/// Far above any scheduling noise: a call slower than timeout + this margin is a hang.
const MARGIN: Duration = Duration::from_secs(2);

fn limiter_with(url: &str, clock: &ManualClock, prefix: &str, deny_cache: usize) -> Limiter {
    let redis = RedisConfig::standalone(url)
        .with_clock(StoreClock::Local)
        .with_key_prefix(prefix);
    let mut cfg = LimiterConfig::new(Backend::Redis(redis));
    cfg.clock = Arc::new(clock.clone());
    cfg.timeout = TIMEOUT;
    cfg.breaker = BreakerConfig {
        failures: 3,
        open_for: OPEN_FOR,
    };
    cfg.deny_cache_capacity = deny_cache;
    Limiter::new(cfg)
}

fn limiter(url: &str, clock: &ManualClock) -> Limiter {
    limiter_with(url, clock, "t", 10_000)
}

fn policy(l: &Limiter, name: &str, limit: u64, on_failure: FailurePolicy, divisor: u64) -> Policy {
    let quota = Quota::per_hour(limit).expect("quota");
    let mut spec = PolicySpec::new(
        name,
        Limit::new(Algorithm::TokenBucket, quota).expect("limit"),
    );
    spec.on_failure = on_failure;
    spec.local_divisor = divisor;
    l.policy(spec).expect("policy")
}

/// A server, a clock at T0, a limiter on both, and one fail-open policy "api" of `limit` an
/// hour.
fn api_on_redis(limit: u64) -> (RedisServer, ManualClock, Limiter, Policy) {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let l = limiter(&server.url(), &clock);
    let p = policy(&l, "api", limit, FailurePolicy::Open, 1);
    (server, clock, l, p)
}

fn client(i: u8) -> ClientKey {
    ClientKey([i; 16])
}

/// Checks once and asserts the call did not hang.
async fn timed_check(l: &Limiter, c: &ClientKey, p: &[&Policy]) -> tollgate::LimitResult {
    let started = Instant::now();
    let r = l
        .check(&tollgate::Plan::for_client(*c, p.iter().copied()))
        .await;
    let took = started.elapsed();
    assert!(took < TIMEOUT + MARGIN, "a check took {took:?}");
    r
}

/// The outcome of one timed check of client 1 under `p`.
async fn outcome(l: &Limiter, p: &Policy) -> Outcome {
    timed_check(l, &client(1), &[p]).await.results[0].outcome
}

fn metrics(l: &Limiter) -> String {
    let mut s = String::new();
    l.render_metrics(&mut s);
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_policy_follows_its_failure_policy_while_redis_is_down() {
    let mut server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let l = limiter(&server.url(), &clock);
    let open = policy(&l, "open", 10, FailurePolicy::Open, 1);
    let closed = policy(&l, "closed", 10, FailurePolicy::Closed, 1);
    let local = policy(&l, "local", 4, FailurePolicy::Local, 2);
    let r = timed_check(&l, &client(1), &[&open]).await;
    assert_eq!(
        r.results[0].outcome,
        Outcome::Allowed,
        "store reachable first"
    );

    server.kill();
    for _ in 0..5 {
        let r = timed_check(&l, &client(1), &[&open]).await;
        assert_eq!(r.action, Action::Allow);
        assert_eq!(r.results[0].outcome, Outcome::FailedOpen);
    }
    let r = timed_check(&l, &client(1), &[&closed]).await;
    assert!(
        matches!(r.action, Action::Unavailable { retry_after } if retry_after > Duration::ZERO)
    );
    assert_eq!(r.results[0].outcome, Outcome::FailedClosed);
    // The local fallback admits limit / divisor = 2, then limits: a real rate limit, a 429.
    for _ in 0..2 {
        let r = timed_check(&l, &client(1), &[&local]).await;
        assert_eq!(r.action, Action::Allow);
        assert_eq!(r.results[0].outcome, Outcome::FallbackAllowed);
    }
    let r = timed_check(&l, &client(1), &[&local]).await;
    assert!(matches!(
        r.action,
        Action::Limit {
            retry_after: Some(_)
        }
    ));
    assert_eq!(r.results[0].outcome, Outcome::FallbackLimited);

    let m = metrics(&l);
    assert!(m.contains("tollgate_breaker_open 1\n"), "{m}");
    assert!(
        !m.contains("tollgate_store_errors_total{kind=\"breaker_open\"} 0\n"),
        "{m}"
    );
    assert!(m.contains("tollgate_decisions_total{policy=\"open\",outcome=\"failed_open\"} 5\n"));
    assert!(!l.ready().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_limiting_resumes_within_two_open_for_after_a_restart() {
    let (mut server, clock, l, p) = api_on_redis(5);
    assert_eq!(outcome(&l, &p).await, Outcome::Allowed);

    server.kill();
    for _ in 0..4 {
        assert_eq!(outcome(&l, &p).await, Outcome::FailedOpen);
    }
    server.restart();
    // Still inside open_for: the breaker skips the store, no call is made.
    let calls = l.metrics().store_calls();
    assert_eq!(outcome(&l, &p).await, Outcome::FailedOpen);
    assert_eq!(l.metrics().store_calls(), calls);

    // The first probe may meet the connection the restart broke; the second must succeed.
    let mut resumed_after = None;
    for probe in 1..=2 {
        clock.advance(OPEN_FOR);
        let r = timed_check(&l, &client(1), &[&p]).await;
        if r.results[0].outcome == Outcome::Allowed {
            resumed_after = Some(probe);
            break;
        }
    }
    assert!(resumed_after.is_some(), "not resumed within 2 x open_for");
    assert!(l.ready().await);
    // Shared limiting again: the restarted server is empty, so 5 - 1 remain, then 429.
    for _ in 0..4 {
        assert_eq!(
            timed_check(&l, &client(1), &[&p]).await.action,
            Action::Allow
        );
    }
    let r = timed_check(&l, &client(1), &[&p]).await;
    assert_eq!(r.results[0].outcome, Outcome::Limited);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_costs_at_most_the_timeout_and_counts_nothing_twice() {
    let (server, clock, l, p) = api_on_redis(100);
    assert_eq!(outcome(&l, &p).await, Outcome::Allowed);

    server.pause();
    let mut waited = Vec::new();
    for _ in 0..20 {
        let started = Instant::now();
        let r = timed_check(&l, &client(1), &[&p]).await;
        waited.push(started.elapsed());
        assert_eq!(r.results[0].outcome, Outcome::FailedOpen);
    }
    // Only the calls before the breaker opened waited (for the timeout); the rest skipped.
    let slow = waited.iter().filter(|d| **d >= TIMEOUT).count();
    assert!(slow <= 3, "{slow} calls waited for the timeout: {waited:?}");
    assert!(metrics(&l).contains("tollgate_breaker_open 1\n"));

    server.resume();
    let mut resumed = false;
    for _ in 0..2 {
        clock.advance(OPEN_FOR);
        if outcome(&l, &p).await == Outcome::Allowed {
            resumed = true;
            break;
        }
    }
    assert!(resumed, "not resumed within 2 x open_for after the thaw");
    // Charged so far: 1 before, at most the 3 calls sent into the frozen server (Redis runs
    // them after the thaw: each at most once), and 1 or 2 probes. Never a request twice.
    let r = timed_check(&l, &client(1), &[&p]).await;
    let remaining = r.results[0].decision.expect("decision").remaining;
    let charged = 100 - remaining;
    assert!((3..=7).contains(&charged), "charged {charged}");
}

/// `n` checks of clients `first..first + n` under `p`, all in flight at once: their outcomes.
async fn together(l: &Limiter, p: &Policy, first: u8, n: u8) -> Vec<Outcome> {
    let mut set = tokio::task::JoinSet::new();
    for c in first..first + n {
        let (l, p) = (l.clone(), p.clone());
        set.spawn(async move { timed_check(&l, &client(c), &[&p]).await.results[0].outcome });
    }
    let mut outcomes = Vec::with_capacity(usize::from(n));
    while let Some(o) = set.join_next().await {
        outcomes.push(o.expect("a check"));
    }
    outcomes
}

/// One stall of the store (frozen past the timeout, then thawed) fails every call in flight
/// at that moment together. Those are one failure to the breaker, not one each: the breaker
/// (3 failures) stays closed, and the next request is decided by Redis. Counted one each, as
/// before, 32 calls of one stall opened it, and every request failed open for `open_for`
/// without asking the store. A store that stays frozen still opens it: the calls begun after
/// each counted failure fail too, three rounds of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_stall_that_fails_the_calls_in_flight_together_does_not_open_the_breaker() {
    let (server, _clock, l, p) = api_on_redis(100);
    assert_eq!(outcome(&l, &p).await, Outcome::Allowed);

    server.pause();
    let stalled = together(&l, &p, 10, 32).await;
    server.resume();
    assert!(
        stalled.iter().all(|o| *o == Outcome::FailedOpen),
        "{stalled:?}"
    );
    assert!(metrics(&l).contains("tollgate_breaker_open 0\n"));
    // Decided by Redis again: no open spell to wait out (the clock has not moved). Asked up
    // to three times, should the thawed server answer the first past the timeout on a
    // loaded machine (one failure of a breaker of three).
    let calls = l.metrics().store_calls();
    let mut decided = false;
    for _ in 0..3 {
        if outcome(&l, &p).await == Outcome::Allowed {
            decided = true;
            break;
        }
    }
    assert!(
        decided,
        "not decided by Redis after the stall: {}",
        metrics(&l)
    );
    assert!(l.metrics().store_calls() > calls);

    // Frozen for good: each round of calls in flight together is one more failure.
    server.pause();
    for round in 0..3u8 {
        let failed = together(&l, &p, 50 + round * 8, 8).await;
        assert!(
            failed.iter().all(|o| *o == Outcome::FailedOpen),
            "{failed:?}"
        );
    }
    let m = metrics(&l);
    server.resume();
    assert!(m.contains("tollgate_breaker_open 1\n"), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_fallback_over_four_gateways_admits_about_the_shared_limit() {
    let mut server = RedisServer::start();
    let url = server.url();
    server.kill();
    let clock = ManualClock::new(T0);
    let gateways: Vec<Limiter> = (0..4).map(|_| limiter(&url, &clock)).collect();
    let policies: Vec<Policy> = gateways
        .iter()
        .map(|g| policy(g, "api", 100, FailurePolicy::Local, 4))
        .collect();
    let mut admitted = 0;
    for i in 0..400 {
        let g = i % 4;
        let r = timed_check(&gateways[g], &client(9), &[&policies[g]]).await;
        if r.action == Action::Allow {
            admitted += 1;
            assert_eq!(r.results[0].outcome, Outcome::FallbackAllowed);
        } else {
            assert_eq!(r.results[0].outcome, Outcome::FallbackLimited);
        }
    }
    assert!(admitted <= 100 + 4, "admitted {admitted}");
    assert!(admitted >= 100, "admitted {admitted}");
    let counted: u64 = gateways
        .iter()
        .map(|g| g.metrics().policies()[0].decisions(Outcome::FallbackAllowed))
        .sum();
    assert_eq!(counted, admitted);
}

fn evalsha_calls(server: &RedisServer) -> u64 {
    let stats = server.cli(&["info", "commandstats"]);
    stats
        .lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .and_then(|l| l.split("calls=").nth(1))
        .and_then(|s| s.split(',').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

async fn abuse(l: &Limiter, p: &Policy, clock: &ManualClock, n: usize) -> Vec<Action> {
    let mut actions = Vec::with_capacity(n + 2);
    for _ in 0..n {
        actions.push(
            l.check(&tollgate::Plan::for_client(client(7), [p]))
                .await
                .action,
        );
    }
    // At the retry time the client passes again, with or without the cache.
    if let Some(Action::Limit {
        retry_after: Some(r),
    }) = actions.last().copied()
    {
        clock.advance(r);
    }
    actions.push(
        l.check(&tollgate::Plan::for_client(client(7), [p]))
            .await
            .action,
    );
    actions
}

/// `n` requests of the abusive client through a new limiter (keys under `prefix`, a deny
/// cache of `deny_cache` entries) on a clock at T0: the limiter, its decisions and the
/// EVALSHA calls they cost, and the policy (whose metrics last as long as it is held).
async fn abuse_with(
    server: &RedisServer,
    prefix: &str,
    deny_cache: usize,
    n: usize,
) -> (Limiter, Vec<Action>, u64, Policy) {
    let clock = ManualClock::new(T0);
    let l = limiter_with(&server.url(), &clock, prefix, deny_cache);
    let p = policy(&l, "api", 10, FailurePolicy::Open, 1);
    let before = evalsha_calls(server);
    let actions = abuse(&l, &p, &clock, n).await;
    let calls = evalsha_calls(server) - before;
    (l, actions, calls, p)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deny_cache_keeps_an_abusive_client_off_redis_with_the_same_decisions() {
    let server = RedisServer::start();
    let n = 10_010;

    let (cached, with_cache, calls_with_cache, _p) = abuse_with(&server, "cached", 10_000, n).await;
    let (_, without_cache, calls_without_cache, _) = abuse_with(&server, "uncached", 0, n).await;

    assert_eq!(with_cache, without_cache, "the cache changed a decision");
    assert_eq!(
        with_cache.iter().filter(|a| **a == Action::Allow).count(),
        11
    );
    // 10 admitted, 1 denial that fills the cache, 1 after the retry time (+ a reload or two).
    assert!(
        calls_with_cache <= 15,
        "{calls_with_cache} store calls with the cache"
    );
    assert!(
        calls_without_cache >= n as u64,
        "{calls_without_cache} without"
    );
    let hits = cached.metrics().policies()[0].deny_cache_hits();
    assert_eq!(hits, n as u64 - 11);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_at_startup_keeps_the_first_requests_off_the_breaker() {
    let (server, clock, l, p) = api_on_redis(10);
    let limit = Limit::new(Algorithm::TokenBucket, Quota::per_hour(10).expect("quota"));
    let sha = tollgate_redis::plan_script_sha(&[tollgate_redis::RuleShape {
        limit: limit.expect("limit"),
        mode: tollgate_core::Mode::Enforce,
    }])
    .expect("script");
    assert_eq!(server.cli(&["script", "exists", &sha]).trim(), "0");
    assert!(l.connect(Duration::from_secs(5)).await);
    // The policy's own script is loaded too: its first request is one EVALSHA.
    assert_eq!(server.cli(&["script", "exists", &sha]).trim(), "1");
    let calls_before = l.metrics().store_calls();
    assert_eq!(outcome(&l, &p).await, Outcome::Allowed);
    assert_eq!(l.metrics().store_calls(), calls_before + 1);
    assert_eq!(
        l.metrics()
            .store_errors(tollgate::metrics::StoreErrorKind::Timeout),
        0
    );

    let mut dead = RedisServer::start();
    let url = dead.url();
    dead.kill();
    let l = limiter(&url, &clock);
    let started = Instant::now();
    assert!(!l.connect(Duration::from_secs(1)).await);
    assert!(started.elapsed() < Duration::from_secs(1) + MARGIN);
    // Not connected: requests follow their policy, and a failed startup connect did not
    // count against the breaker.
    assert!(metrics(&l).contains("tollgate_breaker_open 0\n"));
}

/// A request matched by an enforced policy per API key, an enforced policy per IP and a
/// shadow policy is ONE script call (Redis INFO commandstats), whatever the decision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_with_two_identities_and_a_shadow_policy_is_one_script_call() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    // No deny cache: every request reaches the store.
    let l = limiter_with(&server.url(), &clock, "plan", 0);
    let per_key = policy(&l, "per-key", 10, FailurePolicy::Open, 1);
    let per_ip = policy(&l, "per-ip", 3, FailurePolicy::Open, 1);
    let mut spec = PolicySpec::new(
        "dry",
        Limit::new(Algorithm::Gcra, Quota::per_hour(2).expect("quota")).expect("limit"),
    );
    spec.shadow = true;
    let dry = l.policy(spec).expect("policy");
    let mut plan = tollgate::Plan::new();
    plan.push(client(1), per_key.clone());
    plan.push(client(2), per_ip.clone());
    plan.push(client(1), dry.clone());
    // Warm the script cache so that SCRIPT LOAD is not counted.
    assert!(l.connect(Duration::from_secs(5)).await);
    let _ = l.check(&plan).await;
    let before = evalsha_calls(&server);
    let mut actions = Vec::new();
    for _ in 0..5 {
        actions.push(l.check(&plan).await.action);
    }
    assert_eq!(
        evalsha_calls(&server) - before,
        5,
        "one script call per request"
    );
    // Allowed twice more (3 per IP), then denied; the shadow policy never denies.
    assert_eq!(
        actions.iter().filter(|a| **a == Action::Allow).count(),
        2,
        "{actions:?}"
    );
    let shadow: u64 = l
        .metrics()
        .policies()
        .iter()
        .filter(|p| p.name() == dry.name())
        .map(|p| p.decisions(Outcome::ShadowLimited))
        .sum();
    assert!(
        shadow >= 1,
        "the shadow policy counted its would-be denials"
    );
    // The per-key policy was charged for the 3 allowed requests only.
    let r = l
        .check(&tollgate::Plan::for_client(client(1), [&per_key]))
        .await;
    assert_eq!(r.results[0].decision.map(|d| d.remaining), Some(6));
}
