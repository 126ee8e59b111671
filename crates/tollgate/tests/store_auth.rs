//! A Redis that refuses the gateway's credentials is counted as an `auth` store error, so an
//! operator sees a wrong password as one and not as "other" among transient failures.
#![cfg(feature = "redis")]

mod common;

use common::*;
use std::time::Duration;
use tollgate::policy::FailurePolicy;
use tollgate::quota::{Algorithm, Limit, Quota};
use tollgate::store::RedisConfig;
use tollgate::{Backend, ClientKey, Limiter, LimiterConfig, Outcome, PolicySpec};
use tollgate_testkit::RedisServer;

async fn failed_checks(url: String) -> Limiter {
    let mut cfg = LimiterConfig::new(Backend::Redis(RedisConfig::standalone(url)));
    cfg.timeout = Duration::from_millis(500);
    let l = Limiter::new(cfg);
    let quota = Quota::per_hour(10).expect("quota");
    let mut spec = PolicySpec::new("api", Limit::new(Algorithm::Gcra, quota).expect("limit"));
    spec.on_failure = FailurePolicy::Closed;
    let p = l.policy(spec).expect("policy");
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
