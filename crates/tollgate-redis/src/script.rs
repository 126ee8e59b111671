//! The Lua scripts: one generator, one reply format.
//!
//! A request's plan runs ONE script, generated for the plan's **form** (the algorithm and mode
//! of each rule, in order) and kept: each algorithm's decision body (`scripts/<algorithm>.lua`,
//! the contract below) is written out inline, the quotas arrive packed in one argument (so a
//! thousand overrides of one policy, each its own limit, share one script: Redis keeps every
//! script it is sent until restarted, so scripts per quota grew its memory with every new
//! limit, and refilled it slowly after each restart), the keys are read with one GET (one rule)
//! or one MGET, and every write comes after every decision. What the measurements bought is
//! kept (see docs/benchmarks.md): Redis runs a script's whole chunk on every call, so a
//! generated script has no function and no closure, no table but MGET's and (two rules or
//! more) the unpacked quotas', and an integer reply for an allowed one-rule request.
//!
//! The decision body contract (every `scripts/<algorithm>.lua` is one):
//! - reads `raw` (the key's value, false when missing), `now` (us), `limit`, `p` (period, us),
//!   `burst`, `t` (emission interval, us), `cost`; it never assigns them;
//! - sets `ok`, `remaining`, `reset` (reset_after, us), `retry` (retry_after, us; -1: never),
//!   and, when ok and cost > 0, `value` (the new state) and `idle_at` (when the state equals
//!   a fresh one again);
//! - is one block without `return` or `break`.
//!
//! The call: KEYS are the rules' state keys in plan order; ARGV[1] is the quotas, packed by
//! [`Quotas::pack`]; then nothing (every cost 1, Redis TIME, no PX floor) or the costs
//! 1..n, then optionally `now` ('' = Redis TIME), then optionally a PX floor in milliseconds.
//!
//! The reply (one format, parsed by [`parse_reply`]): the integer
//! `reset_after * base + remaining` for an allowed one-rule plan whose bounds fit below 2^53
//! ([`reply_base`] > 0, sent with the quota); otherwise a string, struct `'>I7' .. n x 'BI7I7I7'`: the
//! script's `now` (us), then per rule allowed (1/0), remaining, reset_after (us) and
//! retry_after + 1 (us; 0: allowed, or retrying never helps).
//!
//! Plans with more rules than [`MAX_INLINE_RULES`], forms past [`MAX_SCRIPTS`], and plans with
//! a sliding log longer than [`IN_PLACE_LOG_LIMIT`] run `scripts/check.lua` (the bodies as
//! functions, the quotas and modes as arguments; a sliding log decided where it lies,
//! `scripts/sliding_window_log_in_place.lua`), which answers in the same format.

use crate::error::RedisStoreError;
use smallvec::SmallVec;
use std::cell::Cell;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, OnceLock, RwLock};
use tollgate_core::algorithms::MAX_LOG_LIMIT;
use tollgate_core::{Algorithm, Decision, Limit, Micros, Mode};
use tollgate_core::{MAX_BURST_SPAN, MAX_LIMIT, MAX_PERIOD};

const PRELUDE: &str = include_str!("../scripts/prelude.lua");
const TTL: &str = include_str!("../scripts/ttl.lua");
const PACKED: &str = include_str!("../scripts/packed.lua");
const ARGS: &str = include_str!("../scripts/args.lua");
const CHECK: &str = include_str!("../scripts/check.lua");
const LOG_RANGED: &str = include_str!("../scripts/log_ranged.lua");
const LOG_IN_PLACE: &str = include_str!("../scripts/sliding_window_log_in_place.lua");
const LEASE: &str = include_str!("../scripts/lease.lua");
const SETTLE: &str = include_str!("../scripts/settle.lua");

/// One rule of a plan as its script sees it: the limit (constants) and the mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RuleShape {
    /// Algorithm and quota.
    pub limit: Limit,
    /// Enforced or shadow.
    pub mode: Mode,
}

/// A plan's quotas as its script's first argument: per rule its limit, period (us), burst
/// and emission interval (us), 7 bytes each, big-endian (struct `'>I7'`, exact in Lua below
/// 2^53, and every bound of the core is); a one-rule plan adds its integer reply's base and
/// bound (0, 0: none; see [`reply_base`]). Kept inline up to [`QUOTA_INLINE_RULES`] rules: no
/// allocation for the common plan, and small to move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Quotas {
    bytes: SmallVec<[u8; QUOTA_BYTES * QUOTA_INLINE_RULES]>,
}

impl Quotas {
    /// The quotas of a plan of these limits (1 to [`MAX_INLINE_RULES`]), and its integer
    /// reply's base (see [`reply_base`]; 0: none, always for several rules or without
    /// `integer_reply`).
    pub(crate) fn pack<'a>(
        mut limits: impl ExactSizeIterator<Item = &'a Limit>,
        integer_reply: bool,
    ) -> (Quotas, u64) {
        if limits.len() == 1 {
            if let Some(limit) = limits.next() {
                return Self::pack_one(limit, integer_reply);
            }
        }
        Self::pack_all(limits, integer_reply)
    }

    /// [`Quotas::pack`] of one limit: the thread's last one again when it is of the same
    /// numbers (most plans are of one policy, packed plan after plan: about 200 instructions
    /// a plan, and a plan's job 86 fewer when kept, under callgrind).
    fn pack_one(limit: &Limit, integer_reply: bool) -> (Quotas, u64) {
        /// The last one-rule quotas packed on a thread, and what they were packed from.
        #[derive(Clone, Copy)]
        struct Last {
            from: (u64, u64, u64, u64),
            integer_reply: bool,
            bytes: [u8; QUOTA_BYTES * QUOTA_INLINE_RULES],
            base: u64,
        }
        thread_local! {
            static LAST: Cell<Option<Last>> = const { Cell::new(None) };
        }
        let from = constants(limit);
        let len = constants_len(1);
        LAST.with(|last| {
            if let Some(l) = last.get() {
                if l.from == from && l.integer_reply == integer_reply {
                    let bytes = SmallVec::from_buf_and_len(l.bytes, len);
                    return (Quotas { bytes }, l.base);
                }
            }
            let (quotas, base) = Self::pack_all(std::iter::once(limit), integer_reply);
            let mut bytes = [0; QUOTA_BYTES * QUOTA_INLINE_RULES];
            if let (Some(to), Some(from_bytes)) = (bytes.get_mut(..len), quotas.bytes.get(..len)) {
                to.copy_from_slice(from_bytes);
                last.set(Some(Last {
                    from,
                    integer_reply,
                    bytes,
                    base,
                }));
            }
            (quotas, base)
        })
    }

    /// [`Quotas::pack`], the numbers packed anew.
    fn pack_all<'a>(
        limits: impl ExactSizeIterator<Item = &'a Limit>,
        integer_reply: bool,
    ) -> (Quotas, u64) {
        let n = limits.len();
        let len = constants_len(n);
        let mut base = 0;
        let fill = |out: &mut [u8]| {
            let mut at = 0;
            let mut put = |v: u64| {
                if let Some(to) = out.get_mut(at..at + 7) {
                    to.copy_from_slice(&v.to_be_bytes()[1..]);
                }
                at += 7;
            };
            for limit in limits {
                let (l, p, b, t) = constants(limit);
                for v in [l, p, b, t] {
                    put(v);
                }
                if n == 1 {
                    let bound;
                    (base, bound) = if integer_reply {
                        reply_base(l, p, b, t)
                    } else {
                        (0, 0)
                    };
                    put(base);
                    put(bound);
                }
            }
        };
        // Written in place at its exact size: a plan of few rules on the stack, then moved
        // into the inline buffer whole (smallvec's element-by-element fill and extend cost
        // a request more than the numbers themselves).
        let bytes = if len <= QUOTA_BYTES * QUOTA_INLINE_RULES {
            let mut buf = [0u8; QUOTA_BYTES * QUOTA_INLINE_RULES];
            fill(&mut buf);
            SmallVec::from_buf_and_len(buf, len)
        } else {
            let mut v = vec![0u8; len];
            fill(&mut v);
            SmallVec::from_vec(v)
        };
        (Quotas { bytes }, base)
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// The rules whose quotas a [`Quotas`] keeps inline: most plans are of one rule or two, and a
/// plan's quotas move with it through its lane's queue.
const QUOTA_INLINE_RULES: usize = 2;

/// The bytes of one rule's quota in [`Quotas`]: four numbers of 7 bytes.
const QUOTA_BYTES: usize = 4 * 7;

/// The numbers of [`Quotas`] for a plan of `rules` rules: four a rule, and the
/// integer reply's base and bound for one rule alone.
fn constants_count(rules: usize) -> usize {
    4 * rules + if rules == 1 { 2 } else { 0 }
}

/// The bytes of [`Quotas`] for a plan of `rules` rules.
pub(crate) fn constants_len(rules: usize) -> usize {
    7 * constants_count(rules)
}

/// What selects a generated script: each rule's algorithm and mode, in plan order (not its
/// quotas, which the call carries).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Form {
    rules: SmallVec<[(Algorithm, Mode); INLINE_RULES]>,
}

