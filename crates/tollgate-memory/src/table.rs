//! One shard's open-addressing table: linear probing over 32-byte slots, deletion by backward
//! shift (no tombstones, so probe lengths never rot), growth by doubling up to a capacity fixed
//! by the shard's key bound, and a clock hand that incremental eviction walks.
//!
//! Why not `HashMap`: the slot is the whole entry (client, rule index, state) in 32 bytes, the
//! final capacity is sized from the bound rather than a power of two (that is most of the
//! memory saving over a hashbrown table at its bound), and eviction needs to visit slots by
//! index from where it left off.

use crate::packed;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Slots per used key at the final capacity: the load factor is kept at or below 4/5.
const LOAD_NUM: usize = 4;
const LOAD_DEN: usize = 5;
const MIN_CAPACITY: usize = 16;

/// One entry: the client key, then the packed state (see [`crate::packed`]). All zero is free.
///
/// The words are atomics so that checks holding the shard's lock *shared* can update a state in
/// place (see `Shard::check_shared`); everything that moves or frees slots holds it exclusively.
#[derive(Debug, Default)]
#[repr(C, align(32))]
pub struct Slot {
    /// Low half of the client key.
    pub lo: AtomicU64,
    /// High half of the client key.
    pub hi: AtomicU64,
    /// Value, rule index and kind; zero means the slot is free.
    pub meta: AtomicU64,
    /// The time field of the state (or 0 for slab entries).
    pub time: AtomicU64,
}

/// The plain contents of a slot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Raw {
    /// Low half of the client key.
    pub lo: u64,
    /// High half of the client key.
    pub hi: u64,
    /// Value, rule index and kind.
    pub meta: u64,
    /// The time field.
    pub time: u64,
}

impl Slot {
    fn is_free(&self) -> bool {
        self.meta.load(Relaxed) == 0
    }

    /// The slot's words. Under the exclusive lock they are stable; under the shared lock the
    /// key and the rule index are.
    pub fn raw(&self) -> Raw {
        Raw {
            lo: self.lo.load(Relaxed),
            hi: self.hi.load(Relaxed),
            meta: self.meta.load(Relaxed),
            time: self.time.load(Relaxed),
        }
    }

    /// Overwrites the slot (exclusive access).
    pub fn set(&mut self, r: Raw) {
        *self.lo.get_mut() = r.lo;
        *self.hi.get_mut() = r.hi;
        *self.meta.get_mut() = r.meta;
        *self.time.get_mut() = r.time;
    }
}

/// Folded multiply: the 128-bit product's halves xored. Cheap and mixes every input bit into
/// the high output bits.
pub fn fold_mul(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    // Truncations intended: the low and the high half of the product.
    (p as u64) ^ ((p >> 64) as u64)
}

/// The hash of a client within a store (it picks the shard).
pub fn client_hash(seed: [u64; 2], lo: u64, hi: u64) -> u64 {
    fold_mul(lo ^ seed[0], hi ^ seed[1])
}

/// The hash of one (client, rule) key within a shard.
pub fn slot_hash(client_hash: u64, rule: u16) -> u64 {
    fold_mul(client_hash ^ u64::from(rule), 0x9e37_79b9_7f4a_7c15)
}

/// Maps a hash onto `0..n` by the high bits of `hash * n` (no division, any `n`).
fn reduce(hash: u64, n: usize) -> usize {
    // n fits in u64 on every supported target and the result is below n.
    ((u128::from(hash) * n as u128) >> 64) as usize
}

/// The slots of one shard.
#[derive(Debug)]
pub struct Table {
    slots: Vec<Slot>,
    len: usize,
    max_capacity: usize,
    seed: [u64; 2],
    /// The clock hand: the next slot incremental eviction looks at ([`Table::tick`]).
    hand: usize,
}

