//! The limiter over the embedded store: decisions, shadow policies, multi-policy requests and
//! the metrics they leave behind. Time is a ManualClock: nothing sleeps.

mod common;

use std::sync::Arc;
use std::time::Duration;
use tollgate::clock::ManualClock;
use tollgate::metrics::MostLimited;
use tollgate::quota::{Algorithm, Limit, Quota};
use tollgate::{Action, ClientKey, Limiter, LimiterConfig, Outcome, Policy, PolicySpec};

const T0: u64 = 1_800_000_000_000_000;

fn limiter(clock: &ManualClock) -> Limiter {
    Limiter::new(LimiterConfig {
        clock: Arc::new(clock.clone()),
        ..LimiterConfig::default()
    })
}

fn spec(name: &str, alg: Algorithm, limit: u64, period: Duration) -> PolicySpec {
    let quota = Quota::new(limit, period).expect("quota");
    PolicySpec::new(name, Limit::new(alg, quota).expect("limit"))
}

fn client(i: u8) -> ClientKey {
    ClientKey([i; 16])
}

/// An enforced policy on `l`: `limit` per `period_s` seconds.
fn policy(l: &Limiter, name: &str, alg: Algorithm, limit: u64, period_s: u64) -> Policy {
    let period = Duration::from_secs(period_s);
    l.policy(spec(name, alg, limit, period)).expect("policy")
}

/// The action for one request of client `c` matched by `policies`.
async fn action(l: &Limiter, c: u8, policies: &[&Policy]) -> Action {
    let plan = tollgate::Plan::for_client(client(c), policies.iter().copied());
    l.check(&plan).await.action
}

#[tokio::test]
async fn admits_the_limit_then_rejects_with_the_exact_retry_time() {
    let clock = ManualClock::new(T0);
    let l = limiter(&clock);
    let p = policy(&l, "api", Algorithm::Gcra, 5, 60);
    for left in (0..5).rev() {
        let r = l.check(&tollgate::Plan::for_client(client(1), [&p])).await;
        assert_eq!(r.action, Action::Allow);
        let d = r.results[0].decision.expect("decision");
        assert_eq!(d.remaining, left);
    }
    let r = l.check(&tollgate::Plan::for_client(client(1), [&p])).await;
    assert_eq!(
        r.action,
        Action::Limit {
            retry_after: Some(Duration::from_secs(12))
        }
    );
    assert_eq!(r.results[0].outcome, Outcome::Limited);
    assert_eq!(r.violated().collect::<Vec<_>>(), vec!["api"]);
    clock.advance(Duration::from_secs(12));
    assert_eq!(action(&l, 1, &[&p]).await, Action::Allow);
    assert_eq!(p.name(), "api");
    let metrics = l.metrics();
    let stats = &metrics.policies()[0];
    assert_eq!(stats.decisions(Outcome::Allowed), 6);
    assert_eq!(stats.decisions(Outcome::Limited), 1);
}

#[tokio::test]
async fn clients_are_independent() {
    let clock = ManualClock::new(T0);
    let l = limiter(&clock);
    let p = policy(&l, "api", Algorithm::FixedWindow, 1, 60);
    assert_eq!(action(&l, 1, &[&p]).await, Action::Allow);
    assert!(matches!(action(&l, 1, &[&p]).await, Action::Limit { .. }));
    assert_eq!(action(&l, 2, &[&p]).await, Action::Allow);
}

