//! envoyproxy/ratelimit's features of 2026 over gRPC against a real `redis-server`: the ban
//! list (`requests_per_unit: 0`), wildcards anywhere, `share_threshold`, quota mode (per
//! descriptor and global) with all-or-nothing, the global shadow mode, merged domains, the
//! response's dynamic metadata, the bounded detailed metric series, and statuses that stay
//! truthful when the deny cache answers.

mod support;

use prost_types::value::Kind;
use std::time::Duration;
use support::*;
use tollgate_rls::config::LoadOptions;
use tollgate_rls::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tollgate_rls::proto::envoy::service::ratelimit::v3::RateLimitResponse;
use tollgate_rls::RlsOptions;
use tollgate_testkit::RedisServer;

const HOUR: i32 = 3;

fn codes(r: &RateLimitResponse) -> Vec<Code> {
    r.statuses.iter().map(code).collect()
}

fn remaining(r: &RateLimitResponse) -> Vec<u32> {
    r.statuses.iter().map(|s| s.limit_remaining).collect()
}

fn keys_with(redis: &RedisServer, prefix: &str) -> usize {
    redis
        .cli(&["--scan", "--pattern", &format!("{prefix}:*")])
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count()
}

const BAN: &str = "\
domain: ban
descriptors:
  - key: remote_address
    value: 10.0.0.66
    rate_limit: {unit: second, requests_per_unit: 0, name: banned}
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: route
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: shadow_ban
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 0}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_per_unit_0_is_a_ban_list_that_stores_nothing_and_charges_nothing_else() {
    let redis = RedisServer::start();
    let mut rls = start(&redis.url(), "ban", BAN, RlsOptions::default()).await;
    for _ in 0..3 {
        let r = rls.one("ban", &[("remote_address", "10.0.0.66")]).await;
        assert_eq!(overall(&r), Code::OverLimit);
        let s = &r.statuses[0];
        assert_eq!((code(s), s.limit_remaining), (Code::OverLimit, 0));
        let limit = s.current_limit.clone().expect("current_limit");
        assert_eq!(
            (limit.name.as_str(), limit.requests_per_unit),
            ("banned", 0)
        );
        assert!(reset_micros(s) <= 1_000_000);
        // No Retry-After: waiting never helps a banned client.
        assert!(r
            .response_headers_to_add
            .iter()
            .all(|h| h.key != "retry-after"));
        let policy = r
            .response_headers_to_add
            .iter()
            .find(|h| h.key == "ratelimit-policy")
            .expect("ratelimit-policy");
        assert!(
            policy.value.starts_with("\"banned\";q=0;w=1"),
            "{}",
            policy.value
        );
    }
    assert_eq!(keys_with(&redis, "ban"), 0, "a ban stores nothing");
    // A banned address with another descriptor: the request is denied, the other descriptor
    // is charged nothing and reports what it really has left.
    for _ in 0..3 {
        let r = rls
            .call(request(
                "ban",
                vec![
                    desc(&[("remote_address", "10.0.0.66")]),
                    desc(&[("route", "/a")]),
                ],
            ))
            .await;
        assert_eq!(overall(&r), Code::OverLimit);
        assert_eq!(codes(&r), vec![Code::OverLimit, Code::Ok]);
        assert_eq!(remaining(&r), vec![0, 5]);
        // The ban leads the headers, the route's limit after it; nothing remains, and no
        // Retry-After.
        let header = |key: &str| {
            r.response_headers_to_add
                .iter()
                .find(|h| h.key == key)
                .map(|h| h.value.clone())
        };
        let policy = header("ratelimit-policy").expect("ratelimit-policy");
        assert!(
            policy.starts_with("\"banned\";q=0;w=1, \"") && policy.ends_with(";q=5;w=3600"),
            "{policy}"
        );
        assert_eq!(header("ratelimit").as_deref(), Some("\"banned\";r=0;t=1"));
        assert_eq!(header("retry-after"), None);
        assert_eq!(r.response_headers_to_add.len(), 2);
    }
    let r = rls.one("ban", &[("route", "/a")]).await;
    assert_eq!(
        remaining(&r),
        vec![4],
        "the denied requests charged the route nothing"
    );
    // Another address is limited as usual; a shadow ban denies nothing.
    let r = rls.one("ban", &[("remote_address", "10.0.0.7")]).await;
    assert_eq!((overall(&r), remaining(&r)), (Code::Ok, vec![9]));
    let r = rls.one("ban", &[("shadow_ban", "x")]).await;
    assert_eq!((overall(&r), codes(&r)), (Code::Ok, vec![Code::Ok]));
}

