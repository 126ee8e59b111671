//! The script texts, built from `scripts/*.lua` with the core's bounds in front; their SHA1s
//! are what EVALSHA names.
//!
//! Each `scripts/<algorithm>.lua` is a decision body: a block of statements with the contract
//! written in `check_one.lua`. It is used two ways:
//! - written out inline in one script per policy shape (algorithm, limit, period, burst), for
//!   a request matched by one policy (the common case): bounds, the quota as constants, and
//!   `check_one.lua` with the body in place of its `@decide` line. No function, no closure:
//!   Redis runs a script's whole chunk on every call, and each closure costs (callgrind);
//! - wrapped in a function of the algorithm's name, in the script with all six algorithms
//!   and `check.lua` for several policies at once, and in the lease script.

use crate::error::RedisStoreError;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};
use tollgate_core::algorithms::MAX_LOG_LIMIT;
use tollgate_core::{Algorithm, Limit};
use tollgate_core::{MAX_BURST_SPAN, MAX_LIMIT, MAX_PERIOD};

const PRELUDE: &str = include_str!("../scripts/prelude.lua");
const TTL: &str = include_str!("../scripts/ttl.lua");
const PACKED: &str = include_str!("../scripts/packed.lua");
const ARGS: &str = include_str!("../scripts/args.lua");
const CHECK: &str = include_str!("../scripts/check.lua");
const LEASE: &str = include_str!("../scripts/lease.lua");
const CHECK_ONE: &str = include_str!("../scripts/check_one.lua");
const CHECK_SET: &str = include_str!("../scripts/check_set.lua");
const COST: &str = include_str!("../scripts/cost.lua");
const CLOCK: &str = include_str!("../scripts/clock.lua");
const WRITE: &str = include_str!("../scripts/write.lua");
/// The lines of the drivers that an algorithm's body and `cost.lua`, `clock.lua` and
/// `write.lua` replace.
const DECIDE_MARK: &str = "-- @decide\n";
const CLOCK_MARK: &str = "-- @clock\n";
const COST_MARK: &str = "-- @cost\n";
const WRITE_MARK: &str = "-- @write\n";

/// `cost.lua` for a policy whose cost is ARGV[at] (a Lua expression: check_set.lua's `$I`).
fn cost(at: &str) -> String {
    COST.replace("$COST", at)
}

/// `clock.lua` for a driver whose optional `now` is ARGV[now_at] (the PX floor follows it).
fn clock(now_at: usize) -> String {
    CLOCK
        .replace("$NOW", &now_at.to_string())
        .replace("$FLOOR", &(now_at + 1).to_string())
}

/// `write.lua` for the key, value and idle instant named by these Lua expressions.
fn write(key: &str, value: &str, idle: &str) -> String {
    WRITE
        .replace("$KEY", key)
        .replace("$VALUE", value)
        .replace("$IDLE", idle)
}

pub(crate) struct Script {
    pub(crate) text: String,
    pub(crate) sha: String,
    /// Single-policy scripts: when nonzero, an allowed request is answered with the integer
    /// `reset_after * reply_base + remaining` (see [`reply_base`]).
    pub(crate) reply_base: u64,
}

pub(crate) fn script() -> &'static Script {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    SCRIPT.get_or_init(|| {
        let functions: Vec<String> = Algorithm::ALL.iter().map(|&a| as_function(a)).collect();
        let mut parts = vec![PRELUDE, TTL, ARGS];
        parts.extend(functions.iter().map(String::as_str));
        parts.push(CHECK);
        build(&parts)
    })
}

/// The lease driver and the algorithms it can lease (see `scripts/lease.lua`).
pub(crate) fn lease_script() -> &'static Script {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    SCRIPT.get_or_init(|| {
        let functions: Vec<String> = [
            Algorithm::FixedWindow,
            Algorithm::TokenBucket,
            Algorithm::LeakyBucket,
            Algorithm::Gcra,
        ]
        .iter()
        .map(|&a| as_function(a))
        .collect();
        let mut parts = vec![PRELUDE, TTL, PACKED, ARGS];
        parts.extend(functions.iter().map(String::as_str));
        parts.push(LEASE);
        build(&parts)
    })
}

