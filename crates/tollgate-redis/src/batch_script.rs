//! The batch script: many plans in one script call (`store.max_batch`).
//!
//! Most of what one script call costs Redis is the call itself (reading, parsing and
//! dispatching the command, entering the script), not the decision: a batch pays it once for
//! every plan queued behind a call in flight (see `lane.rs`). The script is generated for a
//! list of plan forms (a form is each rule's algorithm and mode, see `script.rs`): its store's
//! list, every form its plans have come in so far, up to [`MAX_SCRIPT_FORMS`] forms of
//! [`MAX_SCRIPT_RULES`] rules, or past that the batch's own forms (at most
//! [`MAX_BATCH_FORMS`]); one branch per form, each the same decision bodies and all-or-nothing
//! rule as the form's own script, every plan with its own quotas (so plans of one policy under
//! a thousand overrides, each its own limit, share one branch); it runs the plans in arrival
//! order, each against the state the plans before it left, so a batch decides exactly what the
//! same plans called one after another would.
//!
//! The call:
//! - KEYS: every plan's keys, plan after plan, each plan's in its rules' order.
//! - ARGV[1]: one byte per plan: its form's number in the script (1..=15), plus 16 when the
//!   plan's costs follow, plus 32 when its `now` does, plus 64 when its quotas are the call's;
//!   plus 128 on every plan's byte of a call of one-rule plans whose bytes are all the same
//!   and whose keys all differ (see [`mark_distinct`]), refused on a call of other bytes.
//! - ARGV[2]: the PX floor in milliseconds (0: none).
//! - ARGV[3]: the call's quotas (packed as a plan script's ARGV[1]): the first plan's, sent
//!   once for every plan of the same (most batches are of one policy's plans).
//! - then per plan, in order: its `now` (when flagged; otherwise every plan of the call reads
//!   the same Redis `TIME`), its quotas (unless they are the call's), then its costs (when
//!   flagged; otherwise every cost is 1).
//!
//! The reply: an array, one element per plan in order, each exactly what the shape's own
//! script answers (the integer of an allowed one-rule plan, else the packed string), or an
//! error for that plan alone (an argument out of range). Everything is validated before the
//! first plan runs except each plan's own arguments, which fail that plan and no other.
//!
//! What a plan costs Redis beyond its keys' own work is Lua, so the script does per plan only
//! what differs between plans: a call whose plans all have one byte in ARGV[1] (one form, the
//! same flags: the common batch) is counted once, not plan by plan, and that byte is not read
//! again for each; such a call of a form of up to four rules on the call's quotas, at cost 1
//! and on Redis's clock runs a loop of its own, the quotas unpacked and the clock read before
//! it and nothing of a plan read in it but its keys (see [`uniform_loops`]); the quotas shared
//! by the call's plans travel once, not once a plan (Redis makes an argument of each, and Lua a
//! string); each distinct quotas string is unpacked once a call (kept by the string, so plans
//! of a few limits, tiers among them, unpack each once); in such a loop of one rule, the plans
//! that find no state (a new client, or one whose key expired) all decide the same, so that is
//! decided once before the loop and each of them is only written and answered (see
//! [`fresh_plan`]); in a loop of several rules, each rule's decision on a key with no state is
//! made once before it (see [`fresh_rules`]); in the general loop, a one-rule plan that finds
//! no state, at cost 1 and on Redis's clock, writes and answers what the first such plan of its
//! form and quotas in the call did (see `one_rule`); a write's PX goes to Redis as a number,
//! which Redis prints itself, so a write makes no Lua string, except in a run of writes of the
//! same milliseconds, which share a text formatted once (see [`crate::script::write`]); a
//! call marked as having no key twice keeps no table of its one-rule plans' writes
//! (`written`, which lets a plan read what an earlier plan of the call wrote to its key);
//! `math`, `struct` and `redis` are locals. Measured with callgrind on redis-server (64
//! token-bucket plans a call, 1,000,000 random keys, `redis_bench --script-floor --cases
//! batch`): 31,567 instructions a plan before the first of these, 26,890 after those that came
//! before the call's quotas once; a minimal script that only reads and writes the keys is
//! 17,423. The call's quotas once and the uniform loop took it from 26,656 to 23,279 (the
//! minimal script 17,657 the same hour, one plan a call 50,559; `scripts/profile-redis batch
//! 1000000 6`). The plans that find no state decided once took it from 22,852 to 19,739 with
//! 100,000 keys, which under callgrind's pace are mostly expired when a plan comes
//! (`scripts/profile-redis batch 100000 6`). A Lua function holds at most 200 locals and the
//! script is one function: a test compiles the scripts with the most on a real redis-server.
//!
//! Across slots (a Redis Cluster, Redis 7 or later): plans of the many slots one node serves
//! leave in one call of the across-slots variant. A script's declared keys must share a slot,
//! so KEYS holds only the first plan's first key (it routes the call to the node) and every
//! plan's keys travel in ARGV after their count: ARGV[3] = the number of keys, ARGV[4 ..] the
//! keys, then the call's quotas and the per-plan arguments as above. The script carries the
//! `allow-cross-slot-keys` flag and runs no command on keys of two slots: each plan reads its
//! keys with one GET each (`redis.pcall`), before anything of the plan is written. A key the
//! node does not serve (the client's slot table is stale, the slot is migrating) fails that
//! read, and the plan is answered with the error code [`ELSEWHERE`], nothing of it charged; the
//! store then runs it alone, where the client follows the cluster's MOVED or ASK. A key read is
//! served by the node until the script ends (nothing runs beside a script), so a plan's writes
//! go where its reads did. A uniform call of a one-rule form runs a loop of its own there too
//! (its plans that find no state decided once, as on one server); its plans read their keys
//! as the general loop's do.

use crate::command::Args;
use crate::keys::Keys;
use crate::script::{
    across_slots, body, constants_len, decide, finish, uncharged_and_reply, unpack_format, Bound,
    Cache, Form, Quotas, RuleShape, Script,
};
use std::fmt::Write as _;
use std::sync::{Arc, OnceLock};
use tollgate_core::{Algorithm, Micros, Mode};

/// The most distinct plan forms a batch of its own forms holds (a batch that is not of its
/// store's forms, see `lane.rs`): it stops before a plan of one more form, which leaves first
/// in the next call.
pub(crate) const MAX_BATCH_FORMS: usize = 4;

/// The most forms one batch script has branches for: a plan names its form in the low four
/// bits of its byte in ARGV[1] (1..=15). A store's list of forms grows to at most this.
pub(crate) const MAX_SCRIPT_FORMS: usize = 15;

/// The most rules the forms of one batch script hold in all: the size of the largest script
/// (four forms of sixteen rules, about 390 KB of Lua), whose Lua locals and jumps a test
/// compiles on a real redis-server.
pub(crate) const MAX_SCRIPT_RULES: usize = MAX_BATCH_FORMS * crate::MAX_INLINE_RULES;

/// How many form lists get a batch script, and how many bytes of text their scripts may take
/// (a list of four forms of sixteen rules is about 390 KB; 64 MiB is more than 256 lists of
/// eight-rule forms took). Past either, a batch whose list has none runs its plans one call
/// each, written together on the lane's own connection (one write, as `max_batch = 1`
/// pipelines them), not one a round trip. A store's list grows one form at a time (at most 15
/// lists a store); past it, a list is in one order whatever order its plans came in
/// (`lane.rs` sorts it), so a client that can choose among n forms makes at most the sets of
/// up to four of them: 56 for six forms, 385 for ten (in arrival order they were 516 and
/// 5,860 lists).
const BATCH_SCRIPTS: Bound = Bound {
    scripts: 256,
    bytes: 64 << 20,
};

/// The batch script for plans of these forms (distinct, at most [`MAX_SCRIPT_FORMS`] of at
/// most [`MAX_SCRIPT_RULES`] rules), generated and kept on first use; `None` past
/// [`BATCH_SCRIPTS`].
pub(crate) fn batch_script(forms: &[Form]) -> Option<Arc<Script>> {
    static SCRIPTS: Cache<Vec<Form>> = OnceLock::new();
    cached(&SCRIPTS, forms, false)
}