impl Table {
    /// An empty table that will hold at most `bound` keys; allocates nothing yet.
    pub fn new(bound: usize, seed: [u64; 2]) -> Self {
        let max_capacity = (bound * LOAD_DEN).div_ceil(LOAD_NUM) + 1;
        Self {
            slots: Vec::new(),
            len: 0,
            max_capacity: max_capacity.max(MIN_CAPACITY),
            seed,
            hand: 0,
        }
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Slots allocated.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// The slot at `i`.
    pub fn slot(&self, i: usize) -> &Slot {
        &self.slots[i]
    }

    /// The contents of slot `i`.
    pub fn raw(&self, i: usize) -> Raw {
        self.slots[i].raw()
    }

    /// Overwrites the state words of slot `i` (exclusive access).
    pub fn set_state(&mut self, i: usize, meta: u64, time: u64) {
        let s = &mut self.slots[i];
        *s.meta.get_mut() = meta;
        *s.time.get_mut() = time;
    }

    /// Whether slot `i` holds a key.
    pub fn is_used(&self, i: usize) -> bool {
        !self.slots[i].is_free()
    }

    /// Where the key (client, rule) lives, if present. `hash` is its [`slot_hash`].
    pub fn find(&self, lo: u64, hi: u64, rule: u16, hash: u64) -> Option<usize> {
        let cap = self.slots.len();
        if cap == 0 {
            return None;
        }
        let mut i = reduce(hash, cap);
        // The load factor stays below one, so a free slot ends every probe.
        loop {
            let s = &self.slots[i];
            let meta = s.meta.load(Relaxed);
            if meta == 0 {
                return None;
            }
            if s.lo.load(Relaxed) == lo && s.hi.load(Relaxed) == hi && packed::rule(meta) == rule {
                return Some(i);
            }
            i += 1;
            if i == cap {
                i = 0;
            }
        }
    }

    /// Adds a key known to be absent. The caller keeps `len` within the shard's bound, which
    /// the capacity was sized for.
    pub fn insert(&mut self, slot: Raw, hash: u64) {
        debug_assert!(slot.meta != 0);
        if (self.len + 1) * LOAD_DEN > self.slots.len() * LOAD_NUM {
            self.grow();
        }
        Self::place(&mut self.slots, slot, hash);
        self.len += 1;
    }

    fn place(slots: &mut [Slot], slot: Raw, hash: u64) {
        let cap = slots.len();
        let mut i = reduce(hash, cap);
        while !slots[i].is_free() {
            i += 1;
            if i == cap {
                i = 0;
            }
        }
        slots[i].set(slot);
    }

    fn home(&self, s: &Raw, cap: usize) -> usize {
        let ch = client_hash(self.seed, s.lo, s.hi);
        reduce(slot_hash(ch, packed::rule(s.meta)), cap)
    }

    fn grow(&mut self) {
        let cap = self.slots.len();
        let new_cap = (cap * 2).clamp(MIN_CAPACITY, self.max_capacity.max(cap + 1));
        let fresh = (0..new_cap).map(|_| Slot::default()).collect();
        let old = std::mem::replace(&mut self.slots, fresh);
        for s in old.iter().map(Slot::raw).filter(|s| s.meta != 0) {
            let ch = client_hash(self.seed, s.lo, s.hi);
            Self::place(&mut self.slots, s, slot_hash(ch, packed::rule(s.meta)));
        }
        self.hand = 0;
    }

    /// Frees slot `i`, shifting back the entries of its probe run so that every key stays
    /// reachable from its home slot.
    pub fn remove(&mut self, mut i: usize) {
        let cap = self.slots.len();
        debug_assert!(!self.slots[i].is_free());
        let mut j = i;
        loop {
            j += 1;
            if j == cap {
                j = 0;
            }
            let moving = self.slots[j].raw();
            if moving.meta == 0 {
                break;
            }
            let k = self.home(&moving, cap);
            // The entry at j may fill the hole at i unless its home lies cyclically in (i, j].
            let stays = if i <= j {
                i < k && k <= j
            } else {
                i < k || k <= j
            };
            if !stays {
                self.slots[i].set(moving);
                i = j;
            }
        }
        self.slots[i].set(Raw::default());
        self.len -= 1;
    }

    /// The mean length of the probe run a used slot is in: a key's run, averaged over the
    /// keys (the sum of the runs' squared lengths over the keys).
    #[cfg(test)]
    pub fn mean_run(&self) -> f64 {
        let cap = self.slots.len();
        let Some(start) = self.slots.iter().position(Slot::is_free) else {
            return cap as f64;
        };
        let (mut sq, mut run) = (0usize, 0usize);
        for k in 1..=cap {
            if self.slots[(start + k) % cap].is_free() {
                sq += run * run;
                run = 0;
            } else {
                run += 1;
            }
        }
        sq as f64 / self.len.max(1) as f64
    }

    /// Moves the clock hand one slot back (toward lower indices, from the first slot to the
    /// last) and returns the slot it pointed at (see `Shard::sweep` for the direction).
    pub fn tick(&mut self) -> usize {
        let i = self.hand;
        self.hand = match i.checked_sub(1) {
            Some(back) => back,
            None => self.slots.len().saturating_sub(1),
        };
        i
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packed::{meta, Kind};

    fn slot(n: u64, rule: u16) -> Raw {
        Raw {
            lo: n,
            hi: n.wrapping_mul(31),
            meta: meta(Kind::Gcra, rule, 0),
            time: n,
        }
    }

    fn hash(t: &Table, s: &Raw) -> u64 {
        slot_hash(client_hash(t.seed, s.lo, s.hi), packed::rule(s.meta))
    }

    #[test]
    fn every_key_stays_findable_through_growth_and_removal() {
        let mut t = Table::new(5_000, [1, 2]);
        let keys: Vec<Raw> = (0..5_000).map(|n| slot(n, (n % 3) as u16)).collect();
        for s in &keys {
            assert_eq!(t.find(s.lo, s.hi, packed::rule(s.meta), hash(&t, s)), None);
            t.insert(*s, hash(&t, s));
        }
        assert_eq!(t.len(), 5_000);
        assert!(t.capacity() * 4 >= 5_000 * 5, "load factor above 4/5");
        // Remove every third key, then check presence and absence of all.
        for s in keys.iter().step_by(3) {
            let i = t
                .find(s.lo, s.hi, packed::rule(s.meta), hash(&t, s))
                .expect("present");
            t.remove(i);
        }
        for (n, s) in keys.iter().enumerate() {
            let found = t.find(s.lo, s.hi, packed::rule(s.meta), hash(&t, s));
            if n % 3 == 0 {
                assert_eq!(found, None);
            } else {
                assert_eq!(found.map(|i| t.raw(i)), Some(*s));
            }
        }
        assert_eq!(t.len(), 5_000 - 5_000usize.div_ceil(3));
    }

    #[test]
    fn capacity_stops_at_what_the_bound_needs() {
        let mut t = Table::new(1_000, [7, 9]);
        for n in 0..1_000 {
            let s = slot(n, 0);
            t.insert(s, hash(&t, &s));
        }
        assert_eq!(t.capacity(), 1_251);
    }

    #[test]
    fn the_same_client_with_another_rule_is_another_key() {
        let mut t = Table::new(10, [0, 0]);
        let a = slot(5, 1);
        let b = slot(5, 2);
        t.insert(a, hash(&t, &a));
        assert_eq!(t.find(b.lo, b.hi, 2, hash(&t, &b)), None);
        t.insert(b, hash(&t, &b));
        assert_eq!(t.len(), 2);
    }
}