/// An algorithm's body as the function the multi-policy and lease drivers call:
/// `name(raw, now, limit, p, burst, t, cost)` returning ok, remaining, reset, retry, value,
/// idle_at.
fn as_function(a: Algorithm) -> String {
    format!(
        "local function {}(raw, now, limit, p, burst, t, cost)\n\
         local ok, remaining, reset, retry, value, idle_at\n\
         do\n{}end\n\
         return ok, remaining, reset, retry, value, idle_at\n\
         end",
        a.name(),
        algorithm_file(a)
    )
}

fn algorithm_file(a: Algorithm) -> &'static str {
    match a {
        Algorithm::FixedWindow => include_str!("../scripts/fixed_window.lua"),
        Algorithm::SlidingWindowLog => include_str!("../scripts/sliding_window_log.lua"),
        Algorithm::SlidingWindowCounter => include_str!("../scripts/sliding_window_counter.lua"),
        Algorithm::TokenBucket => include_str!("../scripts/token_bucket.lua"),
        Algorithm::LeakyBucket => include_str!("../scripts/leaky_bucket.lua"),
        Algorithm::Gcra => include_str!("../scripts/gcra.lua"),
    }
}

/// The single-policy script of `limit`, built (and checked: a `Limit` with public fields may
/// bypass [`Limit::new`]) once per policy shape and kept. Past [`MAX_POLICY_SCRIPTS`] shapes
/// the caller falls back to the multi-policy script, which takes the quota as arguments.
pub(crate) fn single_script(limit: &Limit) -> Result<Option<Arc<Script>>, RedisStoreError> {
    static SCRIPTS: Cache<Limit> = OnceLock::new();
    cached(&SCRIPTS, limit, build_single, |l| *l)
}

/// A process-wide script cache, by what selects the script.
type Cache<K> = OnceLock<RwLock<HashMap<K, Arc<Script>, LimitHash>>>;

/// The script for `key` from `cache`, built by `build` and kept on first use; `None` once the
/// cache holds [`MAX_POLICY_SCRIPTS`] scripts (the multi-policy script serves the rest).
fn cached<K, Q>(
    cache: &Cache<K>,
    key: &Q,
    build: impl FnOnce(&Q) -> Result<Script, RedisStoreError>,
    owned: impl FnOnce(&Q) -> K,
) -> Result<Option<Arc<Script>>, RedisStoreError>
where
    K: std::borrow::Borrow<Q> + std::hash::Hash + Eq,
    Q: std::hash::Hash + Eq + ?Sized,
{
    let scripts = cache.get_or_init(Default::default);
    if let Some(s) = scripts
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(key)
    {
        return Ok(Some(Arc::clone(s)));
    }
    let built = Arc::new(build(key)?);
    let mut map = scripts
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if map.len() >= MAX_POLICY_SCRIPTS {
        return Ok(None);
    }
    Ok(Some(Arc::clone(map.entry(owned(key)).or_insert(built))))
}

/// A hasher for the script cache, which every single-policy check reads: its keys are a few
/// trusted integers (no attacker picks them), so SipHash's flood resistance buys nothing and
/// its cost showed in the client's profile (`perf record` of `redis_bench`).
#[derive(Default, Clone, Copy)]
pub(crate) struct LimitHash;

impl std::hash::BuildHasher for LimitHash {
    type Hasher = MultiplyHasher;
    fn build_hasher(&self) -> MultiplyHasher {
        MultiplyHasher(0)
    }
}

/// Multiply-rotate mixing of each written word (the Fx hash's scheme).
pub(crate) struct MultiplyHasher(u64);

impl std::hash::Hasher for MultiplyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// How many policy shapes get a script of their own. Configurations have a handful; the
/// bound keeps a program that makes quotas up at run time from filling Redis' script cache.
pub(crate) const MAX_POLICY_SCRIPTS: usize = 1024;