/// An order on forms (rule by rule: algorithm, then mode; a shorter form first where one is
/// the start of the other), so that a batch's list of forms can be put in one order whatever
/// order its plans came in (see `lane.rs`): the batch script is generated for the list, and
/// one script then serves every arrival order of the same forms.
impl Ord for Form {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // Most comparisons find a plan's form in its store's list (twice a plan: the lane's
        // list, the batch call's byte): equal forms answer without the ordered walk, 64
        // instructions a search for a list of one form under callgrind.
        if self.rules[..] == other.rules[..] {
            return std::cmp::Ordering::Equal;
        }
        let key = |&(a, m): &(Algorithm, Mode)| (a as u8, m as u8);
        self.rules.iter().map(key).cmp(other.rules.iter().map(key))
    }
}

impl PartialOrd for Form {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Form {
    /// The form of a plan of these rules (algorithm and mode, in plan order); `None` for the
    /// plans the generic script serves (no rule, or more than [`MAX_INLINE_RULES`]). One rule
    /// alone runs the enforced rule's script whatever its mode: the verdict is the caller's (a
    /// quota rule alone denies when it denies).
    pub(crate) fn new(rules: impl ExactSizeIterator<Item = (Algorithm, Mode)>) -> Option<Form> {
        let n = rules.len();
        if n == 0 || n > MAX_INLINE_RULES {
            return None;
        }
        let mut rules: SmallVec<[(Algorithm, Mode); INLINE_RULES]> = rules.collect();
        if let [one] = &mut rules[..] {
            one.1 = Mode::Enforce;
        }
        Some(Form { rules })
    }

    /// [`Form::of_limits`] of these rules.
    pub(crate) fn of(rules: &[RuleShape]) -> Option<Form> {
        Form::of_limits(rules.iter().map(|r| (&r.limit, r.mode)))
    }

    /// [`Form::new`] of the rules of these limits and modes, in one pass; `None` also for a
    /// plan with a sliding log the generic script decides in place (see
    /// [`IN_PLACE_LOG_LIMIT`]).
    pub(crate) fn of_limits<'a>(
        rules: impl ExactSizeIterator<Item = (&'a Limit, Mode)>,
    ) -> Option<Form> {
        let mut long_log = false;
        let form = Form::new(rules.map(|(limit, mode)| {
            long_log |= in_place(limit);
            (limit.algorithm(), mode)
        }));
        form.filter(|_| !long_log)
    }

    /// The rules, in plan order.
    pub(crate) fn rules(&self) -> &[(Algorithm, Mode)] {
        &self.rules
    }
}

pub(crate) struct Script {
    pub(crate) text: String,
    pub(crate) sha: String,
    /// An across-slots script (see [`across_slots`]): one key declared, the others in its
    /// arguments.
    pub(crate) across_slots: bool,
}

/// The most rules a generated script inlines. Each rule adds seven Lua locals and its body
/// twice; Lua 5.1 allows 200 locals per function (a batch script of four sixteen-rule
/// branches loads and decides: tests/batch.rs). Larger plans run `check.lua`. Sixteen,
/// not fewer: an Envoy request of ten descriptors (or a request matched by ten policies) is
/// a plan of ten rules, and a generated script coalesces where the generic one goes alone
/// through redis-rs's connection (see docs/benchmarks.md).
pub const MAX_INLINE_RULES: usize = 16;

/// The rules a [`Form`] holds without an allocation: a plan of more (up to
/// [`MAX_INLINE_RULES`]) pays one. Plans are mostly of a rule or a few, and every rule kept
/// inline is written and read for each of them.
const INLINE_RULES: usize = 8;

/// How many forms get a script of their own. Configurations have a handful (quotas are no
/// part of a form); the bound keeps a configuration of very many distinct rule lists from
/// filling Redis' script cache: past it, plans run `check.lua`.
pub(crate) const MAX_SCRIPTS: usize = 1024;

/// The longest `sliding_window_log` (its limit: the most records its value holds) a generated
/// script decides. A generated script reads a log whole and writes it whole on every
/// admission: Redis's time for that grows with the log (36 µs a request at 500 records, 76 at
/// 1,000, 7.3 ms at 100,000: docs/benchmarks.md, "A long `sliding_window_log` on Redis"). A
/// plan with a longer log runs the generic script, which decides a log in place
/// (`scripts/sliding_window_log_in_place.lua`: a few reads of 7 or 14 bytes and an append):
/// 26 µs at 500 records, 35 to 53 at 100,000 (eight runs of one day). Such a plan is sent alone, at once: it does not
/// coalesce, nor queue behind its lane's plans.
pub const IN_PLACE_LOG_LIMIT: u64 = 500;

/// Whether a rule of `limit` is a sliding log longer than [`IN_PLACE_LOG_LIMIT`]: its plan
/// runs the generic script.
pub(crate) fn in_place(limit: &Limit) -> bool {
    limit.algorithm() == Algorithm::SlidingWindowLog && limit.quota().limit() > IN_PLACE_LOG_LIMIT
}

/// The generic script (`check.lua`): any number of rules, quotas and modes as arguments.
pub(crate) fn generic_script() -> &'static Script {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    SCRIPT.get_or_init(|| {
        let functions: Vec<String> = Algorithm::EVERY.iter().map(|&a| as_function(a)).collect();
        let mut parts = vec![PRELUDE, TTL, ARGS];
        parts.extend(functions.iter().map(String::as_str));
        parts.push(LOG_RANGED);
        parts.push(LOG_IN_PLACE);
        parts.push(CHECK);
        finish(&parts)
    })
}

/// Settles, releases and renewals of any keys in one call (`scripts/settle.lua`).
pub(crate) fn settle_script() -> &'static Script {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    SCRIPT.get_or_init(|| finish(&[PRELUDE, TTL, ARGS, LOG_RANGED, SETTLE]))
}

/// The first line of an across-slots script (Redis 7: a script with this flag may touch keys
/// of several slots, each command still of one slot, all on the node that runs it).
pub(crate) const ACROSS_SLOTS_SHEBANG: &str = "#!lua flags=allow-cross-slot-keys\n";

