//! An operator's calls on one client: `Limiter::peek` reads its state without charging it,
//! `Limiter::reset` gives it a full quota again (store, deny cache, local fallback), on the
//! memory store and on a real `redis-server`.
#![cfg(feature = "redis")]

use std::sync::Arc;
use std::time::Duration;
use tollgate::clock::ManualClock;
use tollgate::policy::FailurePolicy;
use tollgate::quota::{Algorithm, Limit, Quota};
use tollgate::store::{RedisConfig, StoreClock};
use tollgate::{Action, Backend, ClientKey, Limiter, LimiterConfig, Plan, Policy, PolicySpec};
use tollgate_testkit::RedisServer;

const T0: u64 = 1_800_000_000_000_000;

fn policy(l: &Limiter, name: &str, algorithm: Algorithm, limit: u64) -> Policy {
    let quota = Quota::new(limit, Duration::from_secs(3600)).expect("quota");
    let mut spec = PolicySpec::new(name, Limit::new(algorithm, quota).expect("limit"));
    spec.on_failure = FailurePolicy::Local;
    spec.local_divisor = 1;
    l.policy(spec).expect("policy")
}

fn memory(clock: &ManualClock) -> Limiter {
    Limiter::new(LimiterConfig {
        clock: Arc::new(clock.clone()),
        ..LimiterConfig::default()
    })
}

fn redis(url: &str, clock: &ManualClock) -> Limiter {
    let redis = RedisConfig::standalone(url)
        .with_clock(StoreClock::Local)
        .with_key_prefix("op");
    let mut cfg = LimiterConfig::new(Backend::Redis(redis));
    cfg.clock = Arc::new(clock.clone());
    cfg.timeout = Duration::from_secs(1);
    Limiter::new(cfg)
}

async fn allowed(l: &Limiter, c: ClientKey, p: &Policy) -> bool {
    l.check(&Plan::for_client(c, [p])).await.action == Action::Allow
}

/// Spends `c`'s quota of 3 under `p`, then checks what peek and reset do, for `c` and a
/// bystander `d` in the same state.
async fn peek_and_reset(l: &Limiter, p: &Policy, what: &str) {
    let (c, d) = (ClientKey([1; 16]), ClientKey([2; 16]));
    let fresh = l.peek(&c, p).await.expect("peek");
    assert_eq!(
        fresh.decision.remaining, 3,
        "{what}: a client never seen is full"
    );
    assert!(
        !l.reset(&c, p).await.expect("reset"),
        "{what}: nothing to reset"
    );
    for k in [c, d] {
        for _ in 0..3 {
            assert!(allowed(l, k, p).await, "{what}");
        }
        assert!(!allowed(l, k, p).await, "{what}: limited");
    }
    // Limited twice: the second answer may come from the deny cache (Redis).
    assert!(!allowed(l, c, p).await, "{what}");
    let spent = l.peek(&c, p).await.expect("peek");
    assert_eq!(spent.decision.remaining, 0, "{what}");
    assert!(spent.decision.reset_after > Duration::ZERO, "{what}");
    // Peeking charges nothing.
    for _ in 0..5 {
        assert_eq!(l.peek(&c, p).await.expect("peek").decision.remaining, 0);
    }
    assert!(
        l.reset(&c, p).await.expect("reset"),
        "{what}: a state was there"
    );
    assert_eq!(
        l.peek(&c, p).await.expect("peek").decision.remaining,
        3,
        "{what}"
    );
    assert!(
        l.peek(&c, p).await.expect("peek").denied_here_for.is_none(),
        "{what}"
    );
    for _ in 0..3 {
        assert!(
            allowed(l, c, p).await,
            "{what}: passes again after the reset"
        );
    }
    assert!(!allowed(l, c, p).await, "{what}");
    assert!(
        !allowed(l, d, p).await,
        "{what}: the bystander stays limited"
    );
}

#[tokio::test]
async fn peek_and_reset_on_the_memory_store() {
    for algorithm in Algorithm::ALL {
        let clock = ManualClock::new(T0);
        let l = memory(&clock);
        let p = policy(&l, "api", algorithm, 3);
        peek_and_reset(&l, &p, &format!("memory {algorithm}")).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peek_and_reset_on_redis_clear_the_deny_cache_too() {
    let server = RedisServer::start();
    for algorithm in Algorithm::ALL {
        let clock = ManualClock::new(T0);
        let l = redis(&server.url(), &clock);
        let p = policy(&l, &format!("api-{algorithm}"), algorithm, 3);
        peek_and_reset(&l, &p, &format!("redis {algorithm}")).await;
        let c = ClientKey([1; 16]);
        // Limited, and remembered by the deny cache: peek says so, reset forgets it.
        assert!(!allowed(&l, c, &p).await);
        assert!(l
            .peek(&c, &p)
            .await
            .expect("peek")
            .denied_here_for
            .is_some());
        assert!(l.reset(&c, &p).await.expect("reset"));
        assert!(
            allowed(&l, c, &p).await,
            "redis {algorithm}: not denied by the cache"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_clears_the_local_fallback_while_redis_is_down() {
    let mut server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let l = redis(&server.url(), &clock);
    let p = policy(&l, "api", Algorithm::TokenBucket, 3);
    let c = ClientKey([7; 16]);
    assert!(allowed(&l, c, &p).await);
    server.kill();
    // The store is gone: the local fallback (limit 3 / divisor 1) decides.
    for _ in 0..3 {
        assert!(allowed(&l, c, &p).await);
    }
    assert!(!allowed(&l, c, &p).await, "the fallback limits");
    let err = l.reset(&c, &p).await.expect_err("the store is down");
    assert!(!err.message.is_empty());
    // The fallback's state was reset even though the store's could not be.
    assert!(allowed(&l, c, &p).await, "the fallback starts fresh");
}
