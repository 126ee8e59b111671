//! The in-process tollgate store: what `tollgate serve` uses without Redis, what the tower
//! middleware uses in a single service, and the local fallback when Redis is down.
//!
//! # Data structure
//!
//! Keys are `(ClientKey, rule.id())`. The store is a fixed array of shards, each a
//! `RwLock` over an open-addressing table (linear probing, backward-shift deletion). The shard
//! is chosen by a seeded hash of the **client only**, so every rule of one client lives in one
//! shard and a request checked against several policies takes exactly one lock: the checks
//! are decided all-or-nothing under it, and there is no lock ordering to get wrong.
//!
//! A slot is 32 bytes: the 16-byte client key and two words of state. The rule is stored as a
//! 16-bit index into the shard's list of rules it has seen (which also remembers each rule's
//! limit, so eviction can judge a key without the request that created it). Fixed window,
//! token bucket, leaky bucket, GCRA and (up to 2^20 units per window) the sliding window
//! counter keep their tollgate-core state inline, field for field; the sliding log and larger
//! counters live in a per-shard slab. Every decision is computed by the tollgate-core
//! functions on that exact state: the store only loads, calls, and stores back.
//!
//! # Atomicity: a read-write lock per shard, a compare-and-swap per key
//!
//! Each shard sits behind a `RwLock`. The common case, one check on a key already present
//! whose state is inline, holds it **shared**: for GCRA (one word of state) the update is a
//! compare-and-swap loop on the slot's time word, as governor does; for the other inline
//! states (two words) a lock bit in the slot's own meta word guards the few nanoseconds of the
//! update. Readers never block each other, so a thread preempted mid-check (common on a busy
//! machine) stalls nobody but callers of the very same key, and only for two-word states.
//!
//! Everything else holds the lock **exclusively**: inserting a key (and evicting for it), a
//! state in the slab (sliding logs), a rule or limit the shard has not seen, a policy whose
//! algorithm changed, and every multi-rule request (decided all-or-nothing under it). The
//! exclusive holder waits for all shared holders, so it never sees a slot mid-update. Either
//! way a check is one atomic read-modify-write of the state: no lost update, for any
//! algorithm; `docs/benchmarks.md` has the numbers.
//!
//! # Bounded memory and eviction
//!
//! `max_keys` is a hard bound: it is split between the shards (their bounds add up to it) and
//! a shard never holds more than its share, so [`MemoryStore::len`] never exceeds `max_keys`.
//! (A store at its bound may hold a little less: a shard that fills before the others evicts
//! within its share. At 1,000,000 keys over 64 shards that is about 0.3%.) A `max_keys` of 0
//! is taken as 1, and there are never more shards than keys, so every shard can hold one.
//! Each table grows by doubling up to `ceil(bound x 5/4) + 1` slots (load factor at most 4/5),
//! so at the bound a key costs 32 / 0.8 = 40 bytes of table, plus the slab for sliding logs.
//!
//! There is no background sweep and nothing to call: every insert (in its shard), and one in
//! 256 of a thread's checks (in the next shard in turn, when its lock is free at that moment),
//! moves a shard's clock hand over a few slots and removes the keys that are **idle**
//! (their state equals a fresh one since at least `idle_grace`; the grace absorbs clocks of
//! concurrent callers that differ by a little). The work per operation is constant whatever
//! the number of keys.
//!
//! When a new key arrives at a full shard, the shard samples up to 32 keys from its clock hand
//! and evicts the state that costs least to forget, in this order:
//! 1. the first idle key found: forgetting it changes no decision;
//! 2. else the sampled key **closest to fresh** (earliest `idle_at`) among those that are
//!    **not limited**, i.e. would still admit a one-unit request now;
//! 3. else (every sampled key is limited: an attacker spraying keys at a strict policy fills
//!    a table with them) the **limited** key closest to fresh, under the default
//!    [`WhenFull::EvictLimited`].
//!
//! A key of the requesting client is never the victim. Evicting a key that is not limited
//! forgives what it has used (its next requests see a fresh state); choosing the one closest
//! to fresh makes that the usage that was about to expire anyway, and under a flood of
//! one-request keys those flood keys, not a client that has spent most of its quota, are the
//! ones closest to fresh.
//!
//! Evicting a limited key is the error a full table allows: that client is admitted again
//! (up to one burst) before its retry time. It happens only when every sampled key is limited,
//! and the victim is the limited key closest to fresh, which under a spray of one-request
//! keys is the oldest spray key, not a real client's; a client whose state is evicted this
//! way gets at most one extra burst per eviction. Denying every new client instead (as
//! nginx's `limit_req` refuses a request whose state it cannot store) hands an attacker who
//! fills the table a denial of service against everyone else; [`WhenFull::Deny`] keeps that
//! behaviour for those who prefer it, and `AdmitUntracked` admits the new key unrecorded.
//! [`MemoryStore::untracked`] counts the requests a full table could not record. For a
//! multi-rule request the room for all new keys is made before anything is charged, so this
//! too is all-or-nothing.
//!
//! Cost-0 checks (pure queries) and denied requests never create an entry.
#![deny(missing_docs)]