/// The across-slots keys of `settle.lua`: after the items' arguments, one per item (KEYS holds
/// the first only, to route the call to its node).
const SETTLE_ACROSS_KEYS: &str = "local n = (#ARGV - 2) / 8
if n < 1 or n % 1 ~= 0 then
  fail('settle: expected 2 + 8 arguments per item (its 7 and its key), got ' .. #ARGV)
end
local keys = {}
for i = 1, n do
  keys[i] = ARGV[2 + 7 * n + i]
end
";

/// The across-slots read of `settle.lua`: a key the node does not serve is "elsewhere".
const SETTLE_ACROSS_READ: &str = "local function read(key, cmd)
  local raw = redis.pcall(cmd, key)
  if type(raw) == 'table' then
    return nil, true
  end
  return raw, false
end
";

/// `settle.lua` for the items of several slots one Cluster node serves (Redis 7's
/// `allow-cross-slot-keys`, as the across-slots batch script): the keys travel after the
/// other arguments, each is read with its own GET, and an item whose key the node does not
/// serve is answered with the error code `TGELSEWHERE`, nothing of it applied. `None` if
/// `settle.lua` no longer has the blocks this replaces (a unit test says so first).
pub(crate) fn settle_script_across() -> Option<&'static Script> {
    static SCRIPT: OnceLock<Option<Script>> = OnceLock::new();
    SCRIPT
        .get_or_init(|| {
            let swap = |text: &str, from: &str, to: &str, with: &str| -> Option<String> {
                let start = text.find(from)?;
                let end = start + text[start..].find(to)?;
                Some(format!("{}{with}{}", &text[..start], &text[end..]))
            };
            let settle = swap(
                SETTLE,
                "local n = #KEYS",
                "-- end of keys\n",
                SETTLE_ACROSS_KEYS,
            )?;
            let settle = swap(
                &settle,
                "local function read(key, cmd)",
                "-- end of read\n",
                SETTLE_ACROSS_READ,
            )?;
            Some(across_slots(finish(&[
                PRELUDE, TTL, ARGS, LOG_RANGED, &settle,
            ])))
        })
        .as_ref()
}

/// Each leasable algorithm's Lua as a function of its own (see `as_function`).
fn leasable_functions() -> Vec<String> {
    Algorithm::ALL
        .iter()
        .filter(|a| a.is_leasable())
        .map(|&a| as_function(a))
        .collect()
}

/// The lease driver (also the give-back of a Redis Cluster plan that spans slots) and the
/// algorithms it can lease (see `scripts/lease.lua`).
pub(crate) fn lease_script() -> &'static Script {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    SCRIPT.get_or_init(|| {
        let functions = leasable_functions();
        let mut parts = vec![PRELUDE, TTL, PACKED, ARGS];
        parts.extend(functions.iter().map(String::as_str));
        parts.push(LEASE);
        finish(&parts)
    })
}

/// Many lease calls in one (coalesced lease refills, see `lane.rs`): `scripts/lease.lua`
/// itself as a function of its own KEYS and ARGV, run for each lease in order under `pcall`,
/// so a lease the script refuses fails alone (it validates before it writes).
///
/// KEYS: one key per lease. ARGV[1]: the arguments each lease takes (9, or 10 with a PX
/// floor); then each lease's arguments as `lease.lua` reads them. Reply: an array, per lease
/// its reply or its error.
pub(crate) fn lease_batch_script() -> &'static Script {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    SCRIPT.get_or_init(|| lease_batch(LEASE_BATCH))
}

/// `lease.lua` as the function `lease_one(KEYS, ARGV)`, then `driver`, which calls it.
fn lease_batch(driver: &str) -> Script {
    let functions = leasable_functions();
    let mut parts = vec![PRELUDE, TTL, PACKED];
    parts.extend(functions.iter().map(String::as_str));
    parts.extend([
        "local function lease_one(KEYS, ARGV)",
        ARGS,
        LEASE,
        "end",
        driver,
    ]);
    finish(&parts)
}

/// `script` as an across-slots script: the flag line first, and its SHA1 again.
pub(crate) fn across_slots(script: Script) -> Script {
    let text = format!("{ACROSS_SLOTS_SHEBANG}{}", script.text);
    let sha = redis::Script::new(&text).get_hash().to_string();
    Script {
        text,
        sha,
        across_slots: true,
    }
}

/// [`lease_batch_script`] for the leases of several slots one Cluster node serves (Redis 7's
/// `allow-cross-slot-keys`, as the across-slots batch script). ARGV[1]: the arguments each
/// lease takes; ARGV[2]: the number of leases; then their keys (KEYS holds the first only, to
/// route the call); then each lease's arguments. A lease whose key the node does not serve is
/// answered with the error code `TGELSEWHERE`, nothing of it applied.
pub(crate) fn lease_batch_script_across() -> &'static Script {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    SCRIPT.get_or_init(|| across_slots(lease_batch(LEASE_BATCH_ACROSS)))
}

/// The driver of [`lease_batch_script_across`]: each key's locality is tried first (EXISTS
/// fails on a key of another node), so a lease of another node is never begun.
const LEASE_BATCH_ACROSS: &str = "local per, n = tonumber(ARGV[1]), tonumber(ARGV[2])
if (per ~= 9 and per ~= 10) or not n or n < 1 or n % 1 ~= 0 or #ARGV ~= 2 + n + per * n then
  return redis.error_reply('ERR tollgate: an across-slots lease batch takes 9 or 10 arguments a key, its count and its keys')
end
local out = {}
for i = 1, n do
  local key = ARGV[2 + i]
  local args, at = {}, 2 + n + (i - 1) * per
  for j = 1, per do
    args[j] = ARGV[at + j]
  end
  if type(redis.pcall('EXISTS', key)) == 'table' then
    out[i] = redis.error_reply('TGELSEWHERE lease ' .. i .. ': a key is served by another node')
  else
    local ok, reply = pcall(lease_one, { key }, args)
    if ok then
      out[i] = reply
    elseif type(reply) == 'table' and reply.err then
      out[i] = reply
    else
      out[i] = redis.error_reply('ERR tollgate: lease ' .. i .. ': ' .. tostring(reply))
    end
  end
end
return out";

/// The driver of [`lease_batch_script`].
const LEASE_BATCH: &str = "local per = tonumber(ARGV[1])
if (per ~= 9 and per ~= 10) or #ARGV ~= 1 + per * #KEYS then
  return redis.error_reply('ERR tollgate: a lease batch takes 9 or 10 arguments a key')
end
local out = {}
for i = 1, #KEYS do
  local args, at = {}, 1 + (i - 1) * per
  for j = 1, per do
    args[j] = ARGV[at + j]
  end
  local ok, reply = pcall(lease_one, { KEYS[i] }, args)
  if ok then
    out[i] = reply
  elseif type(reply) == 'table' and reply.err then
    out[i] = reply
  else
    out[i] = redis.error_reply('ERR tollgate: lease ' .. i .. ': ' .. tostring(reply))
  end
end
return out";

/// An algorithm's body as the function `check.lua` and `lease.lua` call:
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
        body(a)
    )
}

pub(crate) fn body(a: Algorithm) -> &'static str {
    match a {
        Algorithm::FixedWindow => include_str!("../scripts/fixed_window.lua"),
        Algorithm::SlidingWindowLog => include_str!("../scripts/sliding_window_log.lua"),
        Algorithm::SlidingWindowCounter => include_str!("../scripts/sliding_window_counter.lua"),
        Algorithm::TokenBucket => include_str!("../scripts/token_bucket.lua"),
        Algorithm::LeakyBucket => include_str!("../scripts/leaky_bucket.lua"),
        Algorithm::Gcra => include_str!("../scripts/gcra.lua"),
        Algorithm::Concurrency => include_str!("../scripts/concurrency.lua"),
    }
}

