//! The Redis store against one real redis-server: key layout and expiry, all-or-nothing
//! charging, script reloading, failures and reconnection, credentials from the URL.

mod common;

use common::{client, rule, EPOCH_2026};
use std::time::Duration;
use tollgate_core::{Algorithm, Check, Clock, Limit, State, SystemClock};
use tollgate_redis::{
    generic_script_sha, plan_script_quotas, plan_script_sha, plan_script_text, RedisConfig,
    RedisStore, RuleShape, StoreClock,
};
use tollgate_testkit::RedisServer;

const HOUR: Duration = Duration::from_secs(3600);

#[tokio::test]
async fn keys_are_prefix_client_policy_and_expire_when_their_state_is_fresh_again() {
    let server = RedisServer::start();
    let store = common::connect(&server.url(), StoreClock::Local).await;
    let who = client(1);
    for algorithm in Algorithm::ALL {
        let r = rule(&format!("p-{algorithm}"), algorithm, 10, HOUR);
        let now = SystemClock.now();
        let verdict = store
            .check(&[Check::new(who, &r, 3)], now)
            .await
            .expect("check");
        assert!(verdict.allowed);
        let key = format!("test:{{{who}}}:p-{algorithm}");
        assert_eq!(store.key(&who, r.name()), key);
        let mut state: State = r.limit().fresh();
        r.limit().check(&mut state, now, 3, true);
        let idle_ms = (state.idle_at(r.limit().quota()) - now).div_ceil(1000);
        let pttl: i64 = server.cli(&["pttl", &key]).trim().parse().expect("pttl");
        let pttl = u64::try_from(pttl).expect("the key exists and has a TTL");
        assert!(pttl <= idle_ms, "{algorithm}: pttl {pttl} > idle {idle_ms}");
        // The key must not be set to vanish long before its state is fresh again.
        assert!(
            pttl + 60_000 > idle_ms,
            "{algorithm}: pttl {pttl}, idle {idle_ms}"
        );
    }
}

#[tokio::test]
async fn a_denied_policy_charges_none_of_the_others() {
    let server = RedisServer::start();
    // Both clocks: with the store clock and costs of 1 the policy-set script gets no
    // arguments at all, with the local clock it gets the costs and now.
    for clock in [StoreClock::Local, StoreClock::Store] {
        let store = common::connect(&server.url(), clock).await;
        let wide = rule("wide", Algorithm::TokenBucket, 100, HOUR);
        let narrow = rule("narrow", Algorithm::Gcra, 2, HOUR);
        let who = client(2 + clock as u128);
        let now = EPOCH_2026;
        let both = [Check::new(who, &wide, 1), Check::new(who, &narrow, 1)];
        for _ in 0..2 {
            let v = store.check(&both, now).await.expect("check");
            assert!(v.allowed, "{clock:?}");
        }
        let before = server.cli(&["get", &store.key(&who, "wide")]);
        let v = store.check(&both, now).await.expect("check");
        assert!(!v.allowed, "{clock:?}");
        assert!(v.decisions[0].allowed, "wide alone would allow");
        assert_eq!(
            v.decisions[0].remaining, 98,
            "and reports its uncharged state"
        );
        assert!(!v.decisions[1].allowed);
        assert!(v.retry_after(&both).is_some_and(|r| r > 0), "{v:?}");
        assert_eq!(server.cli(&["get", &store.key(&who, "wide")]), before);
        // Decided by the script of this plan's shape, not the generic one.
        let set =
            plan_script_sha(&[enforced(*wide.limit()), enforced(*narrow.limit())]).expect("sha");
        assert_eq!(server.cli(&["script", "exists", &set]).trim(), "1");
    }
}