mod packed;
mod plan;
mod shard;
mod table;

use shard::Shard;
use std::cell::Cell;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;
use tollgate_core::{duration_to_micros, Check, ClientKey, Decision, Micros, Verdict};

pub use shard::EVICTION_SAMPLE;

/// Settings of a [`MemoryStore`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryConfig {
    /// The most keys (client x rule) tracked at once: a hard bound (0 is taken as 1).
    pub max_keys: usize,
    /// Shards (rounded up to a power of two); 0 picks 64, fewer for small `max_keys` so that
    /// each shard holds at least 1024 keys.
    pub shards: usize,
    /// How long past `idle_at` a key is kept before the sweep may drop it.
    pub idle_grace: Duration,
    /// What a full table does with a new key when every sampled key is limited.
    pub when_full: WhenFull,
}

/// What a full table does for a new key when every sampled key is limited. See the crate
/// docs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WhenFull {
    /// Evict the sampled limited key closest to fresh and record the new key. The new client
    /// is decided like any other; the evicted one forgets its state (see the crate docs for
    /// the error this allows).
    #[default]
    EvictLimited,
    /// Deny the new key's request, charging nothing, with a retry time of when a sampled key
    /// stops being limited (and so becomes evictable). Fails closed for new keys only: an
    /// attacker that fills the table with limited keys denies every new client.
    Deny,
    /// Decide the new key's request against a fresh state and admit it without recording it.
    /// Fails open for new keys only: while the table stays full of limited keys, a new key is
    /// not limited at all.
    AdmitUntracked,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            max_keys: 1_000_000,
            shards: 0,
            idle_grace: Duration::from_secs(1),
            when_full: WhenFull::EvictLimited,
        }
    }
}

/// One shard and its published counters, on its own cache lines.
#[repr(align(128))]
struct Padded {
    shard: RwLock<Shard>,
    len: AtomicUsize,
    untracked: AtomicU64,
}

/// The in-memory keyed store. `Send + Sync`; share it through an `Arc`.
pub struct MemoryStore {
    shards: Box<[Padded]>,
    shift: u32,
    seed: [u64; 2],
    max_keys: usize,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("shards", &self.shards.len())
            .field("max_keys", &self.max_keys)
            .field("len", &self.len())
            .finish()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new(MemoryConfig::default())
    }
}

impl MemoryStore {
    /// A store with the given settings. Tables are allocated as keys arrive.
    pub fn new(mut config: MemoryConfig) -> Self {
        config.max_keys = config.max_keys.max(1);
        let n = shard_count(&config);
        let shift = if n == 1 { 64 } else { 64 - n.trailing_zeros() };
        let random = std::collections::hash_map::RandomState::new();
        let seed = [random.hash_one(0x5eed_u64), random.hash_one(0xfeed_u64)];
        let grace = duration_to_micros(config.idle_grace);
        let shards = (0..n)
            .map(|i| {
                let bound = config.max_keys / n + usize::from(i < config.max_keys % n);
                Padded {
                    shard: RwLock::new(Shard::new(bound, seed, grace, config.when_full)),
                    len: AtomicUsize::new(0),
                    untracked: AtomicU64::new(0),
                }
            })
            .collect();
        Self {
            shards,
            shift,
            seed,
            max_keys: config.max_keys,
        }
    }

