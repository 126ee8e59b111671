use super::*;

fn errors(text: &str) -> Vec<String> {
    match validate::validate("t.toml", text, |n| {
        (n == "SECRET").then(|| "s3".to_string())
    }) {
        Ok(_) => Vec::new(),
        Err(e) => e.0.iter().map(ToString::to_string).collect(),
    }
}

const GOOD: &str = r#"
[server]
listen = "127.0.0.1:18080"
admin_listen = "127.0.0.1:19090"
upstream = "http://127.0.0.1:3000/base/"
upstream_timeout = "5s"

[store]
backend = "redis"
url = "redis://:hunter2@127.0.0.1:6379"
timeout = "20ms"
breaker = { failures = 3, open_for = "2s" }

[identity]
sources = ["header:X-Api-Key", "ip"]
trusted_proxies = ["10.0.0.0/8", "127.0.0.1"]
client_ip_header = "forwarded"
ipv6_prefix = 56
secret = "pre-${SECRET}"

[[policy]]
name = "api"
match = { path_prefix = "/api", methods = ["get", "POST"] }
algorithm = "gcra"
limit = 100
period = "1m"
burst = 10
cost = 2
identity = ["ip"]
on_failure = "local"
shadow = true
"#;

#[test]
fn the_builtin_defaults_are_valid() {
    let c = Config::builtin().expect("builtin config");
    assert!(c.decision_mode());
    assert_eq!(c.server.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(c.server.admin_listen.to_string(), "127.0.0.1:9090");
    assert_eq!(c.policies.len(), 1);
    assert_eq!(c.policies[0].limit().quota().limit(), 100);
    assert_eq!(
        c.store.backend,
        StoreBackend::Memory {
            max_keys: 1_000_000
        }
    );
}

#[test]
fn a_full_config_validates_into_typed_values() {
    let c = validate::validate("t.toml", GOOD, |n| {
        (n == "SECRET").then(|| "s3".to_string())
    })
    .expect("valid config");
    let up = c.server.upstream.as_ref().expect("upstream");
    assert_eq!(up.authority.as_str(), "127.0.0.1:3000");
    assert_eq!(up.base_path, "/base");
    assert_eq!(c.secret.0, b"pre-s3");
    assert_eq!(c.identity.trust.ipv6_prefix(), 56);
    assert_eq!(c.store.breaker.failures, 3);
    let p = &c.policies[0];
    assert_eq!(p.methods, vec![Method::GET, Method::POST]);
    assert_eq!(p.limit().quota().burst(), 10);
    assert!(p.spec.shadow);
    assert_eq!(p.spec.on_failure, FailurePolicy::Local);
}

#[test]
fn secrets_never_show_in_debug_output() {
    let c = validate::validate("t.toml", GOOD, |n| {
        (n == "SECRET").then(|| "s3".to_string())
    })
    .expect("valid config");
    let dbg = format!("{c:?}");
    assert!(!dbg.contains("hunter2"), "{dbg}");
    assert!(!dbg.contains("pre-s3"), "{dbg}");
}

#[test]
fn a_typo_is_an_error_naming_line_key_and_what_is_allowed() {
    let e = errors("[[policy]]\nname = \"a\"\nalgorithm = \"gcra\"\nlimt = 5\nperiod = \"1s\"\n");
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with("error: t.toml:4:1: policy[0].limt: unknown field `limt`"),
        "{e:?}"
    );
    assert!(e[0].contains("expected one of"), "{e:?}");
    let e = errors("[servr]\nlisten = \"x\"\n");
    assert!(
        e[0].contains("servr") && e[0].contains("expected one of"),
        "{e:?}"
    );
}