#[tokio::test]
async fn a_policy_set_script_refuses_a_bad_cost_before_any_write() {
    let server = RedisServer::start();
    let limits = [
        Limit::new(
            Algorithm::TokenBucket,
            tollgate_core::Quota::per_minute(10).expect("quota"),
        )
        .expect("limit"),
        Limit::new(
            Algorithm::FixedWindow,
            tollgate_core::Quota::per_minute(5).expect("quota"),
        )
        .expect("limit"),
    ];
    let shape = limits.map(enforced);
    let text = plan_script_text(&shape).expect("script");
    let sha = server.cli(&["script", "load", &text]);
    assert_eq!(sha.trim(), plan_script_sha(&shape).expect("sha"));
    let quotas = plan_script_quotas(&shape).expect("quotas");
    let keys = ["k:{a}:1", "k:{a}:2"];
    // Costs 1 and "x": the second is refused, and the first policy is not charged; and the
    // quotas must be there, whole.
    for bad in [
        &["1", "x"][..],
        &["1", "-1"],
        &["1", "1.5"],
        &["1"],
        &["1", "1", "", "-5"],
    ] {
        let out = evalsha(&server, sha.trim(), &keys, Some(&quotas), bad)
            .await
            .expect_err("refused");
        assert!(out.contains("tollgate: "), "{bad:?}: {out}");
        assert_eq!(
            server.cli(&["exists", "k:{a}:1", "k:{a}:2"]).trim(),
            "0",
            "{bad:?}"
        );
    }
    for cut in [&quotas[..quotas.len() - 1], &[][..]] {
        let out = evalsha(&server, sha.trim(), &keys, Some(cut), &[])
            .await
            .expect_err("refused");
        assert!(out.contains("tollgate: ARGV[1] (quotas)"), "{out}");
    }
    let out = evalsha(&server, sha.trim(), &keys, None, &[])
        .await
        .expect_err("refused");
    assert!(out.contains("tollgate: expected 2 keys"), "{out}");
    assert_eq!(server.cli(&["dbsize"]).trim(), "0");
    // The quotas alone: both charged (costs 1, Redis TIME).
    let out = evalsha(&server, sha.trim(), &keys, Some(&quotas), &[]).await;
    assert!(out.is_ok(), "{out:?}");
    assert_eq!(server.cli(&["exists", "k:{a}:1", "k:{a}:2"]).trim(), "2");
}

/// EVALSHA `sha` on `keys` with `quotas` (when given) then `args`, through a connection of
/// its own (the quotas are bytes, which a command line cannot carry); the reply, or the error
/// as text.
async fn evalsha(
    server: &RedisServer,
    sha: &str,
    keys: &[&str],
    quotas: Option<&[u8]>,
    args: &[&str],
) -> Result<redis::Value, String> {
    let client = redis::Client::open(server.url()).expect("url");
    let mut con = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(sha).arg(keys.len());
    for k in keys {
        cmd.arg(*k);
    }
    if let Some(q) = quotas {
        cmd.arg(q);
    }
    for a in args {
        cmd.arg(*a);
    }
    cmd.query_async::<redis::Value>(&mut con)
        .await
        .map_err(|e| e.to_string())
}

#[tokio::test]
async fn an_invalid_argument_fails_before_any_write() {
    let server = RedisServer::start();
    let store = common::connect(&server.url(), StoreClock::Local).await;
    // The generic script: EVALSHA with the keys and arguments of one call, split on spaces.
    let generic = |call: &str| {
        let mut args = vec!["evalsha", generic_script_sha()];
        args.extend(call.split(' '));
        server.cli(&args)
    };
    // Policy 1 is valid, policy 2 has limit 0: the script must refuse without charging 1.
    let out = generic("2 k1 k2 1000 gcra 10 1000000 10 1 0 gcra 0 1000000 10 1 0");
    assert!(out.contains("tollgate") && out.contains("limit"), "{out}");
    assert_eq!(server.cli(&["exists", "k1", "k2"]).trim(), "0");
    let out = generic("1 k1 1000 nope 1 1 1 1 0");
    assert!(out.contains("not an algorithm"), "{out}");
    let out = generic("1 k1 1000 gcra 1 1");
    assert!(out.contains("expected 1 + 6 arguments"), "{out}");
    // The single-policy script (its quota the call's first argument) validates what a call
    // carries: the quota's length, the cost, now and the PX floor, and the shape of the call.
    let r = rule("v", Algorithm::Gcra, 10, HOUR);
    let text = plan_script_text(&[enforced(*r.limit())]).expect("script");
    let gcra = plan_script_sha(&[enforced(*r.limit())]).expect("script");
    assert_eq!(server.cli(&["script", "load", &text]).trim(), gcra);
    let quotas = plan_script_quotas(&[enforced(*r.limit())]).expect("quotas");
    for (keys, quotas, args, message) in [
        (&["k1"][..], Some(&quotas[..]), &["-5"][..], "(cost)"),
        (&["k1"], Some(&quotas), &["1.5"], "(cost)"),
        (&["k1"], Some(&quotas), &["x"], "(cost)"),
        (&["k1"], Some(&quotas), &["1", "-1"], "(now)"),
        (&["k1"], Some(&quotas), &["1", "soon"], "(now)"),
        (&["k1"], Some(&quotas), &["1", "1000", "-3"], "(PX floor)"),
        (
            &["k1"],
            Some(&quotas),
            &["1", "1000", "1", "extra"],
            "expected 1 keys and 1, 2, 3 or 4",
        ),
        (&["k1"], None, &[], "expected 1 keys and 1, 2, 3 or 4"),
        (
            &["k1"],
            Some(&quotas[1..]),
            &[],
            "ARGV[1] (quotas) must be 42 bytes",
        ),
        (&["k1", "k2"], Some(&quotas), &["1"], "expected 1 keys"),
    ] {
        let out = evalsha(&server, &gcra, keys, quotas, args)
            .await
            .expect_err("refused");
        assert!(
            out.contains("tollgate") && out.contains(message),
            "{args:?}: {out}"
        );
    }
    assert_eq!(server.cli(&["dbsize"]).trim(), "0");
    drop(store);
}

