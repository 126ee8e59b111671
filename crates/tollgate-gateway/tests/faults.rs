//! Redis dies under steady load through `tollgate serve`, and comes back. No request is
//! answered 500 or hangs past the store timeout (plus a margin far above scheduling noise);
//! each policy follows its `on_failure`; shared limiting resumes after the restart.

mod support;

use http::StatusCode;
use std::time::{Duration, Instant};
use support::*;
use tollgate_testkit::RedisServer;

const MARGIN: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_redis_under_load_follows_each_policy_and_recovers() {
    let mut redis = RedisServer::start();
    let body = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout = \"50ms\"\n\
         breaker = {{ failures = 3, open_for = \"500ms\" }}\n\
         [identity]\nsources = [\"header:x-api-key\"]\nsecret = \"s\"\n\
         [[policy]]\nname = \"login\"\nmatch = {{ path_prefix = \"/login\" }}\nalgorithm = \"gcra\"\n\
         limit = 5\nperiod = \"1h\"\non_failure = \"closed\"\n\
         [[policy]]\nname = \"reads\"\nmatch = {{ path_prefix = \"/reads\" }}\nalgorithm = \"token_bucket\"\n\
         limit = 4\nperiod = \"1h\"\non_failure = \"local\"\nlocal_divisor = 2\n\
         [[policy]]\nname = \"api\"\nmatch = {{ path_prefix = \"/api\" }}\nalgorithm = \"fixed_window\"\n\
         limit = 1000\nperiod = \"1h\"\non_failure = \"open\"\n",
        redis.url()
    );
    let g = Gateway::start("", &body);
    let c = client();
    let key: &[(&str, &[u8])] = &[("x-api-key", b"k1")];
    let timed = |path: &'static str| {
        let c = c.clone();
        let url = g.url(path);
        async move {
            let started = Instant::now();
            let a = get(&c, &url, &[("x-api-key", b"k1")]).await;
            let took = started.elapsed();
            assert!(
                took < Duration::from_millis(50) + MARGIN,
                "{path} took {took:?}"
            );
            assert_ne!(a.status, StatusCode::INTERNAL_SERVER_ERROR, "{path}: 500");
            a
        }
    };
    for path in ["/login", "/reads", "/api"] {
        assert_eq!(
            timed(path).await.status,
            StatusCode::OK,
            "{path} with Redis up"
        );
    }

    redis.kill();
    let mut reads = Vec::new();
    for round in 0..20 {
        let login = timed("/login").await;
        assert_eq!(
            login.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "round {round}"
        );
        let retry: u64 = login.header("retry-after").parse().expect("Retry-After");
        assert!(retry >= 1);
        assert_eq!(timed("/api").await.status, StatusCode::OK, "round {round}");
        reads.push(timed("/reads").await.status);
    }
    // The local fallback: 4 / 2 = 2 admitted, then real 429s (not 503s, not 500s).
    assert_eq!(
        reads.iter().filter(|s| **s == StatusCode::OK).count(),
        2,
        "{reads:?}"
    );
    assert!(
        reads[2..]
            .iter()
            .all(|s| *s == StatusCode::TOO_MANY_REQUESTS),
        "{reads:?}"
    );

    let metrics = get(&c, &g.admin_url("/metrics"), &[]).await.text();
    for needle in [
        "tollgate_breaker_open 1",
        "tollgate_decisions_total{policy=\"login\",outcome=\"failed_closed\"} 20",
        "tollgate_decisions_total{policy=\"api\",outcome=\"failed_open\"} 20",
        "tollgate_decisions_total{policy=\"reads\",outcome=\"fallback_allowed\"} 2",
        "tollgate_decisions_total{policy=\"reads\",outcome=\"fallback_limited\"} 18",
    ] {
        assert!(metrics.contains(needle), "missing {needle}:\n{metrics}");
    }
    assert_eq!(
        get(&c, &g.admin_url("/readyz"), &[]).await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );

    redis.restart();
    let restarted = Instant::now();
    let mut resumed = None;
    // Bounded: at most 100 rounds of 50 ms.
    for _ in 0..100 {
        if timed("/login").await.status == StatusCode::OK {
            resumed = Some(restarted.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let resumed = resumed.expect("shared limiting never resumed");
    // Within 2 x open_for, with the margin for a loaded machine.
    assert!(
        resumed < Duration::from_millis(1000) + MARGIN,
        "resumed after {resumed:?}"
    );
    // Shared again: the emptied Redis has 5 - 1 login attempts left for this client, then 429.
    for _ in 0..4 {
        assert_eq!(get(&c, &g.url("/login"), key).await.status, StatusCode::OK);
    }
    let limited = get(&c, &g.url("/login"), key).await;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        get(&c, &g.admin_url("/readyz"), &[]).await.status,
        StatusCode::OK
    );
}

/// A Redis that fills up (past its `maxmemory` under the default `noeviction`) refuses every
/// decision: no request is answered 500, each policy follows its `on_failure`, the errors are
/// counted as `oom`, and the one warning the breaker logs says what Redis answered. Once
/// Redis has room, the limits are shared again and the refused calls charged nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_redis_follows_each_policy_counts_oom_and_the_breakers_warning_says_why() {
    let redis = RedisServer::start();
    let body = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout = \"500ms\"\n\
         breaker = {{ failures = 3, open_for = \"200ms\" }}\n\
         [identity]\nsources = [\"header:x-api-key\"]\nsecret = \"s\"\n\
         [[policy]]\nname = \"login\"\nmatch = {{ path_prefix = \"/login\" }}\nalgorithm = \"gcra\"\n\
         limit = 3\nperiod = \"1h\"\non_failure = \"closed\"\n\
         [[policy]]\nname = \"api\"\nmatch = {{ path_prefix = \"/api\" }}\nalgorithm = \"token_bucket\"\n\
         limit = 1000\nperiod = \"1h\"\non_failure = \"open\"\n",
        redis.url()
    );
    let g = Gateway::start("", &body);
    let c = client();
    let key: &[(&str, &[u8])] = &[("x-api-key", b"k1")];
    assert_eq!(get(&c, &g.url("/login"), key).await.status, StatusCode::OK);
    redis.cli(&["config", "set", "maxmemory", "1"]);
    for round in 0..6 {
        let login = get(&c, &g.url("/login"), key).await;
        assert_eq!(
            login.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "round {round}"
        );
        let api = get(&c, &g.url("/api"), key).await;
        assert_eq!(api.status, StatusCode::OK, "round {round}");
    }
    let metrics = get(&c, &g.admin_url("/metrics"), &[]).await.text();
    assert!(metrics.contains("tollgate_breaker_open 1"), "{metrics}");
    // Three failures open the breaker; a probe after `open_for` on a slow machine is one more.
    let ooms: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("tollgate_store_errors_total{kind=\"oom\"} "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no oom count in\n{metrics}"));
    assert!(ooms >= 3, "{metrics}");
    assert!(
        metrics.contains("tollgate_store_errors_total{kind=\"script\"} 0\n"),
        "{metrics}"
    );
    let log = g.log_text();
    let warning = log
        .lines()
        .find(|l| l.contains("circuit breaker open"))
        .unwrap_or_else(|| panic!("no breaker warning in\n{log}"));
    assert!(
        warning.contains("error=oom: ") && warning.contains("command not allowed when used memory"),
        "{warning}"
    );
    redis.cli(&["config", "set", "maxmemory", "0"]);
    // Bounded: at most 100 rounds of 50 ms for the breaker's probe to succeed.
    let mut answered = None;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let a = get(&c, &g.url("/login"), key).await;
        if a.status != StatusCode::SERVICE_UNAVAILABLE {
            answered = Some(a.status);
            break;
        }
    }
    // One of three was taken before Redis filled up, one now: one is left, then 429.
    assert_eq!(answered, Some(StatusCode::OK));
    assert_eq!(get(&c, &g.url("/login"), key).await.status, StatusCode::OK);
    let limited = get(&c, &g.url("/login"), key).await;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
}
