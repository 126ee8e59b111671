//! A `sliding_window_log` longer than [`IN_PLACE_LOG_LIMIT`] is decided in place (the generic
//! script's `sliding_window_log_in_place.lua`): a few reads of 7 or 14 bytes and an append,
//! never the whole value, which a long log made cost Redis milliseconds a request. These
//! tests hold it to tollgate-core's decisions (with settles, give-backs, clock steps back and
//! a policy whose limit moves across the bound), to its reads, and to its memory.

mod common;

use common::{calls_of, Rng, EPOCH_2026};
use std::time::Duration;
use tollgate_core::{
    decide, Algorithm, Charge, Check, ClientKey, Limit, Micros, Mode, Quota, Rule, State,
};
use tollgate_redis::{GiveBackItem, RedisStore, SettleItem, IN_PLACE_LOG_LIMIT};
use tollgate_testkit::RedisServer;

fn log_limit(limit: u64, period: Micros) -> Limit {
    let q = Quota::new(limit, Duration::from_micros(period)).expect("quota");
    Limit::new(Algorithm::SlidingWindowLog, q).expect("limit")
}

#[derive(Debug, Default)]
struct Seen {
    allowed: u64,
    retry: u64,
    in_place: u64,
    generated: u64,
    settled: u64,
    given_back: u64,
    paired: u64,
}

/// One client's log under one rule name whose limit changes from request to request, across
/// IN_PLACE_LOG_LIMIT (a reload that moves a policy from a generated script to the generic
/// one and back, on the same key), sometimes in a plan with a token bucket; now mostly
/// forward, by steps that fill the log, sometimes far (records expire: the dead prefix grows
/// until it is cut), sometimes back. Every verdict, settle and give-back equals the core's.
async fn trace(store: &RedisStore, seed: u64, seen: &mut Seen) {
    let mut rng = Rng::new(seed);
    let p = rng.range(200_000, 5_000_000);
    let name = format!("long-log-{seed}");
    let rules: Vec<Rule> = [
        IN_PLACE_LOG_LIMIT - rng.range(0, 100),
        IN_PLACE_LOG_LIMIT + 1,
        IN_PLACE_LOG_LIMIT + rng.range(2, 3_000),
        rng.range(30, 200),
    ]
    .iter()
    .map(|&n| Rule::new(name.clone(), log_limit(n, p)))
    .collect();
    let bucket = Rule::new(
        format!("bucket-{seed}"),
        Limit::new(
            Algorithm::TokenBucket,
            Quota::new(500, Duration::from_micros(p)).expect("quota"),
        )
        .expect("limit"),
    );
    let client = common::client(u128::from(seed) + 77);
    let mut log = rules[0].limit().fresh();
    let mut tokens = bucket.limit().fresh();
    let mut pending: Vec<Charge> = Vec::new();
    let mut now = EPOCH_2026 + rng.range(0, p);
    for step in 0..400 {
        let rule = &rules[match rng.range(0, 9) {
            0 => 0,
            1 => 3,
            2 | 3 => 1,
            _ => 2,
        }];
        let limit = rule.limit().quota().limit();
        now = match rng.range(0, 40) {
            0 => now.saturating_sub(rng.range(1, p)),
            1 => now + rng.range(p / 2, 2 * p),
            2 => now + p,
            3..=5 => now,
            _ => now + rng.range(1, 3 * p / limit + 2),
        };
        match rng.range(0, 9) {
            0 if !pending.is_empty() => {
                let i = rng.range(0, pending.len() as u64 - 1) as usize;
                let charge = pending.swap_remove(i);
                let real = match rng.range(0, 2) {
                    0 => 0,
                    1 => rng.range(0, charge.units),
                    _ => charge.units + rng.range(1, 5),
                };
                let s = rule.limit().settle(&mut log, now, charge, real);
                let want = s.refunded + s.charged;
                let item = SettleItem {
                    client,
                    rule,
                    units: charge.units,
                    at: charge.at,
                    real: Some(real),
                };
                let got = store.settle(&[item], now).await.expect("settle");
                assert_eq!(got, vec![want], "seed {seed} step {step}: settle");
                seen.settled += u64::from(want > 0);
            }
            1 => {
                let units = rng.range(1, 6);
                let want = rule.limit().give_back(&mut log, now, units);
                let item = GiveBackItem {
                    client,
                    rule,
                    units,
                };
                let got = store.give_back(&[item], now).await.expect("give back");
                assert_eq!(got, vec![want], "seed {seed} step {step}: give back");
                seen.given_back += u64::from(want > 0);
            }
            _ => {
                let cost = match rng.range(0, 12) {
                    0 => 0,
                    1 => limit + 1,
                    2 => rng.range(1, limit),
                    _ => rng.range(1, 4),
                };
                let paired = rng.chance(20);
                let mut checks = vec![Check::new(client, rule, cost)];
                if paired {
                    let mode = if rng.chance(50) {
                        Mode::Enforce
                    } else {
                        Mode::Shadow
                    };
                    checks.push(Check {
                        mode,
                        ..Check::new(client, &bucket, rng.range(0, 3))
                    });
                }
                let states: Vec<&mut State> = if paired {
                    vec![&mut log, &mut tokens]
                } else {
                    vec![&mut log]
                };
                let want = decide(
                    checks
                        .iter()
                        .zip(states)
                        .map(|(c, s)| (c.rule.limit(), s, c.cost, c.mode)),
                    now,
                );
                let (got, at) = store.check_timed(&checks, now).await.expect("check");
                assert_eq!(got, want, "seed {seed} step {step}: {checks:?} at {now}");
                if want.allowed && cost > 0 {
                    pending.push(Charge {
                        units: cost,
                        at: at[0],
                    });
                    seen.allowed += 1;
                }
                seen.retry += u64::from(want.retry_after(&checks).is_some());
                seen.paired += u64::from(paired);
                if limit > IN_PLACE_LOG_LIMIT {
                    seen.in_place += 1;
                } else {
                    seen.generated += 1;
                }
            }
        }
    }
}