/// A process-wide cache of generated scripts.
pub(crate) type Cache<K> = OnceLock<ScriptCache<K>>;

/// How much a cache of generated scripts keeps: scripts, and bytes of their text. Redis keeps
/// every script it is sent until it restarts, so both bound its script memory as well as
/// ours: a script of sixteen rules is about 100 KB, and the requests' choice of policies picks
/// which forms exist.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bound {
    pub(crate) scripts: usize,
    pub(crate) bytes: usize,
}

/// The plan scripts' bound: [`MAX_SCRIPTS`] forms, 64 MiB of text (more than 1,024 scripts of
/// eight rules take, the most a cache could hold before plans of sixteen rules had scripts).
pub(crate) const PLAN_SCRIPTS: Bound = Bound {
    scripts: MAX_SCRIPTS,
    bytes: 64 << 20,
};

/// Generated scripts by key, and the bytes of their text.
pub(crate) struct ScriptCache<K> {
    map: RwLock<HashMap<K, Arc<Script>, LimitHash>>,
    bytes: std::sync::atomic::AtomicUsize,
}

impl<K> Default for ScriptCache<K> {
    fn default() -> Self {
        Self {
            map: RwLock::new(HashMap::default()),
            bytes: std::sync::atomic::AtomicUsize::new(0),
        }
    }
}

impl<K: Eq + std::hash::Hash> ScriptCache<K> {
    /// The script of `key`, made by `make` and kept on first use; `None` once the cache holds
    /// `bound.scripts` scripts or `bound.bytes` of text. Decided before making one, so a key
    /// past the bound costs a lookup, not a script's text and its SHA-1 on every call (the last
    /// script kept may pass the byte bound by its own size).
    pub(crate) fn get_or_make<Q>(
        &self,
        key: &Q,
        bound: Bound,
        make: impl FnOnce() -> Script,
    ) -> Option<Arc<Script>>
    where
        K: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        use std::sync::atomic::Ordering::Relaxed;
        // The answer the map gives without a new script: the kept one, or none past the
        // bound; asked under the read lock, then again under the write lock.
        let settled = |map: &HashMap<K, Arc<Script>, LimitHash>| match map.get(key) {
            Some(s) => Some(Some(Arc::clone(s))),
            None if map.len() >= bound.scripts || self.bytes.load(Relaxed) >= bound.bytes => {
                Some(None)
            }
            None => None,
        };
        let read = self
            .map
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(answer) = settled(&read) {
            return answer;
        }
        drop(read);
        let built = Arc::new(make());
        let mut map = self
            .map
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(answer) = settled(&map) {
            return answer;
        }
        self.bytes.fetch_add(built.text.len(), Relaxed);
        map.insert(key.to_owned(), Arc::clone(&built));
        Some(built)
    }

    /// How many scripts it keeps, and their bytes.
    #[cfg(test)]
    pub(crate) fn size(&self) -> (usize, usize) {
        let n = self
            .map
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len();
        (n, self.bytes.load(std::sync::atomic::Ordering::Relaxed))
    }
}

/// The script of `form`, generated and kept on first use; `None` past [`PLAN_SCRIPTS`] (the
/// generic script serves the rest).
pub(crate) fn plan_script(form: &Form) -> Option<Arc<Script>> {
    static SCRIPTS: Cache<Form> = OnceLock::new();
    SCRIPTS
        .get_or_init(Default::default)
        .get_or_make(form, PLAN_SCRIPTS, || generate(form))
}

/// A hasher for the script caches, which every check reads: their keys are a few trusted
/// integers (no attacker picks them), so SipHash's flood resistance buys nothing and its cost
/// showed in the client's profile (`perf record` of `redis_bench`).
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

/// The quota of `limit` as the script's constants: limit, period, burst, interval. A `Limit`
/// exists only within the core's bounds, which are within the scripts' (checked by a test).
pub(crate) fn constants(limit: &Limit) -> (u64, u64, u64, u64) {
    let q = limit.quota();
    (
        q.limit(),
        q.period_micros(),
        q.burst(),
        q.emission_interval_micros(),
    )
}

/// Generates the script of `form` (1 to [`MAX_INLINE_RULES`] rules).
fn generate(form: &Form) -> Script {
    let n = form.rules().len();
    let mut lua = String::with_capacity(4096 * n);
    let _ = writeln!(lua, "-- tollgate plan script: {n} rule(s)");
    let len = constants_len(n);
    // One rule: the quota first and the cost before the clock, the layout measured with
    // callgrind (a reordering of the same statements cost a fixed window ~3% more).
    let (key, quota, some_costs, cost_local) = match form.rules() {
        [_] => (
            "local key = keys[1]\n",
            format!(
                "local limit, p, burst, t, base, bound = struct.unpack('{}', ARGV[1])",
                unpack_format(1)
            ),
            String::new(),
            "cost, ",
        ),
        _ => (
            "",
            format!(
                "local K = {{struct.unpack('{}', ARGV[1])}}",
                unpack_format(n)
            ),
            format!(" or (nargs ~= 1 and nargs < {})", n + 1),
            "",
        ),
    };
    let one_cost = if n == 1 { "1, " } else { "" };
    let _ = writeln!(
        lua,
        "local keys, nargs = KEYS, #ARGV\n\
         {key}if #keys ~= {n}{some_costs} or nargs < 1 or nargs > {n3} then\n  \
         return redis.error_reply('ERR tollgate: expected {n} keys and 1, {n1}, {n2} or {n3} ' ..\n    \
         'arguments (quotas, costs, now, PX floor), got ' .. #keys .. ' keys and ' .. nargs .. ' arguments')\n\
         end\n\
         if #ARGV[1] ~= {len} then\n  \
         return redis.error_reply('ERR tollgate: ARGV[1] (quotas) must be {len} bytes')\n\
         end\n\
         {quota}\n\
         local {cost_local}now, ttl_floor = {one_cost}nil, 0\n\
         local px_ms, px_arg",
        n1 = n + 1,
        n2 = n + 2,
        n3 = n + 3
    );
    if n == 1 {
        cost(&mut lua, 2);
    }
    clock(&mut lua, n + 2);
    match form.rules() {
        [one] => one_rule(&mut lua, *one),
        rules => several_rules(&mut lua, rules),
    }
    finish(&[&lua])
}

/// The struct format of [`Quotas`] for `rules` rules.
pub(crate) fn unpack_format(rules: usize) -> String {
    format!(">{}", "I7".repeat(constants_count(rules)))
}

/// Rule `i`'s (from 1) quota in the unpacked table `K` of a several-rule plan.
pub(crate) fn quota_of(i: usize) -> String {
    let at = 4 * (i - 1);
    format!("K[{}], K[{}], K[{}], K[{}]", at + 1, at + 2, at + 3, at + 4)
}

