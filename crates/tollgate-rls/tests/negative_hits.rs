//! Envoy 1.38's `is_negative_hits` and `algorithm: concurrency` rules through the gRPC
//! service, on a real `redis-server` and on the memory store: a negative-hits descriptor gives
//! its hits back exactly, never below a fresh state and never OVER_LIMIT; a concurrency rule
//! admits exactly `requests_per_unit` hits in flight, a negative-hits request frees them, and
//! hits nothing gives back expire after `hold_ttl`, not before. Time is a ManualClock.

mod support;

use std::sync::Arc;
use std::time::Duration;
use support::*;
use tollgate::clock::ManualClock;
use tollgate::{Backend, Limiter, LimiterConfig};
use tollgate_rls::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate_rls::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tollgate_rls::proto::envoy::service::ratelimit::v3::RateLimitResponse;
use tollgate_rls::RlsOptions;
use tollgate_testkit::RedisServer;

const YAML: &str = "\
domain: gb
descriptors:
  - key: tb
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: token_bucket}
  - key: fw
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: log
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: sliding_window_log}
  - key: inflight
    rate_limit: {algorithm: concurrency, requests_per_unit: 3, hold_ttl: 2s, name: inflight}
  - key: ban
    rate_limit: {unit: second, requests_per_unit: 0, name: banned}
";

/// The rate rules the give-back tests run on.
const RATE_KEYS: [&str; 3] = ["tb", "fw", "log"];

fn negative(mut d: RateLimitDescriptor) -> RateLimitDescriptor {
    d.is_negative_hits = true;
    d
}

async fn redis_rls(redis: &RedisServer, prefix: &str) -> Rls {
    start(&redis.url(), prefix, YAML, RlsOptions::default()).await
}

async fn memory_rls() -> Rls {
    let clock = ManualClock::new(T0);
    let mut cfg = LimiterConfig::new(Backend::default());
    cfg.clock = Arc::new(clock.clone());
    start_with(Limiter::new(cfg), clock, YAML, RlsOptions::default()).await
}

impl Rls {
    async fn hits(&mut self, key: &str, value: &str, hits: u64) -> RateLimitResponse {
        let d = with_hits(desc(&[(key, value)]), hits);
        self.call(request("gb", vec![d])).await
    }

    async fn give_back(&mut self, key: &str, value: &str, hits: u64) -> RateLimitResponse {
        let d = negative(with_hits(desc(&[(key, value)]), hits));
        let r = self.call(request("gb", vec![d])).await;
        assert_eq!(overall(&r), Code::Ok, "a give-back is never OVER_LIMIT");
        assert_eq!(code(&r.statuses[0]), Code::Ok);
        r
    }
}

fn remaining(r: &RateLimitResponse) -> u32 {
    r.statuses[0].limit_remaining
}

async fn negative_hits_give_back_exactly(rls: &mut Rls, store: &str) {
    for key in RATE_KEYS {
        let r = rls.hits(key, "exact", 7).await;
        assert_eq!((overall(&r), remaining(&r)), (Code::Ok, 3), "{store} {key}");
        let r = rls.give_back(key, "exact", 4).await;
        assert_eq!(remaining(&r), 7, "{store} {key}: 4 of the 7 given back");
        let r = rls.hits(key, "exact", 1).await;
        assert_eq!(remaining(&r), 6, "{store} {key}");
        // The default hits (the request's, or 1) are given back the same way.
        let d = negative(desc(&[(key, "exact")]));
        let r = rls.call(request("gb", vec![d])).await;
        assert_eq!((overall(&r), remaining(&r)), (Code::Ok, 7), "{store} {key}");
        // Exactly 7 more pass, then OVER_LIMIT: nothing more was given back than asked.
        for i in 0..7 {
            let r = rls.hits(key, "exact", 1).await;
            assert_eq!(overall(&r), Code::Ok, "{store} {key} call {i}");
        }
        let r = rls.hits(key, "exact", 1).await;
        assert_eq!(overall(&r), Code::OverLimit, "{store} {key}");
    }
}

async fn negative_hits_never_go_below_fresh(rls: &mut Rls, store: &str) {
    for key in RATE_KEYS {
        // On a fresh key: nothing changes, the answer is OK with the whole limit.
        let r = rls.give_back(key, "fresh", 1).await;
        assert_eq!(remaining(&r), 10, "{store} {key}");
        // An attacker's flood of negative hits, then a hits_addend far beyond the limit.
        for _ in 0..50 {
            rls.give_back(key, "fresh", 3).await;
        }
        let r = rls.hits(key, "fresh", 4).await;
        assert_eq!(remaining(&r), 6, "{store} {key}");
        let r = rls.give_back(key, "fresh", 4_000_000_000).await;
        assert_eq!(
            remaining(&r),
            10,
            "{store} {key}: back to fresh, not past it"
        );
        // Still exactly the limit admits.
        for i in 0..10 {
            let r = rls.hits(key, "fresh", 1).await;
            assert_eq!(overall(&r), Code::Ok, "{store} {key} call {i}");
        }
        let r = rls.hits(key, "fresh", 1).await;
        assert_eq!(
            overall(&r),
            Code::OverLimit,
            "{store} {key}: no more than the limit"
        );
    }
}

