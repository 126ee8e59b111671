//! The Envoy RLS over gRPC (a tonic client) against a real `redis-server`: envoyproxy/
//! ratelimit's basic integration scenario, then one test per feature of the protocol.

mod support;

use std::sync::Arc;
use std::time::Duration;
use support::*;
use tollgate_rls::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tollgate_rls::proto::grpc::health::v1::health_check_response::ServingStatus;
use tollgate_rls::proto::grpc::health::v1::HealthCheckRequest;
use tollgate_rls::RlsOptions;
use tollgate_testkit::RedisServer;

const BASIC: &str = "\
domain: basic
descriptors:
  - key: key1
    rate_limit: {unit: second, requests_per_unit: 50}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20, name: per_minute}
  - key: key3
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: free
    rate_limit: {unlimited: true}
  - key: dry
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: team
    rate_limit: {unit: hour, requests_per_unit: 5, name: team}
  - key: vip
    rate_limit:
      unit: hour
      requests_per_unit: 100
      replaces: [{name: team}]
  - key: bucket
    rate_limit: {unit: second, requests_per_unit: 2, unit_multiplier: 10, algorithm: token_bucket, burst: 4}
";

const MINUTE: i32 = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_scenario_of_envoyproxy_ratelimit() {
    let redis = RedisServer::start();
    let mut rls = start(&redis.url(), "basic", BASIC, RlsOptions::default()).await;

    // A 50/second descriptor answers 49 remaining.
    let r = rls.one("basic", &[("key1", "foo")]).await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(r.statuses.len(), 1);
    assert_eq!(r.statuses[0].limit_remaining, 49);
    let limit = r.statuses[0].current_limit.clone().expect("current_limit");
    assert_eq!((limit.requests_per_unit, limit.unit), (50, 1));

    // 25 calls on a 20/minute descriptor: 20 OK counting down to 0, then OVER_LIMIT;
    // duration_until_reset decreases as time passes within the window.
    let mut last_reset = u64::MAX;
    for i in 0..25u32 {
        let r = rls.one("basic", &[("key2", "bar")]).await;
        let s = &r.statuses[0];
        if i < 20 {
            assert_eq!(overall(&r), Code::Ok, "call {i}");
            assert_eq!(s.limit_remaining, 19 - i, "call {i}");
        } else {
            assert_eq!(overall(&r), Code::OverLimit, "call {i}");
            assert_eq!(code(s), Code::OverLimit);
            assert_eq!(s.limit_remaining, 0);
        }
        let reset = reset_micros(s);
        assert!(
            reset <= 60_000_000 && reset < last_reset,
            "call {i}: {reset} after {last_reset}"
        );
        last_reset = reset;
        let limit = s.current_limit.clone().expect("current_limit");
        assert_eq!(
            (limit.name.as_str(), limit.requests_per_unit, limit.unit),
            ("per_minute", 20, MINUTE)
        );
        rls.clock.advance(Duration::from_secs(1));
    }

    // Two descriptors, 20/minute and 10/hour: OVER_LIMIT after 10, and unlike envoyproxy's
    // default the 20/minute descriptor is not charged for the denied requests.
    rls.clock.set(T0 + 120_000_000);
    for i in 0..15u32 {
        let r = rls
            .call(request(
                "basic",
                vec![desc(&[("key2", "two")]), desc(&[("key3", "two")])],
            ))
            .await;
        if i < 10 {
            assert_eq!(overall(&r), Code::Ok, "call {i}");
            assert_eq!(r.statuses[0].limit_remaining, 19 - i);
            assert_eq!(r.statuses[1].limit_remaining, 9 - i);
        } else {
            assert_eq!(overall(&r), Code::OverLimit, "call {i}");
            assert_eq!(code(&r.statuses[0]), Code::Ok);
            assert_eq!(code(&r.statuses[1]), Code::OverLimit);
        }
    }
    let r = rls.one("basic", &[("key2", "two")]).await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(
        r.statuses[0].limit_remaining, 9,
        "10 charged, 5 denials not charged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statuses_follow_request_order_and_no_match_is_ok_without_a_limit() {
    let redis = RedisServer::start();
    let mut rls = start(&redis.url(), "order", BASIC, RlsOptions::default()).await;
    let r = rls
        .call(request(
            "basic",
            vec![
                desc(&[("nothing", "here")]),
                desc(&[("key3", "a")]),
                desc(&[("key1", "a"), ("deeper", "x")]),
                desc(&[("key1", "a")]),
            ],
        ))
        .await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(r.statuses.len(), 4);
    assert!(r.statuses[0].current_limit.is_none());
    assert_eq!(
        r.statuses[1]
            .current_limit
            .as_ref()
            .map(|l| l.requests_per_unit),
        Some(10)
    );
    assert!(
        r.statuses[2].current_limit.is_none(),
        "deeper than configured: no rule"
    );
    assert_eq!(
        r.statuses[3]
            .current_limit
            .as_ref()
            .map(|l| l.requests_per_unit),
        Some(50)
    );
    assert!(r.statuses.iter().all(|s| code(s) == Code::Ok));

    let r = rls.one("unknown-domain", &[("key1", "a")]).await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(r.statuses.len(), 1);
    assert!(r.statuses[0].current_limit.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlimited_answers_ok_with_u32_max_remaining() {
    let redis = RedisServer::start();
    let mut rls = start(&redis.url(), "unl", BASIC, RlsOptions::default()).await;
    for _ in 0..3 {
        let r = rls.one("basic", &[("free", "x")]).await;
        assert_eq!(overall(&r), Code::Ok);
        assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
        assert!(r.statuses[0].current_limit.is_none());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_never_answers_over_limit_and_counts_shadow_limited() {
    let redis = RedisServer::start();
    let mut rls = start(&redis.url(), "shadow", BASIC, RlsOptions::default()).await;
    for _ in 0..3 {
        let r = rls.one("basic", &[("dry", "x")]).await;
        assert_eq!(overall(&r), Code::Ok);
        assert_eq!(code(&r.statuses[0]), Code::Ok);
    }
    let mut m = String::new();
    rls.limiter.render_metrics(&mut m);
    let line = m
        .lines()
        .find(|l| l.contains("policy=\"basic.dry\"") && l.contains("outcome=\"shadow_limited\""))
        .expect("shadow_limited series");
    assert!(line.ends_with(" 2"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaces_drops_the_replaced_limit_of_the_same_request() {
    let redis = RedisServer::start();
    let mut rls = start(&redis.url(), "repl", BASIC, RlsOptions::default()).await;
    for _ in 0..8 {
        let r = rls
            .call(request(
                "basic",
                vec![desc(&[("team", "t")]), desc(&[("vip", "v")])],
            ))
            .await;
        assert_eq!(overall(&r), Code::Ok, "the team limit (5) is replaced");
        assert!(r.statuses[0].current_limit.is_none());
        assert_eq!(
            r.statuses[1]
                .current_limit
                .as_ref()
                .map(|l| l.requests_per_unit),
            Some(100)
        );
    }
    // Alone, the team limit applies and was never charged by the replaced calls.
    let r = rls.one("basic", &[("team", "t")]).await;
    assert_eq!(r.statuses[0].limit_remaining, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_addend_of_request_and_descriptor_and_zero_checks_without_charging() {
    let redis = RedisServer::start();
    let mut rls = start(&redis.url(), "hits", BASIC, RlsOptions::default()).await;
    let mut req = request("basic", vec![desc(&[("key3", "h")])]);
    req.hits_addend = 3;
    let r = rls.call(req.clone()).await;
    assert_eq!(r.statuses[0].limit_remaining, 7);
    // The descriptor's own hits_addend wins over the request's.
    req.descriptors[0] = with_hits(desc(&[("key3", "h")]), 2);
    let r = rls.call(req.clone()).await;
    assert_eq!(r.statuses[0].limit_remaining, 5);
    // An explicit 0 checks without charging.
    req.descriptors[0] = with_hits(desc(&[("key3", "h")]), 0);
    for _ in 0..3 {
        let r = rls.call(req.clone()).await;
        assert_eq!(overall(&r), Code::Ok);
        assert_eq!(r.statuses[0].limit_remaining, 5);
    }
    // A request-level 0 means 1.
    let r = rls.one("basic", &[("key3", "h")]).await;
    assert_eq!(r.statuses[0].limit_remaining, 4);
    // More than what remains: denied, nothing charged.
    let r = rls
        .call(request("basic", vec![with_hits(desc(&[("key3", "h")]), 5)]))
        .await;
    assert_eq!(overall(&r), Code::OverLimit);
    let r = rls.one("basic", &[("key3", "h")]).await;
    assert_eq!(r.statuses[0].limit_remaining, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_override_replaces_the_configured_quota_for_that_request() {
    let redis = RedisServer::start();
    let mut rls = start(&redis.url(), "ovr", BASIC, RlsOptions::default()).await;
    let over = || {
        request(
            "basic",
            vec![with_override(desc(&[("key3", "o")]), 3, MINUTE)],
        )
    };
    for i in 0..3u32 {
        let r = rls.call(over()).await;
        assert_eq!(overall(&r), Code::Ok, "call {i}");
        let limit = r.statuses[0].current_limit.clone().expect("current_limit");
        assert_eq!((limit.requests_per_unit, limit.unit), (3, MINUTE));
        assert_eq!(r.statuses[0].limit_remaining, 2 - i);
        assert!(reset_micros(&r.statuses[0]) <= 60_000_000);
    }
    assert_eq!(overall(&rls.call(over()).await), Code::OverLimit);
    // The configured 10/hour is untouched by the override's counter.
    let r = rls.one("basic", &[("key3", "o")]).await;
    assert_eq!(r.statuses[0].limit_remaining, 9);
    // An override with no unit is a clear error, not a guess.
    let err = rls
        .client
        .should_rate_limit(request(
            "basic",
            vec![with_override(desc(&[("key3", "o")]), 3, 0)],
        ))
        .await
        .expect_err("unit required");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tollgate_keys_choose_the_algorithm_and_a_window_of_n_units() {
    let redis = RedisServer::start();
    let mut rls = start(&redis.url(), "tb", BASIC, RlsOptions::default()).await;
    // token_bucket, 2 per 10 s with burst 4: four at once, then a denial.
    for i in 0..4u32 {
        let r = rls.one("basic", &[("bucket", "b")]).await;
        assert_eq!(overall(&r), Code::Ok, "call {i}");
        assert_eq!(r.statuses[0].limit_remaining, 3 - i);
    }
    assert_eq!(
        overall(&rls.one("basic", &[("bucket", "b")]).await),
        Code::OverLimit
    );
    // One token every 5 s.
    rls.clock.advance(Duration::from_secs(5));
    assert_eq!(
        overall(&rls.one("basic", &[("bucket", "b")]).await),
        Code::Ok
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_headers_carry_ratelimit_policy_and_ratelimit_when_draft() {
    let redis = RedisServer::start();
    let mut rls = start(&redis.url(), "hdr", BASIC, RlsOptions::default()).await;
    let r = rls.one("basic", &[("key2", "h")]).await;
    let get = |k: &str| {
        r.response_headers_to_add
            .iter()
            .find(|h| h.key == k)
            .map(|h| h.value.clone())
    };
    assert_eq!(
        get("ratelimit-policy").as_deref(),
        Some("\"basic.key2\";q=20;w=60")
    );
    assert_eq!(
        get("ratelimit").as_deref(),
        Some("\"basic.key2\";r=19;t=60")
    );
    for _ in 0..19 {
        rls.one("basic", &[("key2", "h")]).await;
    }
    let r = rls.one("basic", &[("key2", "h")]).await;
    assert_eq!(overall(&r), Code::OverLimit);
    assert!(r
        .response_headers_to_add
        .iter()
        .any(|h| h.key == "retry-after" && h.value == "60"));

    let off = RlsOptions {
        response_headers: false,
        ..RlsOptions::default()
    };
    let mut quiet = start(&redis.url(), "hdr-off", BASIC, off).await;
    let r = quiet.one("basic", &[("key2", "h")]).await;
    assert!(r.response_headers_to_add.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_values_reach_neither_the_store_nor_the_metric_labels() {
    let redis = RedisServer::start();
    let mut rls = start(&redis.url(), "priv", BASIC, RlsOptions::default()).await;
    let secret = "user-4711-secret-token";
    rls.one("basic", &[("key2", secret)]).await;
    let keys = redis.cli(&["KEYS", "*"]);
    assert!(keys.contains("priv:"), "a key was written: {keys}");
    assert!(!keys.contains(secret), "{keys}");
    let mut m = String::new();
    rls.limiter.render_metrics(&mut m);
    assert!(m.contains("policy=\"basic.key2\""));
    assert!(!m.contains(secret));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_value_of_a_key_only_descriptor_counts_on_its_own() {
    let redis = RedisServer::start();
    let mut rls = start(&redis.url(), "each", BASIC, RlsOptions::default()).await;
    assert_eq!(
        rls.one("basic", &[("key3", "a")]).await.statuses[0].limit_remaining,
        9
    );
    assert_eq!(
        rls.one("basic", &[("key3", "a")]).await.statuses[0].limit_remaining,
        8
    );
    assert_eq!(
        rls.one("basic", &[("key3", "b")]).await.statuses[0].limit_remaining,
        9
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_policies_apply_per_rule_and_health_follows_the_store() {
    let mut redis = RedisServer::start();
    let clock = tollgate::clock::ManualClock::new(T0);
    let closed = RlsOptions {
        on_failure: tollgate::policy::FailurePolicy::Closed,
        ..RlsOptions::default()
    };
    let l = limiter(&redis.url(), "fail", &clock, Duration::from_millis(100));
    let mut rls = start_with(l, clock.clone(), BASIC, closed).await;
    let h = rls
        .health
        .check(HealthCheckRequest::default())
        .await
        .expect("health answers")
        .into_inner();
    assert_eq!(h.status, i32::from(ServingStatus::Serving));
    assert_eq!(overall(&rls.one("basic", &[("key1", "x")]).await), Code::Ok);

    redis.kill();
    let err = rls
        .client
        .should_rate_limit(request("basic", vec![desc(&[("key1", "x")])]))
        .await
        .expect_err("closed: the store failing is UNAVAILABLE, never OVER_LIMIT");
    assert_eq!(err.code(), tonic::Code::Unavailable);
    // A request no rule matches needs no store.
    assert_eq!(
        overall(&rls.one("basic", &[("nothing", "x")]).await),
        Code::Ok
    );
    let h = rls
        .health
        .check(HealthCheckRequest::default())
        .await
        .expect("health answers")
        .into_inner();
    assert_eq!(h.status, i32::from(ServingStatus::NotServing));

    let l = limiter(&redis.url(), "fail", &clock, Duration::from_millis(100));
    let mut open = start_with(l, clock, BASIC, RlsOptions::default()).await;
    let r = open.one("basic", &[("key1", "x")]).await;
    assert_eq!(overall(&r), Code::Ok, "open: allowed");
    // Nothing was charged and nothing is known to be used: the whole limit, never 0.
    assert_eq!(
        r.statuses[0].limit_remaining, 50,
        "open: reports the whole limit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_requests_get_invalid_argument() {
    let redis = RedisServer::start();
    let mut rls = start(&redis.url(), "inv", BASIC, RlsOptions::default()).await;
    let e = rls
        .client
        .should_rate_limit(request("", vec![desc(&[("k", "v")])]))
        .await;
    assert_eq!(
        e.expect_err("empty domain").code(),
        tonic::Code::InvalidArgument
    );
    let e = rls.client.should_rate_limit(request("basic", vec![])).await;
    assert_eq!(
        e.expect_err("no descriptors").code(),
        tonic::Code::InvalidArgument
    );
    let e = rls
        .client
        .should_rate_limit(request("basic", vec![desc(&[("k", "v")]); 300]))
        .await;
    assert_eq!(
        e.expect_err("too many").code(),
        tonic::Code::InvalidArgument
    );
    // One descriptor of more entries than the bound.
    let names: Vec<String> = (0..=tollgate_rls::MAX_ENTRIES)
        .map(|i| format!("k{i}"))
        .collect();
    let entries: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "v")).collect();
    let e = rls
        .client
        .should_rate_limit(request("basic", vec![desc(&entries)]))
        .await;
    let e = e.expect_err("too many entries");
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("entries"), "{}", e.message());
    // And the service still answers.
    assert_eq!(overall(&rls.one("basic", &[("key1", "x")]).await), Code::Ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_without_a_whole_http2_preface_is_closed_and_others_are_served() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let redis = RedisServer::start();
    let mut rls = start(&redis.url(), "preface", BASIC, RlsOptions::default()).await;
    let mut silent = tokio::net::TcpStream::connect(rls.addr)
        .await
        .expect("connect");
    let mut half = tokio::net::TcpStream::connect(rls.addr)
        .await
        .expect("connect");
    half.write_all(b"PRI * HTTP/2.0\r\n").await.expect("write");
    // Served meanwhile.
    assert_eq!(overall(&rls.one("basic", &[("key1", "p")]).await), Code::Ok);
    let bound = tollgate_rls::PREFACE_TIMEOUT + Duration::from_secs(10);
    for conn in [&mut silent, &mut half] {
        let mut buf = [0u8; 64];
        let closed = tokio::time::timeout(bound, async {
            loop {
                match conn.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => continue, // the server's SETTINGS / GOAWAY
                }
            }
        })
        .await;
        assert!(
            closed.is_ok(),
            "the server closes a connection without a preface"
        );
    }
    assert_eq!(overall(&rls.one("basic", &[("key1", "p")]).await), Code::Ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_distinct_overrides_than_the_cache_holds_stay_correct_and_bounded() {
    let redis = RedisServer::start();
    let mut rls = start(&redis.url(), "ovrmany", BASIC, RlsOptions::default()).await;
    let before = rls.limiter.metrics().policies().len();
    // Past the service's cache bound (1024 quotas), then the first quotas again (evicted).
    let quotas = (1..=1100u32)
        .map(|r| ("v", r))
        .chain((1..=8).map(|r| ("w", r)));
    for (pass, rpu) in quotas {
        let value = format!("{pass}{rpu}");
        let r = rls
            .call(request(
                "basic",
                vec![with_override(desc(&[("key3", &value)]), rpu, MINUTE)],
            ))
            .await;
        let limit = r.statuses[0].current_limit.clone().expect("current_limit");
        assert_eq!((limit.requests_per_unit, limit.unit), (rpu, MINUTE));
        assert_eq!(code(&r.statuses[0]), Code::Ok, "{value}");
        assert_eq!(r.statuses[0].limit_remaining, rpu - 1, "{value}");
    }
    // The first quotas again, their policies long evicted from the cache: the same clients
    // under the same rule name read their state on, one request already spent.
    for rpu in 2..=9u32 {
        let value = format!("v{rpu}");
        let r = rls
            .call(request(
                "basic",
                vec![with_override(desc(&[("key3", &value)]), rpu, MINUTE)],
            ))
            .await;
        assert_eq!(code(&r.statuses[0]), Code::Ok, "{value}");
        assert_eq!(
            r.statuses[0].limit_remaining,
            rpu - 2,
            "{value}: state kept"
        );
    }
    // One metric series for every override of the rule, not one per quota.
    let after = rls.limiter.metrics().policies().len();
    assert!(after <= before + 1, "{before} -> {after} policies");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_reuses_an_answer_for_a_second_unless_the_store_failed_since() {
    let mut redis = RedisServer::start();
    let clock = tollgate::clock::ManualClock::new(T0);
    let l = limiter(&redis.url(), "hc", &clock, Duration::from_millis(100));
    let health = tollgate_rls::HealthService::with_clock(l.clone(), Arc::new(clock.clone()));
    assert!(health.ready().await);
    redis.kill();
    // No ping within READY_CACHE: the store's death is not seen yet...
    assert!(health.ready().await, "cached");
    clock.advance(tollgate_rls::READY_CACHE - Duration::from_micros(1));
    assert!(health.ready().await, "still cached");
    // ...until the answer is a second old.
    clock.advance(Duration::from_micros(1));
    assert!(!health.ready().await, "pinged again");

    // A store error counted since the last answer forces a ping at once.
    let mut redis = RedisServer::start();
    let l = limiter(&redis.url(), "hc2", &clock, Duration::from_millis(100));
    let health = tollgate_rls::HealthService::with_clock(l.clone(), Arc::new(clock.clone()));
    let mut rls = start_with(l, clock.clone(), BASIC, RlsOptions::default()).await;
    assert!(health.ready().await);
    redis.kill();
    assert_eq!(overall(&rls.one("basic", &[("key1", "x")]).await), Code::Ok);
    assert!(
        !health.ready().await,
        "a store error since invalidates the answer"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_descriptors_of_one_rule_each_get_their_own_status() {
    let redis = RedisServer::start();
    let mut rls = start(&redis.url(), "many", BASIC, RlsOptions::default()).await;
    // key3 is 10/hour. v0 three times (one item of cost 3), then v1..v99 once each.
    let descriptors = || {
        let mut d = vec![desc(&[("key3", "v0")]); 3];
        d.extend((1..100).map(|i| desc(&[("key3", &format!("v{i}"))])));
        d
    };
    for (round, (v0, others)) in [(7, 9), (4, 8)].into_iter().enumerate() {
        let r = rls.call(request("basic", descriptors())).await;
        assert_eq!(overall(&r), Code::Ok, "round {round}");
        assert_eq!(r.statuses.len(), 102);
        for (k, s) in r.statuses.iter().enumerate() {
            let want = if k < 3 { v0 } else { others };
            assert_eq!(
                (code(s), s.limit_remaining),
                (Code::Ok, want),
                "{round} {k}"
            );
            let limit = s.current_limit.clone().expect("current_limit");
            assert_eq!(limit.requests_per_unit, 10);
        }
    }
    // v0 has 4 left: 5 more is over the limit for v0's statuses only, and nothing is charged.
    let mut d = vec![desc(&[("key3", "v0")]); 5];
    d.push(desc(&[("key3", "v1")]));
    let r = rls.call(request("basic", d)).await;
    assert_eq!(overall(&r), Code::OverLimit);
    for s in &r.statuses[..5] {
        assert_eq!(code(s), Code::OverLimit);
    }
    assert_eq!(code(&r.statuses[5]), Code::Ok);
    let r = rls.one("basic", &[("key3", "v1")]).await;
    assert_eq!(
        r.statuses[0].limit_remaining, 7,
        "v1 was not charged by the denied request"
    );
}

/// A frozen store holds a call no longer than the store's own timeout (500 ms here), far below
/// the call's 5 s deadline, which covers the request's body, not the decision: the call is
/// answered by the failure policy, never cancelled, and the next one is decided again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_store_holds_a_call_only_as_long_as_the_stores_timeout() {
    let redis = RedisServer::start();
    let mut rls = start(&redis.url(), "frozen", BASIC, RlsOptions::default()).await;
    assert_eq!(overall(&rls.one("basic", &[("key3", "a")]).await), Code::Ok);
    redis.pause();
    let started = std::time::Instant::now();
    let answer = rls
        .client
        .should_rate_limit(request("basic", vec![desc(&[("key3", "b")])]))
        .await;
    let took = started.elapsed();
    redis.resume();
    assert!(
        took < Duration::from_secs(3),
        "{took:?}: the store's 500 ms bound the decision, not the call's 5 s"
    );
    match answer {
        Ok(r) => assert_eq!(overall(&r.into_inner()), Code::Ok, "failed open"),
        Err(status) => assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}"),
    }
    let r = rls.one("basic", &[("key3", "a")]).await;
    assert_eq!(overall(&r), Code::Ok);
}
