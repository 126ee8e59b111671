//! Leases against a real redis-server: a grant is charged like a request of that cost, and a
//! give-back leaves the shared state exactly as if only the used units had been taken.

mod common;

use common::{client, connect, random_limit, Rng, EPOCH_2026};
use std::time::Duration;
use tollgate_core::{Algorithm, Check, Rule};
use tollgate_redis::{LeaseRequest, RedisStore, StoreClock};
use tollgate_testkit::RedisServer;

const LEASABLE: [Algorithm; 4] = [
    Algorithm::TokenBucket,
    Algorithm::LeakyBucket,
    Algorithm::Gcra,
    Algorithm::FixedWindow,
];

#[test]
fn only_count_based_algorithms_are_leasable() {
    for a in Algorithm::ALL {
        assert_eq!(a.is_leasable(), LEASABLE.contains(&a), "{a}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_leaves_the_state_of_only_the_used_units() {
    let server = RedisServer::start();
    let store = connect(&server.url(), StoreClock::Local)
        .await
        .with_ttl_floor(Duration::from_secs(3600));
    let mut rng = Rng::new(0x1ea5e);
    for round in 0..200u128 {
        let alg = *rng.pick(&LEASABLE);
        let rule = Rule::new("p", random_limit(&mut rng, alg));
        let q = *rule.limit().quota();
        let leased = client(2 * round);
        let exact = client(2 * round + 1);
        let mut now = EPOCH_2026 + rng.range(0, q.period_micros());
        // Some history on both, identical.
        for _ in 0..rng.range(0, 5) {
            let cost = rng.range(0, 3);
            let (a, b) = twins(&store, &rule, (leased, exact), cost, now).await;
            assert_eq!(a, b);
            now += rng.range(0, q.emission_interval_micros() * 2);
        }
        let want = rng.range(1, q.burst().min(q.limit()) + 2);
        let lease = store
            .lease(
                &leased,
                &rule,
                LeaseRequest {
                    want,
                    need: 1,
                    give_back: 0,
                    give_back_window: 0,
                },
                now,
            )
            .await
            .expect("lease");
        assert!(lease.granted <= want);
        let used = rng.range(0, lease.granted);
        if used > 0 {
            let c = [Check::new(exact, &rule, used)];
            let v = store.check(&c, now).await.expect("check");
            assert!(
                v.allowed,
                "round {round} {alg}: the exact twin could not take {used}"
            );
        }
        now += rng.range(0, q.emission_interval_micros());
        let back = store
            .lease(
                &leased,
                &rule,
                LeaseRequest {
                    want: 0,
                    need: 0,
                    give_back: lease.granted - used,
                    give_back_window: lease.window,
                },
                now,
            )
            .await
            .expect("give back");
        assert_eq!(back.granted, 0);
        // From here on both clients get the same answers.
        for _ in 0..5 {
            let cost = rng.range(0, q.burst().min(q.limit()));
            let (a, b) = twins(&store, &rule, (leased, exact), cost, now).await;
            assert_eq!(
                a, b,
                "round {round} {alg} {q:?}: leased {lease:?}, used {used}"
            );
            now += rng.range(0, q.emission_interval_micros() * 3);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_taken_below_need_and_retry_says_when_it_would_be() {
    let server = RedisServer::start();
    let store = connect(&server.url(), StoreClock::Local).await;
    let rule = common::rule("p", Algorithm::Gcra, 10, Duration::from_secs(10));
    let c = client(1);
    let now = EPOCH_2026;
    let take = |want, need, now| {
        let store = store.clone();
        let rule = rule.clone();
        async move {
            store
                .lease(
                    &c,
                    &rule,
                    LeaseRequest {
                        want,
                        need,
                        give_back: 0,
                        give_back_window: 0,
                    },
                    now,
                )
                .await
                .expect("lease")
        }
    };
    let first = take(8, 1, now).await;
    assert_eq!((first.granted, first.remaining), (8, 2));
    let short = take(5, 3, now).await;
    assert_eq!(short.granted, 0);
    // One unit per second: the third unit is there in 1 s.
    assert_eq!(short.retry_after, Some(1_000_000));
    let later = take(5, 3, now + 1_000_000).await;
    assert_eq!(later.granted, 3);
    let algorithm_error = store
        .lease(
            &c,
            &common::rule("s", Algorithm::SlidingWindowLog, 10, Duration::from_secs(1)),
            LeaseRequest {
                want: 1,
                need: 1,
                give_back: 0,
                give_back_window: 0,
            },
            now,
        )
        .await;
    assert!(algorithm_error.is_err());
}

/// The same check for two clients: their verdicts.
async fn twins(
    store: &RedisStore,
    rule: &Rule,
    (a, b): (tollgate_core::ClientKey, tollgate_core::ClientKey),
    cost: u64,
    now: u64,
) -> (tollgate_core::Verdict, tollgate_core::Verdict) {
    let x = store.check(&[Check::new(a, rule, cost)], now).await;
    let y = store.check(&[Check::new(b, rule, cost)], now).await;
    (x.expect("check"), y.expect("check"))
}