/// The quota of `limit` as the script's constants (limit, period, burst, interval), checked:
/// a `Limit` with public fields may bypass [`Limit::new`], and the script must never receive
/// a constant it would have refused as an argument.
fn constants(limit: &Limit) -> Result<(u64, u64, u64, u64), RedisStoreError> {
    let q = &limit.quota;
    Limit::new(limit.algorithm, *q).map_err(RedisStoreError::invalid)?;
    // The core's bounds already keep these within the Lua bounds.
    let (l, p, b, t) = (
        q.limit(),
        q.period_micros(),
        q.burst(),
        q.emission_interval_micros(),
    );
    if l == 0 || l > MAX_LIMIT || b == 0 || b > MAX_LIMIT || p == 0 || l > p {
        return Err(RedisStoreError::invalid(format!(
            "quota {q:?} is out of the script's bounds"
        )));
    }
    if b.checked_mul(t).is_none_or(|span| span > MAX_BURST_SPAN) {
        return Err(RedisStoreError::invalid("burst x interval exceeds 2^52 us"));
    }
    Ok((l, p, b, t))
}

fn build_single(limit: &Limit) -> Result<Script, RedisStoreError> {
    let (l, p, b, t) = constants(limit)?;
    let (base, reset_bound) = reply_base(l, p, b, t);
    let bind = format!(
        "local limit, p, burst, t = {l}, {p}, {b}, {t}\n\
         local REPLY_BASE, REPLY_RESET_BOUND = {base}, {reset_bound}"
    );
    let driver = CHECK_ONE
        .replace(COST_MARK, &cost("1"))
        .replace(CLOCK_MARK, &clock(2))
        .replace(WRITE_MARK, &write("key", "value", "idle_at"))
        .replace(DECIDE_MARK, algorithm_file(limit.algorithm));
    let mut script = build(&[&bind, &driver]);
    script.reply_base = base;
    Ok(script)
}

/// The most policies a request may have for a policy-set script of its own; requests with
/// more use the multi-policy script (check.lua). Each policy adds seven Lua locals and its
/// body twice; Lua 5.1 allows 200 locals per function.
pub(crate) const MAX_SET_POLICIES: usize = 8;

/// The script of a request matched by the policies `limits` (2 to [`MAX_SET_POLICIES`], in
/// the request's order), built once per set of policy shapes and kept; `None` past
/// [`MAX_POLICY_SCRIPTS`] sets or outside those counts (the multi-policy script serves those).
pub(crate) fn set_script(limits: &[Limit]) -> Result<Option<Arc<Script>>, RedisStoreError> {
    static SCRIPTS: Cache<Box<[Limit]>> = OnceLock::new();
    if !(2..=MAX_SET_POLICIES).contains(&limits.len()) {
        return Ok(None);
    }
    cached(&SCRIPTS, limits, build_set, |l: &[Limit]| l.into())
}

/// The sections of `check_set.lua` (see its header), in the order the script uses them.
const SET_SECTIONS: [&str; 7] = [
    "head",
    "policy",
    "decided",
    "commit",
    "else",
    "uncharged",
    "reply",
];

/// `check_set.lua` cut at its `-- @<section>` lines: the preamble, then one text per section
/// of [`SET_SECTIONS`].
fn set_sections() -> Result<(&'static str, Vec<&'static str>), RedisStoreError> {
    let missing = |name: &str| RedisStoreError::invalid(format!("check_set.lua has no @{name}"));
    let mut rest = CHECK_SET;
    let mut preamble = "";
    let mut sections = Vec::with_capacity(SET_SECTIONS.len());
    for (i, name) in SET_SECTIONS.iter().enumerate() {
        let mark = format!("-- @{name}\n");
        let (before, after) = rest.split_once(&mark).ok_or_else(|| missing(name))?;
        if i == 0 {
            preamble = before;
        } else {
            sections.push(before);
        }
        rest = after;
    }
    sections.push(rest);
    Ok((preamble, sections))
}