#[test]
fn every_value_error_is_reported_at_once() {
    let text = "[server]\nlisten = \"nope\"\n[[policy]]\nname = \"bad name\"\nalgorithm = \"token_buckit\"\nlimit = -5\nperiod = \"1 minute\"\n";
    let e = errors(text);
    assert_eq!(e.len(), 5, "{e:?}");
    assert!(
        e[0].starts_with("error: t.toml:2:10: server.listen:"),
        "{e:?}"
    );
    // Each later error, in order, with what it must say.
    let says: [&[&str]; 4] = [
        &["policy[0].name", "[A-Za-z0-9_-]"],
        &["policy[0].algorithm", "token_bucket"],
        &["t.toml:6:9: policy[0].limit: must be a positive integer"],
        &["policy[0].period", "\"1m\""],
    ];
    for (error, parts) in e[1..].iter().zip(says) {
        for part in parts {
            assert!(error.contains(part), "{part:?} in {e:?}");
        }
    }
    // Each names its key; none repeats what the key held.
    for written in ["nope", "bad name", "token_buckit", "-5", "1 minute"] {
        assert!(
            e.iter().all(|m| !m.contains(written)),
            "{written:?} echoed in {e:?}"
        );
    }
}

/// `"20m"` for `"20ms"` (twenty minutes a request may wait on a frozen store) is refused, at
/// its line, without echoing it; a minute is the most, and a far store's seconds pass.
#[test]
fn a_store_timeout_past_a_minute_is_refused_as_a_unit_typed_wrong() {
    let with = |t: &str| format!("[store]\nbackend = \"redis\"\ntimeout = \"{t}\"\n");
    let e = errors(&with("20m"));
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with("error: t.toml:3:11: store.timeout: is longer than")
            && e[0].contains("at most 60s")
            && e[0].contains("\"ms\" milliseconds")
            && !e[0].contains("20m"),
        "{e:?}"
    );
    for t in ["61s", "2m", "1h", "18446744073709551615us"] {
        assert_eq!(errors(&with(t)).len(), 1, "{t}");
    }
    for t in ["20ms", "5s", "60s", "1m"] {
        assert_eq!(errors(&with(t)), Vec::<String>::new(), "{t}");
    }
}

#[test]
fn quota_rules_and_uniqueness_are_checked() {
    let p = |extra: &str| {
        format!("[[policy]]\nname = \"a\"\nalgorithm = \"token_bucket\"\nperiod = \"1s\"\n{extra}")
    };
    assert!(errors(&p("limit = 2000000\n"))[0].contains("policy[0].limit: rate must be at most"));
    assert!(errors(&p("limit = 5\ncost = 6\n"))[0].contains("policy[0].cost"));
    assert!(errors(&p("limit = 5\nburst = 0\n"))[0].contains("policy[0].burst"));
    let two = format!("{}{}", p("limit = 1\n"), p("limit = 2\n"));
    assert!(errors(&two)[0].contains("duplicate policy name"));
    assert!(errors(&p(""))[0].contains("policy[0].limit: is missing"));
}

#[test]
fn bad_types_env_and_sections_are_errors() {
    assert!(errors("[identity]\nsecret = \"${NOPE}\"\n")[0].contains("NOPE"));
    assert!(errors("[store]\nbackend = \"redis-cluster\"\n")[0].contains("store.urls"));
    assert!(errors("[store]\nbackend = \"memcached\"\n")[0]
        .contains("\"memory\", \"redis\", \"redis-cluster\""));
    assert!(errors("[server]\nupstream = \"https://x\"\n")[0].contains("https upstreams"));
    assert!(errors("[identity]\ntrusted_proxies = [\"10.0.0.0/33\"]\n")[0].contains("CIDR"));
    assert!(errors("[[policy]]\nlimit = 1.5\n")[0].contains("policy[0].limit"));
    assert!(errors("this is not toml")[0].starts_with("error: t.toml:1:"));
}

#[test]
fn the_documented_example_config_is_valid() {
    let text = include_str!("../../../docs/tollgate.example.toml");
    // The real path: `[rls] config` is relative to the file.
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/tollgate.example.toml"
    );
    let c = validate::validate(path, text, |n| match n {
        "TOLLGATE_SECRET" => Some("s".to_string()),
        "ADMIN_TOKEN" => Some("an-admin-token-of-some-length".to_string()),
        _ => None,
    })
    .expect("the example config validates");
    assert_eq!(c.policies.len(), 2);
    assert!(c.server.admin_token.is_some());
    let rls = c.rls.expect("[rls]");
    assert!(rls.config.has_domain("edge"));
    assert_eq!(rls.config.rules().len(), 5);
}