#[tokio::test]
async fn shadow_policies_count_but_never_reject() {
    let clock = ManualClock::new(T0);
    let l = limiter(&clock);
    let mut s = spec("dry", Algorithm::TokenBucket, 2, Duration::from_secs(60));
    s.shadow = true;
    let dry = l.policy(s).expect("policy");
    let api = policy(&l, "api", Algorithm::TokenBucket, 100, 60);
    for _ in 0..5 {
        assert_eq!(action(&l, 1, &[&api, &dry]).await, Action::Allow);
    }
    let metrics = l.metrics();
    let stats = metrics.policies();
    let dry_stats = stats
        .iter()
        .find(|s| s.decisions(Outcome::ShadowLimited) > 0);
    assert_eq!(
        dry_stats.map(|s| s.decisions(Outcome::ShadowLimited)),
        Some(3)
    );
    // The enforcing policy was charged for every request the shadow one would have rejected.
    let r = l
        .check(&tollgate::Plan::for_client(client(1), [&api]))
        .await;
    assert_eq!(r.results[0].decision.map(|d| d.remaining), Some(94));
}

#[tokio::test]
async fn several_policies_are_all_or_nothing() {
    let clock = ManualClock::new(T0);
    let l = limiter(&clock);
    let small = policy(&l, "small", Algorithm::SlidingWindowLog, 2, 10);
    let big = policy(&l, "big", Algorithm::FixedWindow, 10, 3600);
    for _ in 0..2 {
        assert_eq!(action(&l, 1, &[&small, &big]).await, Action::Allow);
    }
    let r = l
        .check(&tollgate::Plan::for_client(client(1), [&small, &big]))
        .await;
    assert!(matches!(
        r.action,
        Action::Limit {
            retry_after: Some(_)
        }
    ));
    // "big" was not charged by the rejected request: 8 left, not 7.
    let big_result = r
        .results
        .iter()
        .find(|x| x.policy.name() == "big")
        .expect("big");
    assert_eq!(big_result.decision.map(|d| d.remaining), Some(8));
    assert_eq!(r.most_constrained().map(|x| x.policy.name()), Some("small"));
}

#[tokio::test]
async fn a_policy_not_charged_because_another_denied_counts_not_charged() {
    let clock = ManualClock::new(T0);
    let l = limiter(&clock);
    let per_key = policy(&l, "per_key", Algorithm::TokenBucket, 1, 3600);
    let per_ip = policy(&l, "per_ip", Algorithm::TokenBucket, 100, 3600);
    for _ in 0..5 {
        action(&l, 1, &[&per_key, &per_ip]).await;
    }
    let r = l
        .check(&tollgate::Plan::for_client(client(1), [&per_key, &per_ip]))
        .await;
    let outcome = |name: &str| {
        r.results
            .iter()
            .find(|x| x.policy.name() == name)
            .map(|x| x.outcome)
    };
    assert_eq!(outcome("per_ip"), Some(Outcome::NotCharged));
    let m = l.metrics();
    let count = |name: &str, o: Outcome| m.policy(name).map(|p| p.decisions(o));
    // One admission, five denials: per_ip was charged once, and says so.
    assert_eq!(count("per_key", Outcome::Limited), Some(5));
    assert_eq!(count("per_ip", Outcome::Allowed), Some(1));
    assert_eq!(count("per_ip", Outcome::NotCharged), Some(5));
    let mut text = String::new();
    l.render_metrics(&mut text);
    assert!(
        text.contains("tollgate_decisions_total{policy=\"per_ip\",outcome=\"not_charged\"} 5"),
        "{text}"
    );
}

#[tokio::test]
async fn a_cost_beyond_capacity_is_rejected_without_retry_time() {
    let clock = ManualClock::new(T0);
    let l = limiter(&clock);
    // A fixed cost the limit can never admit is refused when the policy is made, naming the
    // field; a request that asks for such a cost on its own (an RLS hits_addend) is denied
    // with no retry time.
    let mut s = spec("api", Algorithm::TokenBucket, 5, Duration::from_secs(1));
    s.cost = 6;
    let err = l
        .policy(s.clone())
        .expect_err("cost 6 never fits a burst of 5");
    assert!(
        matches!(
            &err,
            tollgate::Error::InvalidPolicy {
                field: tollgate::PolicyField::Cost,
                ..
            }
        ),
        "{err}"
    );
    s.cost = 1;
    let p = l.policy(s).expect("policy").with_cost(6);
    let r = l.check(&tollgate::Plan::for_client(client(1), [&p])).await;
    assert_eq!(r.action, Action::Limit { retry_after: None });
}