/// A one-rule plan (after the quota, the cost and the clock): the body at the top level, no
/// suffixed locals, GET not MGET.
fn one_rule(lua: &mut String, (algorithm, _): (Algorithm, Mode)) {
    lua.push_str(
        "local raw = redis.pcall('GET', key)\n\
         if raw and raw.err then\n  \
         if raw.err:sub(1, 9) ~= 'WRONGTYPE' then\n    \
         error(raw)\n  \
         end\n  \
         raw = false\n\
         end\n\
         local ok, remaining, reset, retry, value, idle_at\n\
         do\n",
    );
    lua.push_str(body(algorithm));
    lua.push_str(
        "end\n\
         if not ok then\n  \
         return struct.pack('>I7BI7I7I7', now, 0, remaining, reset, retry + 1)\n\
         end\n\
         if cost > 0 then\n",
    );
    write(lua, "key", "value", "idle_at");
    // The integer reply where the caller sent a base (0: none); the Rust side proved every
    // value fits below 2^53 for it, the script checks it anyway.
    lua.push_str(
        "end\n\
         if remaining < base and reset < bound then\n  \
         return reset * base + remaining\n\
         end\n\
         return struct.pack('>I7BI7I7I7', now, 1, remaining, reset, 0)\n",
    );
}

/// A plan of 2 to [`MAX_INLINE_RULES`] rules: every rule decided (suffixed locals), then all
/// charged or none.
fn several_rules(lua: &mut String, rules: &[(Algorithm, Mode)]) {
    let quota = rules.iter().any(|r| r.1 == Mode::Quota);
    lua.push_str("local denied = 0\nlocal raws = redis.call('MGET', unpack(keys))\n");
    if quota {
        // The quota rules are alternatives: the plan is denied when none of them allows.
        lua.push_str("local quota_ok = 0\n");
    }
    for (i, &(algorithm, mode)) in rules.iter().enumerate() {
        let i = i + 1;
        let _ = writeln!(
            lua,
            "local ok_{i}, remaining_{i}, reset_{i}, retry_{i}, value_{i}, idle_{i}, cost_{i}\n\
             do\n  local cost = 1"
        );
        cost(lua, i + 1);
        decide(lua, algorithm, i, None, "  ");
        match mode {
            Mode::Enforce => lua.push_str("  if not ok then\n    denied = denied + 1\n  end\n"),
            Mode::Quota => lua.push_str("  if ok then\n    quota_ok = quota_ok + 1\n  end\n"),
            Mode::Shadow => {}
        }
        let _ = writeln!(
            lua,
            "  ok_{i}, remaining_{i}, reset_{i}, retry_{i}, value_{i}, idle_{i}, cost_{i} =\n    \
             ok, remaining, reset, retry, value, idle_at, cost\n\
             end"
        );
    }
    // All or nothing: charge every rule that allowed (an enforced one always did), or none.
    if quota {
        lua.push_str("if quota_ok == 0 then\n  denied = denied + 1\nend\n");
    }
    lua.push_str("if denied == 0 then\n");
    for (i, &(_, mode)) in rules.iter().enumerate() {
        let i = i + 1;
        match mode {
            Mode::Enforce => {
                let _ = writeln!(lua, "  if cost_{i} > 0 then");
            }
            Mode::Shadow | Mode::Quota => {
                let _ = writeln!(lua, "  if ok_{i} and cost_{i} > 0 then");
            }
        }
        write(
            lua,
            &format!("keys[{i}]"),
            &format!("value_{i}"),
            &format!("idle_{i}"),
        );
        lua.push_str("  end\n");
    }
    uncharged_and_reply(lua, rules, "", "return struct.pack");
}

/// The end of a plan's decision: the denied branch (the rules that would have allowed report
/// their uncharged state), at `outer` indentation, then the packed reply handed to `reply`
/// (`return struct.pack` for a plan alone; a batch stores each plan's). One text for a plan
/// script and each plan of a batch script.
pub(crate) fn uncharged_and_reply(
    lua: &mut String,
    rules: &[(Algorithm, Mode)],
    outer: &str,
    reply: &str,
) {
    let _ = writeln!(lua, "{outer}else");
    for (i, &(algorithm, _)) in rules.iter().enumerate() {
        let i = i + 1;
        let _ = writeln!(lua, "{outer}  if ok_{i} and cost_{i} > 0 then");
        decide(lua, algorithm, i, Some(0), &format!("{outer}    "));
        let _ = writeln!(
            lua,
            "{outer}    remaining_{i}, reset_{i} = remaining, reset\n{outer}  end"
        );
    }
    let _ = writeln!(lua, "{outer}end");
    let values: Vec<String> = (1..=rules.len())
        .map(|i| format!("ok_{i} and 1 or 0, remaining_{i}, reset_{i}, retry_{i} + 1"))
        .collect();
    let _ = writeln!(
        lua,
        "{outer}{reply}('>I7{}', now, {})",
        "BI7I7I7".repeat(rules.len()),
        values.join(", ")
    );
}

/// Rule `i`'s decision body in a block of its own, on its raw value from MGET and its quota
/// from the unpacked table `K` in scope; with `cost` given, at that cost (0: the uncharged
/// state) instead of the `cost` local in scope.
pub(crate) fn decide(
    lua: &mut String,
    algorithm: Algorithm,
    i: usize,
    cost: Option<u64>,
    indent: &str,
) {
    decide_in(lua, algorithm, i, cost, indent, "do");
}

/// [`decide`] with the body in the block `open` begins (`do`, or the `else` of a branch
/// that decides otherwise), closed by its `end`.
pub(crate) fn decide_in(
    lua: &mut String,
    algorithm: Algorithm,
    i: usize,
    cost: Option<u64>,
    indent: &str,
    open: &str,
) {
    let (cost_name, cost_value) = match cost {
        Some(c) => ("cost, ", format!("{c}, ")),
        None => ("", String::new()),
    };
    let _ = writeln!(
        lua,
        "{indent}local raw, {cost_name}limit, p, burst, t = raws[{i}], {cost_value}{}\n\
         {indent}local ok, remaining, reset, retry, value, idle_at\n{indent}{open}",
        quota_of(i)
    );
    lua.push_str(body(algorithm));
    let _ = writeln!(lua, "{indent}end");
}

/// `now` from ARGV[at] when the call has it and it is not empty, else Redis TIME (the
/// default clock = "store": every gateway agrees on time); the PX floor from ARGV[at + 1].
fn clock(lua: &mut String, at: usize) {
    let floor = at + 1;
    let _ = writeln!(
        lua,
        "if nargs >= {at} then\n  \
         local given = ARGV[{at}]\n  \
         if given ~= '' then\n    \
         now = tonumber(given)\n    \
         if not now or now % 1 ~= 0 or now < 0 or now >= MAX_INT then\n      \
         return redis.error_reply('ERR tollgate: ARGV[{at}] (now) must be an integer in ' ..\n        \
         '[0, 2^53) or empty')\n    \
         end\n  \
         end\n  \
         if nargs == {floor} then\n    \
         ttl_floor = tonumber(ARGV[{floor}])\n    \
         if not ttl_floor or ttl_floor % 1 ~= 0 or ttl_floor < 0 or ttl_floor > MAX_PERIOD then\n      \
         return redis.error_reply('ERR tollgate: ARGV[{floor}] (PX floor) must be an integer ' ..\n        \
         'number of milliseconds in [0, period bound]')\n    \
         end\n  \
         end\n\
         end\n\
         if not now then\n  \
         local time = redis.call('TIME')\n  \
         now = time[1] * 1000000 + time[2]\n\
         end"
    );
}

/// A rule's cost from ARGV[at] when the call has more than its quotas (a call with only
/// those charges 1). A cost of 1 is nearly every call: comparing interned strings is cheaper
/// than parsing.
fn cost(lua: &mut String, at: usize) {
    let _ = writeln!(
        lua,
        "if nargs > 1 then\n  \
         local given = ARGV[{at}]\n  \
         if given ~= '1' then\n    \
         cost = tonumber(given)\n    \
         if not cost or cost % 1 ~= 0 or cost < 0 or cost > MAX_INT then\n      \
         return redis.error_reply('ERR tollgate: ARGV[{at}] (cost) must be an integer in ' ..\n        \
         '[0, 2^53]')\n    \
         end\n  \
         end\n\
         end"
    );
}

