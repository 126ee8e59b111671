//! Costs known later through the limiter: reservations settled at the real cost (refunds,
//! debts, the estimate standing when the cost is not trusted or the reservation is dropped),
//! concurrency holds (held, released, renewed past hold_ttl, dropped by the store when their
//! process died), on the memory store and on a real redis-server shared by several limiters.

use std::sync::Arc;
use std::time::Duration;
#[cfg(feature = "redis")]
use std::time::Instant;
use tollgate::clock::ManualClock;
use tollgate::metrics::SettleError;
use tollgate::quota::{Algorithm, Limit, Quota};
#[cfg(feature = "redis")]
use tollgate::store::RedisConfig;
#[cfg(feature = "redis")]
use tollgate::Backend;
use tollgate::{Action, ClientKey, Limiter, LimiterConfig, Plan, Policy, PolicySpec};
#[cfg(feature = "redis")]
use tollgate_testkit::RedisServer;

const MINUTE: Duration = Duration::from_secs(60);

const T0: u64 = 1_800_000_000_000_000;

fn memory(clock: &ManualClock) -> Limiter {
    Limiter::new(LimiterConfig {
        clock: Arc::new(clock.clone()),
        ..LimiterConfig::default()
    })
}

#[cfg(feature = "redis")]
fn redis(url: &str) -> Limiter {
    redis_with_timeout(url, Duration::from_secs(2))
}

/// A limiter on the Redis at `url` whose store calls time out after `timeout`.
#[cfg(feature = "redis")]
fn redis_with_timeout(url: &str, timeout: Duration) -> Limiter {
    let mut config = LimiterConfig::new(Backend::Redis(RedisConfig::standalone(url)));
    config.timeout = timeout;
    Limiter::new(config)
}

/// A policy of `limit` a `period` whose requests are charged `estimate` and settled later.
fn settling(
    l: &Limiter,
    name: &str,
    alg: Algorithm,
    limit: u64,
    burst: u64,
    estimate: u64,
    period: Duration,
) -> Policy {
    let q = Quota::new(limit, period)
        .and_then(|q| q.with_burst(burst))
        .expect("quota");
    let mut spec = PolicySpec::new(name, Limit::new(alg, q).expect("limit"));
    spec.cost = estimate;
    spec.settle = true;
    l.policy(spec).expect("policy")
}

fn in_flight(l: &Limiter, name: &str, limit: u64, hold_ttl: Duration) -> Policy {
    let q = Quota::new(limit, hold_ttl).expect("quota");
    l.policy(PolicySpec::new(
        name,
        Limit::new(Algorithm::Concurrency, q).expect("limit"),
    ))
    .expect("policy")
}

fn remaining(r: &tollgate::LimitResult) -> u64 {
    r.results[0].decision.expect("decided").remaining
}

#[tokio::test]
async fn a_real_cost_below_the_estimate_gives_the_difference_back_for_every_rate_algorithm() {
    for alg in Algorithm::ALL {
        let clock = ManualClock::new(T0);
        let l = memory(&clock);
        let p = settling(&l, "tokens", alg, 100, 100, 50, MINUTE);
        let plan = Plan::for_client(ClientKey([1; 16]), [&p]);
        let (r, res) = l.reserve(&plan).await;
        assert_eq!(remaining(&r), 50, "{alg}");
        res.expect("allowed").settle(12);
        let (r, res) = l.reserve(&plan).await;
        assert_eq!(
            remaining(&r),
            100 - 12 - 50,
            "{alg}: the 38 unused came back"
        );
        drop(res); // settles at the estimate: charged 50
        let q = l
            .check(&Plan::for_client(ClientKey([1; 16]), [&p.with_cost(0)]))
            .await;
        assert_eq!(
            remaining(&q),
            100 - 12 - 50,
            "{alg}: dropped = the estimate stands"
        );
        let counts = l.metrics();
        assert_eq!(
            counts.policy("tokens").map(|c| c.settled_units()),
            Some((38, 0)),
            "{alg}"
        );
    }
}