fn build_set(limits: &[Limit]) -> Result<Script, RedisStoreError> {
    let (preamble, sections) = set_sections()?;
    let [head, policy, decided, commit, otherwise, uncharged, reply] = sections[..] else {
        return Err(RedisStoreError::invalid(
            "check_set.lua has the wrong sections",
        ));
    };
    let n = limits.len();
    let mut text = String::from(preamble);
    text.push_str(
        &head
            .replace(CLOCK_MARK, &clock(n + 1))
            .replace("$N1", &(n + 1).to_string())
            .replace("$N2", &(n + 2).to_string())
            .replace("$N", &n.to_string()),
    );
    let mut commits = String::new();
    let mut uncharges = String::new();
    for (i, limit) in limits.iter().enumerate() {
        let (l, p, b, t) = constants(limit)?;
        let bind = |section: &str| {
            section
                .replace("$I", &(i + 1).to_string())
                .replace("$LIMIT", &l.to_string())
                .replace("$PERIOD", &p.to_string())
                .replace("$BURST", &b.to_string())
                .replace("$T", &t.to_string())
        };
        // Placeholders first: the body is inserted as it is.
        let body = algorithm_file(limit.algorithm);
        text.push_str(&bind(&policy.replace(COST_MARK, &cost("$I"))).replace(DECIDE_MARK, body));
        commits.push_str(&bind(
            &commit.replace(WRITE_MARK, &write("keys[$I]", "value_$I", "idle_$I")),
        ));
        uncharges.push_str(&bind(uncharged).replace(DECIDE_MARK, body));
    }
    text.push_str(decided);
    text.push_str(&commits);
    text.push_str(otherwise);
    text.push_str(&uncharges);
    let format = format!(">{}", "BI7I7I7".repeat(n));
    let values: Vec<String> = (1..=n)
        .map(|i| format!("ok_{i} and 1 or 0, remaining_{i}, reset_{i}, retry_{i} + 1"))
        .collect();
    text.push_str(
        &reply
            .replace("$FORMAT", &format)
            .replace("$VALUES", &values.join(", ")),
    );
    Ok(build(&[&text]))
}

/// How an allowed request's decision fits one integer reply (a table costs Redis ~5,000
/// instructions and a packed string ~2,000 more than an integer, measured with callgrind):
/// `reset_after * base + remaining`, with `remaining < base` and `reset_after < reset_bound`.
/// Every algorithm's remaining is at most max(limit, burst) and its reset_after at most
/// max(burst x interval, 2 x period) (the sliding counter's state lives two periods). Returns
/// (0, 0) when `reset_bound x base` would not stay below 2^53 (exact in Lua): such quotas are
/// answered with the packed string. The script checks both bounds before using the integer.
fn reply_base(limit: u64, period: u64, burst: u64, interval: u64) -> (u64, u64) {
    let base = limit.max(burst) + 1;
    let reset_bound = burst
        .saturating_mul(interval)
        .max(period.saturating_mul(2))
        .saturating_add(1);
    match reset_bound.checked_mul(base) {
        Some(n) if n <= 1 << 53 => (base, reset_bound),
        _ => (0, 0),
    }
}

fn build(parts: &[&str]) -> Script {
    let mut text = format!(
        "-- tollgate: bounds from tollgate-core\n\
             local MAX_LIMIT = {MAX_LIMIT}\n\
             local MAX_PERIOD = {}\n\
             local MAX_BURST_SPAN = {MAX_BURST_SPAN}\n\
             local MAX_LOG_LIMIT = {MAX_LOG_LIMIT}\n\
             local MAX_INT = {}\n",
        tollgate_core::duration_to_micros(MAX_PERIOD),
        1u64 << 53,
    );
    for part in parts {
        text.push_str(part);
        text.push('\n');
    }
    let sha = redis::Script::new(&text).get_hash().to_string();
    Script {
        text,
        sha,
        reply_base: 0,
    }
}

/// The multi-policy Lua script (what `SCRIPT LOAD` receives): for redis-benchmark and for
/// operators who want to read what runs in their Redis.
pub fn script_text() -> &'static str {
    &script().text
}

/// The multi-policy script's SHA1, as EVALSHA names it.
pub fn script_sha() -> &'static str {
    &script().sha
}

/// The script a request matched by one policy with `limit` runs: for redis-benchmark and
/// for operators who want to read what runs in their Redis. Its arguments are the cost, then
/// optionally now (microseconds; empty: Redis TIME) and a PX floor; see `check_one.lua`.
pub fn single_script_text(limit: &Limit) -> Result<String, RedisStoreError> {
    Ok(build_single(limit)?.text)
}

/// The script a request matched by the policies `limits` runs (2 to 8 of them, in the
/// request's order; others use [`script_text`]): for redis-benchmark and for operators. Its
/// arguments are nothing (every cost 1, Redis TIME) or the costs, then optionally now and a
/// PX floor; see `check_set.lua`.
pub fn set_script_text(limits: &[Limit]) -> Result<String, RedisStoreError> {
    if !(2..=MAX_SET_POLICIES).contains(&limits.len()) {
        return Err(RedisStoreError::invalid(format!(
            "a policy-set script takes 2 to {MAX_SET_POLICIES} policies, not {}",
            limits.len()
        )));
    }
    Ok(build_set(limits)?.text)
}

