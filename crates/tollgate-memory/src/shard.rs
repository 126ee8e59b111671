//! One shard: its table, the rules it has seen, the slab for states that do not fit a slot, and
//! the eviction rule. Everything here runs under the shard's lock, which is what makes a check
//! (or several, all-or-nothing) atomic.

use crate::packed::{self, Kind, MAX_RULES};
use crate::table::{slot_hash, Raw, Slot, Table};
use crate::WhenFull;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use tollgate_core::algorithms::GcraState;
use tollgate_core::{Check, Decision, Limit, Micros, Rule, State};

/// Slots the incremental sweep looks at on each insert. A slot's keys gather for a turn of the
/// clock hand (`capacity / SWEEP_ON_INSERT` inserts), so the slots just ahead of the hand are
/// fuller than those behind it by about one over this: at 2, under a stream of new clients
/// (the test `a_stream_of_new_clients_keeps_probe_runs_short`), a key's probe run was 150
/// slots long on average at the grace that fills the table most, against 18 at 4. 8,192 random
/// keys inserted into the same table (10,241 slots, its 4/5 load) give 26 to 30.
const SWEEP_ON_INSERT: usize = 4;
/// Slots the incremental sweep looks at when a check finds the shard lock free.
pub const SWEEP_ON_CHECK: usize = 32;
/// Used slots a full shard samples for a victim before giving up.
pub const EVICTION_SAMPLE: usize = 32;

/// A client's key under a rule, as [`Shard::locate`] found it: the rule's index in the shard,
/// and whether the table holds the key (a state to write over) or not (a new key, which needs
/// room). It holds until the table next changes, so no caller looks the key up again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Located {
    /// The rule's index in the shard.
    pub rule: u16,
    /// Whether the table holds the key.
    pub kept: bool,
}

/// The state of one shard. Aligned to a cache line of its own so that the lock word next to it
/// (written by every check) does not share a line with this read-mostly data.
#[derive(Debug)]
#[repr(align(64))]
pub struct Shard {
    table: Table,
    bound: usize,
    rule_ids: Vec<u64>,
    limits: Vec<Limit>,
    slab: Vec<State>,
    free: Vec<usize>,
    grace: Micros,
    when_full: WhenFull,
    /// Decisions taken against a fresh state without being recorded (see the crate docs).
    pub untracked: u64,
}

impl Shard {
    /// A shard holding at most `bound` keys.
    pub fn new(bound: usize, seed: [u64; 2], grace: Micros, when_full: WhenFull) -> Self {
        Self {
            table: Table::new(bound, seed),
            bound,
            rule_ids: Vec::new(),
            limits: Vec::new(),
            slab: Vec::new(),
            free: Vec::new(),
            grace,
            when_full,
            untracked: 0,
        }
    }

    /// Keys tracked.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// The shard-local index of a rule, registering it (or its new limit) on first sight.
    /// `None` only when the shard has seen [`MAX_RULES`] distinct rules.
    fn rule_index(&mut self, rule: &Rule) -> Option<u16> {
        let id = rule.id();
        let i = match self.rule_ids.iter().position(|&r| r == id) {
            Some(i) => i,
            None if self.rule_ids.len() < MAX_RULES => {
                self.rule_ids.push(id);
                self.limits.push(*rule.limit());
                self.rule_ids.len() - 1
            }
            None => return None,
        };
        if self.limits[i] != *rule.limit() {
            self.limits[i] = *rule.limit();
        }
        u16::try_from(i).ok()
    }

    fn load(&self, i: usize) -> State {
        let s = self.table.raw(i);
        match packed::decode(s.meta, s.time) {
            Some(state) => state,
            None => self.slab[to_index(packed::value(s.meta))].clone(),
        }
    }

    fn store(&mut self, i: usize, state: State) {
        let s = self.table.raw(i);
        let rule = packed::rule(s.meta);
        if packed::kind(s.meta) == Kind::Slab {
            self.slab[to_index(packed::value(s.meta))] = state;
            return;
        }
        let (meta, time) = self.pack(rule, state);
        self.table.set_state(i, meta, time);
    }