const WILD: &str = "\
domain: wild
descriptors:
  - key: path
    value: /api/*/action
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: path
    value: /files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 4}
  - key: path
    value: /own/*
    rate_limit: {unit: hour, requests_per_unit: 4}
  - key: tenant
    value: t*prod
    share_threshold: true
    descriptors:
      - key: path
        value: /v*/items/*
        rate_limit: {unit: hour, requests_per_unit: 6}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wildcards_match_anywhere_and_share_threshold_makes_one_counter() {
    let redis = RedisServer::start();
    let mut rls = start(&redis.url(), "wild", WILD, RlsOptions::default()).await;
    // A wildcard in the middle matches; each value counts on its own without share_threshold.
    let r = rls.one("wild", &[("path", "/api/v1/action")]).await;
    assert_eq!(remaining(&r), vec![2]);
    let r = rls.one("wild", &[("path", "/api/v2/action")]).await;
    assert_eq!(remaining(&r), vec![2], "another value, its own counter");
    let r = rls.one("wild", &[("path", "/api/v1/other")]).await;
    assert!(r.statuses[0].current_limit.is_none(), "no match");
    // share_threshold: every value matching `/files/*` spends one counter.
    for (i, v) in ["/files/a", "/files/b", "/files/c", "/files/d"]
        .iter()
        .enumerate()
    {
        let r = rls.one("wild", &[("path", v)]).await;
        assert_eq!(
            (overall(&r), remaining(&r)),
            (Code::Ok, vec![3 - i as u32]),
            "{v}"
        );
    }
    let r = rls.one("wild", &[("path", "/files/e")]).await;
    assert_eq!(overall(&r), Code::OverLimit, "the shared counter is spent");
    // Without it, the same shape counts per value.
    for v in ["/own/a", "/own/b"] {
        let r = rls.one("wild", &[("path", v)]).await;
        assert_eq!(remaining(&r), vec![3], "{v}");
    }
    // Nested wildcards, several `*`, the parent shared: tenants matching `t*prod` share, the
    // path below counts per value.
    let r = rls
        .one("wild", &[("tenant", "t1prod"), ("path", "/v1/items/9")])
        .await;
    assert_eq!(remaining(&r), vec![5]);
    let r = rls
        .one("wild", &[("tenant", "t2prod"), ("path", "/v1/items/9")])
        .await;
    assert_eq!(
        remaining(&r),
        vec![4],
        "t1prod and t2prod share the tenant level"
    );
    let r = rls
        .one("wild", &[("tenant", "t2prod"), ("path", "/v2/items/1")])
        .await;
    assert_eq!(remaining(&r), vec![5], "another path value");
    let r = rls
        .one("wild", &[("tenant", "t2dev"), ("path", "/v1/items/9")])
        .await;
    assert!(
        r.statuses[0].current_limit.is_none(),
        "t2dev does not match t*prod"
    );
}

const QUOTA: &str = "\
domain: quota
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: plan_a
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: plan_b
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: strict
    rate_limit: {unit: hour, requests_per_unit: 1}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_descriptors_deny_only_when_every_one_is_over_and_all_or_nothing_holds() {
    let redis = RedisServer::start();
    let mut rls = start(&redis.url(), "quota", QUOTA, RlsOptions::default()).await;
    let req = || {
        request(
            "quota",
            vec![
                desc(&[("user", "u")]),
                desc(&[("plan_a", "u")]),
                desc(&[("plan_b", "u")]),
            ],
        )
    };
    // 1st: both quotas have room.
    let r = rls.call(req()).await;
    assert_eq!((overall(&r), remaining(&r)), (Code::Ok, vec![9, 1, 0]));
    // 2nd: plan_b is over but plan_a is not: OK overall, plan_b reports OVER_LIMIT and is
    // charged nothing.
    let r = rls.call(req()).await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(codes(&r), vec![Code::Ok, Code::Ok, Code::OverLimit]);
    assert_eq!(remaining(&r), vec![8, 0, 0]);
    // 3rd: every quota descriptor is over: OVER_LIMIT, and the rate-limit descriptor is not
    // charged (all-or-nothing).
    for _ in 0..3 {
        let r = rls.call(req()).await;
        assert_eq!(overall(&r), Code::OverLimit);
        assert_eq!(codes(&r), vec![Code::Ok, Code::OverLimit, Code::OverLimit]);
        assert_eq!(remaining(&r)[0], 8, "user not charged by a denied request");
    }
    // A rate-limit descriptor denies as usual, whatever the quotas say.
    let strict = |who: &str| {
        request(
            "quota",
            vec![desc(&[("strict", who)]), desc(&[("plan_a", who)])],
        )
    };
    let r = rls.call(strict("v")).await;
    assert_eq!((overall(&r), remaining(&r)), (Code::Ok, vec![0, 1]));
    let r = rls.call(strict("v")).await;
    assert_eq!(overall(&r), Code::OverLimit);
    assert_eq!(
        remaining(&r),
        vec![0, 1],
        "plan_a not charged by the denial"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_global_quota_mode_puts_every_rule_in_quota_mode() {
    let redis = RedisServer::start();
    let options = RlsOptions {
        quota_mode: true,
        ..RlsOptions::default()
    };
    let mut rls = start(&redis.url(), "gquota", QUOTA, options).await;
    let req = || {
        request(
            "quota",
            vec![desc(&[("strict", "w")]), desc(&[("user", "w")])],
        )
    };
    assert_eq!(overall(&rls.call(req()).await), Code::Ok);
    // strict is over, but in quota mode and user is not: OK.
    let r = rls.call(req()).await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(codes(&r), vec![Code::OverLimit, Code::Ok]);
    // Alone, an over quota descriptor is every quota descriptor of its request.
    let r = rls.one("quota", &[("strict", "w")]).await;
    assert_eq!(overall(&r), Code::OverLimit);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_global_shadow_mode_never_answers_over_limit_but_reports_each_descriptor() {
    let redis = RedisServer::start();
    let options = RlsOptions {
        shadow_mode: true,
        ..RlsOptions::default()
    };
    let mut rls = start(&redis.url(), "gshadow", QUOTA, options).await;
    let r = rls.one("quota", &[("strict", "s")]).await;
    assert_eq!((overall(&r), remaining(&r)), (Code::Ok, vec![0]));
    for _ in 0..3 {
        let r = rls.one("quota", &[("strict", "s")]).await;
        assert_eq!(overall(&r), Code::Ok);
        assert_eq!(codes(&r), vec![Code::OverLimit]);
    }
    let ban = start(&redis.url(), "gshadow2", BAN, options).await;
    let mut ban = ban;
    let r = ban.one("ban", &[("remote_address", "10.0.0.66")]).await;
    assert_eq!((overall(&r), codes(&r)), (Code::Ok, vec![Code::OverLimit]));
    let mut text = String::new();
    rls.limiter.render_metrics(&mut text);
    assert!(
        text.contains(
            "tollgate_decisions_total{policy=\"quota.strict\",outcome=\"shadow_limited\"} 3"
        ),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_domains_serves_a_domain_split_across_files() {
    let redis = RedisServer::start();
    let a = "domain: split\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 2}\n";
    let b = "domain: split\ndescriptors:\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 3}\n";
    let merged = LoadOptions {
        merge_domains: true,
    };
    assert!(
        tollgate_rls::config::load_str([("a.yaml", a), ("b.yaml", b)]).is_err(),
        "without merge_domains: one domain per file"
    );
    let mut rls = start_files(
        &redis.url(),
        "merge",
        &[("a.yaml", a), ("b.yaml", b)],
        merged,
        RlsOptions::default(),
    )
    .await;
    let r = rls
        .call(request(
            "split",
            vec![desc(&[("a", "x")]), desc(&[("b", "x")])],
        ))
        .await;
    assert_eq!(remaining(&r), vec![1, 2]);
    // The same descriptor in two files is still an error, at the second file.
    let e = tollgate_rls::config::load_str_with([("a.yaml", a), ("a2.yaml", a)], merged)
        .expect_err("duplicate across files");
    assert_eq!(e.0[0].file, "a2.yaml");
    assert!(e.0[0].message.contains("duplicate"), "{}", e.0[0].message);
}

const META: &str = "\
domain: meta
descriptors:
  - key: model
    value: gpt
    metadata:
      billing: {tier: gold, weight: 2}
      owner: team-a
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: user
    metadata:
      billing: {tier: silver, region: eu}
      flags: [1, true, null]
    rate_limit: {unit: hour, requests_per_unit: 10}
";

fn field<'a>(s: &'a prost_types::Struct, k: &str) -> &'a Kind {
    s.fields
        .get(k)
        .and_then(|v| v.kind.as_ref())
        .unwrap_or_else(|| panic!("no field {k} in {s:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamic_metadata_carries_the_request_and_the_passed_descriptors_metadata() {
    let redis = RedisServer::start();
    let options = RlsOptions {
        dynamic_metadata: true,
        ..RlsOptions::default()
    };
    let mut rls = start(&redis.url(), "meta", META, options).await;
    let mut req = request(
        "meta",
        vec![
            desc(&[("model", "gpt")]),
            with_hits(desc(&[("user", "u1")]), 1),
        ],
    );
    req.hits_addend = 1;
    let r = rls.call(req.clone()).await;
    let m = r.dynamic_metadata.clone().expect("dynamic_metadata");
    assert_eq!(field(&m, "domain"), &Kind::StringValue("meta".into()));
    assert_eq!(field(&m, "hitsAddend"), &Kind::NumberValue(1.0));
    let Kind::ListValue(list) = field(&m, "descriptors") else {
        panic!("descriptors is a list");
    };
    assert_eq!(list.values.len(), 2);
    let Some(Kind::StructValue(first)) = &list.values[0].kind else {
        panic!("a descriptor is a struct");
    };
    let Kind::ListValue(entries) = field(first, "entries") else {
        panic!("entries is a list");
    };
    assert_eq!(
        entries.values[0].kind,
        Some(Kind::StringValue("model=gpt".into()))
    );
    // Both passed: merged, the first descriptor's values kept where both have a key.
    let Kind::StructValue(meta) = field(&m, "metadata") else {
        panic!("metadata is a struct");
    };
    let Kind::StructValue(billing) = field(meta, "billing") else {
        panic!("billing is a struct");
    };
    assert_eq!(field(billing, "tier"), &Kind::StringValue("gold".into()));
    assert_eq!(field(billing, "weight"), &Kind::NumberValue(2.0));
    assert_eq!(field(billing, "region"), &Kind::StringValue("eu".into()));
    assert_eq!(field(meta, "owner"), &Kind::StringValue("team-a".into()));
    // Next: `model` is over its limit and does not pass; only user's metadata is returned.
    let r = rls.call(req).await;
    assert_eq!(overall(&r), Code::OverLimit);
    let m = r.dynamic_metadata.expect("dynamic_metadata");
    let Kind::StructValue(meta) = field(&m, "metadata") else {
        panic!("metadata is a struct");
    };
    assert!(!meta.fields.contains_key("owner"));
    let Kind::StructValue(billing) = field(meta, "billing") else {
        panic!("billing is a struct");
    };
    assert_eq!(field(billing, "tier"), &Kind::StringValue("silver".into()));
    // Off by default.
    let mut plain = start(&redis.url(), "meta2", META, RlsOptions::default()).await;
    assert!(plain
        .one("meta", &[("user", "u")])
        .await
        .dynamic_metadata
        .is_none());
}

const DETAILED: &str = "\
domain: dm
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: route
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {unit: hour, requests_per_unit: 100}
  - key: quiet
    rate_limit: {unit: hour, requests_per_unit: 100}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detailed_metrics_name_request_values_only_where_asked_and_stay_bounded() {
    let redis = RedisServer::start();
    let mut rls = start(&redis.url(), "dm", DETAILED, RlsOptions::default()).await;
    rls.one("dm", &[("user", "alice")]).await;
    rls.one("dm", &[("route", "/x"), ("method", "GET")]).await;
    rls.one("dm", &[("quiet", "secret-value")]).await;
    let mut text = String::new();
    rls.service.render_metrics(&mut text);
    assert!(
        text.contains("key=\"dm.user_alice\",outcome=\"allowed\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("key=\"dm.route_/x.method\",outcome=\"allowed\"} 1"),
        "{text}"
    );
    assert!(
        !text.contains("secret-value"),
        "a rule without the flags: no request value"
    );
    // A flood of distinct values: bounded, the rest under the overflow key.
    let many = tollgate_rls::metrics::MAX_SERIES_KEYS + 200;
    for i in 0..many {
        let v = format!("flood-{i}\"\n");
        rls.one("dm", &[("user", &v)]).await;
    }
    let mut text = String::new();
    rls.service.render_metrics(&mut text);
    let series = text.lines().filter(|l| !l.starts_with('#')).count();
    assert!(
        series <= tollgate_rls::metrics::MAX_SERIES_KEYS + 1,
        "{series}"
    );
    assert!(text.contains(&format!(
        "key=\"{}\",outcome=\"allowed\"}}",
        tollgate_rls::metrics::OVERFLOW_KEY
    )));
    assert!(
        text.lines()
            .all(|l| l.starts_with('#') || l.starts_with("tollgate_")),
        "a newline in a value never starts a line of its own"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_deny_cache_answers_reports_the_others_real_remaining() {
    let redis = RedisServer::start();
    let yaml = "domain: dc\ndescriptors:\n  - key: tight\n    rate_limit: {unit: hour, requests_per_unit: 1}\n  - key: wide\n    rate_limit: {unit: hour, requests_per_unit: 10}\n";
    let mut rls = start(&redis.url(), "dc", yaml, RlsOptions::default()).await;
    let req = || request("dc", vec![desc(&[("tight", "t")]), desc(&[("wide", "w")])]);
    let r = rls.call(req()).await;
    assert_eq!((overall(&r), remaining(&r)), (Code::Ok, vec![0, 9]));
    let hits = |rls: &Rls| {
        let mut text = String::new();
        rls.limiter.render_metrics(&mut text);
        text.lines()
            .find(|l| l.starts_with("tollgate_deny_cache_hits_total{policy=\"dc.tight\"}"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0)
    };
    for i in 0..4 {
        let r = rls.call(req()).await;
        assert_eq!(overall(&r), Code::OverLimit, "call {i}");
        assert_eq!(codes(&r), vec![Code::OverLimit, Code::Ok], "call {i}");
        assert_eq!(
            remaining(&r),
            vec![0, 9],
            "call {i}: wide has 9 left, never 0"
        );
        assert!(r.statuses[1].duration_until_reset.is_some(), "call {i}");
    }
    assert!(
        hits(&rls) >= 3,
        "the later calls were the deny cache's: {}",
        hits(&rls)
    );
    // wide is charged elsewhere: the next store answer refreshes what the cache reports.
    rls.one("dc", &[("wide", "w")]).await;
    rls.clock.advance(Duration::from_secs(1));
    let r = rls.call(req()).await;
    assert_eq!(remaining(&r), vec![0, 8]);
    assert_eq!(
        r.statuses[0].current_limit.clone().map(|l| l.unit),
        Some(HOUR)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_descriptor_key_with_quotes_or_newlines_is_escaped_in_the_headers() {
    let redis = RedisServer::start();
    let yaml = "domain: inj\ndescriptors:\n  - key: \"a\\\"b\\r\\nSet-Cookie: x\"\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
    let mut rls = start(&redis.url(), "inj", yaml, RlsOptions::default()).await;
    for _ in 0..2 {
        let r = rls.one("inj", &[("a\"b\r\nSet-Cookie: x", "v")]).await;
        assert!(!r.response_headers_to_add.is_empty());
        for h in &r.response_headers_to_add {
            assert!(
                h.value.bytes().all(|b| (0x20..0x7f).contains(&b)),
                "{}: {:?}",
                h.key,
                h.value
            );
            if h.key == "ratelimit-policy" {
                assert!(
                    h.value.starts_with("\"inj.a\\\"b??Set-Cookie: x\";q=1"),
                    "{}",
                    h.value
                );
            }
        }
    }
}

/// A reload (a new service behind the same `LiveRls`) keeps the detailed series' counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_keeps_the_detailed_series_counts() {
    let build = || {
        let config = tollgate_rls::config::load_str([("dm.yaml", DETAILED)]).expect("yaml");
        tollgate_rls::RlsService::new(
            tollgate::Limiter::new(tollgate::LimiterConfig::default()),
            tollgate::IdentityHasher::new(b"s"),
            config,
            RlsOptions::default(),
        )
        .expect("service")
    };
    let live = tollgate_rls::LiveRls::new(build());
    let r = live
        .current()
        .decide(&request("dm", vec![desc(&[("user", "bob")])]))
        .await
        .expect("decided");
    assert_eq!(overall(&r), Code::Ok);
    live.replace(build());
    let r = live
        .current()
        .decide(&request("dm", vec![desc(&[("user", "bob")])]))
        .await
        .expect("decided");
    assert_eq!(overall(&r), Code::Ok);
    let mut text = String::new();
    live.current().render_metrics(&mut text);
    assert!(
        text.contains("key=\"dm.user_bob\",outcome=\"allowed\"} 2"),
        "{text}"
    );
}