#[tokio::test]
async fn quotas_too_large_for_an_integer_reply_are_answered_packed_and_decide_like_core() {
    // The single-policy script answers an allowed request with one integer when the quota's
    // bounds let remaining and reset_after share it below 2^53, else with a packed string.
    // These quotas are too large for the integer: the packed path must decode exactly.
    let server = RedisServer::start();
    let store = common::connect(&server.url(), StoreClock::Local).await;
    let day = Duration::from_secs(86_400);
    for algorithm in Algorithm::ALL {
        let (limit, period) = match algorithm {
            Algorithm::SlidingWindowLog => (100_000, day * 366),
            Algorithm::SlidingWindowCounter => (100_000, day),
            _ => (1 << 40, day * 366),
        };
        let quota = tollgate_core::Quota::new(limit, period).expect("quota");
        let r = tollgate_core::Rule::new(
            format!("big-{algorithm}"),
            Limit::new(algorithm, quota).expect("limit"),
        );
        let who = client(9);
        let mut state = r.limit().fresh();
        let mut now = EPOCH_2026;
        for cost in [3, 2, 0, limit, 1] {
            let expected = r.limit().check(&mut state, now, cost, true);
            let v = store
                .check(&[Check::new(who, &r, cost)], now)
                .await
                .expect("check");
            assert_eq!(v.decisions[0], expected, "{algorithm} cost {cost}");
            now += 1_000_003;
        }
    }
}

#[tokio::test]
async fn zero_cost_queries_and_impossible_costs_write_nothing() {
    let server = RedisServer::start();
    let store = common::connect(&server.url(), StoreClock::Store).await;
    let r = rule("q", Algorithm::Gcra, 5, HOUR);
    let who = client(3);
    let v = store
        .check(&[Check::new(who, &r, 0)], 0)
        .await
        .expect("check");
    assert!(v.allowed);
    assert_eq!(v.decisions[0].remaining, 5);
    let v = store
        .check(&[Check::new(who, &r, 6)], 0)
        .await
        .expect("check");
    assert!(!v.allowed);
    assert_eq!(v.decisions[0].retry_after, None, "retrying never helps");
    assert_eq!(server.cli(&["dbsize"]).trim(), "0");
}

#[tokio::test]
async fn the_store_clock_is_redis_time() {
    let server = RedisServer::start();
    // The caller's `now` is ignored: a wildly wrong one changes nothing.
    let store = common::connect(&server.url(), StoreClock::Store).await;
    let r = rule("s", Algorithm::Gcra, 5, HOUR);
    let who = client(4);
    let mut allowed = 0;
    for i in 0..6u64 {
        let v = store
            .check(&[Check::new(who, &r, 1)], i * 1_000_000_000_000)
            .await
            .expect("check");
        allowed += u64::from(v.allowed);
        if !v.allowed {
            let retry = v.decisions[0].retry_after.expect("a retry time");
            assert!(retry > 700_000_000 && retry <= 720_000_000, "{retry}");
        }
    }
    assert_eq!(allowed, 5);
}