#[test]
fn lease_is_refused_for_the_sliding_algorithms_with_the_key_and_line() {
    let text = "[[policy]]\nname = \"a\"\nalgorithm = \"sliding_window_log\"\nlimit = 10\nperiod = \"1s\"\nsync = \"lease\"\n";
    let errs = errors(text);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(errs[0].starts_with("error: t.toml:6:"), "{}", errs[0]);
    assert!(errs[0].contains("sync"), "{}", errs[0]);
    assert!(errs[0].contains("sliding_window_log"), "{}", errs[0]);
    let ok = "[[policy]]\nname = \"a\"\nalgorithm = \"gcra\"\nlimit = 10\nperiod = \"1s\"\nsync = \"lease\"\nlease_ttl = \"100ms\"\nlease_max = 50\n";
    assert!(errors(ok).is_empty(), "{:?}", errors(ok));
}

#[test]
fn a_lease_ttl_the_limiter_refuses_is_refused_at_its_line() {
    // The limiter's rule (at least 1ms) is the config's: nothing check-config accepts fails
    // when serve registers the policy.
    let text = "[[policy]]\nname = \"api\"\nalgorithm = \"gcra\"\nlimit = 10\nperiod = \"1s\"\nsync = \"lease\"\nlease_ttl = \"500us\"\n";
    let errs = errors(text);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(
        errs[0].starts_with("error: t.toml:7:13: policy[0].lease_ttl: "),
        "{}",
        errs[0]
    );
    assert!(errs[0].contains("at least 1ms"), "{}", errs[0]);
}

#[test]
fn a_tier_whose_burst_cannot_pay_the_cost_is_refused_at_the_tier() {
    let text = "[[policy]]\nname = \"api\"\nalgorithm = \"token_bucket\"\nlimit = 10\nperiod = \"1s\"\ncost = 5\ntier = \"header:x-plan\"\ntiers.small = { limit = 2 }\n";
    let errs = errors(text);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(errs[0].contains("t.toml:8:"), "{}", errs[0]);
    assert!(
        errs[0].contains("policy[0].tiers.small.cost"),
        "{}",
        errs[0]
    );
    assert!(errs[0].contains("can never be admitted"), "{}", errs[0]);
}

#[test]
fn the_sentinel_backend_takes_sentinel_urls_and_a_master_name() {
    let text = "[store]\nbackend = \"redis-sentinel\"\nurls = [\"redis://127.0.0.1:26379\", \"redis://:pw@s2:26380\"]\nmaster_name = \"mymaster\"\n";
    let c = validate::validate("t.toml", text, |_| None).expect("valid");
    assert_eq!(
        c.store.backend,
        StoreBackend::RedisSentinel {
            urls: vec![
                "redis://127.0.0.1:26379".to_string(),
                "redis://:pw@s2:26380".to_string()
            ],
            master_name: "mymaster".to_string(),
        }
    );
    assert!(!format!("{:?}", c.store.backend).contains("pw@"));
    let e = errors("[store]\nbackend = \"redis-sentinel\"\nurls = [\"redis://s:1\"]\n");
    assert!(
        e[0].contains("t.toml:2:11: store.master_name: is missing"),
        "{e:?}"
    );
    let e = errors("[store]\nbackend = \"redis-sentinel\"\nmaster_name = \"m\"\n");
    assert!(
        e[0].contains("store.urls") && e[0].contains("sentinel"),
        "{e:?}"
    );
    let e = errors("[store]\nbackend = \"redis\"\nmaster_name = \"m\"\n");
    assert!(
        e[0].contains("t.toml:3:15: store.master_name: only applies"),
        "{e:?}"
    );
}

#[test]
fn long_messages_keep_their_start_and_their_help() {
    let v = format!(
        "\"{}\" is not allowed; expected a number",
        "y".repeat(10_000)
    );
    let cut = tollgate_rls::config::cut(&v, 200, 300);
    assert!(cut.starts_with(&format!("\"{}", "y".repeat(199))), "{cut}");
    assert!(
        cut.ends_with("\" is not allowed; expected a number"),
        "{cut}"
    );
    assert!(cut.len() < 300, "{cut}");
    assert_eq!(tollgate_rls::config::cut("short", 200, 300), "short");
}

