//! A Redis Cluster (3 masters, 3 replicas, real processes) loses a master: clients whose keys
//! live on the other masters never notice; clients on the lost shard follow their failure
//! policy until the replica is promoted, then shared limiting resumes.
#![cfg(feature = "redis")]

use std::sync::Arc;
use std::time::{Duration, Instant};
use tollgate::clock::ManualClock;
use tollgate::policy::FailurePolicy;
use tollgate::quota::{Algorithm, Limit, Quota};
use tollgate::store::{BreakerConfig, RedisConfig, StoreClock};
use tollgate::{Action, Backend, ClientKey, Limiter, LimiterConfig, Outcome, PolicySpec};
use tollgate_testkit::RedisCluster;

const T0: u64 = 1_800_000_000_000_000;

fn error_counts(l: &Limiter) -> String {
    let mut s = String::new();
    l.render_metrics(&mut s);
    s.lines()
        .filter(|x| x.starts_with("tollgate_store_errors_total{"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn key_of(c: &ClientKey) -> String {
    format!("t:{{{c}}}:api")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_master_affects_only_the_clients_of_its_shard() {
    let mut cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3, 1))
        .await
        .expect("cluster");
    let clock = ManualClock::new(T0);
    let redis = RedisConfig::cluster(cluster.seed_urls())
        .with_clock(StoreClock::Local)
        .with_key_prefix("t");
    let mut cfg = LimiterConfig::new(Backend::Redis(redis));
    cfg.clock = Arc::new(clock.clone());
    cfg.timeout = Duration::from_millis(200);
    cfg.breaker = BreakerConfig {
        failures: 3,
        open_for: Duration::from_millis(500),
    };
    let l = Limiter::new(cfg);
    let quota = Quota::per_hour(100_000).expect("quota");
    let mut spec = PolicySpec::new("api", Limit::new(Algorithm::Gcra, quota).expect("limit"));
    spec.on_failure = FailurePolicy::Closed;
    let p = l.policy(spec).expect("policy");

    let lost = ClientKey([1; 16]);
    let lost_master = cluster.master_of_key(&key_of(&lost)).expect("master");
    let safe = (2..=255u8)
        .map(|i| ClientKey([i; 16]))
        .find(|c| cluster.master_of_key(&key_of(c)) != Some(lost_master))
        .expect("a client on another master");
    for c in [&lost, &safe] {
        let plan = tollgate::Plan::for_client(*c, [&p]);
        assert_eq!(l.check(&plan).await.results[0].outcome, Outcome::Allowed);
    }

    let dead = cluster.kill_master_of_key(&key_of(&lost));
    let started = Instant::now();
    let mut failed_closed = 0;
    let mut resumed = false;
    // Bounded: 60 s of real time or 600 rounds, whichever first.
    for _ in 0..600 {
        let r = l.check(&tollgate::Plan::for_client(safe, [&p])).await;
        assert_eq!(
            r.results[0].outcome,
            Outcome::Allowed,
            "a client of a healthy shard noticed the outage after {:?}: {}",
            started.elapsed(),
            error_counts(&l)
        );
        let r = l.check(&tollgate::Plan::for_client(lost, [&p])).await;
        match r.results[0].outcome {
            Outcome::FailedClosed => {
                assert!(matches!(r.action, Action::Unavailable { .. }));
                failed_closed += 1;
            }
            Outcome::Allowed => {
                if failed_closed > 0 {
                    resumed = true;
                    break;
                }
            }
            other => panic!("unexpected outcome {other:?} for the lost shard"),
        }
        if started.elapsed() > Duration::from_secs(60) {
            break;
        }
        clock.advance(Duration::from_millis(250));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        failed_closed > 0,
        "the lost shard's client never saw the outage"
    );
    assert!(resumed, "shared limiting did not resume after failover");
    assert_ne!(cluster.master_of_key(&key_of(&lost)), Some(dead));
}