/// The SHA1 of [`set_script_text`].
pub fn set_script_sha(limits: &[Limit]) -> Result<String, RedisStoreError> {
    let text = set_script_text(limits)?;
    Ok(redis::Script::new(&text).get_hash().to_string())
}

/// The SHA1 of [`single_script_text`].
pub fn single_script_sha(limit: &Limit) -> Result<String, RedisStoreError> {
    Ok(build_single(limit)?.sha)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_integer_reply_is_used_only_where_every_value_fits_below_2_pow_53() {
        // 100 per minute: remaining <= 100, reset_after <= 2 minutes.
        assert_eq!(
            reply_base(100, 60_000_000, 100, 600_000),
            (101, 120_000_001)
        );
        // The largest values of both must combine exactly in a double.
        let (base, bound) = reply_base(1000, 86_400_000_000, 1000, 86_400_000);
        assert!(base > 0 && (bound - 1) * base + (base - 1) < 1 << 53);
        // Too large: the packed string instead.
        assert_eq!(
            reply_base(1 << 40, 31_622_400_000_000, 1 << 40, 28_760),
            (0, 0)
        );
    }

    #[test]
    fn a_policy_set_script_has_every_section_and_no_placeholder_left() {
        let quota = tollgate_core::Quota::per_minute(100).expect("quota");
        let limits: Vec<Limit> = tollgate_core::Algorithm::ALL
            .iter()
            .map(|&a| Limit::new(a, quota).expect("limit"))
            .collect();
        let text = set_script_text(&limits).expect("script");
        // The preamble's comments name the placeholders; no code line keeps one.
        let code = text.lines().filter(|l| !l.trim_start().starts_with("--"));
        for line in code {
            assert!(!line.contains('$'), "a placeholder is left: {line}");
        }
        for mark in [DECIDE_MARK, COST_MARK, CLOCK_MARK, WRITE_MARK] {
            assert!(!text.contains(mark), "{mark}");
        }
        // Every policy is decided, committed and re-decided uncharged.
        assert_eq!(text.matches("local ok_").count(), limits.len());
        assert_eq!(
            text.matches("redis.call('SET', keys[").count(),
            limits.len()
        );
        assert_eq!(
            text.matches("remaining_6, reset_6 = remaining, reset")
                .count(),
            1
        );
        assert!(text.contains("ARGV[7] (now)") && text.contains("ARGV[8] (PX floor)"));
    }

    #[test]
    fn the_script_carries_the_core_bounds_and_every_algorithm() {
        let text = script_text();
        assert!(text.contains("local MAX_LIMIT = 1099511627776\n"));
        assert!(text.contains("local MAX_PERIOD = 31622400000000\n"));
        for a in tollgate_core::Algorithm::ALL {
            assert!(
                text.contains(&format!("local function {}(", a.name())),
                "{a}"
            );
            assert!(
                text.contains(&format!("  {} = {},", a.name(), a.name())),
                "{a}"
            );
        }
        assert_eq!(script_sha().len(), 40);
        for a in tollgate_core::Algorithm::ALL {
            let quota = tollgate_core::Quota::per_minute(100).expect("quota");
            let one = single_script_text(&Limit::new(a, quota).expect("limit")).expect("script");
            assert!(one.contains("local limit, p, burst, t = 100, 60000000, 100, 600000\n"));
            // The body is inline: its own file's text, no function and no marker left.
            assert!(one.contains(algorithm_file(a)), "{a}");
            assert!(
                !one.contains("local function") && !one.contains("= function"),
                "{a} defines a function"
            );
            for mark in [DECIDE_MARK, COST_MARK, CLOCK_MARK, WRITE_MARK] {
                assert!(!one.contains(mark), "{a}: {mark}");
            }
            assert!(!one.contains('$'), "{a}: a placeholder is left");
            let others = tollgate_core::Algorithm::ALL.iter().filter(|&&b| b != a);
            for b in others {
                assert!(
                    !one.contains(&format!("-- {}.lua:", b.name())),
                    "{a} has {b}"
                );
            }
        }
    }
}