#[test]
fn store_urls_expand_environment_variables() {
    let text = "[store]\nbackend = \"redis\"\nurl = \"redis://:${SECRET}@127.0.0.1:6379\"\n";
    let c = validate::validate("t.toml", text, |n| {
        (n == "SECRET").then(|| "s3".to_string())
    })
    .expect("valid");
    assert_eq!(
        c.store.backend,
        StoreBackend::Redis {
            url: "redis://:s3@127.0.0.1:6379".to_string()
        }
    );
    let e = errors("[store]\nbackend = \"redis-cluster\"\nurls = [\"redis://:${NOPE}@h:1\"]\n");
    assert!(
        e[0].contains("t.toml:3:9: store.urls") && e[0].contains("NOPE"),
        "{e:?}"
    );
}

#[test]
fn store_max_batch_defaults_to_64_and_out_of_range_values_name_file_line_and_key() {
    let c = Config::builtin().expect("builtin config");
    assert_eq!(c.store.max_batch, 64);
    let at = |v: &str| errors(&format!("[store]\nbackend = \"redis\"\nmax_batch = {v}\n"));
    for ok in ["1", "64", "1024"] {
        assert!(at(ok).is_empty(), "{ok}: {:?}", at(ok));
    }
    let c = validate::validate("t.toml", "[store]\nmax_batch = 1\n", |_| None).expect("valid");
    assert_eq!(c.store.max_batch, 1);
    for bad in ["0", "-3", "1025", "100000000000"] {
        let e = at(bad);
        assert_eq!(e.len(), 1, "{bad}: {e:?}");
        assert!(
            e[0].starts_with("error: t.toml:3:13: store.max_batch: must be an integer from 1"),
            "{bad}: {e:?}"
        );
        assert!(e[0].contains("1024"), "{e:?}");
    }
    let e = at("\"64\"");
    assert!(e[0].contains("store.max_batch"), "{e:?}");
}

/// A `[server]` head in proxy mode: costs known later need one.
const PROXY: &str = "[server]\nupstream = \"http://127.0.0.1:3000\"\n\n";