#[tokio::test]
async fn scripts_are_reloaded_after_a_flush_without_failing_the_request() {
    let server = RedisServer::start();
    let store = common::connect(&server.url(), StoreClock::Store).await;
    let r = rule("f", Algorithm::TokenBucket, 5, HOUR);
    let sha = plan_script_sha(&[enforced(*r.limit())]).expect("script");
    let exists = |sha: &str| server.cli(&["script", "exists", sha]).trim().to_string();
    // The generic script is loaded on connect, a plan shape's own script on first use.
    assert_eq!(exists(generic_script_sha()), "1");
    assert_eq!(exists(&sha), "0");
    let who = client(5);
    let one = [Check::new(who, &r, 1)];
    let check = || store.check(&one, 0);
    assert!(check().await.expect("check").allowed);
    assert_eq!(exists(&sha), "1");
    server.cli(&["script", "flush"]);
    assert_eq!(exists(&sha), "0");
    assert!(check().await.expect("check").allowed);
    assert_eq!(exists(&sha), "1");
    // Both scripts count the same state: 2 of 5 used.
    let other = rule("g", Algorithm::Gcra, 5, HOUR);
    let v = store
        .check(
            &[
                Check::new(client(5), &r, 1),
                Check::new(client(5), &other, 1),
            ],
            0,
        )
        .await
        .expect("check");
    assert_eq!(v.decisions[0].remaining, 2);
}

