//! `sync = "lease"` against a real redis-server: the shared count never exceeds the limit,
//! unused units go back, a killed limiter loses at most its lease, and a hot key costs few
//! store calls. Limiter time is a ManualClock shared with the store (clock = local).
#![cfg(feature = "redis")]

use std::sync::Arc;
use std::time::Duration;
use tollgate::metrics::LeaseKind;
use tollgate::tollgate_core::{Check, Rule};
use tollgate::{
    Action, Algorithm, Backend, ClientKey, Limit, Limiter, LimiterConfig, ManualClock, Policy,
    PolicySpec, Quota, RedisConfig, StoreClock, SyncMode,
};
use tollgate_redis::RedisStore;
use tollgate_testkit::RedisServer;

const T0: u64 = 1_800_000_000_000_000;
const TTL: Duration = Duration::from_millis(200);

fn redis(url: &str) -> RedisConfig {
    RedisConfig::standalone(url)
        .with_clock(StoreClock::Local)
        .with_key_prefix("lease")
}

fn limiter(url: &str, clock: &ManualClock) -> Limiter {
    let mut cfg = LimiterConfig::new(Backend::Redis(redis(url)));
    cfg.clock = Arc::new(clock.clone());
    cfg.timeout = Duration::from_secs(2);
    Limiter::new(cfg)
}

fn limit(alg: Algorithm, n: u64, period: Duration) -> Limit {
    Limit::new(alg, Quota::new(n, period).expect("quota")).expect("limit")
}

fn lease_policy(l: &Limiter, lim: Limit, max: u64) -> Policy {
    let mut spec = PolicySpec::new("hot", lim);
    spec.sync = SyncMode::Lease { ttl: TTL, max };
    l.policy(spec).expect("policy")
}

fn hot() -> ClientKey {
    ClientKey([0xaa; 16])
}