#[tokio::test]
async fn long_logs_decided_in_place_match_core_across_settles_clock_steps_and_reloads() {
    let server = RedisServer::start();
    let store = common::local_store(&server).await;
    let mut seen = Seen::default();
    for seed in 0..10 {
        trace(&store, 4_000 + seed, &mut seen).await;
    }
    // The traces reached what they test.
    assert!(
        seen.allowed > 1_000
            && seen.retry > 100
            && seen.in_place > 1_000
            && seen.generated > 500
            && seen.settled > 50
            && seen.given_back > 50
            && seen.paired > 200,
        "{seen:?}"
    );
}

/// A client that sends at its limit, one request a millisecond for three periods, keeps its
/// log full: every request is admitted (as the core admits it), no request reads the value
/// whole (no GET, no MGET: a few GETRANGEs of 7 or 14 bytes), and the value never holds more
/// than about twice the live records (the dead prefix is cut once it outnumbers them).
#[tokio::test]
async fn a_full_long_log_is_read_in_small_pieces_and_holds_at_most_twice_its_window() {
    let server = RedisServer::start();
    let store = common::local_store(&server).await;
    let limit = 3_000;
    let rule = Rule::new("full", log_limit(limit, 3_000_000));
    let client = common::client(5);
    let key = store.key(&client, "full");
    let mut model = rule.limit().fresh();
    let cli = |args: &[&str]| server.cli(args);
    let mut strlen = 0u64;
    let mut cuts = 0;
    let (mut getranges, mut checks) = (0, 0);
    for i in 0..3 * limit + 20 {
        if i == 300 {
            // Past 2,048 bytes a log is no longer read whole: count from here.
            cli(&["config", "resetstat"]);
        }
        let now = EPOCH_2026 + i * 1_000;
        let want = rule.limit().check(&mut model, now, 1, true);
        let got = store
            .check(&[Check::new(client, &rule, 1)], now)
            .await
            .expect("check");
        assert_eq!(got.decisions[0], want, "request {i}");
        assert!(
            got.allowed,
            "request {i}: a client at its limit is admitted"
        );
        if i % 50 == 0 || i > 3 * limit {
            let len: u64 = cli(&["strlen", &key]).trim().parse().expect("strlen");
            // 8 bytes of header, 14 a record; at most `limit` live records and as many dead.
            assert!(len <= 8 + 14 * (2 * limit + 1), "request {i}: {len} bytes");
            cuts += usize::from(len < strlen);
            strlen = len;
        }
        if i >= 300 {
            checks += 1;
        }
    }
    getranges += calls_of(cli, &["getrange"]);
    assert_eq!(calls_of(cli, &["get", "mget"]), 0, "a long log read whole");
    // STRLEN, the header, the newest record, the binary search (13 steps at most for 6,001
    // records) and the record before the window: 16; the cuts read the live records once.
    assert!(
        getranges <= checks * 16,
        "{getranges} GETRANGEs for {checks} checks"
    );
    assert!(cuts >= 2, "the dead prefix was cut {cuts} times");
    // Past the window: denied, retrying when the oldest live record leaves, as the core says.
    let now = EPOCH_2026 + (3 * limit + 19) * 1_000;
    for cost in [1, 2, 40] {
        let want = rule.limit().check(&mut model, now, cost, true);
        let got = store
            .check(&[Check::new(client, &rule, cost)], now)
            .await
            .expect("check");
        assert!(!got.allowed && want.retry_after.is_some(), "{got:?}");
        assert_eq!(
            got.decisions[0], want,
            "a request of {cost} over a full log"
        );
    }
}