#[tokio::test]
async fn metrics_render_every_family() {
    let clock = ManualClock::new(T0);
    let l = limiter(&clock);
    let p = policy(&l, "api", Algorithm::Gcra, 1, 60);
    l.check(&tollgate::Plan::for_client(client(1), [&p])).await;
    l.check(&tollgate::Plan::for_client(client(1), [&p])).await;
    let mut out = String::new();
    l.render_metrics(&mut out);
    for needle in [
        "tollgate_decisions_total{policy=\"api\",outcome=\"allowed\"} 1\n",
        "tollgate_decisions_total{policy=\"api\",outcome=\"limited\"} 1\n",
        "# TYPE tollgate_store_duration_seconds histogram\n",
        "tollgate_store_errors_total{kind=\"timeout\"} 0\n",
        "tollgate_breaker_open 0\n",
        "tollgate_deny_cache_hits_total{policy=\"api\"} 0\n",
        "tollgate_memory_keys 1\n",
        "tollgate_lease_units_total{policy=\"api\",kind=\"granted\"} 0\n",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in\n{out}");
    }
    assert!(l.ready().await);
}

#[tokio::test]
async fn invalid_policies_are_rejected_with_a_reason() {
    let l = Limiter::new(LimiterConfig::default());
    let quota = Quota::per_second(200_000).expect("quota");
    // A limit the algorithm cannot run does not exist: no policy can be built with it.
    let err = Limit::new(Algorithm::SlidingWindowLog, quota).expect_err("too large a log");
    assert!(err.to_string().contains("sliding_window_log"), "{err}");
    let mut s = spec("x", Algorithm::Gcra, 5, Duration::from_secs(1));
    s.local_divisor = 0;
    assert!(l.policy(s).is_err());
    let s = spec("", Algorithm::Gcra, 5, Duration::from_secs(1));
    assert!(l.policy(s).is_err());
}

#[tokio::test]
async fn limited_decisions_and_only_they_count_a_client_among_the_most_limited() {
    let clock = ManualClock::new(T0);
    let l = limiter(&clock);
    let api = policy(&l, "api", Algorithm::TokenBucket, 3, 60);
    let shadow = l
        .policy(PolicySpec {
            shadow: true,
            ..spec(
                "dry-run",
                Algorithm::TokenBucket,
                1,
                Duration::from_secs(60),
            )
        })
        .expect("policy");
    for _ in 0..10 {
        l.check(&tollgate::Plan::for_client(client(1), [&api, &shadow]))
            .await;
    }
    for _ in 0..3 {
        l.check(&tollgate::Plan::for_client(client(2), [&api]))
            .await;
    }
    let MostLimited {
        clients: top,
        limited,
    } = l.top_limited(10);
    assert_eq!(
        limited, 7,
        "client 1's 7 rejections; shadow denials are not limits"
    );
    assert_eq!(top.len(), 1, "{top:?}");
    assert_eq!((top[0].client, &*top[0].policy), (client(1), "api"));
    assert_eq!((top[0].count, top[0].error), (7, 0));
    // Five minutes later the list has moved on.
    clock.advance(Duration::from_secs(300));
    assert!(l.top_limited(10).clients.is_empty());
}

/// A check's future is moved several times on its way through a gateway (into the tower
/// layer's box, through tracing's instrument), so its size is paid on every request. The
/// memory store's must not carry the Redis store's connect or call futures: those are boxed
/// where they start. (The Redis backend is compiled in when the workspace's tests run, as
/// the gateway enables it: 15,696 bytes before the boxing, 760 after. Since a Redis decision
/// became one call borrowed in place across one await, 424 in a test build; bound by value
/// out of an `Option` instead, the call took its room twice, 688 in a release build.)
#[test]
fn a_checks_future_stays_small() {
    let clock = ManualClock::new(T0);
    let l = limiter(&clock);
    let p = policy(&l, "api", Algorithm::Gcra, 5, 60);
    let plan = tollgate::Plan::for_client(client(1), [&p]);
    let size = std::mem::size_of_val(&l.check(&plan));
    eprintln!("Limiter::check future: {size} bytes");
    assert!(size <= 512, "Limiter::check's future is {size} bytes");
}