/// What the shared state has left for the hot client (a zero-cost query).
async fn shared_remaining(url: &str, lim: Limit, now: u64) -> u64 {
    let store = RedisStore::connect(redis(url)).await.expect("connect");
    let rule = Rule::new("hot", lim);
    let v = store
        .check(&[Check::new(hot(), &rule, 0)], now)
        .await
        .expect("query");
    v.decisions[0].remaining
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_limiters_never_exceed_the_shared_limit_and_return_what_they_did_not_use() {
    let server = RedisServer::start();
    let url = server.url();
    let clock = ManualClock::new(T0);
    for alg in [
        Algorithm::Gcra,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::FixedWindow,
    ] {
        server.cli(&["flushall"]);
        let lim = limit(alg, 500, Duration::from_secs(3600));
        let gateways: Vec<(Limiter, Policy)> = (0..20)
            .map(|_| {
                let l = limiter(&url, &clock);
                let p = lease_policy(&l, lim, 20);
                (l, p)
            })
            .collect();
        let gateways = Arc::new(gateways);
        let mut tasks = Vec::new();
        for t in 0..8u64 {
            let gateways = gateways.clone();
            tasks.push(tokio::spawn(async move {
                let mut admitted = 0u64;
                let mut x = t.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                for _ in 0..150 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let (l, p) = &gateways[(x % 20) as usize];
                    if l.check(&tollgate::Plan::for_client(hot(), [p]))
                        .await
                        .action
                        == Action::Allow
                    {
                        admitted += 1;
                    }
                    if x % 7 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
                admitted
            }));
        }
        let mut admitted = 0;
        for t in tasks {
            admitted += t.await.expect("task");
        }
        assert!(
            admitted <= 500,
            "{alg}: admitted {admitted} of 1200 with a limit of 500"
        );
        for (l, _) in gateways.iter() {
            l.shutdown().await;
        }
        let granted: u64 = gateways
            .iter()
            .map(|(l, _)| l.metrics().policies()[0].lease_units(LeaseKind::Granted))
            .sum();
        let used: u64 = gateways
            .iter()
            .map(|(l, _)| l.metrics().policies()[0].lease_units(LeaseKind::Used))
            .sum();
        let returned: u64 = gateways
            .iter()
            .map(|(l, _)| l.metrics().policies()[0].lease_units(LeaseKind::Returned))
            .sum();
        assert_eq!(used, admitted, "{alg}");
        assert_eq!(
            granted,
            used + returned,
            "{alg}: every unit used or returned"
        );
        // Time stood still: the shared state shows exactly the units that were used.
        assert_eq!(
            shared_remaining(&url, lim, T0).await,
            500 - admitted,
            "{alg}"
        );
        // Far more was offered than the limit: leasing must not strand much of it.
        assert!(admitted >= 450, "{alg}: admitted only {admitted}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_limiter_loses_at_most_its_lease() {
    let server = RedisServer::start();
    let url = server.url();
    let clock = ManualClock::new(T0);
    let lim = limit(Algorithm::Gcra, 1000, Duration::from_secs(3600));
    let l = limiter(&url, &clock);
    let p = lease_policy(&l, lim, 50);
    for _ in 0..30 {
        assert_eq!(
            l.check(&tollgate::Plan::for_client(hot(), [&p]))
                .await
                .action,
            Action::Allow
        );
    }
    let stats = l.metrics().policies()[0].clone();
    let granted = stats.lease_units(LeaseKind::Granted);
    let used = stats.lease_units(LeaseKind::Used);
    assert_eq!(used, 30);
    let held = granted - used - stats.lease_units(LeaseKind::Returned);
    assert!(held <= 50, "held {held}");
    drop(l); // killed: no shutdown, nothing given back
    let remaining = shared_remaining(&url, lim, T0).await;
    assert_eq!(remaining, 1000 - used - held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_leases_go_back_without_further_requests() {
    let server = RedisServer::start();
    let url = server.url();
    let clock = ManualClock::new(T0);
    let lim = limit(Algorithm::TokenBucket, 1000, Duration::from_secs(3600));
    let l = limiter(&url, &clock);
    let p = lease_policy(&l, lim, 50);
    for _ in 0..10 {
        l.check(&tollgate::Plan::for_client(hot(), [&p])).await;
    }
    let stats = l.metrics().policies()[0].clone();
    assert!(
        stats.lease_units(LeaseKind::Granted) > 10,
        "no lease was taken"
    );
    clock.advance(TTL + Duration::from_millis(1));
    // The sweeper runs every 50 ms of real time; wait for it, bounded.
    for _ in 0..100 {
        if stats.lease_units(LeaseKind::Returned) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let returned = stats.lease_units(LeaseKind::Returned);
    assert_eq!(returned, stats.lease_units(LeaseKind::Granted) - 10);
    // The clock moved 201 ms: 0.2 units of refill at 1000/hour, none whole.
    let now = T0 + 201_000;
    assert_eq!(shared_remaining(&url, lim, now).await, 990);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_key_costs_few_store_calls() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let lim = limit(Algorithm::Gcra, 100_000, Duration::from_secs(1));
    let l = limiter(&server.url(), &clock);
    let p = lease_policy(&l, lim, 100);
    let mut admitted = 0;
    for i in 0..2_000u64 {
        if l.check(&tollgate::Plan::for_client(hot(), [&p]))
            .await
            .action
            == Action::Allow
        {
            admitted += 1;
        }
        if i % 10 == 9 {
            clock.advance(Duration::from_micros(100));
        }
    }
    assert_eq!(admitted, 2_000);
    let calls = l.metrics().store_calls();
    assert!(calls <= 40, "{calls} store calls for 2000 requests");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_mode_rejects_algorithms_it_cannot_give_back_to() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let l = limiter(&server.url(), &clock);
    for alg in [Algorithm::SlidingWindowLog, Algorithm::SlidingWindowCounter] {
        let mut spec = PolicySpec::new("s", limit(alg, 10, Duration::from_secs(1)));
        spec.sync = SyncMode::Lease { ttl: TTL, max: 10 };
        let err = l.policy(spec).expect_err("not leasable");
        assert!(err.to_string().contains("supports token_bucket"), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_window_lease_never_outlives_its_window() {
    let server = RedisServer::start();
    let url = server.url();
    // Start 1 s before a window boundary. (Redis expires the key in real time at the end of
    // the window: a window long in real time keeps it while the test runs.)
    let period = 10_000_000;
    let start = T0 - T0 % period + period - 1_000_000;
    let clock = ManualClock::new(start);
    let lim = limit(Algorithm::FixedWindow, 10, Duration::from_secs(10));
    let l = limiter(&url, &clock);
    let p = lease_policy(&l, lim, 10);
    let mut first = 0;
    for _ in 0..20 {
        if l.check(&tollgate::Plan::for_client(hot(), [&p]))
            .await
            .action
            == Action::Allow
        {
            first += 1;
        }
    }
    // Into the next window, past the cooldown the exhausted lease started.
    clock.advance(Duration::from_millis(1_030));
    let mut second = 0;
    for _ in 0..20 {
        if l.check(&tollgate::Plan::for_client(hot(), [&p]))
            .await
            .action
            == Action::Allow
        {
            second += 1;
        }
    }
    assert_eq!(first, 10, "{first} then {second}");
    assert_eq!(second, 10, "units of the old window blocked the new one");
}
