//! `Limiter::give_back`: units of a charge nothing recorded go back to each plan item's state
//! (never below fresh), the answer reads the states after it, and the units count as
//! refunded; on the memory store and on a real redis-server.

use std::sync::Arc;
use std::time::Duration;
use tollgate::clock::ManualClock;
use tollgate::quota::{Algorithm, Limit, Quota};
#[cfg(feature = "redis")]
use tollgate::store::{RedisConfig, StoreClock};
#[cfg(feature = "redis")]
use tollgate::Backend;
use tollgate::{Action, ClientKey, Limiter, LimiterConfig, Plan, PolicySpec};
#[cfg(feature = "redis")]
use tollgate_testkit::RedisServer;

const T0: u64 = 1_800_000_000_000_000;

async fn gives_back_each_item_and_never_below_fresh(l: &Limiter, store: &str) {
    for alg in Algorithm::EVERY {
        let q = Quota::new(10, Duration::from_secs(60)).expect("quota");
        let name = format!("gb-{alg}");
        let p = l
            .policy(PolicySpec::new(&name, Limit::new(alg, q).expect("limit")))
            .expect("policy");
        let client = ClientKey([7; 16]);
        let charge = Plan::for_client(client, [&p.with_cost(6)]);
        assert!(l.check(&charge).await.is_allowed(), "{store} {alg}");
        let back = p.with_cost(4);
        let r = l.give_back(&Plan::for_client(client, [&back])).await;
        assert_eq!(r.action, Action::Allow, "{store} {alg}");
        assert!(r.results[0].policy.is(&back), "the plan's own policy value");
        let d = r.results[0].decision.expect("decided");
        assert_eq!(d.remaining, 8, "{store} {alg}: 6 charged, 4 back");
        // Far more than was charged: back to fresh, no further.
        let r = l
            .give_back(&Plan::for_client(client, [&p.with_cost(1_000)]))
            .await;
        assert_eq!(r.results[0].decision.expect("decided").remaining, 10);
        let full = Plan::for_client(client, [&p.with_cost(10)]);
        assert!(l.check(&full).await.is_allowed(), "{store} {alg}");
        assert!(!l.check(&full).await.is_allowed(), "{store} {alg}: not 11");
        let refunded = l.metrics().policy(&name).map(|c| c.settled_units().0);
        assert_eq!(refunded, Some(4 + 2), "{store} {alg}");
    }
}

#[tokio::test]
async fn a_give_back_on_memory_returns_units_and_never_goes_below_fresh() {
    let clock = ManualClock::new(T0);
    let l = Limiter::new(LimiterConfig {
        clock: Arc::new(clock.clone()),
        ..LimiterConfig::default()
    });
    gives_back_each_item_and_never_below_fresh(&l, "memory").await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_on_redis_returns_units_and_never_goes_below_fresh() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let redis = RedisConfig::standalone(server.url()).with_clock(StoreClock::Local);
    let mut config = LimiterConfig::new(Backend::Redis(redis));
    config.clock = Arc::new(clock.clone());
    config.timeout = Duration::from_secs(2);
    let l = Limiter::new(config);
    l.connect(Duration::from_secs(5)).await;
    gives_back_each_item_and_never_below_fresh(&l, "redis").await;
}