/// Whatever a policy is named, its `RateLimit-Policy` item and its `RateLimit` value are
/// printable ASCII: a header value that needs no check where it is written (decision mode
/// writes them into its answers as they are).
#[tokio::test]
async fn header_values_are_printable_ascii_whatever_the_name() {
    use tollgate::headers::{ratelimit_policy_item, write_ratelimit};
    let clock = ManualClock::new(T0);
    let l = limiter(&clock);
    let mut names: Vec<String> = (0u8..128).map(|b| format!("a{}z", b as char)).collect();
    names.extend(
        [
            "é",
            "\u{2028}",
            "\u{feff}x",
            "\"\\\"",
            "🦀",
            "\r\nx-injected: 1",
        ]
        .map(String::from),
    );
    let printable = |b: &[u8]| b.iter().all(|c| (b' '..=b'~').contains(c));
    let mut checked = 0;
    for (i, name) in names.iter().enumerate() {
        let Ok(p) = l.policy(spec(
            name,
            Algorithm::TokenBucket,
            10,
            Duration::from_secs(60),
        )) else {
            continue;
        };
        let plan = tollgate::Plan::for_client(client(i as u8), [&p]);
        let result = l.check(&plan).await;
        let item = ratelimit_policy_item(&result).expect("one policy advertised");
        assert!(printable(&item), "{name:?}: {item:?}");
        let mut value = Vec::new();
        write_ratelimit(&result, &mut value).expect("a value");
        assert!(printable(&value), "{name:?}: {value:?}");
        checked += 1;
    }
    assert!(checked > 100, "only {checked} names were accepted");
}

/// The header values as bytes (a policy's item shared as written when it was built,
/// `RateLimit` written on the stack or at the end of a buffer) are exactly the strings the
/// RLS writes: one policy,
/// several, shadow ones, names that need escaping and a name too long for the stack buffer.
#[tokio::test]
async fn header_values_as_bytes_are_the_strings_byte_for_byte() {
    use tollgate::headers::{
        ratelimit, ratelimit_policy, ratelimit_policy_value, ratelimit_value, write_ratelimit,
    };
    let clock = ManualClock::new(T0);
    let l = limiter(&clock);
    let long = "n".repeat(300);
    let api = policy(&l, "api", Algorithm::TokenBucket, 100, 60);
    let odd = policy(&l, "we\"ird\\ né", Algorithm::FixedWindow, 7, 3600);
    let big = policy(&l, &long, Algorithm::Gcra, 1_000_000, 86_400);
    let mut shadow_spec = spec("dry", Algorithm::Gcra, 3, Duration::from_secs(1));
    shadow_spec.shadow = true;
    let dry = l.policy(shadow_spec).expect("policy");
    let cases: [&[&Policy]; 6] = [
        &[&api],
        &[&odd],
        &[&big],
        &[&api, &odd],
        &[&dry],
        &[&dry, &api, &big],
    ];
    for (i, policies) in cases.iter().enumerate() {
        for _ in 0..3 {
            let plan = tollgate::Plan::for_client(client(i as u8), policies.iter().copied());
            let result = l.check(&plan).await;
            let as_bytes =
                |b: Option<bytes::Bytes>| b.map(|b| String::from_utf8(b.to_vec()).expect("utf-8"));
            assert_eq!(
                as_bytes(ratelimit_policy_value(&result)),
                ratelimit_policy(&result),
                "case {i}"
            );
            assert_eq!(
                as_bytes(ratelimit_value(&result)),
                ratelimit(&result),
                "case {i}"
            );
            // Written at the end of what a buffer holds already, or not at all.
            let mut out = b"before ".to_vec();
            let wrote = write_ratelimit(&result, &mut out).is_some();
            let expected = ratelimit(&result).map(|v| format!("before {v}"));
            assert_eq!(wrote, expected.is_some(), "case {i}");
            assert_eq!(
                String::from_utf8(out).expect("utf-8"),
                expected.unwrap_or_else(|| "before ".into()),
                "case {i}"
            );
        }
    }
    // Shadow only: nothing advertised either way.
    let plan = tollgate::Plan::for_client(client(9), [&dry]);
    let result = l.check(&plan).await;
    assert_eq!(ratelimit_policy_value(&result), None);
    assert_eq!(ratelimit_value(&result), None);
    // The escaping of a name is the one written once.
    let plan = tollgate::Plan::for_client(client(10), [&odd]);
    let value = ratelimit(&l.check(&plan).await).expect("a value");
    assert!(value.starts_with("\"we\\\"ird\\\\ n?\";r=6;t="), "{value}");
}

