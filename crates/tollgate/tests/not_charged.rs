//! `not_charged` on a real `redis-server`: a policy that allowed while another rule of the
//! plan denied counts `not_charged`, whether the store decided the denial or the deny cache
//! answered it locally, so `allowed` counts only charged admissions.
#![cfg(feature = "redis")]

use std::sync::Arc;
use std::time::Duration;
use tollgate::clock::ManualClock;
use tollgate::quota::{Algorithm, Limit, Quota};
use tollgate::store::{RedisConfig, StoreClock};
use tollgate::{Action, Backend, ClientKey, Limiter, LimiterConfig, Outcome, Plan, PolicySpec};
use tollgate_testkit::RedisServer;

const T0: u64 = 1_800_000_000_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_another_rule_denied_counts_not_charged_on_redis_and_in_the_deny_cache() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let redis = RedisConfig::standalone(server.url())
        .with_clock(StoreClock::Local)
        .with_key_prefix("nc");
    let mut cfg = LimiterConfig::new(Backend::Redis(redis));
    cfg.clock = Arc::new(clock.clone());
    cfg.timeout = Duration::from_secs(1);
    let l = Limiter::new(cfg);
    let spec = |name: &str, limit: u64| {
        let quota = Quota::new(limit, Duration::from_secs(3600)).expect("quota");
        PolicySpec::new(
            name,
            Limit::new(Algorithm::FixedWindow, quota).expect("limit"),
        )
    };
    let per_key = l.policy(spec("per_key", 1)).expect("policy");
    let per_ip = l.policy(spec("per_ip", 1000)).expect("policy");
    let (key, ip) = (ClientKey([1; 16]), ClientKey([2; 16]));
    let mut answers = Vec::new();
    for _ in 0..10 {
        let mut plan = Plan::new();
        plan.push(key, per_key.clone());
        plan.push(ip, per_ip.clone());
        answers.push(l.check(&plan).await.action == Action::Allow);
    }
    assert_eq!(answers.iter().filter(|a| **a).count(), 1);
    let m = l.metrics();
    let count = |name: &str, o: Outcome| m.policy(name).map_or(0, |p| p.decisions(o));
    assert_eq!(count("per_key", Outcome::Allowed), 1);
    assert_eq!(count("per_key", Outcome::Limited), 9);
    assert!(
        m.policy("per_key").map_or(0, |p| p.deny_cache_hits()) >= 1,
        "the deny cache answered some"
    );
    // per_ip was charged once and refused nine times with the request.
    assert_eq!(count("per_ip", Outcome::Allowed), 1);
    assert_eq!(count("per_ip", Outcome::NotCharged), 9);
}