    /// Decides a request's plan at `now` (microseconds since the epoch), all-or-nothing (see
    /// [`tollgate_core::decide`]): when every enforced check allows, every check that allowed is
    /// charged; otherwise nothing is. The checks may be of several clients: every shard they
    /// touch is locked (in ascending order, so two plans never wait on each other in a cycle)
    /// for the whole decision.
    pub fn check(&self, checks: &[Check<'_>], now: Micros) -> Verdict {
        if let [one] = checks {
            // A verdict's one decision is inline: nothing is allocated.
            let d = self.check_one(one, now);
            return Verdict {
                allowed: tollgate_core::plan_allows([(one.mode, d.allowed)]),
                decisions: tollgate_core::Decisions::from_buf([d]),
            };
        }
        let keys: Vec<Place> = checks.iter().map(|c| self.place(&c.client)).collect();
        let mut order: Vec<usize> = keys.iter().map(|k| k.shard).collect();
        order.sort_unstable();
        order.dedup();
        let mut guards: Vec<RwLockWriteGuard<'_, Shard>> = order
            .iter()
            .map(|&i| write(&self.shards[i].shard))
            .collect();
        // Each check's shard among the locked ones, found once.
        let at: Vec<usize> = keys
            .iter()
            .map(|k| order.binary_search(&k.shard).unwrap_or(0))
            .collect();
        let verdict = plan::decide(&mut guards, &keys, &at, checks, now);
        for (g, &i) in guards.iter().zip(&order) {
            publish(&self.shards[i], g);
        }
        verdict
    }

    /// [`MemoryStore::check`] for a single check, returning its decision without allocating a
    /// [`Verdict`]: the same decision and the same charge.
    pub fn check_one(&self, check: &Check<'_>, now: Micros) -> Decision {
        let Place { lo, hi, ch, shard } = self.place(&check.client);
        let padded = &self.shards[shard];
        let shared = read(&padded.shard).check_shared(lo, hi, ch, check, now);
        match shared {
            Some(d) => {
                self.sweep_now_and_then(now);
                d
            }
            None => {
                let mut shard = write(&padded.shard);
                let d = shard.check_one(lo, hi, ch, check, now);
                publish(padded, &shard);
                d
            }
        }
    }

    /// Settles `client`'s charge `charge` under `rule` at its real cost (a refund or a debt,
    /// see [`tollgate_core::Limit::settle`]; a concurrency hold is released), or, with `real`
    /// `None`, renews a concurrency hold. Returns the units applied. A debt for a key no longer
    /// tracked needs room like a new key; when the table has none, the debt is forgiven.
    pub fn settle(
        &self,
        client: &ClientKey,
        rule: &tollgate_core::Rule,
        charge: tollgate_core::Charge,
        real: Option<u64>,
        now: Micros,
    ) -> u64 {
        let Place { lo, hi, ch, shard } = self.place(client);
        let padded = &self.shards[shard];
        let mut guard = write(&padded.shard);
        let (index, mut state) = guard.locate(lo, hi, ch, rule);
        let Some(index) = index else {
            return 0;
        };
        let limit = rule.limit();
        let done = match real {
            Some(real) => {
                let s = limit.settle(&mut state, now, charge, real);
                s.refunded + s.charged
            }
            None => limit.renew(&mut state, now, charge).units,
        };
        if done > 0 {
            let insert = index.kept || guard.reserve(1, now, &[(lo, hi)]).unwrap_or(false);
            if !insert {
                return 0;
            }
            guard.put(lo, hi, ch, index.rule, state, insert);
            publish(padded, &guard);
        }
        done
    }

    /// Gives back `units` of a charge nothing recorded (Envoy's negative hits, see
    /// [`tollgate_core::Limit::give_back`]) to `client`'s state under `rule`. Returns the
    /// units given back: none for a key not tracked (a fresh state has nothing to give back).
    pub fn give_back(
        &self,
        client: &ClientKey,
        rule: &tollgate_core::Rule,
        units: u64,
        now: Micros,
    ) -> u64 {
        let Place { lo, hi, ch, shard } = self.place(client);
        let padded = &self.shards[shard];
        let mut guard = write(&padded.shard);
        let (index, mut state) = guard.locate(lo, hi, ch, rule);
        let Some(index) = index else {
            return 0;
        };
        if !index.kept {
            return 0;
        }
        let back = rule.limit().give_back(&mut state, now, units);
        if back > 0 {
            guard.put(lo, hi, ch, index.rule, state, true);
            publish(padded, &guard);
        }
        back
    }

    /// Forgets `client`'s state under `rule` (an operator's reset): its next check starts
    /// from a fresh state. Whether a key was tracked.
    pub fn remove(&self, client: &ClientKey, rule: &tollgate_core::Rule) -> bool {
        let Place { lo, hi, ch, shard } = self.place(client);
        let padded = &self.shards[shard];
        let mut guard = write(&padded.shard);
        let removed = guard.remove(lo, hi, ch, rule.id());
        publish(padded, &guard);
        removed
    }

    fn place(&self, client: &ClientKey) -> Place {
        let (lo, hi) = halves(client);
        let ch = table::client_hash(self.seed, lo, hi);
        Place {
            lo,
            hi,
            ch,
            shard: self.shard_of(ch),
        }
    }

    /// Keys tracked now (the `tollgate_memory_keys` metric); never above `max_keys`.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|p| p.len.load(Ordering::Relaxed))
            .sum()
    }

