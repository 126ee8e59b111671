//! `not_charged` on a real `redis-server`: a policy that allowed while another rule of the
//! plan denied counts `not_charged`, whether the store decided the denial or the deny cache
//! answered it locally, so `allowed` counts only charged admissions. And a plan of one policy
//! (its verdict's one decision kept inline) decides as the same policy beside a shadow one
//! that never limits (a plan of two), in every mode.
#![cfg(feature = "redis")]

mod common;

use std::sync::Arc;
use std::time::Duration;
use tollgate::clock::ManualClock;
use tollgate::quota::{Algorithm, Limit, Quota};
use tollgate::store::{RedisConfig, StoreClock};
use tollgate::{Action, Backend, ClientKey, Limiter, LimiterConfig, Outcome, Plan, PolicySpec};
use tollgate_testkit::RedisServer;

const T0: u64 = 1_800_000_000_000_000;

/// A limiter's config on `server`, its keys under `prefix`, timed by `clock` (the store's
/// clock is the limiter's: nothing depends on the machine's time).
fn config(server: &RedisServer, clock: &ManualClock, prefix: &str) -> LimiterConfig {
    let redis = RedisConfig::standalone(server.url())
        .with_clock(StoreClock::Local)
        .with_key_prefix(prefix);
    let mut cfg = LimiterConfig::new(Backend::Redis(redis));
    cfg.clock = Arc::new(clock.clone());
    cfg.timeout = Duration::from_secs(2);
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_another_rule_denied_counts_not_charged_on_redis_and_in_the_deny_cache() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let l = Limiter::new(config(&server, &clock, "nc"));
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_of_one_policy_decides_as_it_does_beside_a_shadow_policy_in_every_mode() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let mut cfg = config(&server, &clock, "one");
    // Every answer from the store: the deny cache would answer some denials locally.
    cfg.deny_cache_capacity = 0;
    let l = Limiter::new(cfg);
    let mut client = 0u8;
    for alg in [
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::Gcra,
    ] {
        for mode in ["enforce", "quota", "shadow"] {
            let quota = Quota::new(3, Duration::from_secs(10)).expect("quota");
            let mut spec = PolicySpec::new(
                format!("api_{alg:?}_{mode}"),
                Limit::new(alg, quota).expect("limit"),
            );
            spec.shadow = mode == "shadow";
            let p = l.policy(spec).expect("policy");
            let p = if mode == "quota" {
                p.in_quota_mode()
            } else {
                p
            };
            let wide = Quota::new(1_000_000, Duration::from_secs(1)).expect("quota");
            let mut open = PolicySpec::new(
                format!("open_{alg:?}_{mode}"),
                Limit::new(Algorithm::TokenBucket, wide).expect("limit"),
            );
            open.shadow = true;
            let open = l.policy(open).expect("policy");
            // Two clients of their own: one sends the plan alone, one beside `open`.
            let (alone, beside) = (ClientKey([client; 16]), ClientKey([client + 1; 16]));
            client += 2;
            let mut limited = 0;
            for i in 0..16u32 {
                let one = l.check(&Plan::for_client(alone, [&p])).await;
                let two = l.check(&Plan::for_client(beside, [&p, &open])).await;
                let what = format!("{alg:?} {mode}, request {i}");
                limited += usize::from(common::answered_alike(&one, &two, &what));
                clock.advance(Duration::from_millis(if i % 4 == 3 { 2_500 } else { 10 }));
            }
            assert!(limited > 0, "{alg:?} {mode}: never over the limit");
        }
    }
}