    /// The meta and time words for a state, moving it to the slab when it does not fit.
    fn pack(&mut self, rule: u16, state: State) -> (u64, u64) {
        if let Some((kind, value, time)) = packed::encode(&state) {
            return (packed::meta(kind, rule, value), time);
        }
        let j = match self.free.pop() {
            Some(j) => {
                self.slab[j] = state;
                j
            }
            None => {
                self.slab.push(state);
                self.slab.len() - 1
            }
        };
        (packed::meta(Kind::Slab, rule, to_value(j)), 0)
    }

    fn evict(&mut self, i: usize) {
        let meta = self.table.raw(i).meta;
        if packed::kind(meta) == Kind::Slab {
            let j = to_index(packed::value(meta));
            // Drop the state's heap memory now; the index is reused.
            self.slab[j] = State::Gcra(Default::default());
            self.free.push(j);
        }
        self.table.remove(i);
    }

    /// When the key at `i` becomes equal to a fresh one. A state of another algorithm than its
    /// rule's is reset by the next check anyway, so it counts as idle.
    fn idle_at(&self, i: usize) -> Micros {
        let limit = &self.limits[usize::from(packed::rule(self.table.raw(i).meta))];
        let state = self.load(i);
        if state.algorithm() != limit.algorithm() {
            return 0;
        }
        state.idle_at(limit.quota())
    }

    /// When the key at `i` is limited now (a request of one unit would be denied): how long
    /// until that request would pass.
    fn limited_for(&self, i: usize, now: Micros) -> Option<Micros> {
        let limit = &self.limits[usize::from(packed::rule(self.table.raw(i).meta))];
        let mut state = self.load(i);
        let d = limit.check(&mut state, now, 1, false);
        (!d.allowed).then(|| d.retry_after.unwrap_or(Micros::MAX))
    }

    fn is_idle(&self, idle_at: Micros, now: Micros) -> bool {
        idle_at.saturating_add(self.grace) <= now
    }

    /// Looks at `n` slots from the clock hand and evicts those that are idle.
    ///
    /// The hand moves one slot for every slot it looks at, evicted or not, and toward lower
    /// indices. An eviction fills its slot by shifting back the entries after it in its probe
    /// run: those the hand has just looked at, so none is skipped, and the shift walks the
    /// slots behind the hand, which it has just thinned. (A hand that stayed on each slot it
    /// emptied moved only one slot for each insert under a stream of new clients, while the
    /// slots ahead of it filled up: one probe run grew over most of the table, and every
    /// insert, lookup and eviction walked it. See the test below.)
    pub fn sweep(&mut self, now: Micros, n: usize, spare: &[(u64, u64)]) {
        if self.table.capacity() == 0 {
            return;
        }
        for _ in 0..n {
            let i = self.table.tick();
            let s = self.table.raw(i);
            // Idle first: most slots are kept, and `spare` holds every client of the request.
            if s.meta != 0 && self.is_idle(self.idle_at(i), now) && !spare.contains(&(s.lo, s.hi)) {
                self.evict(i);
            }
        }
    }