#[test]
fn costs_known_later_are_read_and_their_bad_values_refused_at_their_key_and_line() {
    let good = format!("{PROXY}[[policy]]\nname = \"tokens\"\nalgorithm = \"token_bucket\"\nlimit = 100000\nperiod = \"1h\"\nburst = 8000\ncost = 500\ncost_from_request = \"X-Max-Tokens\"\ncost_max = 4000\ncost_from_response = \"x-tokens-used\"\n\n[[policy]]\nname = \"inflight\"\nalgorithm = \"concurrency\"\nlimit = 10\nhold_ttl = \"5m\"\n");
    let c = Config::parse("t.toml", &good).expect("valid");
    let tokens = &c.policies[0];
    assert!(tokens.spec.settle);
    assert_eq!(tokens.costs.max, 4000);
    assert_eq!(
        tokens.costs.from_request.as_ref().map(|h| h.as_str()),
        Some("x-max-tokens")
    );
    let inflight = &c.policies[1];
    assert!(inflight.spec.limit.algorithm().is_concurrency());
    assert_eq!(
        inflight.spec.limit.quota().period(),
        std::time::Duration::from_secs(300)
    );
    // hold_ttl defaults to 5m; cost_max to the burst.
    let dflt = format!("{PROXY}[[policy]]\nname = \"i\"\nalgorithm = \"concurrency\"\nlimit = 3\n\n[[policy]]\nname = \"t\"\nalgorithm = \"gcra\"\nlimit = 60\nperiod = \"1m\"\nburst = 30\ncost_from_request = \"x-n\"\n");
    let c = Config::parse("t.toml", &dflt).expect("valid");
    assert_eq!(
        c.policies[0].spec.limit.quota().period(),
        std::time::Duration::from_secs(300)
    );
    assert_eq!(c.policies[1].costs.max, 30);

    let base =
        "[[policy]]\nname = \"p\"\nalgorithm = \"token_bucket\"\nlimit = 100\nperiod = \"1m\"\n";
    for (extra, key, says) in [
        (
            "cost_from_request = \"bad header\"\n",
            "cost_from_request",
            "not an HTTP header name",
        ),
        (
            "cost_from_response = \"\"\n",
            "cost_from_response",
            "not an HTTP header name",
        ),
        (
            "cost_from_request = \"x-n\"\ncost_max = 101\n",
            "cost_max",
            "above what the policy can ever admit (100",
        ),
        (
            "cost_from_request = \"x-n\"\ncost_max = 0\n",
            "cost_max",
            "positive integer",
        ),
        (
            "cost_max = 10\n",
            "cost_max",
            "only applies with cost_from_request",
        ),
        (
            "hold_ttl = \"5m\"\n",
            "hold_ttl",
            "only applies with algorithm = \"concurrency\"",
        ),
        (
            "cost_from_response = \"x-used\"\nsync = \"lease\"\n",
            "sync",
            "needs sync = \"exact\"",
        ),
    ] {
        let text = format!("{PROXY}{base}{extra}");
        let errs = errors(&text);
        assert_eq!(errs.len(), 1, "{extra}: {errs:?}");
        assert!(errs[0].starts_with("error: t.toml:"), "{}", errs[0]);
        assert!(
            errs[0].contains(&format!("policy[0].{key}: ")),
            "{extra}: {}",
            errs[0]
        );
        assert!(errs[0].contains(says), "{extra}: {}", errs[0]);
        assert!(
            !errs[0].contains("bad header"),
            "a refused value is not echoed: {}",
            errs[0]
        );
    }
    let conc = "[[policy]]\nname = \"i\"\nalgorithm = \"concurrency\"\nlimit = 2\n";
    for (extra, key) in [
        ("period = \"1m\"\n", "period"),
        ("burst = 5\n", "burst"),
        ("cost = 2\n", "cost"),
        ("cost_from_response = \"x-used\"\n", "cost_from_response"),
        ("hold_ttl = \"0s\"\n", "hold_ttl"),
        ("hold_ttl = \"soon\"\n", "hold_ttl"),
        ("hold_ttl = \"1000000000d\"\n", "hold_ttl"),
        ("sync = \"lease\"\n", "sync"),
    ] {
        let text = format!("{PROXY}{conc}{extra}");
        let errs = errors(&text);
        assert!(!errs.is_empty(), "{extra} accepted");
        assert!(
            errs.iter()
                .any(|e| e.contains(&format!("policy[0].{key}: "))),
            "{extra}: {errs:?}"
        );
        assert!(
            errs.iter().all(|e| e.starts_with("error: t.toml:")),
            "{errs:?}"
        );
    }
}

#[test]
fn decision_mode_refuses_what_needs_a_response_end() {
    let text = "[[policy]]\nname = \"t\"\nalgorithm = \"gcra\"\nlimit = 10\nperiod = \"1m\"\ncost_from_response = \"x-used\"\n\n[[policy]]\nname = \"i\"\nalgorithm = \"concurrency\"\nlimit = 2\n";
    let errs = errors(text);
    assert_eq!(errs.len(), 2, "{errs:?}");
    assert!(errs[0].starts_with("error: t.toml:6:"), "{}", errs[0]);
    assert!(
        errs[0].contains("policy[0].cost_from_response: needs proxy mode"),
        "{}",
        errs[0]
    );
    assert!(errs[1].starts_with("error: t.toml:10:"), "{}", errs[1]);
    assert!(errs[1].contains("policy[1].algorithm:"), "{}", errs[1]);
    // A request-side estimate needs no response: fine in decision mode.
    let ok = "[[policy]]\nname = \"t\"\nalgorithm = \"gcra\"\nlimit = 10\nperiod = \"1m\"\ncost_from_request = \"x-n\"\n";
    assert!(errors(ok).is_empty(), "{:?}", errors(ok));
}