    /// Whether no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The configured bound on [`MemoryStore::len`].
    pub fn max_keys(&self) -> usize {
        self.max_keys
    }

    /// Requests of new keys that a full table could not record because every sampled key was
    /// limited: denied under [`WhenFull::Deny`], admitted uncharged under
    /// [`WhenFull::AdmitUntracked`]. Export it next to `tollgate_memory_keys`.
    pub fn untracked(&self) -> u64 {
        self.shards
            .iter()
            .map(|p| p.untracked.load(Ordering::Relaxed))
            .sum()
    }

    fn sweep_now_and_then(&self, now: Micros) {
        let n = CHECKS.with(|c| {
            let n = c.get().wrapping_add(1);
            c.set(n);
            n
        });
        if !n.is_multiple_of(SWEEP_PERIOD) {
            return;
        }
        let padded = &self.shards[(n / SWEEP_PERIOD) as usize % self.shards.len()];
        if let Ok(mut shard) = padded.shard.try_write() {
            shard.sweep(now, shard::SWEEP_ON_CHECK, &[]);
            publish(padded, &shard);
        }
    }

    fn shard_of(&self, client_hash: u64) -> usize {
        // shift is 64 for a single shard: checked_shr gives None, which means shard 0.
        client_hash
            .checked_shr(self.shift)
            .map_or(0, |s| usize::try_from(s).unwrap_or(0))
    }
}

fn shard_count(config: &MemoryConfig) -> usize {
    let mut n = if config.shards > 0 {
        config.shards.next_power_of_two()
    } else {
        let mut n = 64;
        while n > 1 && config.max_keys / n < 1024 {
            n /= 2;
        }
        n
    };
    while n > 1 && n > config.max_keys {
        n /= 2;
    }
    n
}

/// Where a client's keys live: its halves, its hash and its shard.
#[derive(Clone, Copy)]
pub(crate) struct Place {
    pub(crate) lo: u64,
    pub(crate) hi: u64,
    pub(crate) ch: u64,
    pub(crate) shard: usize,
}

fn halves(client: &ClientKey) -> (u64, u64) {
    let v = client.as_u128();
    // Truncations intended: the two halves of the key.
    (v as u64, (v >> 64) as u64)
}

/// Makes the shard's counters readable without its lock.
fn publish(padded: &Padded, shard: &Shard) {
    padded.len.store(shard.len(), Ordering::Relaxed);
    padded.untracked.store(shard.untracked, Ordering::Relaxed);
}

fn read(m: &RwLock<Shard>) -> RwLockReadGuard<'_, Shard> {
    // A panic inside a check leaves the shard's table consistent (every write is one slot);
    // keep serving rather than failing every later request.
    m.read().unwrap_or_else(PoisonError::into_inner)
}

fn write(m: &RwLock<Shard>) -> RwLockWriteGuard<'_, Shard> {
    m.write().unwrap_or_else(PoisonError::into_inner)
}

/// Checks that stay on the shared path do not sweep the shard they use; instead one in
/// [`SWEEP_PERIOD`] of a thread's checks sweeps a few slots of the next shard in turn (so cold
/// shards are swept too), if its lock is free right now (never waiting for it). The counter is
/// per thread, so it costs no shared write.
const SWEEP_PERIOD: u32 = 256;

thread_local! {
    static CHECKS: Cell<u32> = const { Cell::new(0) };
}