#[tokio::test]
async fn check_now_decides_as_check_does_on_the_in_process_store() {
    // Two limiters fed the same requests, one through `check`, one through `check_now`:
    // every answer, outcome and remaining count is the same, and so are the metrics.
    let clock = ManualClock::new(T0);
    let (a, b) = (limiter(&clock), limiter(&clock));
    let mut dry = spec("dry", Algorithm::TokenBucket, 3, Duration::from_secs(60));
    dry.shadow = true;
    let (a_dry, b_dry) = (
        a.policy(dry.clone()).expect("policy"),
        b.policy(dry).expect("policy"),
    );
    let a_api = policy(&a, "api", Algorithm::Gcra, 5, 60);
    let b_api = policy(&b, "api", Algorithm::Gcra, 5, 60);
    let mut denied = 0;
    for i in 0..12u8 {
        let c = i % 2;
        let via_check = a
            .check(&tollgate::Plan::for_client(client(c), [&a_api, &a_dry]))
            .await;
        let now = b
            .check_now(&tollgate::Plan::for_client(client(c), [&b_api, &b_dry]))
            .expect("the in-process store answers at once");
        assert_eq!(via_check.action, now.action, "request {i}");
        let outcomes = |r: &tollgate::LimitResult| -> Vec<(Outcome, Option<u64>)> {
            r.results
                .iter()
                .map(|p| (p.outcome, p.decision.map(|d| d.remaining)))
                .collect()
        };
        assert_eq!(outcomes(&via_check), outcomes(&now), "request {i}");
        denied += usize::from(now.action != Action::Allow);
        clock.advance(Duration::from_secs(1));
    }
    // Each client had 6 requests against 5 (plus the seconds' drip): some were denied.
    assert!(denied > 0);
    let metrics = |l: &Limiter| {
        let mut s = String::new();
        l.render_metrics(&mut s);
        s
    };
    assert_eq!(metrics(&a), metrics(&b));
}