/// The batch script of `forms` for plans of several slots served by one Cluster node (see
/// "Across slots" above); kept like [`batch_script`].
pub(crate) fn batch_script_across(forms: &[Form]) -> Option<Arc<Script>> {
    static SCRIPTS: Cache<Vec<Form>> = OnceLock::new();
    cached(&SCRIPTS, forms, true)
}

/// The error code of a plan of an across-slots batch with a key the node does not serve:
/// its caller runs it alone, where the client follows the cluster's redirections.
pub(crate) const ELSEWHERE: &str = "TGELSEWHERE";

/// Whether one batch script holds `forms` forms of `rules` rules in all: at most
/// [`MAX_SCRIPT_FORMS`] of at most [`MAX_SCRIPT_RULES`].
pub(crate) fn script_holds(forms: usize, rules: usize) -> bool {
    forms <= MAX_SCRIPT_FORMS && rules <= MAX_SCRIPT_RULES
}

fn cached(scripts: &Cache<Vec<Form>>, forms: &[Form], across: bool) -> Option<Arc<Script>> {
    let rules: usize = forms.iter().map(|f| f.rules().len()).sum();
    if forms.is_empty() || !script_holds(forms.len(), rules) {
        return None;
    }
    scripts
        .get_or_init(Default::default)
        .get_or_make(forms, BATCH_SCRIPTS, || generate(forms, across))
}

/// One plan of a batch call, as [`push_batch_call`] writes it: its keys and costs in rule
/// order, its `now` (sent with the local clock only) and its shape (its quotas).
pub(crate) struct CallPlan<'a> {
    pub(crate) keys: &'a Keys,
    pub(crate) costs: &'a [u64],
    pub(crate) now: Micros,
    pub(crate) form: &'a Form,
    pub(crate) quotas: &'a Quotas,
}