#[tokio::test]
async fn a_real_cost_above_the_estimate_is_a_debt_the_client_waits_out() {
    let clock = ManualClock::new(T0);
    let l = memory(&clock);
    // 60 per minute: one token a second.
    let p = settling(&l, "tokens", Algorithm::TokenBucket, 60, 60, 10, MINUTE);
    let plan = Plan::for_client(ClientKey([2; 16]), [&p]);
    // Five requests in flight at once (50 of 60 charged), each turning out to cost 20: 100 in
    // all, 40 past the bucket.
    let mut flying = Vec::new();
    for _ in 0..5 {
        let (r, res) = l.reserve(&plan).await;
        assert!(r.is_allowed());
        flying.push(res.expect("allowed"));
    }
    for r in flying {
        r.settle(20);
    }
    let (r, _) = l.reserve(&plan).await;
    // 40 owed plus the 10 of this request: 50 seconds.
    assert_eq!(
        r.action,
        Action::Limit {
            retry_after: Some(Duration::from_secs(50))
        }
    );
    clock.advance(Duration::from_secs(49));
    assert!(!l.check(&plan).await.is_allowed());
    clock.advance(Duration::from_secs(1));
    assert!(l.check(&plan).await.is_allowed());
    let c = l.metrics();
    assert_eq!(c.policy("tokens").map(|c| c.settled_units()), Some((0, 50)));
}

#[tokio::test]
async fn a_real_cost_the_policy_could_never_admit_is_not_trusted() {
    let clock = ManualClock::new(T0);
    let l = memory(&clock);
    let p = settling(&l, "tokens", Algorithm::Gcra, 100, 100, 10, MINUTE);
    let plan = Plan::for_client(ClientKey([3; 16]), [&p]);
    let (_, res) = l.reserve(&plan).await;
    res.expect("allowed").settle(u64::MAX);
    let (r, _) = l.reserve(&plan).await;
    assert_eq!(remaining(&r), 80, "the estimate stood: 10 + 10");
    let c = l.metrics();
    let errors = c
        .policy("tokens")
        .map(|c| c.settle_errors(SettleError::TooLarge));
    assert_eq!(errors, Some(1));
}

#[tokio::test]
async fn holds_are_released_when_the_reservation_ends_and_denied_at_the_limit() {
    let clock = ManualClock::new(T0);
    let l = memory(&clock);
    let p = in_flight(&l, "inflight", 2, Duration::from_secs(300));
    let plan = Plan::for_client(ClientKey([4; 16]), [&p]);
    let (_, a) = l.reserve(&plan).await;
    let (_, b) = l.reserve(&plan).await;
    let (r, c) = l.reserve(&plan).await;
    assert!(c.is_none());
    assert_eq!(
        r.action,
        Action::Limit {
            retry_after: Some(Duration::from_secs(1))
        }
    );
    assert_eq!(
        l.metrics().policy("inflight").map(|c| c.in_flight()),
        Some(2)
    );
    drop(a);
    assert_eq!(
        l.metrics().policy("inflight").map(|c| c.in_flight()),
        Some(1)
    );
    let (r, d) = l.reserve(&plan).await;
    assert!(
        r.is_allowed(),
        "a released hold makes room at once (no deny cache for holds)"
    );
    drop((b, d));
    assert_eq!(
        l.metrics().policy("inflight").map(|c| c.in_flight()),
        Some(0)
    );
    // Another client has its own holds.
    let other = Plan::for_client(ClientKey([5; 16]), [&p]);
    assert!(l.reserve(&other).await.0.is_allowed());
}

#[tokio::test]
async fn a_concurrency_hold_and_a_rate_limit_are_all_or_nothing() {
    let clock = ManualClock::new(T0);
    let l = memory(&clock);
    let hold = in_flight(&l, "inflight", 5, Duration::from_secs(300));
    let rate = settling(&l, "rate", Algorithm::FixedWindow, 2, 2, 1, MINUTE);
    let plan = Plan::for_client(ClientKey([6; 16]), [&hold, &rate]);
    let (_, a) = l.reserve(&plan).await;
    let (_, b) = l.reserve(&plan).await;
    let (r, c) = l.reserve(&plan).await;
    assert!(!r.is_allowed() && c.is_none(), "the rate denies");
    assert_eq!(
        l.metrics().policy("inflight").map(|c| c.in_flight()),
        Some(2),
        "the denied request holds nothing"
    );
    drop((a, b));
}