    /// Makes room for one more key, or says how long until a sampled key stops being limited
    /// when the shard is full of keys it must keep.
    ///
    /// Victims, in order: an idle key (forgetting it changes no decision); else, among the
    /// sampled keys that are not limited, the one closest to fresh (earliest `idle_at`); else,
    /// under [`WhenFull::EvictLimited`], the limited key closest to fresh (the cheapest state
    /// to forget: its client may be admitted once more, at most a burst, sooner than its
    /// retry time). A key of the requesting client is never the victim.
    fn make_room(&mut self, now: Micros, spare: &[(u64, u64)]) -> Result<(), Micros> {
        self.sweep(now, SWEEP_ON_INSERT, spare);
        if self.table.len() < self.bound {
            return Ok(());
        }
        let mut best: Option<(usize, Micros)> = None;
        let mut best_limited: Option<(usize, Micros)> = None;
        let mut wait = Micros::MAX;
        let (mut seen, mut steps) = (0, 0);
        while seen < EVICTION_SAMPLE && steps < self.table.capacity() {
            steps += 1;
            let i = self.table.tick();
            if !self.table.is_used(i) {
                continue;
            }
            seen += 1;
            let s = self.table.raw(i);
            if spare.contains(&(s.lo, s.hi)) {
                continue;
            }
            let idle_at = self.idle_at(i);
            if self.is_idle(idle_at, now) {
                self.evict(i);
                return Ok(());
            }
            if best.is_some_and(|(_, b)| b <= idle_at) {
                continue;
            }
            match self.limited_for(i, now) {
                None => best = Some((i, idle_at)),
                Some(w) => {
                    wait = wait.min(w);
                    if best_limited.is_none_or(|(_, b)| idle_at < b) {
                        best_limited = Some((i, idle_at));
                    }
                }
            }
        }
        let limited = best_limited.filter(|_| self.when_full == WhenFull::EvictLimited);
        match best.or(limited) {
            Some((i, _)) => {
                self.evict(i);
                Ok(())
            }
            None => Err(wait.max(1)),
        }
    }

    /// Inserts a key known to be absent after [`Shard::make_room`] succeeded.
    fn insert(&mut self, lo: u64, hi: u64, rule: u16, hash: u64, state: State) {
        let (meta, time) = self.pack(rule, state);
        self.table.insert(Raw { lo, hi, meta, time }, hash);
    }

    /// What a full table answers for a new key: under `Deny`, a denial that says when a
    /// sampled key stops being limited; under `AdmitUntracked`, the fresh decision.
    fn full(&mut self, fresh: Decision, wait: Micros) -> Decision {
        self.untracked += 1;
        match self.when_full {
            WhenFull::AdmitUntracked => fresh,
            // Under EvictLimited only when nothing could be evicted at all (every sampled key
            // was the requesting client's own).
            WhenFull::Deny | WhenFull::EvictLimited => denial(fresh, wait),
        }
    }

    /// The index of a rule this shard already knows with this very limit (read-only).
    fn known_rule(&self, rule: &Rule) -> Option<u16> {
        let i = self.rule_ids.iter().position(|&r| r == rule.id())?;
        (self.limits[i] == *rule.limit()).then_some(())?;
        u16::try_from(i).ok()
    }

    /// Decides and charges one check holding the shard lock **shared**: for a key already
    /// present with its state inline. A GCRA state is one word, updated by compare-and-swap; a
    /// two-word state is updated under a lock bit in its own slot. `None` means "take the lock
    /// exclusively" (new key, slab state, new rule or limit, algorithm change); nothing was
    /// written then.
    pub fn check_shared(
        &self,
        lo: u64,
        hi: u64,
        ch: u64,
        check: &Check<'_>,
        now: Micros,
    ) -> Option<Decision> {
        let limit = check.rule.limit();
        let rule = self.known_rule(check.rule)?;
        let slot = self
            .table
            .slot(self.table.find(lo, hi, rule, slot_hash(ch, rule))?);
        match packed::kind(slot.meta.load(Relaxed)) {
            Kind::Gcra => loop {
                // Under a shared lock a GCRA slot's meta word never changes: the time word is
                // the whole state.
                let tat = slot.time.load(Acquire);
                let mut state = State::Gcra(GcraState { tat });
                let d = limit.check(&mut state, now, check.cost, true);
                let State::Gcra(GcraState { tat: new }) = state else {
                    return None;
                };
                if new == tat
                    || slot
                        .time
                        .compare_exchange_weak(tat, new, Release, Relaxed)
                        .is_ok()
                {
                    return Some(d);
                }
            },
            Kind::Empty | Kind::Slab => None,
            _ => {
                let guard = SlotLock::acquire(slot);
                let meta = guard.meta;
                let mut state = packed::decode(meta, slot.time.load(Relaxed))?;
                let d = limit.check(&mut state, now, check.cost, true);
                let (kind, value, time) = packed::encode(&state)?;
                if kind != packed::kind(meta) {
                    return None;
                }
                slot.time.store(time, Relaxed);
                guard.release(packed::meta(kind, packed::rule(meta), value));
                Some(d)
            }
        }
    }

