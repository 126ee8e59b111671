//! A Redis that refuses the gateway's calls is counted by why: credentials refused as an `auth`
//! store error, so an operator sees a wrong password as one and not as "other" among transient
//! failures; a full Redis (past `maxmemory`, `noeviction`) as `oom`, not as `script` (a bug).
#![cfg(feature = "redis")]

mod common;

use common::*;
use std::time::Duration;
use tollgate::policy::FailurePolicy;
use tollgate::quota::{Algorithm, Limit, Quota};
use tollgate::store::RedisConfig;
use tollgate::{Backend, ClientKey, Limiter, LimiterConfig, Outcome, PolicySpec};
use tollgate_testkit::RedisServer;

/// A limiter on the Redis at `url` and its one policy, `api`: GCRA, `limit` an hour, closed
/// when the store fails.
fn closed_policy(url: String, limit: u64) -> (Limiter, tollgate::Policy) {
    let mut cfg = LimiterConfig::new(Backend::Redis(RedisConfig::standalone(url)));
    cfg.timeout = Duration::from_millis(500);
    let l = Limiter::new(cfg);
    let quota = Quota::per_hour(limit).expect("quota");
    let mut spec = PolicySpec::new("api", Limit::new(Algorithm::Gcra, quota).expect("limit"));
    spec.on_failure = FailurePolicy::Closed;
    let p = l.policy(spec).expect("policy");
    (l, p)
}

async fn failed_checks(url: String) -> Limiter {
    let (l, p) = closed_policy(url, 10);
    for _ in 0..2 {
        let r = l
            .check(&tollgate::Plan::for_client(ClientKey([3; 16]), [&p]))
            .await;
        assert_eq!(r.results[0].outcome, Outcome::FailedClosed);
    }
    l
}

#[tokio::test]
async fn a_wrong_password_or_none_counts_as_an_auth_error() {
    let server = RedisServer::start_with_args(&["--requirepass", "right-one"]);
    let port = server.port();
    // AUTH refused (WRONGPASS).
    let l = failed_checks(format!("redis://:wrong-one@127.0.0.1:{port}")).await;
    assert!(store_errors(&l, "auth") >= 2);
    assert_eq!(store_errors(&l, "other"), 0);
    // No password where one is required (NOAUTH, or Redis 7's "unauthenticated bulk length"
    // for the script sent first).
    let l = failed_checks(format!("redis://127.0.0.1:{port}")).await;
    let m = metrics_text(&l);
    assert!(store_errors(&l, "auth") >= 2, "{m}");
    assert_eq!(store_errors(&l, "other"), 0);
    // The right one works.
    let mut cfg = LimiterConfig::new(Backend::Redis(RedisConfig::standalone(format!(
        "redis://:right-one@127.0.0.1:{port}"
    ))));
    cfg.timeout = Duration::from_millis(500);
    let l = Limiter::new(cfg);
    let quota = Quota::per_hour(10).expect("quota");
    let p = l
        .policy(PolicySpec::new(
            "api",
            Limit::new(Algorithm::Gcra, quota).expect("limit"),
        ))
        .expect("policy");
    let r = l
        .check(&tollgate::Plan::for_client(ClientKey([3; 16]), [&p]))
        .await;
    assert_eq!(r.results[0].outcome, Outcome::Allowed);
    assert_eq!(store_errors(&l, "auth"), 0);
}

/// A Redis past its `maxmemory` under `noeviction` refuses every script's first write, so
/// every call: each request follows its policy's failure policy, the store error is `oom`,
/// nothing is charged, and the store decides again once it has room.
#[tokio::test]
async fn a_full_redis_counts_as_an_oom_error_and_charges_nothing() {
    let server = RedisServer::start();
    let (l, p) = closed_policy(server.url(), 3);
    let plan = tollgate::Plan::for_client(ClientKey([4; 16]), [&p]);
    let outcome = |r: tollgate::LimitResult| r.results[0].outcome;
    assert_eq!(outcome(l.check(&plan).await), Outcome::Allowed);
    server.cli(&["config", "set", "maxmemory", "1"]);
    for _ in 0..2 {
        assert_eq!(outcome(l.check(&plan).await), Outcome::FailedClosed);
    }
    assert_eq!(store_errors(&l, "oom"), 2, "{}", metrics_text(&l));
    assert_eq!(store_errors(&l, "script"), 0);
    server.cli(&["config", "set", "maxmemory", "0"]);
    // One of three was taken before: two are left, the refused calls charged nothing.
    for _ in 0..2 {
        assert_eq!(outcome(l.check(&plan).await), Outcome::Allowed);
    }
    assert_eq!(outcome(l.check(&plan).await), Outcome::Limited);
}
