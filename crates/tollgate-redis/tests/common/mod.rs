//! Shared by the integration tests: a small deterministic PRNG, random quotas, and stores
//! connected to servers the tests start themselves.
#![allow(dead_code)]

pub mod cut;
pub mod relay;

use std::time::Duration;
use tollgate_core::{Algorithm, Check, ClientKey, Limit, Quota, Rule};
use tollgate_redis::{RedisConfig, RedisStore, StoreClock};

/// What `rule` has left for `client` at `now` (a check of cost 0, which charges nothing).
pub async fn remaining(store: &RedisStore, client: ClientKey, rule: &Rule, now: u64) -> u64 {
    match store.check(&[Check::new(client, rule, 0)], now).await {
        Ok(v) => v.decisions[0].remaining,
        Err(e) => panic!("query: {e}"),
    }
}

/// SplitMix64: deterministic, seeded per test, no dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [lo, hi].
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.range(1, 100) <= percent
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.range(0, items.len() as u64 - 1) as usize]
    }
}

/// A random valid limit for `algorithm`: small and large limits, periods from a millisecond
/// to a day (and odd ones that do not divide evenly), bursts below and above the limit.
pub fn random_limit(rng: &mut Rng, algorithm: Algorithm) -> Limit {
    for _ in 0..1000 {
        let period_us = match rng.range(0, 5) {
            0 => rng.range(1_000, 50_000),
            1 => 1_000_000,
            2 => rng.range(1_000_000, 120_000_000),
            3 => 60_000_000,
            4 => 3_600_000_000,
            _ => 86_400_000_000,
        };
        let limit = match rng.range(0, 3) {
            0 => rng.range(1, 5),
            1 => rng.range(1, 30),
            2 => rng.range(30, 1000),
            _ => rng.range(1, 100_000),
        };
        let burst = match rng.range(0, 2) {
            0 => limit,
            1 => rng.range(1, limit.max(2)),
            _ => rng.range(limit, limit * 3),
        };
        let Ok(q) = Quota::new(limit, Duration::from_micros(period_us)) else {
            continue;
        };
        let Ok(q) = q.with_burst(burst) else {
            continue;
        };
        if let Ok(l) = Limit::new(algorithm, q) {
            return l;
        }
    }
    panic!("no valid quota found for {algorithm}");
}

pub fn client(n: u128) -> ClientKey {
    ClientKey::from_u128(n.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834))
}

/// Clients numbered from `from` on whose keys live on master `m` of `cluster` (each asks the
/// cluster's node table, so take a few).
pub fn clients_of(
    cluster: &tollgate_testkit::RedisCluster,
    m: usize,
    from: u128,
) -> impl Iterator<Item = u128> + '_ {
    (from..)
        .filter(move |&w| cluster.master_of_slot(u32::from(client(w).cluster_slot())) == Some(m))
}

pub fn rule(name: &str, algorithm: Algorithm, limit: u64, period: Duration) -> Rule {
    let quota = match Quota::new(limit, period) {
        Ok(q) => q,
        Err(e) => panic!("bad quota in a test: {e}"),
    };
    match Limit::new(algorithm, quota) {
        Ok(l) => Rule::new(name, l),
        Err(e) => panic!("bad limit in a test: {e}"),
    }
}

/// A store on `server` deciding at the caller's time. Virtual time runs at its own pace (and
/// backwards): keys must not expire in real time, hence the PX floor of an hour.
pub async fn local_store(server: &tollgate_testkit::RedisServer) -> RedisStore {
    connect(&server.url(), StoreClock::Local)
        .await
        .with_ttl_floor(Duration::from_secs(3600))
}

pub async fn connect(url: &str, clock: StoreClock) -> RedisStore {
    connect_to(RedisConfig::standalone(url), clock, url).await
}

pub async fn connect_cluster(seeds: Vec<String>, clock: StoreClock) -> RedisStore {
    connect_to(RedisConfig::cluster(seeds), clock, "the cluster").await
}

/// Connects with `config`, its clock set and its keys under the `test` prefix; `what` names
/// the server in the panic message.
async fn connect_to(config: RedisConfig, clock: StoreClock, what: &str) -> RedisStore {
    let config = config.with_clock(clock).with_key_prefix("test");
    match RedisStore::connect(config).await {
        Ok(s) => s,
        Err(e) => panic!("cannot connect to {what}: {e}"),
    }
}

/// The server settings docs/operations.md advises for a limiter's Redis ("Redis: `hz 100`",
/// "Redis: memory"), with a 64 MiB limit.
pub const ADVISED_ARGS: [&str; 6] = [
    "--hz",
    "100",
    "--maxmemory",
    "64mb",
    "--maxmemory-policy",
    "volatile-ttl",
];

/// Microseconds since the epoch of 2026-01-01, a realistic `now`.
pub const EPOCH_2026: u64 = 1_767_225_600_000_000;

/// Script calls (EVALSHA and EVAL) a server ran since its stats were reset.
pub fn script_calls(cli: impl Fn(&[&str]) -> String) -> u64 {
    calls_of(&cli, &["evalsha", "eval"])
}

/// The calls of the commands `names` (lower case, as INFO commandstats names them) a server
/// ran since its stats were reset.
pub fn calls_of(cli: impl Fn(&[&str]) -> String, names: &[&str]) -> u64 {
    let stats = cli(&["info", "commandstats"]);
    counts(&stats, |name| {
        name.strip_prefix("cmdstat_")
            .is_some_and(|n| names.contains(&n))
    })
}

/// The errors of the kind `code` (`NOSCRIPT`, ...) a server answered since its stats were
/// reset (INFO errorstats).
pub fn errors_of(cli: impl Fn(&[&str]) -> String, code: &str) -> u64 {
    let stats = cli(&["info", "errorstats"]);
    counts(&stats, |name| name.strip_prefix("errorstat_") == Some(code))
}

/// The sum of the `calls=` or `count=` of the INFO lines whose name `wanted` picks.
fn counts(info: &str, wanted: impl Fn(&str) -> bool) -> u64 {
    info.lines()
        .filter_map(|l| {
            let (name, fields) = l.split_once(':')?;
            if !wanted(name) {
                return None;
            }
            let n = fields.split(',').find_map(|f| {
                f.strip_prefix("calls=")
                    .or_else(|| f.strip_prefix("count="))
            })?;
            n.trim().parse::<u64>().ok()
        })
        .sum()
}

/// The scripts a server keeps (`INFO memory`'s `number_of_cached_scripts`).
pub fn cached_scripts(cli: impl Fn(&[&str]) -> String) -> u64 {
    info_number(cli, "memory", "number_of_cached_scripts")
}

/// A number of a server's `INFO section`: the field `field`; panics (with the text) without it.
pub fn info_number(cli: impl Fn(&[&str]) -> String, section: &str, field: &str) -> u64 {
    let info = cli(&["info", section]);
    info.lines()
        .find_map(|l| l.trim_end().strip_prefix(field)?.strip_prefix(':'))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in {info}"))
}