/// SET key value, expiring at the idle instant rounded up to the next millisecond (never
/// early: from then on the state equals a fresh one); GET makes SET answer a bulk string
/// rather than a status (a Lua table: -750 instructions).
///
/// The PX goes as a number while the milliseconds change from write to write (a found
/// bucket's own): Redis prints a number argument itself (7.0.15's source: `%.17g`, exact for
/// a whole number below 2^53), and no Lua string is made, where `string.format('%d', ms)`
/// made one a write, hashed into Lua's string table, swept by its collector and freed. From
/// the second write in a row of the same milliseconds (the rules of a plan, or the new keys
/// of a call, that write the same) it goes as text formatted once, which Redis only copies:
/// printing a number costs Redis more than copying a string (ten rules a plan all writing
/// 1 ms cost Redis 2 µs a decision more with a number each, about 0.2 µs a write;
/// docs/benchmarks.md, thirty-sixth session). A text is never equal to a number in Lua, so
/// `px_arg == ms - ms % 1` holds only while it is still the number. The caller declares the
/// locals `px_ms` and `px_arg`.
pub(crate) fn write(lua: &mut String, key: &str, value: &str, idle: &str) {
    px_ms(lua, idle);
    let _ = writeln!(
        lua,
        "  if ms ~= px_ms then\n    \
         px_ms, px_arg = ms, ms - ms % 1\n  \
         elseif px_arg == ms - ms % 1 then\n    \
         px_arg = string.format('%d', ms)\n  \
         end"
    );
    set_replacing(lua, "  ", key, value, "px_arg");
}

/// `SET key value PX px GET` (see [`write`]) at `indent`, where a key of another type (a stray
/// write under the store's prefix, which MGET reads as absent, so the plan was decided as a
/// fresh one's) is deleted and written over, as the generic script does; any other error is
/// raised as `redis.call` raises it (`error` of pcall's answer: the same reply, counted once
/// in the server's error stats). Before, the write failed after the earlier writes
/// of the plan (and of the batch) had landed: a plan charged in part, though its call failed,
/// and every later call of that client failing until the key went. Counted by callgrind
/// (`scripts/profile-redis`, docs/benchmarks.md): no change in Redis's instructions a plan.
pub(crate) fn set_replacing(lua: &mut String, indent: &str, key: &str, value: &str, px: &str) {
    let _ = writeln!(
        lua,
        "{indent}local set = redis.pcall('SET', {key}, {value}, 'PX', {px}, 'GET')\n\
         {indent}if set and set.err then\n\
         {indent}  if set.err:sub(1, 9) ~= 'WRONGTYPE' then\n\
         {indent}    error(set)\n\
         {indent}  end\n\
         {indent}  redis.call('DEL', {key})\n\
         {indent}  redis.call('SET', {key}, {value}, 'PX', {px}, 'GET')\n\
         {indent}end"
    );
}

/// The local `ms`: a write's PX in milliseconds from the instant `idle` the state is a fresh
/// one's again, at least 1 and at least the PX floor. Its whole part is the PX (`%d`
/// truncates, which for a positive quotient is the floor; a number argument is floored by
/// `ms - ms % 1`), so no math.floor call (measured ~1,000 instructions dearer).
pub(crate) fn px_ms(lua: &mut String, idle: &str) {
    let _ = writeln!(
        lua,
        "  local ms = ({idle} - now + 999) / 1000\n  \
         if ms < 1 then\n    ms = 1\n  end\n  \
         if ms < ttl_floor then\n    ms = ttl_floor\n  end"
    );
}

/// How an allowed one-rule decision fits one integer reply (a table costs Redis ~5,000
/// instructions and a packed string ~2,000 more than an integer, measured with callgrind):
/// `reset_after * base + remaining`, with `remaining < base` and `reset_after < reset_bound`.
/// Every algorithm's remaining is at most max(limit, burst) and its reset_after at most
/// max(burst x interval, 2 x period) (the sliding counter's state lives two periods). Returns
/// (0, 0) when `reset_bound x base` would not stay below 2^53 (exact in Lua).
pub(crate) fn reply_base(limit: u64, period: u64, burst: u64, interval: u64) -> (u64, u64) {
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

/// The script text: the core's bounds (so the script and the core can never disagree on
/// them), then the parts; and its SHA1.
pub(crate) fn finish(parts: &[&str]) -> Script {
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
        across_slots: false,
    }
}

/// A script's answer: the script's `now` (absent from an integer reply) and one decision per
/// rule, in plan order.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) now: Option<Micros>,
    pub(crate) decisions: tollgate_core::Decisions,
}

/// Parses any script's reply (see the module docs) for rules whose limits are `limits`.
pub(crate) fn parse_reply(
    reply: &redis::Value,
    limits: impl ExactSizeIterator<Item = u64>,
    base: u64,
) -> Result<Reply, RedisStoreError> {
    let n = limits.len();
    match reply {
        redis::Value::Int(v) if n == 1 && base > 0 => {
            let v = u64::try_from(*v)
                .map_err(|_| RedisStoreError::protocol(format!("the script answered {v}")))?;
            let mut decisions = tollgate_core::Decisions::new();
            for limit in limits {
                decisions.push(Decision {
                    allowed: true,
                    limit,
                    remaining: v % base,
                    reset_after: v / base,
                    retry_after: None,
                });
            }
            Ok(Reply {
                now: None,
                decisions,
            })
        }
        redis::Value::BulkString(b) if b.len() == 7 + 22 * n => {
            let int = |item: &[u8], at: usize| {
                item[at..at + 7]
                    .iter()
                    .fold(0u64, |acc, &x| (acc << 8) | u64::from(x))
            };
            let mut decisions = tollgate_core::Decisions::with_capacity(n);
            for (item, limit) in b[7..].chunks_exact(22).zip(limits) {
                let allowed = match item[0] {
                    0 => false,
                    1 => true,
                    other => {
                        return Err(RedisStoreError::protocol(format!(
                            "the script answered flag {other}"
                        )))
                    }
                };
                decisions.push(Decision {
                    allowed,
                    limit,
                    remaining: int(item, 1),
                    reset_after: int(item, 8),
                    retry_after: if allowed {
                        None
                    } else {
                        int(item, 15).checked_sub(1)
                    },
                });
            }
            Ok(Reply {
                now: Some(int(b, 0)),
                decisions,
            })
        }
        other => Err(RedisStoreError::protocol(format!(
            "the script answered {other:?}, expected {} bytes{}",
            7 + 22 * n,
            if n == 1 { " or an integer" } else { "" }
        ))),
    }
}

/// The text of the script a plan of these rules runs (`None`: it runs the generic script,
/// [`generic_script_text`]): for redis-benchmark, and for operators who want to read what runs
/// in their Redis.
pub fn plan_script_text(rules: &[RuleShape]) -> Option<String> {
    plan_script(&Form::of(rules)?).map(|s| s.text.clone())
}

/// The SHA1 of [`plan_script_text`], as EVALSHA names it.
pub fn plan_script_sha(rules: &[RuleShape]) -> Option<String> {
    plan_script(&Form::of(rules)?).map(|s| s.sha.clone())
}

/// The quotas of a plan of these rules as its script's first argument (`ARGV[1]`, see the
/// module docs), with the integer reply allowed for one rule; `None` for the plans the
/// generic script serves (as [`plan_script_text`]).
pub fn plan_script_quotas(rules: &[RuleShape]) -> Option<Vec<u8>> {
    // No form, no script of its own (and nothing to pack its quotas for).
    Form::of(rules)?;
    let (quotas, _) = Quotas::pack(rules.iter().map(|r| &r.limit), true);
    Some(quotas.as_bytes().to_vec())
}