async fn negative_hits_are_never_over_the_limit(rls: &mut Rls, store: &str) {
    let r = rls.hits("fw", "full", 10).await;
    assert_eq!(remaining(&r), 0);
    // A give-back on a key at its limit: OK (give_back asserts it), one unit free.
    let r = rls.give_back("fw", "full", 1).await;
    assert_eq!(remaining(&r), 1, "{store}");
    // Beside a descriptor that is over its limit: the request is OVER_LIMIT, the give-back
    // is OK and happens anyway (it is no charge).
    rls.hits("tb", "full", 10).await;
    let r = rls
        .call(request(
            "gb",
            vec![
                with_hits(desc(&[("tb", "full")]), 1),
                negative(desc(&[("fw", "full")])),
            ],
        ))
        .await;
    assert_eq!(overall(&r), Code::OverLimit, "{store}");
    assert_eq!(code(&r.statuses[0]), Code::OverLimit);
    assert_eq!(code(&r.statuses[1]), Code::Ok);
    assert_eq!(r.statuses[1].limit_remaining, 2, "{store}");
}

async fn a_give_back_and_a_charge_in_one_call_give_back_first(rls: &mut Rls, store: &str) {
    // Envoy's stream end: the estimate (5) back and the real cost (3) charged, in one call,
    // on a key with nothing left: the charge finds the 5 given back.
    assert_eq!(overall(&rls.hits("tb", "end", 10).await), Code::Ok);
    let r = rls
        .call(request(
            "gb",
            vec![
                negative(with_hits(desc(&[("tb", "end")]), 5)),
                with_hits(desc(&[("tb", "end")]), 3),
            ],
        ))
        .await;
    assert_eq!(overall(&r), Code::Ok, "{store}");
    assert_eq!(code(&r.statuses[1]), Code::Ok);
    assert_eq!(r.statuses[1].limit_remaining, 2, "{store}: 10 - 5 + 3 used");
}

async fn a_concurrency_rule_counts_hits_in_flight(rls: &mut Rls, store: &str) {
    // Exactly requests_per_unit pass, then OVER_LIMIT.
    for i in 0..5u32 {
        let r = rls.hits("inflight", "user", 1).await;
        let want = if i < 3 { Code::Ok } else { Code::OverLimit };
        assert_eq!(overall(&r), want, "{store} request {i}");
        let limit = r.statuses[0].current_limit.clone().expect("current_limit");
        assert_eq!(
            (limit.name.as_str(), limit.requests_per_unit, limit.unit),
            ("inflight", 3, 0),
            "the limit in flight, unit UNKNOWN"
        );
    }
    // A negative-hits request frees one: exactly one more passes.
    let r = rls.give_back("inflight", "user", 1).await;
    assert_eq!(remaining(&r), 1, "{store}");
    assert_eq!(overall(&rls.hits("inflight", "user", 1).await), Code::Ok);
    assert_eq!(
        overall(&rls.hits("inflight", "user", 1).await),
        Code::OverLimit
    );
    // Another user has its own holds.
    assert_eq!(overall(&rls.hits("inflight", "other", 3).await), Code::Ok);
    // Hits nothing gives back are held for hold_ttl (2 s), not less...
    rls.clock.advance(Duration::from_millis(1_999));
    let r = rls.hits("inflight", "user", 1).await;
    assert_eq!(overall(&r), Code::OverLimit, "{store}: not before hold_ttl");
    // ...and dropped within hold_ttl + 2 buckets (hold_ttl / 4).
    rls.clock.advance(Duration::from_millis(501));
    for i in 0..3 {
        let r = rls.hits("inflight", "user", 1).await;
        assert_eq!(overall(&r), Code::Ok, "{store}: expired holds, request {i}");
    }
    assert_eq!(
        overall(&rls.hits("inflight", "user", 1).await),
        Code::OverLimit
    );
    // A flood of negative hits frees what is held, never more.
    for _ in 0..20 {
        rls.give_back("inflight", "user", 2).await;
    }
    for i in 0..3 {
        let r = rls.hits("inflight", "user", 1).await;
        assert_eq!(
            overall(&r),
            Code::Ok,
            "{store}: after the flood, request {i}"
        );
    }
    assert_eq!(
        overall(&rls.hits("inflight", "user", 1).await),
        Code::OverLimit,
        "{store}: a flood of negative hits never admits more than the limit"
    );
}

macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        mod on_redis {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let redis = RedisServer::start();
                    let mut rls = redis_rls(&redis, stringify!($name)).await;
                    super::$name(&mut rls, "redis").await;
                }
            )*
        }
        mod on_memory {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let mut rls = memory_rls().await;
                    super::$name(&mut rls, "memory").await;
                }
            )*
        }
    };
}