/// The memory store's clients are keyed with SipHash, every Redis backend's with keyed
/// BLAKE3; `validate_keyed` (a reload's) keeps the running store's keying whatever the file
/// names, the overrides' keys and the admin API's among them.
#[test]
fn client_keys_follow_the_store_unless_a_keying_is_given() {
    let policy = "[identity]\nsources = [\"header:x-api-key\"]\nsecret = \"k\"\n\
                  [[policy]]\nname = \"p\"\nalgorithm = \"gcra\"\nlimit = 10\nperiod = \"1m\"\n";
    let memory = format!("[store]\nbackend = \"memory\"\n{policy}");
    let redis = format!("[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:1\"\n{policy}");
    let cluster =
        format!("[store]\nbackend = \"redis-cluster\"\nurls = [\"redis://127.0.0.1:1\"]\n{policy}");
    let key_of = |c: &Config| {
        c.client_key(&c.policies[0], b"header:x-api-key=abc")
            .expect("an identity")
    };
    let local = IdentityHasher::process_local(b"k").client_key("header:x-api-key", b"abc");
    let shared = IdentityHasher::new(b"k").client_key("header:x-api-key", b"abc");
    assert_ne!(local, shared);
    for (text, want, keying) in [
        (policy, local, Keying::ProcessLocal),
        (memory.as_str(), local, Keying::ProcessLocal),
        (redis.as_str(), shared, Keying::Shared),
        (cluster.as_str(), shared, Keying::Shared),
    ] {
        let c = validate::validate("t.toml", text, |_| None).expect("valid");
        assert_eq!(Keying::of(&c.store.backend), keying, "{text}");
        assert_eq!(Keying::of_hasher(&c.hasher), keying, "{text}");
        assert_eq!(key_of(&c), want, "{text}");
        for forced in [Keying::Shared, Keying::ProcessLocal] {
            let c =
                validate::validate_keyed("t.toml", text, |_| None, Some(forced)).expect("valid");
            assert_eq!(Keying::of_hasher(&c.hasher), forced, "{text}");
            let want = if forced == Keying::Shared {
                shared
            } else {
                local
            };
            assert_eq!(key_of(&c), want, "{text} keyed {forced:?}");
        }
    }
}

#[test]
fn a_long_settled_sliding_log_on_redis_draws_a_warning_and_a_short_or_unsettled_one_none() {
    let cfg = |backend: &str, limit: u64, tier_limit: u64, settled: bool| {
        let settle = if settled {
            "cost_from_response = \"x-used\"\n"
        } else {
            ""
        };
        format!(
            "{PROXY}[store]\n{backend}\n[identity]\nsecret = \"s\"\n\
             [[policy]]\nname = \"log\"\nalgorithm = \"sliding_window_log\"\nlimit = {limit}\n\
             period = \"1h\"\n{settle}tier = \"header:x-plan\"\n\
             tiers = {{ gold = {{ limit = {tier_limit} }} }}\n"
        )
    };
    let warnings = |text: &str| match Config::parse("t.toml", text) {
        Ok(c) => c.warnings,
        Err(e) => panic!("{e}"),
    };
    let redis = "backend = \"redis\"\nurl = \"redis://127.0.0.1:6379\"";
    let long: Vec<String> = warnings(&cfg(redis, 10_000, 50_000, true))
        .into_iter()
        .filter(|w| w.contains("sliding_window_log"))
        .collect();
    assert_eq!(long.len(), 2, "{long:?}");
    assert!(
        long[0].starts_with(
            "warning: t.toml: policy[0]: sliding_window_log with a limit of 10000 and its cost settled"
        ),
        "{long:?}"
    );
    assert!(
        long[1].starts_with(
            "warning: t.toml: policy[0].tiers.gold: sliding_window_log with a limit of 50000 and"
        ),
        "{long:?}"
    );
    // At the bound, unsettled (a check costs the same at any length), and on the memory
    // store, nothing.
    for text in [
        cfg(redis, super::log_cost::LOG_WARN_LIMIT, 100, true),
        cfg(redis, 10_000, 50_000, false),
        cfg("backend = \"memory\"", 10_000, 50_000, true),
    ] {
        let w = warnings(&text);
        assert!(w.iter().all(|w| !w.contains("sliding_window_log")), "{w:?}");
    }
}