/// The generic script's text (`check.lua`: any number of rules, quotas as arguments).
pub fn generic_script_text() -> &'static str {
    &generic_script().text
}

/// The generic script's SHA1.
pub fn generic_script_sha() -> &'static str {
    &generic_script().sha
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shapes() -> Vec<RuleShape> {
        let quota = tollgate_core::Quota::per_minute(100).expect("quota");
        Algorithm::ALL
            .iter()
            .enumerate()
            .map(|(i, &a)| RuleShape {
                limit: Limit::new(a, quota).expect("limit"),
                mode: if i % 2 == 1 {
                    Mode::Shadow
                } else {
                    Mode::Enforce
                },
            })
            .collect()
    }

    #[test]
    fn the_integer_reply_is_used_only_where_every_value_fits_below_2_pow_53() {
        // 100 per minute: remaining <= 100, reset_after <= 2 minutes.
        assert_eq!(
            reply_base(100, 60_000_000, 100, 600_000),
            (101, 120_000_001)
        );
        let (base, bound) = reply_base(1000, 86_400_000_000, 1000, 86_400_000);
        assert!(base > 0 && (bound - 1) * base + (base - 1) < 1 << 53);
        assert_eq!(
            reply_base(1 << 40, 31_622_400_000_000, 1 << 40, 28_760),
            (0, 0)
        );
    }

    /// The 7-byte big-endian integers of packed quotas.
    fn unpacked(bytes: &[u8]) -> Vec<u64> {
        bytes
            .chunks_exact(7)
            .map(|c| c.iter().fold(0u64, |acc, &x| (acc << 8) | u64::from(x)))
            .collect()
    }

    /// A cache of generated scripts stops making new ones at its count or at its bytes,
    /// whichever comes first, and keeps serving the ones it has.
    #[test]
    fn a_script_cache_is_bounded_by_count_and_by_bytes() {
        let script = |n: usize| Script {
            text: "x".repeat(n),
            sha: String::new(),
            across_slots: false,
        };
        let by_bytes = Bound {
            scripts: 100,
            bytes: 250,
        };
        let cache: ScriptCache<u32> = ScriptCache::default();
        for k in 0..3 {
            assert!(
                cache.get_or_make(&k, by_bytes, || script(100)).is_some(),
                "{k}"
            );
        }
        // 300 bytes kept: past the bound (the last one passed it by its own size).
        assert_eq!(cache.size(), (3, 300));
        let mut made = false;
        assert!(cache
            .get_or_make(&3, by_bytes, || {
                made = true;
                script(1)
            })
            .is_none());
        assert!(!made, "nothing is made past the bound");
        assert!(cache.get_or_make(&1, by_bytes, || script(1)).is_some());
        assert_eq!(cache.size(), (3, 300));
        let by_count = Bound {
            scripts: 2,
            bytes: usize::MAX,
        };
        let cache: ScriptCache<u32> = ScriptCache::default();
        assert!(cache.get_or_make(&0, by_count, || script(10)).is_some());
        assert!(cache.get_or_make(&1, by_count, || script(10)).is_some());
        assert!(cache.get_or_make(&2, by_count, || script(10)).is_none());
        assert_eq!(cache.size(), (2, 20));
        // The plan scripts' byte bound holds more than the count bound of the largest
        // eight-rule scripts did, and bounds the sixteen-rule ones.
        let rules = |n: usize| -> Vec<RuleShape> {
            (0..n)
                .map(|i| RuleShape {
                    limit: Limit::new(
                        Algorithm::ALL[i % Algorithm::ALL.len()],
                        tollgate_core::Quota::per_minute(100).expect("quota"),
                    )
                    .expect("limit"),
                    mode: Mode::Enforce,
                })
                .collect()
        };
        let eight = plan_script_text(&rules(8)).expect("script").len();
        let sixteen = plan_script_text(&rules(MAX_INLINE_RULES))
            .expect("script")
            .len();
        assert!(MAX_SCRIPTS * eight < PLAN_SCRIPTS.bytes, "{eight}");
        assert!(MAX_SCRIPTS * sixteen > PLAN_SCRIPTS.bytes, "{sixteen}");
    }

    #[test]
    fn a_one_rule_script_inlines_its_body_and_takes_its_quota_as_an_argument() {
        let other =
            tollgate_core::Quota::new(7, std::time::Duration::from_secs(3600)).expect("quota");
        for rule in shapes() {
            let a = rule.limit.algorithm();
            let text = plan_script_text(&[rule]).expect("script");
            assert!(text.contains(
                "local limit, p, burst, t, base, bound = struct.unpack('>I7I7I7I7I7I7', ARGV[1])\n"
            ));
            assert!(text.contains(body(a)), "{a}");
            assert!(
                !text.contains("local function") && !text.contains("= function"),
                "{a} defines a function"
            );
            assert!(text.contains("redis.pcall('GET', key)") && !text.contains("MGET"));
            assert!(text.contains("return reset * base + remaining"), "{a}");
            // A shadow rule alone runs the enforced rule's script.
            let enforced = RuleShape {
                mode: Mode::Enforce,
                ..rule
            };
            assert_eq!(plan_script_sha(&[rule]), plan_script_sha(&[enforced]));
            // Another quota of the algorithm is the same script (Redis keeps every script it
            // is sent: one per quota grew its memory with each override's limit).
            let limit = Limit::new(a, other).expect("limit");
            let again = RuleShape { limit, ..rule };
            assert_eq!(plan_script_sha(&[rule]), plan_script_sha(&[again]));
            assert_ne!(plan_script_quotas(&[rule]), plan_script_quotas(&[again]));
        }
        // 100 per minute: limit, period, burst, interval, then the integer reply's base and
        // bound; none for a Cluster plan across slots (always the packed string).
        let rule = shapes()[0];
        let (l, p, b, t) = constants(&rule.limit);
        let (base, bound) = reply_base(l, p, b, t);
        let quotas = plan_script_quotas(&[rule]).expect("quotas");
        assert_eq!(quotas.len(), constants_len(1));
        assert_eq!(
            unpacked(&quotas),
            [100, 60_000_000, 100, 600_000, base, bound]
        );
        assert_eq!((base, bound), (101, 120_000_001));
        let (packed, _) = Quotas::pack([&rule.limit].into_iter(), false);
        assert_eq!(
            unpacked(packed.as_bytes()),
            [100, 60_000_000, 100, 600_000, 0, 0]
        );
        assert_eq!(Quotas::pack([&rule.limit].into_iter(), false).1, 0);
        assert_eq!(Quotas::pack([&rule.limit].into_iter(), true).1, 101);
        // Two rules: no integer reply, whatever the call allows.
        let (two, base) = Quotas::pack([&rule.limit, &rule.limit].into_iter(), true);
        assert_eq!(base, 0);
        assert_eq!(
            unpacked(two.as_bytes()),
            [100, 60_000_000, 100, 600_000, 100, 60_000_000, 100, 600_000]
        );
    }

    #[test]
    fn forms_order_rule_by_rule_and_only_equal_forms_compare_equal() {
        let rules: Vec<(Algorithm, Mode)> = Algorithm::ALL
            .iter()
            .flat_map(|&a| [(a, Mode::Enforce), (a, Mode::Shadow), (a, Mode::Quota)])
            .collect();
        let mut forms = Vec::new();
        for &a in &rules {
            forms.extend(Form::new([a].into_iter()));
            for &b in &rules {
                forms.extend(Form::new([a, b].into_iter()));
            }
        }
        let key = |f: &Form| -> Vec<(u8, u8)> {
            f.rules().iter().map(|&(a, m)| (a as u8, m as u8)).collect()
        };
        for x in &forms {
            for y in &forms {
                assert_eq!(x.cmp(y), key(x).cmp(&key(y)), "{x:?} {y:?}");
                assert_eq!(x.cmp(y).is_eq(), x == y, "{x:?} {y:?}");
            }
        }
    }

    #[test]
    fn one_rules_quotas_kept_from_the_last_plan_are_those_packed_anew() {
        // Limits of other numbers, and of the same numbers under another algorithm, one
        // after another and back, with and without the integer reply.
        let per = |n| tollgate_core::Quota::per_minute(n).expect("quota");
        let limits = [
            Limit::new(Algorithm::TokenBucket, per(100)).expect("limit"),
            Limit::new(Algorithm::TokenBucket, per(100)).expect("limit"),
            Limit::new(Algorithm::Gcra, per(100)).expect("limit"),
            Limit::new(Algorithm::TokenBucket, per(7)).expect("limit"),
            Limit::new(Algorithm::TokenBucket, per(100)).expect("limit"),
        ];
        for integer_reply in [true, true, false, true] {
            for limit in &limits {
                let kept = Quotas::pack([limit].into_iter(), integer_reply);
                let anew = Quotas::pack_all([limit].into_iter(), integer_reply);
                assert_eq!(kept, anew, "{limit:?} integer reply {integer_reply}");
                let (l, p, b, t) = constants(limit);
                let (base, bound) = if integer_reply {
                    reply_base(l, p, b, t)
                } else {
                    (0, 0)
                };
                assert_eq!(unpacked(kept.0.as_bytes()), [l, p, b, t, base, bound]);
            }
        }
    }

    #[test]
    fn a_plan_script_decides_every_rule_and_charges_by_mode() {
        let rules = shapes();
        let text = plan_script_text(&rules).expect("script");
        assert_eq!(text.matches("local ok_").count(), rules.len());
        assert_eq!(text.matches("redis.call('MGET'").count(), 1);
        assert_eq!(
            text.matches("redis.pcall('SET', keys[").count(),
            rules.len()
        );
        // Enforced rules count denials; shadow rules are charged only when they allowed.
        assert_eq!(text.matches("denied = denied + 1").count(), 3);
        assert!(text.contains("  if ok_2 and cost_2 > 0 then\n  local ms"));
        assert!(text.contains("  if cost_1 > 0 then\n  local ms"));
        assert!(text.contains("remaining_6, reset_6 = remaining, reset"));
        assert!(text.contains("ARGV[8] (now)") && text.contains("ARGV[9] (PX floor)"));
        assert!(text.contains(&format!(
            "local K = {{struct.unpack('>{}', ARGV[1])}}",
            "I7".repeat(4 * rules.len())
        )));
        assert!(text.contains("raws[6], K[21], K[22], K[23], K[24]\n"));
        let quotas = plan_script_quotas(&rules).expect("quotas");
        assert_eq!(quotas.len(), 28 * rules.len());
        assert_eq!(
            unpacked(&quotas[..28]),
            [100, 60_000_000, 100, 600_000],
            "rule 1's quota first"
        );
        assert!(text.contains(&format!("'>I7{}'", "BI7I7I7".repeat(6))));
        for a in Algorithm::ALL {
            assert_eq!(
                text.matches(body(a)).count(),
                2,
                "{a}: decided and uncharged"
            );
        }
        // Order and mode are part of the shape.
        let mut swapped = rules.clone();
        swapped.swap(0, 1);
        assert_ne!(plan_script_sha(&rules), plan_script_sha(&swapped));
        // Beyond the inline bound: the generic script.
        let many: Vec<RuleShape> = rules
            .iter()
            .cycle()
            .take(MAX_INLINE_RULES + 1)
            .copied()
            .collect();
        assert!(plan_script_text(&many).is_none());
    }

    #[test]
    fn the_across_slots_settle_and_lease_scripts_take_their_keys_from_argv() {
        let settle = settle_script_across().expect("settle.lua still has its two blocks");
        assert!(settle.text.starts_with(ACROSS_SLOTS_SHEBANG));
        assert!(settle.across_slots && !settle_script().across_slots);
        assert_eq!(settle.sha, redis::Script::new(&settle.text).get_hash());
        assert!(
            settle.text.contains(SETTLE_ACROSS_KEYS) && settle.text.contains(SETTLE_ACROSS_READ)
        );
        // Neither the plain blocks nor KEYS are left.
        assert!(!settle.text.contains("#KEYS") && !settle.text.contains("KEYS["));
        // The plain read is gone. A sliding log's own reads (log_ranged.lua's redis.call) come
        // after the across read answered that the node serves its key (EXISTS, through pcall).
        assert!(!settle.text.contains("return redis.call(cmd, key), false"));
        assert!(settle
            .text
            .contains("read(keys[i], log and 'EXISTS' or 'GET')"));
        // The plain script keeps its own.
        let plain = settle_script();
        assert!(plain.text.contains("local keys = KEYS\n"));
        assert!(plain.text.contains("return redis.call(cmd, key), false"));
        assert!(!plain.text.contains("redis.pcall(cmd, key)"));
        assert_ne!(plain.sha, settle.sha);
        let lease = lease_batch_script_across();
        assert!(lease.text.starts_with(ACROSS_SLOTS_SHEBANG));
        assert!(lease.across_slots && !lease_batch_script().across_slots);
        assert!(lease.text.contains("redis.pcall('EXISTS', key)"));
        assert!(lease.text.contains("'TGELSEWHERE lease '"));
        assert_ne!(lease.sha, lease_batch_script().sha);
    }

    #[test]
    fn the_generic_script_carries_the_core_bounds_and_every_algorithm() {
        let text = generic_script_text();
        assert!(text.contains("local MAX_LIMIT = 1099511627776\n"));
        assert!(text.contains("local MAX_PERIOD = 31622400000000\n"));
        for a in Algorithm::ALL {
            assert!(
                text.contains(&format!("local function {}(", a.name())),
                "{a}"
            );
        }
        assert_eq!(generic_script_sha().len(), 40);
    }

    #[test]
    fn every_reply_form_parses_to_the_same_decisions() {
        let limits = [100u64, 5];
        let mut packed = vec![0, 0, 0, 0, 0, 0, 42];
        packed.extend([1, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 9]);
        packed.extend([0; 7]);
        packed.extend([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3]);
        packed.extend([0, 0, 0, 0, 0, 0, 5]);
        let r =
            parse_reply(&redis::Value::BulkString(packed), limits.into_iter(), 0).expect("packed");
        assert_eq!(r.now, Some(42));
        assert!(r.decisions[0].allowed && r.decisions[0].remaining == 7);
        assert_eq!(r.decisions[0].reset_after, 9);
        assert_eq!(r.decisions[1].retry_after, Some(4));
        assert_eq!(r.decisions[1].limit, 5);
        let one = parse_reply(&redis::Value::Int(9 * 101 + 7), [100u64].into_iter(), 101)
            .expect("integer");
        assert_eq!(one.now, None);
        assert_eq!(
            (one.decisions[0].remaining, one.decisions[0].reset_after),
            (7, 9)
        );
        assert!(parse_reply(&redis::Value::Int(3), limits.into_iter(), 101).is_err());
        assert!(parse_reply(&redis::Value::BulkString(vec![1; 8]), [1u64].into_iter(), 0).is_err());
    }
}