    /// Decides and charges one check for the client `(lo, hi)` whose hash is `ch`.
    pub fn check_one(
        &mut self,
        lo: u64,
        hi: u64,
        ch: u64,
        check: &Check<'_>,
        now: Micros,
    ) -> Decision {
        let limit = check.rule.limit();
        let Some(rule) = self.rule_index(check.rule) else {
            self.untracked += 1;
            return limit.check(&mut limit.fresh(), now, check.cost, true);
        };
        let hash = slot_hash(ch, rule);
        match self.table.find(lo, hi, rule, hash) {
            Some(i) => {
                let meta = self.table.raw(i).meta;
                if packed::kind(meta) == Kind::Slab {
                    let state = &mut self.slab[to_index(packed::value(meta))];
                    return limit.check(state, now, check.cost, true);
                }
                let mut state = self.load(i);
                let d = limit.check(&mut state, now, check.cost, true);
                self.store(i, state);
                d
            }
            None => {
                let mut state = limit.fresh();
                let d = limit.check(&mut state, now, check.cost, true);
                if !d.allowed || check.cost == 0 {
                    return d;
                }
                match self.make_room(now, &[(lo, hi)]) {
                    Ok(()) => {
                        self.insert(lo, hi, rule, hash, state);
                        d
                    }
                    Err(wait) => self.full(d, wait),
                }
            }
        }
    }

    /// Where `rule`'s state of the client `(lo, hi)` (hash `ch`) lives, and the state (fresh
    /// when absent). `None` when the shard has seen too many rules (such a check is decided on
    /// a fresh state and never recorded).
    pub fn locate(&mut self, lo: u64, hi: u64, ch: u64, rule: &Rule) -> (Option<Located>, State) {
        let Some(r) = self.rule_index(rule) else {
            self.untracked += 1;
            return (None, rule.limit().fresh());
        };
        let found = self.table.find(lo, hi, r, slot_hash(ch, r));
        let state = match found {
            Some(i) => self.load(i),
            None => rule.limit().fresh(),
        };
        let located = Located {
            rule: r,
            kept: found.is_some(),
        };
        (Some(located), state)
    }

    /// Forgets the state of the client `(lo, hi)` (hash `ch`) under the rule with id
    /// `rule_id`, whatever its limit: the next check starts fresh. Whether there was one.
    pub fn remove(&mut self, lo: u64, hi: u64, ch: u64, rule_id: u64) -> bool {
        let Some(r) = self.rule_ids.iter().position(|&r| r == rule_id) else {
            return false;
        };
        let Ok(r) = u16::try_from(r) else {
            return false;
        };
        match self.table.find(lo, hi, r, slot_hash(ch, r)) {
            Some(i) => {
                self.evict(i);
                true
            }
            None => false,
        }
    }

    /// Makes room for `n` new keys, evicting no key of the clients in `spare` (those of the
    /// request), or says how long until a sampled key stops being limited. Under
    /// `AdmitUntracked` a failure is `Ok(false)`: the new keys are then not recorded.
    pub fn reserve(&mut self, n: usize, now: Micros, spare: &[(u64, u64)]) -> Result<bool, Micros> {
        for _ in 0..n {
            if let Err(wait) = self.make_room(now, spare) {
                self.untracked += 1;
                return match self.when_full {
                    WhenFull::Deny | WhenFull::EvictLimited => Err(wait),
                    WhenFull::AdmitUntracked => Ok(false),
                };
            }
        }
        Ok(true)
    }

    /// Writes `state` for the rule index `rule` of the client: over its slot when present
    /// (found again: evictions move slots), inserted when `insert` (room was reserved).
    pub fn put(&mut self, lo: u64, hi: u64, ch: u64, rule: u16, state: State, insert: bool) {
        let hash = slot_hash(ch, rule);
        match self.table.find(lo, hi, rule, hash) {
            Some(i) => self.store(i, state),
            None if insert => self.insert(lo, hi, rule, hash, state),
            None => {}
        }
    }
}

