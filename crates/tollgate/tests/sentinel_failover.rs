//! Redis Sentinel (a master, a replica, three sentinels; real processes) loses its master:
//! requests follow their failure policy while the sentinels fail over, and once they have
//! promoted the replica the limiter finds it through them and decides there again, with the
//! state the replica kept.
#![cfg(feature = "redis")]

mod common;

use common::*;
use std::time::{Duration, Instant};
use tollgate::policy::FailurePolicy;
use tollgate::quota::{Algorithm, Limit, Quota};
use tollgate::store::{BreakerConfig, RedisConfig};
use tollgate::{Backend, ClientKey, Limiter, LimiterConfig, Outcome, PolicySpec};
use tollgate_testkit::RedisSentinels;

const OPEN_FOR: Duration = Duration::from_millis(500);

fn limiter(set: &RedisSentinels) -> Limiter {
    let redis = RedisConfig::sentinel(set.sentinel_urls(), set.master_name()).with_key_prefix("s");
    let mut cfg = LimiterConfig::new(Backend::Redis(redis));
    cfg.timeout = Duration::from_millis(200);
    cfg.breaker = BreakerConfig {
        failures: 3,
        open_for: OPEN_FOR,
    };
    Limiter::new(cfg)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_resume_on_the_promoted_replica_within_two_breaker_periods() {
    let mut set = tokio::task::spawn_blocking(RedisSentinels::start)
        .await
        .expect("sentinels");
    let l = limiter(&set);
    let quota = Quota::per_hour(5).expect("quota");
    let mut spec = PolicySpec::new("api", Limit::new(Algorithm::Gcra, quota).expect("limit"));
    spec.on_failure = FailurePolicy::Closed;
    let p = l.policy(spec).expect("policy");
    let client = ClientKey([7; 16]);

    for i in 0..3 {
        let r = l.check(&tollgate::Plan::for_client(client, [&p])).await;
        assert_eq!(r.results[0].outcome, Outcome::Allowed, "request {i}");
    }
    // The replica has the client's state before its master dies (replication is async).
    let replicated = (0..250).any(|_| {
        std::thread::sleep(Duration::from_millis(20));
        set.replica().cli(&["DBSIZE"]).trim() == "1"
    });
    assert!(replicated, "the replica never received the client's key");

    set.master().kill();
    let killed = Instant::now();
    let promoted_port = set.replica().port();
    let set = std::sync::Arc::new(set);
    let watcher = {
        let set = std::sync::Arc::clone(&set);
        tokio::task::spawn_blocking(move || {
            set.wait_for_failover(Duration::from_secs(40))
                .then(Instant::now)
        })
    };
    let mut watcher = Some(watcher);
    let mut promoted_at: Option<Instant> = None;
    let mut failed_closed = 0;
    let mut resumed_at = None;
    // Bounded: 60 s of real time or 1,200 rounds of 50 ms, whichever first.
    for _ in 0..1200 {
        if watcher.as_ref().is_some_and(|w| w.is_finished()) {
            if let Some(w) = watcher.take() {
                promoted_at = w.await.expect("watcher");
                assert!(
                    promoted_at.is_some(),
                    "the sentinels did not fail over in 40 s"
                );
            }
        }
        let r = l.check(&tollgate::Plan::for_client(client, [&p])).await;
        match r.results[0].outcome {
            Outcome::FailedClosed => failed_closed += 1,
            Outcome::Allowed if failed_closed > 0 => {
                resumed_at = Some(Instant::now());
                break;
            }
            other => panic!(
                "unexpected {other:?} after {:?} ({failed_closed} failed closed so far)",
                killed.elapsed()
            ),
        }
        if killed.elapsed() > Duration::from_secs(60) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(failed_closed > 0, "the lost master was never noticed");
    let resumed_at = resumed_at.expect("decisions did not resume within 60 s of the kill");
    if let Some(w) = watcher.take() {
        promoted_at = w.await.expect("watcher");
    }
    let promoted_at = promoted_at.expect("the sentinels did not fail over");
    let lag = resumed_at.saturating_duration_since(promoted_at);
    assert!(
        lag <= 2 * OPEN_FOR,
        "decisions resumed {lag:?} after the promotion; expected at most {:?}",
        2 * OPEN_FOR
    );
    assert_eq!(set.master_port(), Some(promoted_port));
    // The outage is counted as what it is: no master reachable, not a script or unknown error.
    assert!(store_errors(&l, "connection") + store_errors(&l, "timeout") > 0);
    assert_eq!(store_errors(&l, "script"), 0);
    assert_eq!(store_errors(&l, "other"), 0);
    // The promoted replica kept the state: 4 of 5 are used, one more is allowed, then none.
    let r = l.check(&tollgate::Plan::for_client(client, [&p])).await;
    assert_eq!(r.results[0].outcome, Outcome::Allowed);
    let r = l.check(&tollgate::Plan::for_client(client, [&p])).await;
    assert_eq!(r.results[0].outcome, Outcome::Limited);
    // The plans ran on the store's own connection to the new master (src/direct.rs).
    let clients = set.replica().cli(&["CLIENT", "LIST"]);
    assert!(
        clients
            .lines()
            .any(|c| c.contains(" name=tollgate-batch ") && c.contains("cmd=eval")),
        "{clients}"
    );
}

/// `SENTINEL FAILOVER` leaves the old master up, answering as a master until the sentinels
/// demote it (seconds later): the limiter must not keep writing there, where its writes are
/// lost at the resync. It follows the sentinels' new answer within a few of its watcher's
/// rounds (one a second), long before the old master is demoted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_with_the_old_master_alive_moves_the_writes_to_the_new_master() {
    let set = tokio::task::spawn_blocking(RedisSentinels::start)
        .await
        .expect("sentinels");
    let l = limiter(&set);
    let quota = Quota::per_hour(1000).expect("quota");
    let p = l
        .policy(PolicySpec::new(
            "api",
            Limit::new(Algorithm::TokenBucket, quota).expect("limit"),
        ))
        .expect("policy");
    let first = l
        .check(&tollgate::Plan::for_client(ClientKey([1; 16]), [&p]))
        .await;
    assert_eq!(first.results[0].outcome, Outcome::Allowed);
    let set = std::sync::Arc::new(set);
    let answer = set.failover();
    assert!(
        answer.contains("OK"),
        "SENTINEL FAILOVER answered {answer:?}"
    );
    let promoted = {
        let set = std::sync::Arc::clone(&set);
        tokio::task::spawn_blocking(move || set.wait_for_failover(Duration::from_secs(30)))
            .await
            .expect("watcher")
    };
    assert!(promoted, "the sentinels did not fail over in 30 s");
    let new_master = set.replica();
    let keys = |s: &tollgate_testkit::RedisServer| -> u64 {
        s.cli(&["DBSIZE"]).trim().parse().unwrap_or(0)
    };
    let before = keys(new_master);
    let switched = Instant::now();
    let mut moved = false;
    // Bounded: 100 rounds of 50 ms; a fresh client each, so each allowed check writes a key.
    for i in 0..100u8 {
        let _ = l
            .check(&tollgate::Plan::for_client(ClientKey([i + 2; 16]), [&p]))
            .await;
        if keys(new_master) > before {
            moved = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        moved,
        "no write reached the new master within {:?} of the sentinels naming it",
        switched.elapsed()
    );
}