#[tokio::test]
async fn a_dead_server_fails_calls_fast_and_a_restarted_one_is_used_again() {
    let mut server = RedisServer::start();
    let store = common::connect(&server.url(), StoreClock::Store).await;
    let r = rule("r", Algorithm::Gcra, 100, HOUR);
    let who = client(6);
    let checks = [Check::new(who, &r, 1)];
    let call = || store.check(&checks, 0);
    assert!(call().await.expect("check").allowed);
    server.kill();
    for _ in 0..3 {
        let res = tokio::time::timeout(Duration::from_secs(5), call()).await;
        let err = res
            .expect("a dead server must not hang a call")
            .expect_err("server is dead");
        assert_eq!(err.kind(), tollgate_redis::ErrorKind::Connection, "{err}");
        assert!(err.is_transient());
    }
    // Same port, empty script cache: the store reconnects and reloads by itself.
    server.restart();
    let mut recovered = false;
    for _ in 0..100 {
        if let Ok(Ok(v)) = tokio::time::timeout(Duration::from_secs(5), call()).await {
            assert!(v.allowed);
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        recovered,
        "the store did not reconnect to the restarted server"
    );
    assert_eq!(
        server
            .cli(&[
                "script",
                "exists",
                &plan_script_sha(&[enforced(*r.limit())]).expect("script")
            ])
            .trim(),
        "1"
    );
}

#[tokio::test]
async fn a_frozen_server_times_out_and_is_used_again_when_it_thaws() {
    let server = RedisServer::start();
    let store = common::connect(&server.url(), StoreClock::Store).await;
    let r = rule("z", Algorithm::Gcra, 100, HOUR);
    let who = client(7);
    server.pause();
    let res = tokio::time::timeout(
        Duration::from_secs(10),
        store.check(&[Check::new(who, &r, 1)], 0),
    )
    .await;
    server.resume();
    let err = res
        .expect("the client's response timeout bounds the call")
        .expect_err("frozen");
    assert!(err.is_transient(), "{err}");
    let mut recovered = false;
    for _ in 0..100 {
        if let Ok(v) = store.check(&[Check::new(who, &r, 1)], 0).await {
            assert!(v.allowed);
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(recovered);
}

/// A call timeout (`store.timeout`) longer than redis-rs's one-second reply timeout holds for
/// every call: with the server frozen 1.5 s under a 5 s timeout, the plan is answered at
/// `max_batch` 1 (redis-rs's connection), where it failed after 1 s while the coalesced
/// calls waited, and at the default; and on a Cluster, where plans alone go on redis-rs's
/// cluster connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_timeout_longer_than_a_second_holds_on_every_connection() {
    let freeze = Duration::from_millis(1_500);
    let r = rule("slow", Algorithm::TokenBucket, 10, HOUR);
    let who = client(9);
    let ask = |store: tollgate_redis::RedisStore, r: tollgate_core::Rule| async move {
        store.check_bounded(&[Check::new(who, &r, 1)], 0).await
    };
    for max_batch in [1, tollgate_redis::DEFAULT_MAX_BATCH] {
        let server = RedisServer::start();
        let config = tollgate_redis::RedisConfig::standalone(server.url())
            .with_call_timeout(Duration::from_secs(5))
            .with_max_batch(max_batch);
        let store = tollgate_redis::RedisStore::connect(config)
            .await
            .expect("connect");
        ask(store.clone(), r.clone()).await.expect("warm");
        server.pause();
        let call = tokio::spawn(ask(store.clone(), r.clone()));
        tokio::time::sleep(freeze).await;
        server.resume();
        let v = call.await.expect("task");
        assert_eq!(
            v.expect("answered within the call timeout").decisions[0].remaining,
            8,
            "max_batch {max_batch}"
        );
    }
    let mut cluster = tollgate_testkit::RedisCluster::start(3, 0);
    let config = tollgate_redis::RedisConfig::cluster(cluster.seed_urls())
        .with_call_timeout(Duration::from_secs(5))
        .with_max_batch(1);
    let store = tollgate_redis::RedisStore::connect(config)
        .await
        .expect("connect");
    ask(store.clone(), r.clone()).await.expect("warm");
    let node = cluster
        .master_of_key(&store.key(&who, "slow"))
        .expect("a master");
    cluster.node_mut(node).pause();
    let call = tokio::spawn(ask(store.clone(), r.clone()));
    tokio::time::sleep(freeze).await;
    cluster.node_mut(node).resume();
    let v = call.await.expect("task");
    assert_eq!(
        v.expect("answered within the call timeout").decisions[0].remaining,
        8,
        "on a Cluster"
    );
}

#[tokio::test]
async fn credentials_come_from_the_url() {
    let server = RedisServer::start_with_args(&["--requirepass", "s3cret"]);
    let port = server.port();
    let ok = RedisStore::connect(RedisConfig::standalone(format!(
        "redis://:s3cret@127.0.0.1:{port}"
    )))
    .await
    .expect("the right password connects");
    ok.ping().await.expect("ping");
    server.cli(&[
        "-a",
        "s3cret",
        "--no-auth-warning",
        "acl",
        "setuser",
        "gw",
        "on",
        ">pw2",
        "~*",
        "+@all",
    ]);
    let user = RedisStore::connect(RedisConfig::standalone(format!(
        "redis://gw:pw2@127.0.0.1:{port}"
    )))
    .await
    .expect("an ACL user connects");
    let r = rule("a", Algorithm::Gcra, 1, HOUR);
    assert!(
        user.check(&[Check::new(client(8), &r, 1)], 0)
            .await
            .expect("check")
            .allowed
    );
    let err = RedisStore::connect(RedisConfig::standalone(format!(
        "redis://:wrong@127.0.0.1:{port}"
    )))
    .await
    .expect_err("a wrong password is refused");
    assert!(!err.is_transient(), "{err}");
    assert!(
        !format!("{err}").contains("wrong"),
        "errors do not print passwords: {err}"
    );
}

#[tokio::test]
async fn policies_checked_twice_in_one_request_are_refused() {
    let server = RedisServer::start();
    let store = common::connect(&server.url(), StoreClock::Store).await;
    let r = rule("d", Algorithm::Gcra, 1, HOUR);
    let l: &Limit = r.limit();
    assert_eq!(l.quota().limit(), 1);
    let err = store
        .check(
            &[Check::new(client(9), &r, 1), Check::new(client(9), &r, 1)],
            0,
        )
        .await
        .expect_err("duplicate");
    assert_eq!(err.kind(), tollgate_redis::ErrorKind::Invalid);
}

/// An enforced rule of this limit, as a script shape.
fn enforced(limit: Limit) -> RuleShape {
    RuleShape {
        limit,
        mode: tollgate_core::Mode::Enforce,
    }
}

#[tokio::test]
async fn the_expiry_frequency_and_the_memory_policy_are_read_from_the_server() {
    // Redis's default, which connect() warns about (docs/operations.md, "Redis: `hz 100`";
    // "Redis: memory" for the policy, warned about where a maxmemory is set).
    let default = RedisServer::start();
    let store = common::connect(&default.url(), StoreClock::Store).await;
    assert_eq!(store.expiry_hz().await.expect("INFO server"), [10]);
    // No memory limit by default: nothing refused, nothing evicted, no advice.
    let limits = store.memory_limits().await.expect("INFO memory");
    assert_eq!(limits, [(0, "noeviction".to_string())]);
    let advised = RedisServer::start_with_args(&common::ADVISED_ARGS);
    let store = common::connect(&advised.url(), StoreClock::Store).await;
    assert_eq!(store.expiry_hz().await.expect("INFO server"), [100]);
    let limits = store.memory_limits().await.expect("INFO memory");
    assert_eq!(limits, [(64 << 20, "volatile-ttl".to_string())]);
    // A server that refuses INFO is still served: the advice is all that is lost.
    let renamed = RedisServer::start_with_args(&["--rename-command", "INFO", "\"\""]);
    let store = common::connect(&renamed.url(), StoreClock::Store).await;
    assert!(store.expiry_hz().await.is_err());
    assert!(store.memory_limits().await.is_err());
    let r = rule("served", Algorithm::TokenBucket, 1, HOUR);
    let checks = [Check::new(client(77), &r, 1)];
    assert!(store.check(&checks, 0).await.expect("check").allowed);
}

/// A flood of new clients (made-up API keys) fills a server with a `maxmemory`. Every key the
/// store writes expires when its state is fresh again, so under `maxmemory-policy volatile-ttl`
/// (what docs/operations.md recommends) Redis makes room by evicting the keys nearest to
/// fresh: the flood's own, one request old, before a limited client's, which holds a whole
/// period of debt. Every plan of the flood is decided, and the limited client stays limited.
/// Under `noeviction` (Redis's default) the same flood ends in plans that fail as `oom`: each
/// request then follows its failure policy, so a flood could turn limiting off where that
/// policy is `open`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_new_clients_on_a_full_server_evicts_its_own_keys_under_volatile_ttl() {
    for policy in ["volatile-ttl", "noeviction"] {
        let server = RedisServer::start_with_args(&["--maxmemory-policy", policy]);
        let store = common::connect(&server.url(), StoreClock::Store).await;
        let r = std::sync::Arc::new(rule("flood", Algorithm::TokenBucket, 5, HOUR));
        let limited = client(7);
        for _ in 0..5 {
            let v = store.check(&[Check::new(limited, &r, 1)], 0).await;
            assert!(v.expect("check").allowed);
        }
        let used: u64 = common::info_number(|a| server.cli(a), "memory", "used_memory");
        let room = (used + (1 << 20)).to_string();
        server.cli(&["config", "set", "maxmemory", &room]);
        // Rounds of 1,000 new clients at once, until Redis has evicted 2,000 keys or refused a
        // write (at most 50 rounds: 1 MiB holds about 10,000 of these keys).
        let mut oom = 0usize;
        for round in 0..50u128 {
            let tasks: Vec<_> = (0..1000u128)
                .map(|i| {
                    let (store, r) = (store.clone(), r.clone());
                    tokio::spawn(async move {
                        let who = client(1_000_000 + round * 1000 + i);
                        store.check(&[Check::new(who, &r, 1)], 0).await
                    })
                })
                .collect();
            for t in tasks {
                match t.await.expect("task") {
                    Ok(v) => assert!(v.allowed, "a new client was limited"),
                    Err(e) if e.kind() == tollgate_redis::ErrorKind::Oom => oom += 1,
                    Err(e) => panic!("{policy}: {e}"),
                }
            }
            if oom > 0 || common::info_number(|a| server.cli(a), "stats", "evicted_keys") >= 2000 {
                break;
            }
        }
        let evicted = common::info_number(|a| server.cli(a), "stats", "evicted_keys");
        if policy == "noeviction" {
            assert!(oom > 0, "the flood never filled the server");
            assert_eq!(evicted, 0);
            continue;
        }
        assert_eq!(oom, 0, "{policy}: plans failed on a server that may evict");
        assert!(evicted >= 2000, "{evicted} keys evicted");
        let v = store.check(&[Check::new(limited, &r, 1)], 0).await;
        let v = v.expect("check");
        assert!(!v.allowed, "the limited client's state was evicted");
        assert_eq!(v.decisions[0].remaining, 0);
    }
}

/// A server whose own settings refuse writes (here `min-replicas-to-write 1` with no replica:
/// NOREPLICAS; a failed save under `stop-writes-on-bgsave-error`, MISCONF, is answered the same
/// way) fails each call at its script's first write: the kind is `config`, a setting to fix on
/// the server, not `script`, and nothing is charged.
#[tokio::test]
async fn a_server_whose_settings_refuse_writes_fails_as_config_and_charges_nothing() {
    let server = RedisServer::start();
    let store = common::connect(&server.url(), StoreClock::Store).await;
    let r = rule("refused", Algorithm::TokenBucket, 3, HOUR);
    let checks = [Check::new(client(8), &r, 1)];
    assert!(store.check(&checks, 0).await.expect("check").allowed);
    server.cli(&["config", "set", "min-replicas-to-write", "1"]);
    for _ in 0..2 {
        let err = store.check(&checks, 0).await.expect_err("no replica");
        assert_eq!(err.kind(), tollgate_redis::ErrorKind::Config, "{err}");
        assert!(err.to_string().contains("NOREPLICAS"), "{err}");
    }
    server.cli(&["config", "set", "min-replicas-to-write", "0"]);
    let v = store.check(&checks, 0).await.expect("check");
    assert!(v.allowed);
    assert_eq!(
        v.decisions[0].remaining, 1,
        "the refused calls charged nothing"
    );
}

/// A server with a `timeout` closes a client's connection idle that many seconds. redis-rs
/// learns of it only from its next call, which failed (the first request after a quiet spell
/// followed its failure policy, and with `max_batch = 1` every plan takes that connection);
/// the store PINGs its shared connection twice a second, so none sits idle that long. The
/// batches' own connection checks its socket before each call. Both settings, after the
/// shortest `timeout` a server takes (1 s) has passed twice over, and a settle (redis-rs's
/// connection at every setting).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_call_fails_after_a_quiet_spell_longer_than_the_servers_idle_timeout() {
    let server = RedisServer::start_with_args(&["--timeout", "1"]);
    let r = rule("quiet", Algorithm::TokenBucket, 5, HOUR);
    let mut stores = Vec::new();
    for max_batch in [1, 64] {
        let config = RedisConfig::standalone(server.url())
            .with_max_batch(max_batch)
            .with_key_prefix(format!("quiet{max_batch}"));
        let store = RedisStore::connect(config).await.expect("connect");
        let checks = [Check::new(client(9), &r, 1)];
        assert!(store.check(&checks, 0).await.expect("check").allowed);
        stores.push((max_batch, store));
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    for (max_batch, store) in &stores {
        let checks = [Check::new(client(9), &r, 1)];
        let v = store.check(&checks, 0).await;
        let v = v.unwrap_or_else(|e| panic!("max_batch {max_batch}: {e}"));
        assert_eq!(v.decisions[0].remaining, 3, "max_batch {max_batch}");
    }
    // A settle takes redis-rs's connection at every setting: after another quiet spell, the
    // default's store gives one unit of its last charge back.
    let (_, store) = &stores[1];
    let (v, charges) = store
        .check_timed(&[Check::new(client(9), &r, 2)], 0)
        .await
        .expect("check");
    assert!(v.allowed);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let item = tollgate_redis::SettleItem {
        client: client(9),
        rule: &r,
        units: 2,
        at: charges[0],
        real: Some(1),
    };
    let settled = store
        .settle(&[item], 0)
        .await
        .expect("a settle after a quiet spell");
    assert_eq!(settled, [1]);
}