/// The lock bit of one slot, held by a check under the shared shard lock. Dropping it
/// without [`SlotLock::release`] (an early return, a panic in a check) restores the meta word
/// as it was, so a slot is never left locked.
struct SlotLock<'a> {
    slot: &'a Slot,
    meta: u64,
}

impl<'a> SlotLock<'a> {
    fn acquire(slot: &'a Slot) -> Self {
        let mut spins = 0u32;
        loop {
            let meta = slot.meta.load(Relaxed);
            if meta & packed::LOCKED == 0
                && slot
                    .meta
                    .compare_exchange_weak(meta, meta | packed::LOCKED, Acquire, Relaxed)
                    .is_ok()
            {
                return Self { slot, meta };
            }
            spins += 1;
            if spins.is_multiple_of(64) {
                // The holder may be preempted: let it run.
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    fn release(mut self, meta: u64) {
        self.meta = meta;
    }
}

impl Drop for SlotLock<'_> {
    fn drop(&mut self) {
        self.slot.meta.store(self.meta, Release);
    }
}

/// A full table's denial of a new key: nothing is charged, and the retry time is when a
/// sampled key stops being limited (and so could make room).
pub fn denial(fresh: Decision, wait: Micros) -> Decision {
    Decision {
        allowed: false,
        limit: fresh.limit,
        remaining: 0,
        reset_after: 0,
        retry_after: Some(wait),
    }
}

fn to_index(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

fn to_value(i: usize) -> u64 {
    u64::try_from(i).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::client_hash;
    use std::time::Duration;
    use tollgate_core::{Algorithm, Quota};

    /// A shard that keeps taking new clients, each idle a few microseconds after its one
    /// request (a limit of a billion an hour) and kept for the grace after that, as under a
    /// flood of one-request clients or a ten-descriptor RLS load: the sweep must keep the
    /// probe runs as short as a table of random keys at its load has them (26 to 30 slots a
    /// key's run at 4/5, 8,192 keys in this table's 10,241 slots). A clock hand that stayed
    /// on each slot it emptied moved one slot an insert here, the slots ahead of it filled
    /// up, and a key's run was 1,303 and 1,277 slots long on average (graces of 10 and 40 ms,
    /// the first two below; 9.5 and 9.5 now); every insert, lookup and eviction walked it.
    #[test]
    fn a_stream_of_new_clients_keeps_probe_runs_short() {
        let quota = Quota::new(1_000_000_000, Duration::from_secs(3600)).expect("quota");
        let rule = Rule::new(
            "tb",
            Limit::new(Algorithm::TokenBucket, quota).expect("limit"),
        );
        let seed = [0x1234_5678, 0x9abc_def0];
        let bound = 8_192;
        // A new client every 10 us: a grace of 40 ms keeps about 4,000 of them.
        for grace in [10_000, 40_000, 60_000, 100_000] {
            let mut shard = Shard::new(bound, seed, grace, WhenFull::EvictLimited);
            let (mut runs, mut samples) = (0.0, 0);
            for n in 0..100_000u64 {
                let now = 1_750_000_000_000_000 + n * 10;
                let lo = n.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5555;
                let hi = lo.rotate_left(29) ^ n;
                let ch = client_hash(seed, lo, hi);
                let (r, mut state) = shard.locate(lo, hi, ch, &rule);
                let r = r.expect("one rule").rule;
                assert!(rule.limit().check(&mut state, now, 1, true).allowed);
                assert_eq!(shard.reserve(1, now, &[(lo, hi)]), Ok(true));
                shard.put(lo, hi, ch, r, state, true);
                if n >= 50_000 && n % 1_000 == 0 {
                    runs += shard.table.mean_run();
                    samples += 1;
                }
            }
            let mean = runs / f64::from(samples);
            assert!(shard.len() <= bound);
            assert!(
                mean < 40.0,
                "grace {grace} us: a key's probe run is {mean:.0} slots long on average"
            );
        }
    }
}
