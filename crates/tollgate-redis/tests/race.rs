//! The distributed race from the design: 20 gateways (20 independent stores, each with its
//! own connection) fire 300 concurrent requests at one client limited to 100 per hour.
//! Exactly 100 must pass, every time, for every algorithm; and a sliding log long enough to be
//! decided in place (tests/long_log.rs) admits exactly its limit too.

mod common;

use common::{client, rule, EPOCH_2026};
use std::sync::Arc;
use std::time::Duration;
use tollgate_core::{Algorithm, Check, Rule};
use tollgate_redis::{RedisStore, StoreClock};
use tollgate_testkit::RedisServer;

const GATEWAYS: usize = 20;
const REQUESTS: usize = 300;
const REPETITIONS: u128 = 20;

async fn race(stores: &[RedisStore], rule: Arc<Rule>, who: u128, requests: usize) -> usize {
    let barrier = Arc::new(tokio::sync::Barrier::new(requests));
    let mut tasks = Vec::with_capacity(requests);
    for i in 0..requests {
        let store = stores[i % stores.len()].clone();
        let rule = rule.clone();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let checks = [Check::new(client(who), &rule, 1)];
            store.check(&checks, EPOCH_2026).await
        }));
    }
    let mut allowed = 0;
    for t in tasks {
        match t.await {
            Ok(Ok(v)) => allowed += usize::from(v.allowed),
            Ok(Err(e)) => panic!("store error in the race: {e}"),
            Err(e) => panic!("task failed: {e}"),
        }
    }
    allowed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_gateways_admit_exactly_the_limit() {
    let server = RedisServer::start();
    for algorithm in Algorithm::ALL {
        // Fixed windows are aligned to the hour: with Redis' clock a repetition could straddle
        // a boundary (and rightly admit twice). The gateway clock pins it inside one window.
        let clock = if algorithm == Algorithm::FixedWindow {
            StoreClock::Local
        } else {
            StoreClock::Store
        };
        let mut stores = Vec::with_capacity(GATEWAYS);
        for _ in 0..GATEWAYS {
            stores.push(common::connect(&server.url(), clock).await);
        }
        let r = Arc::new(rule(
            &format!("race-{algorithm}"),
            algorithm,
            100,
            Duration::from_secs(3600),
        ));
        for rep in 0..REPETITIONS {
            let who = (algorithm as u128) << 32 | rep;
            let allowed = race(&stores, r.clone(), who, REQUESTS).await;
            assert_eq!(allowed, 100, "{algorithm}, repetition {rep}");
        }
        // 20 gateways are 40 connections to Redis (plus redis-cli's own): each store's
        // multiplexed one and the one its coalesced calls are written on; none per request.
        let clients = server.cli(&["client", "list"]).lines().count();
        assert_eq!(clients, 2 * GATEWAYS + 1, "{algorithm}");
    }
}

/// A sliding log above `IN_PLACE_LOG_LIMIT`, decided in place (its reads and its append in one
/// script, on the generic script's path, not coalesced): 20 gateways, one and a half times its
/// limit at once, exactly its limit admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_gateways_admit_exactly_a_long_logs_limit() {
    let server = RedisServer::start();
    let limit = tollgate_redis::IN_PLACE_LOG_LIMIT + 100;
    let mut stores = Vec::with_capacity(GATEWAYS);
    for _ in 0..GATEWAYS {
        stores.push(common::connect(&server.url(), StoreClock::Store).await);
    }
    let r = Arc::new(rule(
        "race-long-log",
        Algorithm::SlidingWindowLog,
        limit,
        Duration::from_secs(3600),
    ));
    for rep in 0..3 {
        let requests = usize::try_from(limit * 3 / 2).expect("a small count");
        let allowed = race(&stores, r.clone(), 1 << 40 | rep, requests).await;
        assert_eq!(allowed as u64, limit, "repetition {rep}");
    }
}