/// A key of another type where the log should be (not tollgate's, or an operator's mistake)
/// reads as an empty log and the first charge replaces it, as the generic script treats any
/// rule's key (MGET reads it as missing, SET replaces it).
#[tokio::test]
async fn a_long_log_key_of_another_type_reads_as_empty_and_is_replaced() {
    let server = RedisServer::start();
    let store = common::local_store(&server).await;
    let rule = Rule::new("typed", log_limit(IN_PLACE_LOG_LIMIT + 1, 60_000_000));
    let client: ClientKey = common::client(9);
    let key = store.key(&client, "typed");
    server.cli(&["rpush", &key, "x", "y"]);
    let got = store
        .check(&[Check::new(client, &rule, 3)], EPOCH_2026)
        .await
        .expect("check");
    assert!(got.allowed);
    assert_eq!(got.decisions[0].remaining, IN_PLACE_LOG_LIMIT + 1 - 3);
    assert_eq!(server.cli(&["type", &key]).trim(), "string");
    let mut model = rule.limit().fresh();
    rule.limit().check(&mut model, EPOCH_2026, 3, true);
    let want = rule.limit().check(&mut model, EPOCH_2026 + 1, 2, true);
    let got = store
        .check(&[Check::new(client, &rule, 2)], EPOCH_2026 + 1)
        .await
        .expect("check");
    assert_eq!(got.decisions[0], want);
}

/// Records a charge left in place after they expired (a dead prefix) stay out of the window
/// when a settle removes the newest record, the one whose instant kept them out: with the
/// clock stepped back (gateways' clocks disagree), the core, which dropped them when it
/// charged, counts none of them, and neither does the store. By a refund, and by a give-back.
#[tokio::test]
async fn expired_records_stay_out_when_a_settle_removes_the_newest_and_the_clock_steps_back() {
    let server = RedisServer::start();
    let store = common::local_store(&server).await;
    let rule = Rule::new("dead", log_limit(IN_PLACE_LOG_LIMIT + 1, 1_000_000));
    for (who, by_refund) in [(21u128, true), (22, false)] {
        let client = common::client(who);
        let mut model = rule.limit().fresh();
        let t0 = EPOCH_2026;
        // A charge at t0, expired by the last one (t0 + 1.5 s, a period later) but kept in
        // place, a dead prefix shorter than the two live records after it (t0 + 0.9 s and
        // t0 + 0.95 s): not cut.
        let times = [t0, t0 + 900_000, t0 + 950_000, t0 + 1_500_000];
        for (now, cost) in times.into_iter().zip([2, 1, 1, 1]) {
            let want = rule.limit().check(&mut model, now, cost, true);
            let got = store
                .check(&[Check::new(client, &rule, cost)], now)
                .await
                .expect("check");
            assert_eq!(got.decisions[0], want);
        }
        let key = store.key(&client, "dead");
        let len: u64 = server
            .cli(&["strlen", &key])
            .trim()
            .parse()
            .expect("strlen");
        assert_eq!(
            len,
            8 + 4 * 14,
            "the expired records are still in the value"
        );
        let now = t0 + 1_500_000;
        let (want, got) = if by_refund {
            let charge = Charge { units: 1, at: now };
            let want = rule.limit().settle(&mut model, now, charge, 0).refunded;
            let item = SettleItem {
                client,
                rule: &rule,
                units: 1,
                at: now,
                real: Some(0),
            };
            (want, store.settle(&[item], now).await.expect("settle"))
        } else {
            let want = rule.limit().give_back(&mut model, now, 1);
            let item = GiveBackItem {
                client,
                rule: &rule,
                units: 1,
            };
            (
                want,
                store.give_back(&[item], now).await.expect("give back"),
            )
        };
        assert_eq!((want, got), (1, vec![1]));
        // Back to t0 + 0.5 s, which the newest record left (t0 + 0.95 s) moves to t0 + 0.95
        // s: the window from t0 - 0.05 s would hold the charge of t0 again.
        let back = t0 + 500_000;
        let want = rule.limit().check(&mut model, back, 0, true);
        assert_eq!(
            want.remaining,
            IN_PLACE_LOG_LIMIT + 1 - 2,
            "the core counts the two live records only"
        );
        let got = store
            .check(&[Check::new(client, &rule, 0)], back)
            .await
            .expect("check");
        assert_eq!(got.decisions[0], want, "refund: {by_refund}");
    }
}