#[tokio::test]
async fn a_live_hold_outlives_hold_ttl_because_it_is_renewed() {
    // Real time: the renewer runs every 100 ms; hold_ttl 800 ms (a bucket is 100 ms).
    let l = Limiter::new(LimiterConfig::default());
    let p = in_flight(&l, "inflight", 1, Duration::from_millis(800));
    let plan = Plan::for_client(ClientKey([7; 16]), [&p]);
    let (_, held) = l.reserve(&plan).await;
    assert!(held.is_some());
    for _ in 0..12 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert!(
            !l.reserve(&plan).await.0.is_allowed(),
            "the hold is still held"
        );
    }
    drop(held);
    assert!(l.reserve(&plan).await.0.is_allowed());
    assert_eq!(
        l.metrics().policy("inflight").map(|c| c.holds_expired()),
        Some(0)
    );
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_sharing_redis_never_hold_more_than_the_limit_and_a_dead_ones_holds_expire() {
    let server = RedisServer::start();
    let ttl = Duration::from_secs(2);
    let gateways: Vec<Limiter> = (0..3).map(|_| redis(&server.url())).collect();
    for g in &gateways {
        assert!(g.connect(Duration::from_secs(5)).await);
    }
    let policies: Vec<Policy> = gateways
        .iter()
        .map(|g| in_flight(g, "inflight", 4, ttl))
        .collect();
    let client = ClientKey([8; 16]);
    // 12 requests at once across three gateways: exactly 4 hold.
    let mut tasks = Vec::new();
    for i in 0..12 {
        let g = gateways[i % 3].clone();
        let p = policies[i % 3].clone();
        tasks.push(tokio::spawn(async move {
            let plan = Plan::for_client(client, [&p]);
            g.reserve(&plan).await.1
        }));
    }
    let mut held = Vec::new();
    for t in tasks {
        if let Some(r) = t.await.expect("task") {
            held.push(r);
        }
    }
    assert_eq!(held.len(), 4, "exactly the limit holds across gateways");
    // Release two: two more fit, from any gateway.
    held.truncate(2);
    for g in &gateways {
        g.flush_settles().await;
    }
    let plan = |i: usize| Plan::for_client(client, [&policies[i]]);
    for (i, g) in gateways.iter().enumerate().take(2) {
        let (r, res) = g.reserve(&plan(i)).await;
        assert!(r.is_allowed(), "room after the releases");
        held.push(res.expect("allowed"));
    }
    assert!(!gateways[2].reserve(&plan(2)).await.0.is_allowed());
    drop(held);
    for g in &gateways {
        g.flush_settles().await;
    }
    // A gateway that dies with holds: its own runtime stops (no renewal, no release).
    let url = server.url();
    let dead = std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        rt.block_on(async {
            let g = redis(&url);
            let p = in_flight(&g, "inflight", 4, ttl);
            let plan = Plan::for_client(client, [&p]);
            for _ in 0..4 {
                let (r, res) = g.reserve(&plan).await;
                assert!(r.is_allowed());
                std::mem::forget(res); // the process dies: nothing is released
            }
        });
        drop(rt);
        std::time::Instant::now()
    })
    .join()
    .expect("dead gateway");
    // Not freed before hold_ttl...
    let live = &gateways[0];
    while dead.elapsed() < ttl - Duration::from_millis(300) {
        assert!(
            !live.reserve(&plan(0)).await.0.is_allowed(),
            "freed before hold_ttl"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // ...and freed within hold_ttl + 2 buckets (plus the test's own slack).
    let deadline = dead + ttl + ttl / 4 + Duration::from_secs(1);
    let freed = loop {
        let (r, res) = live.reserve(&plan(0)).await;
        if r.is_allowed() {
            break res;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the dead gateway's holds never expired"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        dead.elapsed() >= ttl,
        "freed {:?} after the death",
        dead.elapsed()
    );
    drop(freed);
}

/// The system clock moved by an offset that the test may change: a gateway whose clock is
/// wrong, or is stepped.
#[cfg(feature = "redis")]
#[derive(Clone)]
struct Skewed(Arc<std::sync::atomic::AtomicI64>);

#[cfg(feature = "redis")]
impl tollgate::clock::Clock for Skewed {
    fn now(&self) -> u64 {
        tollgate::clock::SystemClock
            .now()
            .saturating_add_signed(self.0.load(std::sync::atomic::Ordering::SeqCst))
    }
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_hold_on_redis_is_renewed_whatever_the_gateways_clock_says() {
    // clock = store: Redis counts holds in buckets of its own TIME. A gateway clock an hour
    // behind or ahead of it, or merely a bucket boundary between the gateway's reading and
    // Redis's, must neither stop the renewals nor make one name a bucket the hold is not in
    // (either loses the hold while its request is live: one more request would be let in).
    // Nor may the gateway's clock stepped back an hour while the hold is live (an operator,
    // or NTP) stall the renewals until it has caught up.
    let server = RedisServer::start();
    let hour: i64 = 3_600_000_000;
    for (skew, stepped) in [(-hour, -hour), (hour, hour), (0, 0), (0, -hour)] {
        let mut config = LimiterConfig::new(Backend::Redis(RedisConfig::standalone(server.url())));
        config.timeout = Duration::from_secs(2);
        let clock = Skewed(Arc::new(std::sync::atomic::AtomicI64::new(skew)));
        config.clock = Arc::new(clock.clone());
        let l = Limiter::new(config);
        assert!(l.connect(Duration::from_secs(5)).await);
        // hold_ttl 400 ms: a bucket is 50 ms, so the 100 ms renewer crosses bucket
        // boundaries on nearly every renewal.
        let name = format!("inflight{skew}{stepped}");
        let p = in_flight(&l, &name, 1, Duration::from_millis(400));
        let client = ClientKey([11; 16]);
        let plan = Plan::for_client(client, [&p]);
        let (r, held) = l.reserve(&plan).await;
        assert!(r.is_allowed(), "skew {skew}");
        clock.0.store(stepped, std::sync::atomic::Ordering::SeqCst);
        // Three seconds: seven hold_ttls.
        let until = Instant::now() + Duration::from_secs(3);
        while Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(60)).await;
            assert!(
                !l.reserve(&plan).await.0.is_allowed(),
                "skew {skew}: the live hold was lost"
            );
        }
        assert_eq!(
            l.metrics().policy(&name).map(|c| c.holds_expired()),
            Some(0),
            "skew {skew}"
        );
        // Its release names the bucket the last renewal moved it to: freed at once, not
        // after hold_ttl.
        drop(held);
        l.flush_settles().await;
        assert!(
            l.reserve(&plan).await.0.is_allowed(),
            "skew {skew}: released"
        );
    }
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_released_while_its_renewal_is_in_flight_is_gone_once_a_flush_returns() {
    // A reservation that ends while the renewer's call for its hold is in flight is released
    // when that call answers (the release names the bucket the renewal moves the hold to).
    // A flush waits for that release too: a request after it finds the hold gone. (Before,
    // a flush returned at once, and a request right after it was refused; the test above
    // met it about one run in six.)
    let server = RedisServer::start();
    let l = redis_with_timeout(&server.url(), Duration::from_secs(5));
    assert!(l.connect(Duration::from_secs(5)).await);
    // hold_ttl 400 ms: a bucket of 50 ms lives 500 ms, longer than the freeze below.
    let p = in_flight(&l, "inflight", 1, Duration::from_millis(400));
    let plan = Plan::for_client(ClientKey([12; 16]), [&p]);
    for round in 0..3 {
        let (r, held) = l.reserve(&plan).await;
        assert!(r.is_allowed(), "round {round}");
        assert!(
            !l.reserve(&plan).await.0.is_allowed(),
            "round {round}: held"
        );
        server.pause();
        // The renewer looks every 100 ms and renews a hold a bucket old: one renewal is in
        // flight, waiting on the frozen server, when the reservation ends.
        tokio::time::sleep(Duration::from_millis(150)).await;
        drop(held);
        let resume = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            server.resume();
        };
        tokio::join!(l.flush_settles(), resume);
        assert!(
            l.reserve(&plan).await.0.is_allowed(),
            "round {round}: the hold outlived its flushed release"
        );
        l.flush_settles().await;
    }
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn settles_on_redis_are_coalesced_and_exact() {
    let server = RedisServer::start();
    let l = redis(&server.url());
    assert!(l.connect(Duration::from_secs(5)).await);
    let p = settling(
        &l,
        "tokens",
        Algorithm::SlidingWindowLog,
        1000,
        1000,
        10,
        MINUTE,
    );
    let mut reservations = Vec::new();
    for i in 0..200u8 {
        let plan = Plan::for_client(ClientKey([i; 16]), [&p]);
        let (r, res) = l.reserve(&plan).await;
        assert!(r.is_allowed());
        reservations.push(res.expect("allowed"));
    }
    let calls = l.metrics().store_calls();
    for r in reservations {
        r.settle(3);
    }
    l.flush_settles().await;
    let settle_calls = l.metrics().store_calls() - calls;
    assert!(
        settle_calls < 200 / 4,
        "200 settles took {settle_calls} store calls"
    );
    for i in [0u8, 99, 199] {
        let q = l
            .check(&Plan::for_client(ClientKey([i; 16]), [&p.with_cost(0)]))
            .await;
        assert_eq!(remaining(&q), 997, "client {i}: 7 of the 10 came back");
    }
    assert_eq!(
        l.metrics().policy("tokens").map(|c| c.settled_units()),
        Some((1400, 0))
    );
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_three_master_cluster_settles_and_holds_stay_in_each_clients_slot() {
    // The fixed window counts on Redis's own clock, charged when a request is reserved and
    // refunded when it settles, later: a window's end between the two refuses the refund (its
    // window has passed), and the client's count starts again. So a window of an hour, not
    // `settling`'s minute (a minute ends sixty times as often), and the test started clear of
    // the hour's end.
    let hour = Duration::from_secs(3600);
    tollgate_testkit::clear_of_window_end(hour);
    let cluster = tokio::task::spawn_blocking(|| tollgate_testkit::RedisCluster::start(3, 0))
        .await
        .expect("cluster");
    let make = || {
        let mut config =
            LimiterConfig::new(Backend::Redis(RedisConfig::cluster(cluster.seed_urls())));
        config.timeout = Duration::from_secs(2);
        Limiter::new(config)
    };
    let gateways = [make(), make()];
    for g in &gateways {
        assert!(g.connect(Duration::from_secs(10)).await);
    }
    let window: Vec<Policy> = gateways
        .iter()
        .map(|g| settling(g, "window", Algorithm::FixedWindow, 100, 100, 20, hour))
        .collect();
    let holds: Vec<Policy> = gateways
        .iter()
        .map(|g| in_flight(g, "inflight", 2, Duration::from_secs(30)))
        .collect();
    // Clients on every master: each settles exactly, in batches of many slots.
    let clients: Vec<ClientKey> = (0..60u8).map(|i| ClientKey([i; 16])).collect();
    let mut reservations = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        let g = i % 2;
        let plan = Plan::for_client(*c, [&window[g], &holds[g]]);
        let (r, res) = gateways[g].reserve(&plan).await;
        assert!(r.is_allowed(), "{c:?}");
        reservations.push(res.expect("allowed"));
    }
    // A second hold for every client fits (limit 2), a third does not, from either gateway.
    for (i, c) in clients.iter().enumerate().take(10) {
        let g = (i + 1) % 2;
        let plan = Plan::for_client(*c, [&holds[g]]);
        let (r, second) = gateways[g].reserve(&plan).await;
        assert!(r.is_allowed());
        assert!(
            !gateways[i % 2].reserve(&plan).await.0.is_allowed(),
            "a third hold"
        );
        drop(second);
    }
    for r in reservations {
        r.settle(5);
    }
    for g in &gateways {
        g.flush_settles().await;
    }
    for (i, c) in clients.iter().enumerate() {
        let g = i % 2;
        let q = gateways[g]
            .check(&Plan::for_client(*c, [&window[g].with_cost(0)]))
            .await;
        assert_eq!(remaining(&q), 95, "client {i}: 15 of its 20 came back");
    }
    let refunded: u64 = gateways
        .iter()
        .filter_map(|g| g.metrics().policy("window").map(|c| c.settled_units().0))
        .sum();
    assert_eq!(refunded, 60 * 15);
    let in_flight: u64 = gateways
        .iter()
        .filter_map(|g| g.metrics().policy("inflight").map(|c| c.in_flight()))
        .sum();
    assert_eq!(in_flight, 0, "every hold released");
    // A plan across two slots (two clients) holds and settles in each one's slot.
    let (a, b) = (clients[0], clients[1]);
    let mut plan = Plan::new();
    plan.push(a, holds[0].clone());
    plan.push(b, window[0].clone());
    let (r, res) = gateways[0].reserve(&plan).await;
    assert!(r.is_allowed());
    res.expect("allowed").settle(40);
    gateways[0].flush_settles().await;
    let q = gateways[0]
        .check(&Plan::for_client(b, [&window[0].with_cost(0)]))
        .await;
    assert_eq!(
        remaining(&q),
        95 - 40,
        "a debt of 20 past the estimate of 20"
    );
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn a_refund_clears_a_denial_the_deny_cache_remembered() {
    let server = RedisServer::start();
    let l = redis(&server.url());
    assert!(l.connect(Duration::from_secs(5)).await);
    // 100 an hour: a token every 36 s.
    let hour = Duration::from_secs(3600);
    let p = settling(&l, "tokens", Algorithm::TokenBucket, 100, 100, 60, hour);
    let plan = Plan::for_client(ClientKey([9; 16]), [&p]);
    let (_, first) = l.reserve(&plan).await;
    let first = first.expect("allowed");
    let (r, _) = l.reserve(&plan).await;
    assert!(!r.is_allowed(), "40 left of 100: an estimate of 60 waits");
    assert!(
        l.denied_locally(&plan).is_some(),
        "remembered by the deny cache"
    );
    first.settle(10);
    l.flush_settles().await;
    assert!(
        l.denied_locally(&plan).is_none(),
        "the refund made the denial stale"
    );
    let (r, _) = l.reserve(&plan).await;
    assert!(r.is_allowed(), "90 left after the refund");
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_fails_leaves_the_hold_to_expire_after_hold_ttl() {
    let server = RedisServer::start();
    let l = redis_with_timeout(&server.url(), Duration::from_millis(200));
    assert!(l.connect(Duration::from_secs(5)).await);
    let ttl = Duration::from_secs(2);
    let p = in_flight(&l, "inflight", 1, ttl);
    let plan = Plan::for_client(ClientKey([10; 16]), [&p]);
    let (_, held) = l.reserve(&plan).await;
    let held = held.expect("allowed");
    // Redis stops answering: the release times out (counted), the hold stays in Redis.
    server.pause();
    drop(held);
    l.flush_settles().await;
    server.resume();
    let failed = Instant::now();
    let errors = l
        .metrics()
        .policy("inflight")
        .map(|c| c.settle_errors(SettleError::Store));
    assert_eq!(errors, Some(1));
    assert_eq!(
        l.metrics().policy("inflight").map(|c| c.in_flight()),
        Some(0)
    );
    // A fresh limiter (no breaker history) sees the hold until it expires, then room.
    let other = redis(&server.url());
    assert!(other.connect(Duration::from_secs(5)).await);
    let q = in_flight(&other, "inflight", 1, ttl);
    let plan = Plan::for_client(ClientKey([10; 16]), [&q]);
    assert!(
        !other.reserve(&plan).await.0.is_allowed(),
        "the hold is still in Redis"
    );
    let freed = loop {
        let (r, res) = other.reserve(&plan).await;
        if r.is_allowed() {
            break res;
        }
        assert!(
            failed.elapsed() < ttl * 2,
            "the orphaned hold never expired"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    drop(freed);
}