#[tokio::test]
async fn a_plan_of_one_policy_decides_as_it_does_beside_a_shadow_policy_in_every_mode() {
    // A plan of one policy keeps its verdict's one decision inline (nothing allocated), a
    // plan of two does not. A shadow policy that never limits changes nothing of the other's
    // answer, so twin limiters fed the plan alone and the plan beside it must agree on every
    // action (the retry time with it), outcome and remaining count, enforced, in quota mode
    // and in shadow mode, over the limit and back under it.
    for alg in [
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::Gcra,
    ] {
        for mode in ["enforce", "quota", "shadow"] {
            let clock = ManualClock::new(T0);
            let (alone, beside) = (limiter(&clock), limiter(&clock));
            let make = |l: &Limiter| {
                let mut s = spec("api", alg, 3, Duration::from_secs(10));
                s.shadow = mode == "shadow";
                let p = l.policy(s).expect("policy");
                if mode == "quota" {
                    p.in_quota_mode()
                } else {
                    p
                }
            };
            let (p_alone, p_beside) = (make(&alone), make(&beside));
            let mut open = spec(
                "open",
                Algorithm::TokenBucket,
                1_000_000,
                Duration::from_secs(1),
            );
            open.shadow = true;
            let open = beside.policy(open).expect("policy");
            let mut limited = 0;
            for i in 0..16u32 {
                let one = alone
                    .check(&tollgate::Plan::for_client(client(1), [&p_alone]))
                    .await;
                let two = beside
                    .check(&tollgate::Plan::for_client(client(1), [&p_beside, &open]))
                    .await;
                let what = format!("{alg:?} {mode}, request {i}");
                limited += usize::from(common::answered_alike(&one, &two, &what));
                // Four requests a second against 3 in 10 s: limited within the first
                // second, then admitted again as the seconds pass.
                clock.advance(Duration::from_millis(if i % 4 == 3 { 2_500 } else { 10 }));
            }
            assert!(limited > 0, "{alg:?} {mode}: never over the limit");
        }
    }
}

#[cfg(feature = "redis")]
#[test]
fn check_now_does_not_answer_for_a_remote_store() {
    // A remote store waits for its answer: no answer now, and no call is made (nothing
    // listens on port 1, and nothing here awaits).
    let redis = tollgate::store::RedisConfig::standalone("redis://127.0.0.1:1");
    let remote = Limiter::new(LimiterConfig::new(tollgate::Backend::Redis(redis)));
    let p = policy(&remote, "api", Algorithm::Gcra, 5, 60);
    assert!(remote
        .check_now(&tollgate::Plan::for_client(client(1), [&p]))
        .is_none());
}

/// `most_constrained` (what `RateLimit` reports) is the greatest `constraint()` among the
/// enforced results with a decision, the last of equals: checked against that definition
/// written as an iterator chain, over random results with many ties, shadow policies and
/// results without a decision.
#[test]
fn the_most_constrained_result_is_the_last_greatest_enforced_one() {
    use tollgate::{Decision, LimitResult, PolicyResult};
    let clock = ManualClock::new(T0);
    let l = limiter(&clock);
    let mut policies = Vec::new();
    for i in 0..4 {
        policies.push(policy(&l, &format!("p{i}"), Algorithm::TokenBucket, 10, 60));
        let mut s = spec(
            &format!("s{i}"),
            Algorithm::TokenBucket,
            10,
            Duration::from_secs(60),
        );
        s.shadow = true;
        policies.push(l.policy(s).expect("policy"));
    }
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = |n: u64| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % n
    };
    for case in 0..2_000 {
        let len = next(9) as usize;
        let results: Vec<PolicyResult> = (0..len)
            .map(|_| {
                let allowed = next(2) == 0;
                let decision = (next(6) != 0).then(|| Decision {
                    allowed,
                    limit: 10,
                    remaining: next(3),
                    reset_after: Duration::from_secs(next(3)),
                    retry_after: match (allowed, next(4)) {
                        (true, _) => None,
                        (false, 0) => None,
                        (false, w) => Some(Duration::from_millis(w)),
                    },
                });
                PolicyResult {
                    policy: policies[next(policies.len() as u64) as usize].clone(),
                    outcome: Outcome::Allowed,
                    decision,
                }
            })
            .collect();
        let r = LimitResult {
            action: Action::Allow,
            results,
        };
        let expected = r
            .results
            .iter()
            .filter(|x| !x.policy.is_shadow())
            .filter_map(|x| Some((x, x.decision?)))
            .max_by_key(|(_, d)| d.constraint())
            .map(|(x, _)| x as *const PolicyResult);
        assert_eq!(
            r.most_constrained().map(|x| x as *const PolicyResult),
            expected,
            "case {case}"
        );
    }
}