/// A batch call's arguments after the script's SHA (see "The call" and "Across slots"
/// above): `plans` in order, `forms` the list the script was generated for, `local` when each
/// plan's `now` travels (the local clock), `floor_ms` the PX floor (0: none).
pub(crate) fn push_batch_call(
    cmd: &mut dyn Args,
    plans: &[CallPlan<'_>],
    forms: &[Form],
    across: bool,
    local: bool,
    floor_ms: u64,
) {
    let keys: usize = plans.iter().map(|p| p.keys.len()).sum();
    let push_keys = |cmd: &mut dyn Args| {
        for p in plans {
            for k in p.keys.iter() {
                cmd.arg(k);
            }
        }
    };
    if across {
        // One declared key routes the call to its node; all travel after the count.
        let first = plans.first().and_then(|p| p.keys.first());
        cmd.arg(1).arg(first.unwrap_or_default());
    } else {
        cmd.arg(keys);
        push_keys(cmd);
    }
    let costs = |p: &CallPlan<'_>| p.costs.iter().any(|&c| c != 1);
    // The call's quotas: the first plan's, sent once for every plan that has the same.
    let shared = plans.first().map(|p| p.quotas.as_bytes());
    let shares = |p: &CallPlan<'_>| Some(p.quotas.as_bytes()) == shared;
    let spec: Vec<u8> = plans
        .iter()
        .map(|p| {
            // The list is sorted (`lane.rs`) and holds at most MAX_SCRIPT_FORMS (< 16) forms:
            // the number fits the low bits. A plan of a form not in it (none, as batches are
            // made) is sent as form 0, which the script refuses, rather than decided by
            // another form's branch.
            let s = forms.binary_search(p.form).map_or(0, |s| s + 1);
            let mut b = u8::try_from(s).unwrap_or(0);
            if costs(p) {
                b += 16;
            }
            if local {
                b += 32;
            }
            if shares(p) {
                b += 64;
            }
            b
        })
        .collect();
    let spec = mark_distinct(spec, plans);
    cmd.arg(spec).arg(floor_ms);
    if across {
        cmd.arg(keys);
        push_keys(cmd);
    }
    cmd.arg(shared.unwrap_or_default());
    for p in plans {
        if local {
            cmd.arg(p.now);
        }
        if !shares(p) {
            cmd.arg(p.quotas.as_bytes());
        }
        if costs(p) {
            for c in p.costs {
                cmd.arg(*c);
            }
        }
    }
}

/// A uniform call's bytes (every plan's the same, on the call's quotas: the script's uniform
/// loops) of plans of one rule with their high bit set when no key comes twice in the call:
/// the script then keeps no table of the keys it wrote (`written`, which lets a plan read
/// what an earlier plan of the call wrote to its key), a hash insert a write and a lookup a
/// plan less. Told by 64-bit fingerprints of the keys: two keys with different fingerprints
/// differ, so the mark is never set wrongly; two different keys with the same one only leave
/// the call unmarked. A client chooses only its identity, which reaches the key through the
/// keyed hash: it cannot aim at a collision, and one would only cost its call the mark.
fn mark_distinct(mut spec: Vec<u8>, plans: &[CallPlan<'_>]) -> Vec<u8> {
    let Some(&first) = spec.first() else {
        return spec;
    };
    // Only plans of one rule: the script keeps its table of writes for plans of several.
    if !(64..128).contains(&first)
        || spec.iter().any(|&b| b != first)
        || plans.iter().any(|p| p.keys.len() != 1)
    {
        return spec;
    }
    // One key a plan, on the stack for the default batch; a larger call's on the heap.
    let n = plans.len();
    let mut small = [0u64; 64];
    let mut large = Vec::new();
    let prints: &mut [u64] = match small.get_mut(..n) {
        Some(prints) => prints,
        None => {
            large.resize(n, 0);
            &mut large
        }
    };
    for (print, key) in prints
        .iter_mut()
        .zip(plans.iter().flat_map(|p| p.keys.iter()))
    {
        *print = fingerprint(key);
    }
    prints.sort_unstable();
    if prints.windows(2).any(|w| w[0] == w[1]) {
        return spec;
    }
    for b in &mut spec {
        *b += 128;
    }
    spec
}

/// A key's 64-bit fingerprint: its 8-byte words folded (the last one read overlapping the one
/// before, so no byte is read alone), then mixed. Keys of one call differ in the hex of their
/// client's keyed hash, whole words of it, so a fold tells them apart; any function of the key
/// would keep the mark correct (equal keys, equal fingerprints), this one is cheap.
fn fingerprint(key: &[u8]) -> u64 {
    let word = |w: &[u8]| {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        u64::from_le_bytes(b)
    };
    let mut h = key.len() as u64;
    let mut words = key.chunks_exact(8);
    for w in &mut words {
        h = h.rotate_left(23) ^ word(w);
    }
    let rest = words.remainder();
    if !rest.is_empty() {
        let last = match key.len().checked_sub(8) {
            Some(at) => word(&key[at..]),
            // A key shorter than a word (none the store makes): its bytes, zero-padded.
            None => rest
                .iter()
                .rev()
                .fold(0u64, |w, &b| (w << 8) | u64::from(b)),
        };
        h = h.rotate_left(23) ^ last;
    }
    h = (h ^ (h >> 32)).wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 29)
}

/// For benchmarks: the text of the batch script a standalone server runs for plans of these
/// rules (one form; `None` where no batch script serves it: no rule, or more than
/// [`crate::MAX_INLINE_RULES`]), the one the store loads.
#[doc(hidden)]
pub fn batch_script_text(rules: &[RuleShape]) -> Option<String> {
    batch_script(&[Form::of(rules)?]).map(|s| s.text.clone())
}

/// For benchmarks: the SHA1 of [`batch_script_text`], as EVALSHA names it.
#[doc(hidden)]
pub fn batch_script_sha(rules: &[RuleShape]) -> Option<String> {
    batch_script(&[Form::of(rules)?]).map(|s| s.sha.clone())
}

/// For benchmarks: what follows the SHA in a batch call of plans of these rules on a
/// standalone server, as `RedisStore::check` sends it (store clock, every cost 1, no PX
/// floor): the key count, the keys, then ARGV. `keys` holds the plans' keys, plan after plan,
/// `rules.len()` each; `None` for a count that is not a whole number of plans, no plan, or
/// rules no batch script serves.
#[doc(hidden)]
pub fn batch_script_args(rules: &[RuleShape], keys: &[String]) -> Option<Vec<Vec<u8>>> {
    if rules.is_empty() || !keys.len().is_multiple_of(rules.len()) {
        return None;
    }
    batch_script_args_each(&vec![rules; keys.len() / rules.len()], keys)
}

/// For benchmarks: [`batch_script_args`] with each plan's own rules (`plans[i]`: the rules of
/// the plan whose keys come i-th), all of one form (the same algorithms and modes in order,
/// any quotas: a plan of another form than the first's gives `None`).
#[doc(hidden)]
pub fn batch_script_args_each(plans: &[&[RuleShape]], keys: &[String]) -> Option<Vec<Vec<u8>>> {
    let rules = plans.first()?;
    let form = Form::of(rules)?;
    if keys.len() != plans.len() * rules.len() {
        return None;
    }
    let costs = vec![1; rules.len()];
    let quotas: Vec<Quotas> = plans
        .iter()
        .map(|rules| {
            (Form::of(rules).as_ref() == Some(&form))
                .then(|| Quotas::pack(rules.iter().map(|r| &r.limit), true).0)
        })
        .collect::<Option<_>>()?;
    let keys: Vec<Keys> = keys.chunks(rules.len()).map(Keys::from_iter).collect();
    let plans: Vec<CallPlan<'_>> = keys
        .iter()
        .zip(&quotas)
        .map(|(keys, quotas)| CallPlan {
            keys,
            costs: &costs,
            now: 0,
            form: &form,
            quotas,
        })
        .collect();
    let mut cmd = redis::Cmd::new();
    push_batch_call(
        &mut cmd,
        &plans,
        std::slice::from_ref(&form),
        false,
        false,
        0,
    );
    Some(
        cmd.args_iter()
            .filter_map(|a| match a {
                redis::Arg::Simple(bytes) => Some(bytes.to_vec()),
                // No cursor in a script call.
                _ => None,
            })
            .collect(),
    )
}

/// The most scripts [`many_forms_batch_scripts`] gives: the sets of one to four of its ten
/// forms.
#[doc(hidden)]
pub const MANY_FORMS_SCRIPTS: usize = 385;

/// For benchmarks: the texts of `n` (at most [`MANY_FORMS_SCRIPTS`]) batch scripts that plans
/// of ten two-rule forms made, a token bucket then one of five algorithms, enforced or in
/// shadow (the far section's "many forms"), when each batch had a script of its own forms:
/// sets of four forms first, then of three, two and one, each list sorted. What a store kept
/// loaded on its server before 2026-12-05 when its clients' requests matched many policies
/// (a store's list of forms now makes at most fifteen), and still makes for forms past a full
/// list. Generated apart from the process's cache.
#[doc(hidden)]
pub fn many_forms_batch_scripts(n: usize) -> Vec<String> {
    let forms: Vec<Form> = Algorithm::ALL
        .iter()
        .filter(|&&a| a != Algorithm::SlidingWindowLog)
        .flat_map(|&a| [Mode::Enforce, Mode::Shadow].map(|m| (a, m)))
        .filter_map(|second| {
            Form::new([(Algorithm::TokenBucket, Mode::Enforce), second].into_iter())
        })
        .collect();
    // Each set as a bit mask over `forms`: the larger sets first, in order of mask within a size.
    let mut sets: Vec<u32> = (1..1u32 << forms.len())
        .filter(|m| m.count_ones() as usize <= MAX_BATCH_FORMS)
        .collect();
    sets.sort_by_key(|m| std::cmp::Reverse(m.count_ones()));
    sets.into_iter()
        .take(n)
        .map(|mask| {
            let mut list: Vec<Form> = (0..forms.len())
                .filter(|i| mask >> i & 1 == 1)
                .filter_map(|i| forms.get(i).cloned())
                .collect();
            list.sort_unstable();
            generate(&list, false).text
        })
        .collect()
}

/// For tests: the batch scripts with the most Lua locals, which Redis must compile (a Lua
/// function holds at most 200): for each algorithm, a branch of [`crate::MAX_INLINE_RULES`]
/// rules of it (a quota rule among them, as that adds a local) beside three smaller forms,
/// and the most branches a script has (fifteen forms), one slot and across slots.
#[doc(hidden)]
pub fn largest_batch_scripts() -> Vec<String> {
    use tollgate_core::{Limit, Quota};
    let Ok(quota) = Quota::new(100, std::time::Duration::from_secs(60)) else {
        return Vec::new();
    };
    let form = |n: usize, algorithm: Option<Algorithm>, mode: Mode| {
        let rules: Vec<RuleShape> = (0..n)
            .filter_map(|i| {
                let a = algorithm.unwrap_or(Algorithm::ALL[i % Algorithm::ALL.len()]);
                Some(RuleShape {
                    limit: Limit::new(a, quota).ok()?,
                    mode: if i == 0 { Mode::Quota } else { mode },
                })
            })
            .collect();
        Form::of(&rules)
    };
    let mut texts = Vec::new();
    // The most branches a script has (a store's list of forms at its bound): a form of
    // sixteen rules and fourteen of three, 58 rules.
    let many: Option<Vec<Form>> =
        std::iter::once(form(crate::MAX_INLINE_RULES, None, Mode::Shadow))
            .chain((0..MAX_SCRIPT_FORMS - 1).map(|i| {
                let rules: Vec<RuleShape> = [
                    (Algorithm::ALL[i % 5], Mode::Enforce),
                    (Algorithm::ALL[(i / 5) % 5], Mode::Shadow),
                    (Algorithm::TokenBucket, Mode::Quota),
                ]
                .into_iter()
                .filter_map(|(a, mode)| {
                    Some(RuleShape {
                        limit: Limit::new(a, quota).ok()?,
                        mode,
                    })
                })
                .collect();
                Form::of(&rules)
            }))
            .collect();
    if let Some(forms) = many {
        for across in [false, true] {
            texts.push(generate(&forms, across).text);
        }
    }
    for &a in Algorithm::ALL.iter() {
        let forms: Option<Vec<Form>> = [
            form(crate::MAX_INLINE_RULES, Some(a), Mode::Shadow),
            form(1, None, Mode::Enforce),
            form(2, None, Mode::Shadow),
            form(3, None, Mode::Enforce),
        ]
        .into_iter()
        .collect();
        let Some(forms) = forms else { continue };
        for across in [false, true] {
            texts.push(generate(&forms, across).text);
        }
    }
    texts
}

/// Generates the batch script of `forms` (`across`: the across-slots one).
fn generate(forms: &[Form], across: bool) -> Script {
    let mut lua = String::with_capacity(8192 * forms.len());
    let rules_of: Vec<String> = forms.iter().map(|s| s.rules().len().to_string()).collect();
    // Across slots the keys travel in ARGV[4 ..] after their count (KEYS holds the first, for
    // routing only): a script's declared keys must share a slot.
    let (keys, nkeys, shared_at, first_arg) = if across {
        (
            "local nkeys = tonumber(argv[3])\n\
             if not nkeys or nkeys % 1 ~= 0 or nkeys < 0 or nkeys + 4 > nargs then\n  \
             return redis.error_reply('ERR tollgate: ARGV[3] must count the keys that follow')\n\
             end\n\
             local keys = {}\n\
             for j = 1, nkeys do\n  keys[j] = argv[3 + j]\nend\n",
            "nkeys",
            "4 + nkeys",
            "5 + nkeys",
        )
    } else {
        ("local keys = KEYS\n", "#keys", "3", "4")
    };
    let _ = writeln!(
        lua,
        "-- tollgate batch script: {} plan form(s){}\n\
         local argv, pack, sunpack = ARGV, struct.pack, struct.unpack\n\
         local math, struct, redis = math, struct, redis\n\
         local spec, nargs = argv[1], #argv\n\
         if not spec or nargs < 3 then\n  \
         return redis.error_reply('ERR tollgate: a batch starts with its plans\\' shapes, a PX floor and its quotas')\n\
         end\n\
         local plans, ttl_floor = #spec, tonumber(argv[2])\n\
         if not ttl_floor or ttl_floor % 1 ~= 0 or ttl_floor < 0 or ttl_floor > MAX_PERIOD then\n  \
         return redis.error_reply('ERR tollgate: ARGV[2] (PX floor) must be an integer ' ..\n    \
         'number of milliseconds in [0, period bound]')\n\
         end\n\
         {keys}\
         local rules_of = {{{}}}\n\
         local byte = string.byte\n\
         local need_keys, need_args = 0, 0\n\
         local uniform = plans > 0 and spec == string.rep(string.char(byte(spec, 1)), plans)\n\
         local distinct = uniform and byte(spec, 1) >= 128\n\
         for i = 1, uniform and 1 or plans do\n  \
         local b = byte(spec, i)\n  \
         if distinct then\n    b = b - 128\n  end\n  \
         local n = rules_of[b % 16]\n  \
         if not n or b >= 128 then\n    \
         return redis.error_reply('ERR tollgate: plan ' .. i .. ' names no shape of this script')\n  \
         end\n  \
         need_keys = need_keys + n\n  \
         if b >= 64 then\n    b = b - 64\n  else\n    need_args = need_args + 1\n  end\n  \
         if b >= 32 then\n    need_args = need_args + 1\n    b = b - 32\n  end\n  \
         if b >= 16 then\n    need_args = need_args + n\n  end\n\
         end\n\
         if uniform then\n  \
         need_keys, need_args = need_keys * plans, need_args * plans\n\
         end\n\
         need_args = need_args + {first_arg} - 1\n\
         if {nkeys} ~= need_keys or nargs ~= need_args then\n  \
         return redis.error_reply('ERR tollgate: the plans take ' .. need_keys .. ' keys and ' ..\n    \
         need_args .. ' arguments, got ' .. {nkeys} .. ' and ' .. nargs)\n\
         end\n\
         local out, clock, k, a = {{}}, nil, 0, {first_arg}\n\
         local call_quotas = argv[{shared_at}]\n\
         if plans == 0 then\n  return out\nend\n\
         local all, written = {{}}, {{}}\n\
         local unpacked, fresh_of = {{}}, {{}}\n\
         local spec_of = uniform and byte(spec, 1) % 128\n\
         local px_ms, px_arg",
        forms.len(),
        if across { ", across slots" } else { "" },
        rules_of.join(", "),
    );
    if !across {
        // One MGET reads every key (across slots, each plan reads its own: see `branch`).
        lua.push_str(
            "if need_keys <= 1000 then\n  \
             all = redis.call('MGET', unpack(keys))\n\
             else\n  \
             for c = 1, need_keys, 1000 do\n    \
             local e = c + 999\n    \
             if e > need_keys then\n      e = need_keys\n    end\n    \
             local part = redis.call('MGET', unpack(keys, c, e))\n    \
             for j = 1, #part do\n      all[c + j - 1] = part[j]\n    end\n  \
             end\n\
             end\n",
        );
    }
    uniform_loops(&mut lua, forms, across);
    lua.push_str(
        "for i = 1, plans do\n  \
         local b = spec_of or byte(spec, i)\n  \
         local shared = b >= 64\n  \
         if shared then\n    b = b - 64\n  end\n  \
         local s, now, bad = b % 16, clock, nil\n  \
         local timed = b >= 32\n  \
         if timed then\n    \
         now = tonumber(argv[a])\n    \
         a = a + 1\n    \
         if not now or now % 1 ~= 0 or now < 0 or now >= MAX_INT then\n      \
         bad = 'now must be an integer in [0, 2^53)'\n    \
         end\n    \
         b = b - 32\n  \
         elseif not now then\n    \
         local time = redis.call('TIME')\n    \
         now = time[1] * 1000000 + time[2]\n    \
         clock = now\n  \
         end\n  \
         local costs = b >= 16\n",
    );
    for (j, form) in forms.iter().enumerate() {
        let word = if j == 0 { "if" } else { "elseif" };
        let _ = writeln!(lua, "  {word} s == {} then", j + 1);
        branch(&mut lua, form, j + 1, across);
    }
    lua.push_str("  end\nend\nreturn out\n");
    let script = finish(&[&lua]);
    if across {
        across_slots(script)
    } else {
        script
    }
}

/// One form's branch: its quotas and costs read (and the argument cursor moved past them),
/// then the plan decided, charged all or nothing and answered in `out[i]`; the key cursor
/// moves past its keys.
fn branch(lua: &mut String, form: &Form, s: usize, across: bool) {
    let rules = form.rules();
    let n = rules.len();
    let names: Vec<String> = (1..=n).map(|i| format!("cost_{i}")).collect();
    let ones = vec!["1"; n].join(", ");
    let len = constants_len(n);
    let _ = writeln!(
        lua,
        "    local quotas = call_quotas\n    \
         if not shared then\n      quotas = argv[a]\n      a = a + 1\n    end\n    \
         if #quotas ~= {len} then\n      \
         bad = 'quotas must be {len} bytes'\n    \
         end\n    \
         local {} = {ones}\n    if costs then",
        names.join(", ")
    );
    for (i, name) in names.iter().enumerate() {
        let _ = writeln!(
            lua,
            "      {name} = tonumber(argv[a + {i}])\n      \
             if not {name} or {name} % 1 ~= 0 or {name} < 0 or {name} > MAX_INT then\n        \
             bad = 'costs must be integers in [0, 2^53]'\n      \
             end"
        );
    }
    let _ = writeln!(lua, "      a = a + {n}\n    end");
    if across {
        // Its own keys, each a GET of one slot; a key this node does not serve (a stale slot
        // map, a slot migrating) fails the read, never the script, and the plan is answered
        // ELSEWHERE before anything of it is written: its caller runs it alone. A key read
        // here stays here until the script ends (a script runs alone), so writes cannot fail so.
        let _ = writeln!(
            lua,
            "    local moved = false\n    \
             if not bad then\n      \
             for j = 1, {n} do\n        \
             local key = keys[k + j]\n        \
             local raw = written[key]\n        \
             if raw == nil then\n          \
             raw = redis.pcall('GET', key)\n          \
             if type(raw) == 'table' then\n            \
             moved = true\n            \
             break\n          \
             end\n        \
             end\n        \
             all[k + j] = raw\n      \
             end\n    \
             end\n    \
             if moved then\n      \
             out[i] = redis.error_reply('{ELSEWHERE} plan ' .. i .. ': a key is served by another node')\n    \
             elseif bad then"
        );
    } else {
        lua.push_str("    if bad then\n");
    }
    lua.push_str(
        "      out[i] = redis.error_reply('ERR tollgate: plan ' .. i .. ': ' .. bad)\n    \
         else\n",
    );
    // The plan's quotas unpacked once a call: kept by their string (Lua interns strings, so
    // the lookup hashes nothing), so that the plans of a few limits (one policy, or tiers)
    // unpack each limit once. Their length was checked: it fixes the format, whatever the form.
    let _ = writeln!(
        lua,
        "    local K = unpacked[quotas]\n    \
         if not K then\n      \
         K = {{sunpack('{}', quotas)}}\n      \
         unpacked[quotas] = K\n    \
         end",
        unpack_format(n)
    );
    match rules {
        [one] => one_rule(lua, *one, s),
        _ => several_rules(lua, rules, false),
    }
    let _ = writeln!(lua, "    end\n    k = k + {n}");
}

/// The most rules a form whose uniform calls get a loop of their own has: each such loop is
/// a second copy of its form's branch, and a form of sixteen rules is about 90 KB of Lua.
const UNIFORM_LOOP_RULES: usize = 4;

/// The uniform calls' loops, before the general one: a call whose plans are all of one form
/// of at most [`UNIFORM_LOOP_RULES`] rules, every one on the call's quotas, at cost 1 and on
/// Redis's clock (every plan's byte `64 + s`: the common batch) runs a loop of that form
/// alone. The quotas are unpacked and the clock read once, before it; no plan's byte,
/// argument or quotas is read in it. The decisions, writes and answers are the general
/// branch's own code, so it decides what the general loop decides for the same plans.
///
/// Across slots only forms of one rule get such a loop: each plan reads its key alone there
/// (see `branch`), and a plan whose key the node does not serve is answered [`ELSEWHERE`]
/// with nothing written, as in the general loop.
fn uniform_loops(lua: &mut String, forms: &[Form], across: bool) {
    let mut first = true;
    for (j, form) in forms.iter().enumerate() {
        let rules = form.rules();
        let n = rules.len();
        if n > UNIFORM_LOOP_RULES || (across && n > 1) {
            continue;
        }
        let word = if first { "if" } else { "elseif" };
        first = false;
        let _ = writeln!(
            lua,
            "{word} spec_of == {} and #call_quotas == {} then\n  \
             local K = {{sunpack('{}', call_quotas)}}\n  \
             local time = redis.call('TIME')\n  \
             local now = time[1] * 1000000 + time[2]",
            64 + j + 1,
            constants_len(n),
            unpack_format(n),
        );
        match rules {
            [rule] => {
                lua.push_str(
                    "  local limit, p, burst, t, base, bound = K[1], K[2], K[3], K[4], K[5], K[6]\n  \
                     local cost = 1\n",
                );
                fresh_plan(lua, rule.0);
                if across {
                    // Its key read alone: an error (a key of another node) answers ELSEWHERE.
                    let _ = write!(
                        lua,
                        "  for i = 1, plans do\n    \
                         local key = keys[i]\n    \
                         local raw = nil\n    \
                         if not distinct then\n      \
                         raw = written[key]\n    \
                         end\n    \
                         if raw == nil then\n      \
                         raw = redis.pcall('GET', key)\n    \
                         end\n    \
                         if type(raw) == 'table' then\n      \
                         out[i] = redis.error_reply('{ELSEWHERE} plan ' .. i .. ': a key is served by another node')\n    \
                         elseif"
                    );
                } else {
                    lua.push_str(
                        "  for i = 1, plans do\n    \
                         local key = keys[i]\n    \
                         local raw = all[i]\n    \
                         if not distinct then\n      \
                         raw = written[key] or raw\n    \
                         end\n    \
                         if",
                    );
                }
                lua.push_str(" not raw and fresh_value then\n");
                crate::script::set_replacing(lua, "      ", "key", "fresh_value", "fresh_px");
                lua.push_str(
                    "      if not distinct then\n        \
                     written[key] = fresh_value\n      \
                     end\n      \
                     out[i] = fresh_out\n    \
                     else\n",
                );
                one_rule_decided(lua, *rule);
                lua.push_str("    end\n");
            }
            _ => {
                let names: Vec<String> = (1..=n).map(|i| format!("cost_{i}")).collect();
                let _ = writeln!(
                    lua,
                    "  local {} = {}",
                    names.join(", "),
                    vec!["1"; n].join(", ")
                );
                fresh_rules(lua, rules);
                lua.push_str("  for i = 1, plans do\n");
                several_rules(lua, rules, true);
                let _ = writeln!(lua, "    k = k + {n}");
            }
        }
        lua.push_str("  end\n  return out\n");
    }
    if !first {
        lua.push_str("end\n");
    }
}

/// What a uniform call's one-rule plan that finds no state (its key missing) writes and
/// answers, decided once before the loop: every such plan of the call has the same quotas,
/// cost and clock, so the same decision. Sets `fresh_value`, `fresh_px` (the write's value
/// and PX text) and `fresh_out` (the answer) when it allows; none when it denies (a burst
/// below the cost), and each such plan is decided in the loop as any other. A key expires
/// when its state is a fresh one's again, so under the load (100,000 clients at 100
/// a minute, each back about once a second) about half the plans find none (0.46 a request,
/// counted in docs/benchmarks.md's eleventh session): each is then a write and an answer,
/// no decision and no new Lua string.
fn fresh_plan(lua: &mut String, algorithm: Algorithm) {
    lua.push_str(
        "  local fresh_value, fresh_px, fresh_out\n  \
         do\n    \
         local raw = false\n    \
         local ok, remaining, reset, retry, value, idle_at\n    \
         do\n",
    );
    lua.push_str(body(algorithm));
    lua.push_str("    end\n    if ok then\n");
    crate::script::px_ms(lua, "idle_at");
    lua.push_str(
        "      fresh_value, fresh_px = value, string.format('%d', ms)\n      \
         if remaining < base and reset < bound then\n        \
         fresh_out = reset * base + remaining\n      \
         else\n        \
         fresh_out = pack('>I7BI7I7I7', now, 1, remaining, reset, 0)\n      \
         end\n    \
         end\n  \
         end\n",
    );
}

/// A one-rule plan: GET, the body, SET when allowed; the integer reply where the caller sent
/// a base, as the form's own script answers.
///
/// A plan that finds no state, at cost 1 and on Redis's clock, decides what every such plan
/// of its form and quotas decides in the call: the first one's write and answer are kept
/// (`fresh_of[s][quotas]`: its value, PX text and answer) and the others only write and
/// answer them, as the uniform loop's do (see [`fresh_plan`]), for calls of plans of a few
/// limits (tiers, overrides).
fn one_rule(lua: &mut String, rule: (Algorithm, Mode), s: usize) {
    let _ = writeln!(
        lua,
        "    local cost, key = cost_1, keys[k + 1]\n    \
         local limit, p, burst, t, base, bound = K[1], K[2], K[3], K[4], K[5], K[6]\n    \
         local raw = written[key] or all[k + 1]\n    \
         local fresh = not raw and not timed and cost == 1\n    \
         local kept = fresh and fresh_of[{s}]\n    \
         kept = kept and kept[quotas]\n    \
         if kept then"
    );
    crate::script::set_replacing(lua, "      ", "key", "kept[1]", "kept[2]");
    let _ = writeln!(
        lua,
        "      written[key] = kept[1]\n      \
         out[i] = kept[3]\n    \
         else"
    );
    one_rule_decided(lua, rule);
    // The kept PX is text, formatted once here: every plan that writes it passes a string,
    // which Redis copies, not a number it would print again for each.
    let _ = writeln!(
        lua,
        "    if fresh and ok then\n      \
         local of = fresh_of[{s}]\n      \
         if not of then\n        \
         of = {{}}\n        \
         fresh_of[{s}] = of\n      \
         end"
    );
    crate::script::px_ms(lua, "idle_at");
    lua.push_str(
        "      of[quotas] = {value, string.format('%d', ms), out[i]}\n    \
         end\n    \
         end\n",
    );
}

/// A one-rule plan's decision, write and answer, given `key`, `raw`, its quota, `cost` and
/// `now` as locals.
fn one_rule_decided(lua: &mut String, (algorithm, _): (Algorithm, Mode)) {
    lua.push_str(
        "    local ok, remaining, reset, retry, value, idle_at\n    \
         do\n",
    );
    lua.push_str(body(algorithm));
    lua.push_str(
        "    end\n    \
         if not ok then\n      \
         out[i] = pack('>I7BI7I7I7', now, 0, remaining, reset, retry + 1)\n    \
         else\n      \
         if cost > 0 then\n",
    );
    crate::script::write(lua, "key", "value", "idle_at");
    lua.push_str(
        "        if not distinct then\n          \
         written[key] = value\n        \
         end\n      \
         end\n      \
         if remaining < base and reset < bound then\n        \
         out[i] = reset * base + remaining\n      \
         else\n        \
         out[i] = pack('>I7BI7I7I7', now, 1, remaining, reset, 0)\n      \
         end\n    \
         end\n",
    );
}

/// What each rule of a uniform call's plans of several rules decides for a key that holds no
/// state, decided once before the loop as [`fresh_plan`] does for one rule (the same quotas,
/// cost 1 and clock for every plan): `fresh_ok_i`, `fresh_remaining_i`, `fresh_reset_i`,
/// `fresh_retry_i`, `fresh_value_i` and `fresh_idle_i` for rule `i`. A plan still decides
/// all or nothing over its rules, each found state decided as before.
fn fresh_rules(lua: &mut String, rules: &[(Algorithm, Mode)]) {
    let n = rules.len();
    for i in 1..=n {
        let _ = writeln!(
            lua,
            "  local fresh_ok_{i}, fresh_remaining_{i}, fresh_reset_{i}, fresh_retry_{i}, \
             fresh_value_{i}, fresh_idle_{i}"
        );
    }
    // Every key missing, as MGET answers one.
    let _ = writeln!(
        lua,
        "  do\n    local raws = {{{}}}",
        vec!["false"; n].join(", ")
    );
    for (i, &(algorithm, _)) in rules.iter().enumerate() {
        let i = i + 1;
        let _ = writeln!(lua, "    do\n      local cost = cost_{i}");
        decide(lua, algorithm, i, None, "      ");
        let _ = writeln!(
            lua,
            "      fresh_ok_{i}, fresh_remaining_{i}, fresh_reset_{i}, fresh_retry_{i}, \
             fresh_value_{i}, fresh_idle_{i} =\n        \
             ok, remaining, reset, retry, value, idle_at\n    \
             end"
        );
    }
    lua.push_str("  end\n");
}

/// [`decide`] in a uniform loop: a rule whose key holds no state takes what [`fresh_rules`]
/// decided for it before the loop; any other runs the body.
fn decide_or_fresh(lua: &mut String, algorithm: Algorithm, i: usize) {
    let open = format!(
        "if not raw then\n        \
         ok, remaining, reset, retry, value, idle_at = fresh_ok_{i}, fresh_remaining_{i}, \
         fresh_reset_{i}, fresh_retry_{i}, fresh_value_{i}, fresh_idle_{i}\n      \
         else"
    );
    crate::script::decide_in(lua, algorithm, i, None, "      ", &open);
}

/// A plan of 2 to 8 rules: every rule decided (suffixed locals) on one MGET, then all charged
/// or none; a denied plan reports the uncharged state of the rules that would have allowed.
/// In a uniform loop (`fresh`), a rule whose key holds no state takes what [`fresh_rules`]
/// decided before the loop.
fn several_rules(lua: &mut String, rules: &[(Algorithm, Mode)], fresh: bool) {
    let quota = rules.iter().any(|r| r.1 == Mode::Quota);
    let raws: Vec<String> = (1..=rules.len())
        .map(|i| format!("written[keys[k + {i}]] or all[k + {i}]"))
        .collect();
    let _ = writeln!(
        lua,
        "    local denied = 0\n    local raws = {{{}}}",
        raws.join(", ")
    );
    if quota {
        lua.push_str("    local quota_ok = 0\n");
    }
    for (i, &(algorithm, mode)) in rules.iter().enumerate() {
        let i = i + 1;
        let _ = writeln!(
            lua,
            "    local ok_{i}, remaining_{i}, reset_{i}, retry_{i}, value_{i}, idle_{i}\n    \
             do\n      local cost = cost_{i}"
        );
        if fresh {
            decide_or_fresh(lua, algorithm, i);
        } else {
            decide(lua, algorithm, i, None, "      ");
        }
        match mode {
            Mode::Enforce => {
                lua.push_str("      if not ok then\n        denied = denied + 1\n      end\n")
            }
            Mode::Quota => {
                lua.push_str("      if ok then\n        quota_ok = quota_ok + 1\n      end\n")
            }
            Mode::Shadow => {}
        }
        let _ = writeln!(
            lua,
            "      ok_{i}, remaining_{i}, reset_{i}, retry_{i}, value_{i}, idle_{i} =\n        \
             ok, remaining, reset, retry, value, idle_at\n    \
             end"
        );
    }
    if quota {
        lua.push_str("    if quota_ok == 0 then\n      denied = denied + 1\n    end\n");
    }
    lua.push_str("    if denied == 0 then\n");
    for (i, &(_, mode)) in rules.iter().enumerate() {
        let i = i + 1;
        match mode {
            Mode::Enforce => {
                let _ = writeln!(lua, "      if cost_{i} > 0 then");
            }
            Mode::Shadow | Mode::Quota => {
                let _ = writeln!(lua, "      if ok_{i} and cost_{i} > 0 then");
            }
        }
        crate::script::write(
            lua,
            &format!("keys[k + {i}]"),
            &format!("value_{i}"),
            &format!("idle_{i}"),
        );
        let _ = writeln!(lua, "        written[keys[k + {i}]] = value_{i}\n      end");
    }
    uncharged_and_reply(lua, rules, "    ", "out[i] = pack");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script::RuleShape;
    use tollgate_core::{Algorithm, Limit, Quota};

    #[test]
    fn many_forms_make_one_script_a_set_of_up_to_four_of_ten() {
        let all = many_forms_batch_scripts(usize::MAX);
        assert_eq!(all.len(), MANY_FORMS_SCRIPTS);
        let distinct: std::collections::HashSet<&String> = all.iter().collect();
        assert_eq!(distinct.len(), MANY_FORMS_SCRIPTS, "a set came twice");
        // Sets of four first: each of those scripts has four branches.
        assert!(all[0].contains("elseif s == 4 then"));
        assert!(!all[MANY_FORMS_SCRIPTS - 1].contains("s == 2 then"));
        assert_eq!(many_forms_batch_scripts(7), all[..7].to_vec());
    }

    fn shape(rules: &[(Algorithm, Mode)]) -> Form {
        shape_of(rules, 100)
    }

    fn shape_of(rules: &[(Algorithm, Mode)], per_minute: u64) -> Form {
        let quota = Quota::per_minute(per_minute).expect("quota");
        let rules: Vec<RuleShape> = rules
            .iter()
            .map(|&(a, mode)| RuleShape {
                limit: Limit::new(a, quota).expect("limit"),
                mode,
            })
            .collect();
        Form::of(&rules).expect("form")
    }

    /// The room a batch's plans ask for (`PlanJob::room`) holds every argument the batch
    /// writes, at its largest: the most rules, the longest numbers, costs, the local clock,
    /// a PX floor and the across-slots layout (else the command regrows as it is written).
    #[test]
    fn a_batch_fits_in_the_room_its_plans_ask_for() {
        use crate::lane::{PlanJob, Room};
        let quota = Quota::new(tollgate_core::MAX_LIMIT, tollgate_core::MAX_PERIOD).expect("quota");
        for rules in [1, 2, crate::MAX_INLINE_RULES] {
            let rule = RuleShape {
                limit: Limit::new(Algorithm::Gcra, quota).expect("limit"),
                mode: Mode::Shadow,
            };
            let shape = vec![rule; rules];
            let form = Form::of(&shape).expect("form");
            let job = PlanJob {
                keys: (0..rules)
                    .map(|i| format!("tollgate:{{{:032x}}}:a-policy-name-{i}", u128::MAX))
                    .collect(),
                costs: smallvec::smallvec![u64::MAX; rules],
                now: u64::MAX,
                script: crate::script::plan_script(&form).expect("script"),
                form: form.clone(),
                quotas: Quotas::pack(shape.iter().map(|r| &r.limit), true).0,
            };
            for plans in [1, 2, 64] {
                let calls: Vec<CallPlan<'_>> = (0..plans)
                    .map(|_| CallPlan {
                        keys: &job.keys,
                        costs: &job.costs,
                        now: job.now,
                        form: &job.form,
                        quotas: &job.quotas,
                    })
                    .collect();
                let mut cmd = redis::Cmd::new();
                push_batch_call(
                    &mut cmd,
                    &calls,
                    std::slice::from_ref(&form),
                    true,
                    true,
                    u64::MAX,
                );
                let room = (0..plans).fold(Room::SMALL, |r, _| r.and(job.room()));
                let args = cmd.args_iter().len();
                let bytes: usize = cmd
                    .args_iter()
                    .map(|a| match a {
                        redis::Arg::Simple(b) => b.len(),
                        _ => 0,
                    })
                    .sum();
                assert!(
                    args <= room.args,
                    "{rules} rules x {plans}: {args} arguments"
                );
                assert!(
                    bytes <= room.bytes,
                    "{rules} rules x {plans}: {bytes} bytes"
                );
            }
        }
    }

    #[test]
    fn a_batch_script_has_one_branch_per_shape_and_answers_in_an_array() {
        let one = shape(&[(Algorithm::TokenBucket, Mode::Enforce)]);
        let two = shape(&[
            (Algorithm::Gcra, Mode::Enforce),
            (Algorithm::SlidingWindowLog, Mode::Shadow),
        ]);
        let s = batch_script(&[one.clone(), two.clone()]).expect("script");
        assert!(s.text.contains("  if s == 1 then\n") && s.text.contains("  elseif s == 2 then\n"));
        assert!(s.text.contains("local rules_of = {1, 2}\n"));
        // One MGET reads every key; a key written earlier in the batch is read from `written`.
        assert_eq!(
            s.text.matches("redis.call('MGET', unpack(keys))").count(),
            1
        );
        assert!(!s.text.contains("redis.call('GET'"));
        assert!(s.text.contains("local raw = written[key] or all[k + 1]\n"));
        assert!(s.text.contains(
            "local raws = {written[keys[k + 1]] or all[k + 1], written[keys[k + 2]] or all[k + 2]}\n"
        ));
        // Each form's writes, in its branch and in its uniform loop.
        assert_eq!(s.text.matches("written[key] = value\n").count(), 2);
        assert_eq!(
            s.text.matches("written[keys[k + 2]] = value_2\n").count(),
            2
        );
        assert!(s.text.contains("out[i] = reset * base + remaining"));
        // A plan's quotas are the call's (its byte has 64), or its own argument, read before
        // its costs.
        assert!(s
            .text
            .contains("if b >= 64 then\n    b = b - 64\n  else\n    need_args = need_args + 1\n"));
        assert!(s.text.contains(
            "local quotas = call_quotas\n    if not shared then\n      quotas = argv[a]\n"
        ));
        // A uniform call of either form has its own loop; of five rules, none.
        assert!(s
            .text
            .contains("if spec_of == 65 and #call_quotas == 42 then\n"));
        assert!(s.text.contains(&format!(
            "elseif spec_of == 66 and #call_quotas == {} then\n",
            constants_len(2)
        )));
        let five = shape(&[(Algorithm::Gcra, Mode::Enforce); 5]);
        let s5 = batch_script(&[one.clone(), five]).expect("script");
        assert!(s5.text.contains("if spec_of == 65 ") && !s5.text.contains("spec_of == 66"));
        // Each quotas string unpacked once a call, kept by the string.
        assert!(s.text.contains(
            "local K = unpacked[quotas]\n    if not K then\n      K = {sunpack('>I7I7I7I7I7I7', quotas)}\n      unpacked[quotas] = K\n"
        ));
        assert!(s.text.contains(
            "local K = unpacked[quotas]\n    if not K then\n      K = {sunpack('>I7I7I7I7I7I7I7I7', quotas)}\n      unpacked[quotas] = K\n"
        ));
        // The two branches' and the two uniform loops' (their quotas once, before the loop).
        assert_eq!(s.text.matches("sunpack('>I7I7I7I7I7I7").count(), 4);
        assert!(s
            .text
            .contains("local K = {sunpack('>I7I7I7I7I7I7', call_quotas)}\n"));
        assert!(s
            .text
            .contains("local K = {sunpack('>I7I7I7I7I7I7I7I7', call_quotas)}\n"));
        assert!(s.text.contains(
            "local limit, p, burst, t, base, bound = K[1], K[2], K[3], K[4], K[5], K[6]\n"
        ));
        // Plans of the same rules under other quotas (overrides) run the same script.
        let (one_b, two_b) = (
            shape_of(&[(Algorithm::TokenBucket, Mode::Enforce)], 7),
            shape_of(
                &[
                    (Algorithm::Gcra, Mode::Enforce),
                    (Algorithm::SlidingWindowLog, Mode::Shadow),
                ],
                3,
            ),
        );
        assert_eq!((&one_b, &two_b), (&one, &two));
        assert_eq!(batch_script(&[one_b, two_b]).expect("script").sha, s.sha);
        // Plans all of one byte (one form, the same flags) are counted once, not one by one,
        // and their byte is not read again for each.
        assert!(s.text.contains(
            "local uniform = plans > 0 and spec == string.rep(string.char(byte(spec, 1)), plans)\n"
        ));
        assert!(s.text.contains("for i = 1, uniform and 1 or plans do\n"));
        assert!(s.text.contains("local b = spec_of or byte(spec, i)\n"));
        // A uniform call marked as having no key twice (`mark_distinct`) reads its keys
        // without the table of writes: in the one-rule form's uniform loop and its general
        // branch, each write to that table is skipped then.
        assert!(s
            .text
            .contains("local distinct = uniform and byte(spec, 1) >= 128\n"));
        assert!(s
            .text
            .contains("local spec_of = uniform and byte(spec, 1) % 128\n"));
        assert!(s.text.contains(
            "    local raw = all[i]\n    if not distinct then\n      raw = written[key] or raw\n    end\n"
        ));
        // Each write passes its PX as a number (Redis prints it: no Lua string a write) or,
        // in a run of writes of the same milliseconds, as text formatted once. One write for
        // the one-rule form, two for the two-rule one, each in its branch and its uniform
        // loop. Each write is a `redis.pcall`, and a `redis.call` again where it failed
        // (`crate::script::set_replacing`).
        let writes = s
            .text
            .matches("local set = redis.pcall('SET', key, value, 'PX', px_arg, 'GET')")
            .count()
            + (1..=2)
                .map(|i| {
                    let w = format!(
                        "local set = redis.pcall('SET', keys[k + {i}], value_{i}, 'PX', px_arg, 'GET')"
                    );
                    s.text.matches(&w).count()
                })
                .sum::<usize>();
        assert_eq!(writes, 6);
        assert_eq!(s.text.matches("'PX', px_arg, 'GET')").count(), 2 * writes);
        // Text only from the second write in a row of the same milliseconds.
        assert_eq!(
            s.text
                .matches(
                    "  elseif px_arg == ms - ms % 1 then\n    px_arg = string.format('%d', ms)\n"
                )
                .count(),
            writes
        );
        // The one-rule form's uniform loop decides a plan that finds no state once, before
        // it, and its plans write what that decision wrote; the general loop keeps the first
        // such plan's write. Those two PX are text, formatted once a call.
        assert_eq!(
            s.text.matches("string.format('%d', ms)").count(),
            2 + writes
        );
        assert_eq!(
            s.text
                .matches("fresh_value, fresh_px = value, string.format('%d', ms)")
                .count(),
            1
        );
        assert!(s.text.contains(
            "    if not raw and fresh_value then\n      \
             local set = redis.pcall('SET', key, fresh_value, 'PX', fresh_px, 'GET')\n"
        ));
        assert!(s
            .text
            .contains("of[quotas] = {value, string.format('%d', ms), out[i]}"));
        assert!(s.text.trim_end().ends_with("return out"));
        assert!(!s.text.contains("local function"));
        // The same list is the same script; another order is another one.
        let again = batch_script(&[one.clone(), two.clone()]).expect("script");
        assert_eq!(again.sha, s.sha);
        assert_ne!(
            batch_script(&[two, one.clone()]).expect("script").sha,
            s.sha
        );
        assert!(batch_script(&[]).is_none());
        // A script has branches for at most fifteen forms (a plan's number is four bits) of
        // at most MAX_SCRIPT_RULES rules in all.
        let distinct = |n: usize, rules: usize| -> Vec<Form> {
            (0..n)
                .map(|i| {
                    let mut r = vec![(Algorithm::ALL[i % 5], Mode::Enforce)];
                    r.extend((1..rules).map(|j| {
                        let mode = if (i / 5) >> (j - 1) & 1 == 1 {
                            Mode::Shadow
                        } else {
                            Mode::Enforce
                        };
                        (Algorithm::ALL[(i + j) % 5], mode)
                    }));
                    shape_of(&r, 100)
                })
                .collect()
        };
        let fifteen = distinct(MAX_SCRIPT_FORMS, 4);
        assert_eq!(
            fifteen
                .iter()
                .collect::<std::collections::HashSet<_>>()
                .len(),
            MAX_SCRIPT_FORMS
        );
        let s = batch_script(&fifteen).expect("fifteen forms of sixty rules");
        assert!(s.text.contains("elseif s == 15 then"));
        assert!(batch_script(&distinct(MAX_SCRIPT_FORMS + 1, 4)).is_none());
        assert!(batch_script(&distinct(13, 5)).is_none(), "65 rules");
        assert!(batch_script(&distinct(12, 5)).is_some());
    }

    #[test]
    fn fingerprints_tell_keys_apart_and_take_any_length() {
        let mut prints: Vec<u64> = (0..20_000u32)
            .map(|i| {
                fingerprint(
                    format!("tollgate:{{{:032x}}}:api", u128::from(i) * 0x9e37_79b9).as_bytes(),
                )
            })
            .collect();
        prints.sort_unstable();
        prints.dedup();
        assert_eq!(prints.len(), 20_000);
        // Every length, the short ones included: keys differing in their last byte, or in
        // their length alone, have different fingerprints.
        for n in 1..40 {
            let key = vec![b'k'; n];
            let mut other = key.clone();
            other[n - 1] = b'j';
            assert_ne!(fingerprint(&key), fingerprint(&other), "length {n}");
            assert_ne!(fingerprint(&key), fingerprint(&key[..n - 1]), "length {n}");
        }
        assert_ne!(fingerprint(b"abc"), fingerprint(b"abd"));
        assert_ne!(fingerprint(b"abcdefghi"), fingerprint(b"abcdefghj"));
    }

    #[test]
    fn the_batch_script_and_call_given_to_benchmarks_are_the_ones_the_store_sends() {
        let quota = Quota::per_minute(100).expect("quota");
        let rule = RuleShape {
            limit: Limit::new(Algorithm::TokenBucket, quota).expect("limit"),
            mode: Mode::Enforce,
        };
        let form = Form::of(&[rule]).expect("form");
        let loaded = batch_script(&[form]).expect("script");
        let text = batch_script_text(&[rule]).expect("text");
        assert_eq!(text, loaded.text);
        assert_eq!(
            batch_script_sha(&[rule]).as_deref(),
            Some(loaded.sha.as_str())
        );
        assert_eq!(redis::Script::new(&text).get_hash(), loaded.sha);
        // Not a plan script: the batch of one form is another text.
        assert_ne!(crate::plan_script_sha(&[rule]), batch_script_sha(&[rule]));

        // Three plans: the key count, the keys, one byte per plan (form 1, costs 1, Redis
        // TIME), no PX floor, then each plan's quotas (a plan script's ARGV[1]).
        let keys: Vec<String> = (0..3).map(|i| format!("tollgate:{{{i}}}:api")).collect();
        let args = batch_script_args(&[rule], &keys).expect("args");
        let quotas = crate::plan_script_quotas(&[rule]).expect("quotas");
        let mut want: Vec<Vec<u8>> = vec![b"3".to_vec()];
        want.extend(keys.iter().map(|k| k.as_bytes().to_vec()));
        // Every plan's byte says its quotas are the call's, sent once, and (the high bit) that
        // no key comes twice in the call.
        want.push(vec![128 + 64 + 1; 3]);
        want.push(b"0".to_vec());
        want.push(quotas.clone());
        assert_eq!(args, want);
        // A key twice: the call is not marked, and the script keeps its table of writes.
        let twice = [keys[0].clone(), keys[1].clone(), keys[0].clone()];
        let args = batch_script_args(&[rule], &twice).expect("args");
        assert_eq!(args[4], vec![64 + 1; 3]);

        // Plans of other quotas carry their own, after the call's (the first plan's).
        let daily = RuleShape {
            limit: Limit::new(
                Algorithm::TokenBucket,
                Quota::new(5000, std::time::Duration::from_secs(86_400)).expect("quota"),
            )
            .expect("limit"),
            ..rule
        };
        let other = crate::plan_script_quotas(&[daily]).expect("quotas");
        let each: [&[RuleShape]; 3] = [&[rule], &[daily], &[rule]];
        let args = batch_script_args_each(&each, &keys).expect("args");
        assert_eq!(args[4], vec![64 + 1, 1, 64 + 1], "not uniform: not marked");
        assert_eq!(args[6..], [quotas.clone(), other]);
        let gcra = RuleShape {
            limit: Limit::new(Algorithm::Gcra, quota).expect("limit"),
            ..rule
        };
        let mixed: [&[RuleShape]; 3] = [&[rule], &[gcra], &[rule]];
        assert!(batch_script_args_each(&mixed, &keys).is_none(), "two forms");
        assert!(
            batch_script_args_each(&each[..2], &keys).is_none(),
            "a key too many"
        );

        // Two rules a plan: their keys in pairs, one byte and one quotas argument per plan.
        let hourly = Quota::new(1000, std::time::Duration::from_secs(3600)).expect("quota");
        let pair = [
            rule,
            RuleShape {
                limit: Limit::new(Algorithm::Gcra, hourly).expect("limit"),
                mode: Mode::Shadow,
            },
        ];
        let args = batch_script_args(&pair, &keys[..2]).expect("args");
        assert_eq!(args.len(), 1 + 2 + 2 + 1);
        // Plans of several rules are never marked: the script keeps its table of writes
        // for them.
        assert_eq!(args[3], vec![64 + 1]);
        assert_eq!(args[5], crate::plan_script_quotas(&pair).expect("quotas"));
        assert!(batch_script_args(&pair, &keys).is_none());
        assert!(batch_script_args(&[rule], &[]).is_none());
        assert!(batch_script_args(&[], &keys).is_none());
        assert!(batch_script_text(&[]).is_none());
    }

    /// Each plan names its form by its place in the batch's sorted list (1 to 15, with the
    /// costs bit); a plan of a form the list lacks names form 0, which the script refuses
    /// ("names no shape of this script"), instead of being decided by another form's branch.
    #[test]
    fn each_plan_names_its_forms_place_in_the_list_and_a_stranger_names_none() {
        let (a, b, c) = (
            shape(&[(Algorithm::TokenBucket, Mode::Enforce)]),
            shape(&[(Algorithm::Gcra, Mode::Enforce)]),
            shape(&[(Algorithm::FixedWindow, Mode::Enforce)]),
        );
        let mut list = vec![a.clone(), b.clone()];
        list.sort();
        let quota = Quota::per_minute(100).expect("quota");
        let (quotas, _) = Quotas::pack(
            [Limit::new(Algorithm::TokenBucket, quota).expect("limit")].iter(),
            false,
        );
        let keys: Keys = ["k"].into_iter().collect();
        let plan = |form, costs| CallPlan {
            keys: &keys,
            costs,
            now: 0,
            form,
            quotas: &quotas,
        };
        let plans = [plan(&b, &[1][..]), plan(&a, &[2][..]), plan(&c, &[1][..])];
        let mut cmd = redis::Cmd::new();
        push_batch_call(&mut cmd, &plans, &list, false, false, 0);
        let spec = cmd
            .args_iter()
            .filter_map(|a| match a {
                redis::Arg::Simple(bytes) => Some(bytes.to_vec()),
                _ => None,
            })
            .nth(4)
            .expect("the plans' bytes after the key count and three keys");
        let place = |f: &Form| list.iter().position(|l| l == f).expect("listed") as u8 + 1;
        // All three plans have the first's quotas: the call's, each flagged 64.
        assert_eq!(spec, vec![place(&b) + 64, place(&a) + 16 + 64, 64]);
        assert!(generate(&list, false)
            .text
            .contains("names no shape of this script"));
    }

    #[test]
    fn the_across_slots_script_reads_each_plans_keys_alone_and_answers_elsewhere() {
        let one = shape(&[(Algorithm::TokenBucket, Mode::Enforce)]);
        let two = shape(&[
            (Algorithm::FixedWindow, Mode::Enforce),
            (Algorithm::Gcra, Mode::Enforce),
        ]);
        let s = batch_script_across(&[one.clone(), two.clone()]).expect("script");
        // The flag line comes first, or Redis reads it as no flag at all.
        assert!(s
            .text
            .starts_with("#!lua flags=allow-cross-slot-keys\n-- tollgate: bounds"));
        assert_eq!(s.sha, redis::Script::new(&s.text).get_hash());
        // No multi-key command (one slot per command), a guarded GET per key, the keys from
        // ARGV after their count.
        assert!(!s.text.contains("MGET"));
        // One in each form's branch, one in the one-rule form's uniform loop: across slots
        // a form of two rules has none.
        assert_eq!(s.text.matches("redis.pcall('GET', key)").count(), 3);
        assert!(s
            .text
            .contains("if spec_of == 65 and #call_quotas == 42 then\n"));
        assert!(!s.text.contains("spec_of == 66"));
        assert_eq!(s.text.matches("a key is served by another node").count(), 3);
        assert!(!s.text.contains("redis.call('GET'"));
        assert!(s.text.contains("keys[j] = argv[3 + j]"));
        // The call's quotas after the keys, each plan's own arguments after them.
        assert!(s.text.contains(
            "local out, clock, k, a = {}, nil, 0, 5 + nkeys\nlocal call_quotas = argv[4 + nkeys]\n"
        ));
        assert!(s.text.contains("'TGELSEWHERE plan ' .. i"));
        // Another script than the one-slot batch of the same shapes.
        let plain = batch_script(&[one, two]).expect("script");
        assert_ne!(plain.sha, s.sha);
        assert!(!plain.text.contains("redis.pcall('GET'") && plain.text.contains("MGET"));
    }
}
