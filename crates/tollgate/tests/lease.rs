//! `sync = "lease"` against a real redis-server: the shared count never exceeds the limit,
//! unused units go back, a killed limiter loses at most its lease, and a hot key costs few
//! store calls. Limiter time is a ManualClock shared with the store (clock = local).
#![cfg(feature = "redis")]

use std::sync::Arc;
use std::time::Duration;
use tollgate::clock::ManualClock;
use tollgate::metrics::LeaseKind;
use tollgate::policy::SyncMode;
use tollgate::quota::{Algorithm, Limit, Quota};
use tollgate::store::{RedisConfig, StoreClock};
use tollgate::{Action, Backend, ClientKey, Limiter, LimiterConfig, Policy, PolicySpec};
use tollgate_core::{Check, Rule};
use tollgate_redis::RedisStore;
use tollgate_testkit::RedisServer;

const T0: u64 = 1_800_000_000_000_000;
const TTL: Duration = Duration::from_millis(200);
const HOUR: Duration = Duration::from_secs(3600);

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

/// Whether the hot client's request is allowed under `p`.
async fn allowed(l: &Limiter, p: &Policy) -> bool {
    l.check(&tollgate::Plan::for_client(hot(), [p]))
        .await
        .action
        == Action::Allow
}

/// One limiter leasing from its own redis-server, on a clock the test moves.
struct Leasing {
    limiter: Limiter,
    policy: Policy,
    lim: Limit,
    clock: ManualClock,
    server: RedisServer,
}

impl Leasing {
    /// A server, a clock at `start` and a limiter with one lease policy on `lim` (leases of
    /// at most `max` units).
    fn start(start: u64, lim: Limit, max: u64) -> Self {
        let server = RedisServer::start();
        let clock = ManualClock::new(start);
        let limiter = limiter(&server.url(), &clock);
        let policy = lease_policy(&limiter, lim, max);
        Self {
            limiter,
            policy,
            lim,
            clock,
            server,
        }
    }

    /// How many of `n` requests of the hot client are allowed.
    async fn admitted(&self, n: u64) -> u64 {
        let mut admitted = 0;
        for _ in 0..n {
            admitted += u64::from(allowed(&self.limiter, &self.policy).await);
        }
        admitted
    }
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
        let lim = limit(alg, 500, HOUR);
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
                    if allowed(l, p).await {
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
    let t = Leasing::start(T0, limit(Algorithm::Gcra, 1000, HOUR), 50);
    assert_eq!(t.admitted(30).await, 30);
    let stats = t.limiter.metrics().policies()[0].clone();
    let granted = stats.lease_units(LeaseKind::Granted);
    let used = stats.lease_units(LeaseKind::Used);
    assert_eq!(used, 30);
    let held = granted - used - stats.lease_units(LeaseKind::Returned);
    assert!(held <= 50, "held {held}");
    drop(t.limiter); // killed: no shutdown, nothing given back
    let remaining = shared_remaining(&t.server.url(), t.lim, T0).await;
    assert_eq!(remaining, 1000 - used - held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_leases_go_back_without_further_requests() {
    let t = Leasing::start(T0, limit(Algorithm::TokenBucket, 1000, HOUR), 50);
    t.admitted(10).await;
    let lease_units = |kind| t.limiter.metrics().policies()[0].lease_units(kind);
    assert!(lease_units(LeaseKind::Granted) > 10, "no lease was taken");
    t.clock.advance(TTL + Duration::from_millis(1));
    // The sweeper runs every 50 ms of real time; wait for it, bounded.
    for _ in 0..100 {
        if lease_units(LeaseKind::Returned) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stats = t.limiter.metrics().policies()[0].clone();
    let returned = stats.lease_units(LeaseKind::Returned);
    assert_eq!(returned, stats.lease_units(LeaseKind::Granted) - 10);
    // The clock moved 201 ms: 0.2 units of refill at 1000/hour, none whole.
    let now = T0 + 201_000;
    assert_eq!(shared_remaining(&t.server.url(), t.lim, now).await, 990);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_key_costs_few_store_calls() {
    let t = Leasing::start(
        T0,
        limit(Algorithm::Gcra, 100_000, Duration::from_secs(1)),
        100,
    );
    let mut admitted = 0;
    for _ in 0..200 {
        admitted += t.admitted(10).await;
        t.clock.advance(Duration::from_micros(100));
    }
    assert_eq!(admitted, 2_000);
    let calls = t.limiter.metrics().store_calls();
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
        let tollgate::Error::InvalidPolicy { field, reason, .. } = &err;
        assert_eq!(*field, tollgate::PolicyField::Sync, "{err}");
        assert!(reason.contains("use token_bucket"), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_window_lease_never_outlives_its_window() {
    // Start 1 s before a window boundary. (Redis expires the key in real time at the end of
    // the window: a window long in real time keeps it while the test runs.)
    let period = 10_000_000;
    let start = T0 - T0 % period + period - 1_000_000;
    let t = Leasing::start(
        start,
        limit(Algorithm::FixedWindow, 10, Duration::from_secs(10)),
        10,
    );
    let first = t.admitted(20).await;
    // Into the next window, past the cooldown the exhausted lease started.
    t.clock.advance(Duration::from_millis(1_030));
    let second = t.admitted(20).await;
    assert_eq!(first, 10, "{first} then {second}");
    assert_eq!(second, 10, "units of the old window blocked the new one");
}

/// Leased policies a reload drops (overrides, say) take their metric series with them: the
/// limiter's lease bookkeeping holds no policy alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_leased_policies_leave_no_metric_series() {
    let redis = RedisServer::start();
    let clock = ManualClock::new(1_800_000_000_000_000);
    let l = limiter(&redis.url(), &clock);
    let kept = lease_policy(&l, limit(Algorithm::TokenBucket, 100, HOUR), 10);
    let mut dropped = Vec::new();
    for i in 0..3000 {
        let mut spec = PolicySpec::new(
            format!("hot.override-{i}"),
            limit(Algorithm::TokenBucket, 50, HOUR),
        );
        spec.sync = SyncMode::Lease { ttl: TTL, max: 10 };
        dropped.push(l.policy(spec).expect("policy"));
    }
    assert!(allowed(&l, &dropped[0]).await, "a leased override serves");
    assert!(allowed(&l, &kept).await);
    drop(dropped);
    let mut text = String::new();
    l.render_metrics(&mut text);
    assert!(
        !text.contains("override-"),
        "series of dropped policies remain"
    );
    assert!(
        text.contains("policy=\"hot\""),
        "the kept policy's series stays"
    );
    assert!(allowed(&l, &kept).await, "the kept policy still leases");
}