on_both_stores!(
    negative_hits_give_back_exactly,
    negative_hits_never_go_below_fresh,
    negative_hits_are_never_over_the_limit,
    a_give_back_and_a_charge_in_one_call_give_back_first,
    a_concurrency_rule_counts_hits_in_flight,
);

/// A YAML with `rate_limit` lines `lines`: its first error's (line, key, message).
fn refusal(lines: &str) -> (usize, String, String) {
    let yaml = format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n{lines}");
    let e = tollgate_rls::config::load_str([("odd.yaml", yaml.as_str())]).expect_err("refused");
    let first = &e.0[0];
    assert_eq!(first.file, "odd.yaml");
    (first.line, first.key.clone(), first.message.clone())
}

#[test]
fn odd_hold_ttls_are_refused_with_the_file_line_and_key_never_the_value() {
    let key = "descriptors[0].rate_limit.hold_ttl";
    for (value, says) in [
        ("0", "no valid unit"),
        ("0s", "above zero"),
        ("99999999999999999999d", "too large"),
        ("99999999999999d", "too large"),
        ("400d", "at most 366d"),
        ("soon", "not a duration"),
        ("\"-5s\"", "not a duration"),
        ("[1, 2]", "expected a string"),
    ] {
        let lines = format!(
            "      algorithm: concurrency\n      requests_per_unit: 5\n      hold_ttl: {value}\n"
        );
        let (line, k, message) = refusal(&lines);
        assert_eq!((line, k.as_str()), (7, key), "{value}: {message}");
        assert!(message.contains(says), "{value}: {message}");
        // (A one-character value may appear in the help text's examples.)
        let shown = value.trim_matches('"');
        assert!(
            shown.len() < 2 || !message.contains(shown),
            "{value} echoed: {message}"
        );
    }
}

#[test]
fn a_concurrency_rule_takes_no_unit_and_hold_ttl_needs_concurrency() {
    let (line, key, message) =
        refusal("      algorithm: concurrency\n      unit: second\n      requests_per_unit: 5\n");
    assert_eq!((line, key.as_str()), (6, "descriptors[0].rate_limit.unit"));
    assert!(message.contains("takes no unit"), "{message}");
    let (line, key, message) =
        refusal("      unit: second\n      requests_per_unit: 5\n      hold_ttl: 5m\n");
    assert_eq!(
        (line, key.as_str()),
        (7, "descriptors[0].rate_limit.hold_ttl")
    );
    assert!(
        message.contains("only `algorithm: concurrency`"),
        "{message}"
    );
    let (_, key, _) = refusal("      algorithm: concurrency\n      requests_per_unit: 0\n");
    assert_eq!(key, "descriptors[0].rate_limit.requests_per_unit");
    // The default hold_ttl is 5 minutes.
    let c = tollgate_rls::config::load_str([(
        "ok.yaml",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {algorithm: concurrency, requests_per_unit: 10}\n",
    )])
    .expect("valid");
    let tollgate_rls::config::RuleLimit::InFlight {
        requests_per_unit,
        hold_ttl,
        limit,
    } = c.rules()[0].limit
    else {
        panic!("an in-flight rule")
    };
    assert_eq!(
        (requests_per_unit, hold_ttl),
        (10, Duration::from_secs(300))
    );
    assert!(limit.algorithm().is_concurrency());
}

/// A give-back to a rule that admits nothing (`requests_per_unit: 0`, or a limit override of
/// 0) has nothing to give back: OK, nothing remaining, the rule's limit of 0 reported, no
/// reset, and the request's other descriptors decided as without it. The same request
/// charging the banned rule is refused.
#[tokio::test]
async fn a_give_back_to_a_rule_that_admits_nothing_gives_nothing_and_denies_nothing() {
    use tollgate_rls::proto::envoy::service::ratelimit::v3::rate_limit_response::RateLimit;
    let mut rls = memory_rls().await;
    // Unit::Second on the wire, as the rule's and the override's.
    let second = 1;
    let cases = [
        (desc(&[("ban", "x")]), "banned"),
        (with_override(desc(&[("fw", "x")]), 0, second), ""),
    ];
    for (d, name) in cases {
        let r = rls
            .call(request(
                "gb",
                vec![negative(d.clone()), desc(&[("fw", "y")])],
            ))
            .await;
        assert_eq!(
            overall(&r),
            Code::Ok,
            "{name:?}: nothing given back, nothing denied"
        );
        let s = &r.statuses[0];
        assert_eq!((code(s), s.limit_remaining), (Code::Ok, 0), "{name:?}");
        assert_eq!(
            s.current_limit,
            Some(RateLimit {
                name: name.into(),
                requests_per_unit: 0,
                unit: second,
            }),
            "{name:?}"
        );
        assert_eq!(s.duration_until_reset, None, "{name:?}");
        assert_eq!(
            r.statuses[1].limit_remaining,
            if name.is_empty() { 8 } else { 9 }
        );
        let r = rls.call(request("gb", vec![d])).await;
        assert_eq!(
            overall(&r),
            Code::OverLimit,
            "{name:?}: charged, it is refused"
        );
    }
}
