//! The deny cache: after the store denies a client under a policy with retry time `t`, that
//! client and policy are denied locally until `t`, with no store call.
//!
//! Exact for every tollgate algorithm: a denial consumes nothing, and capacity never comes
//! back sooner than `retry_after` says, so the store would have answered the same. It keeps an
//! abusive client's traffic off Redis. Bounded: a fixed number of shards, each holding at most
//! `capacity / shards` entries; a full shard first drops expired entries, then the entry that
//! expires soonest (forgetting a denial only costs a store call, never a wrong admission).
//!
//! A denial is remembered with its cost: it answers only requests costing as much or more
//! (a cheaper one may fit, e.g. an RLS request with a smaller `hits_addend`).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use tollgate_core::{ClientKey, Micros};

const SHARDS: usize = 32;

/// Keys are already uniform (a keyed hash of the client, an FNV hash of the policy name):
/// mixing them once is enough.
#[derive(Default)]
pub(crate) struct PrehashedHasher(u64);

impl Hasher for PrehashedHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.0 = (self.0 ^ u64::from_le_bytes(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    fn write_u128(&mut self, v: u128) {
        // Truncation intended: the two halves are mixed in one after the other.
        self.write_u64(v as u64);
        self.write_u64((v >> 64) as u64);
    }
}

/// Makes room for `key` in a shard holding at most `per_shard` entries: when it is full and
/// `key` is new, the entries that expired go, then (still full) the one that expires soonest.
/// `expires` is when an entry stops meaning anything.
///
/// Before the table would grow, the entries that expired go too, so that under client churn a
/// shard stays the size of what is live instead of filling to its bound with entries that
/// mean nothing (and gives memory back when most of it went). Amortised: after a sweep that
/// leaves it mostly full, the table grows at once, so the next sweep waits for as many new
/// entries as are live.
pub(crate) fn make_room<V, H: std::hash::BuildHasher>(
    map: &mut HashMap<(u128, u64), V, H>,
    per_shard: usize,
    key: &(u128, u64),
    now: Micros,
    expires: impl Fn(&V) -> Micros,
) {
    if map.contains_key(key) {
        return;
    }
    if map.len() >= per_shard {
        map.retain(|_, v| expires(v) > now);
        if map.len() >= per_shard {
            if let Some(k) = map.iter().min_by_key(|(_, v)| expires(v)).map(|(k, _)| *k) {
                map.remove(&k);
            }
        }
        return;
    }
    if map.len() >= SWEEP_FLOOR && map.len() >= map.capacity() {
        map.retain(|_, v| expires(v) > now);
        let (len, capacity) = (map.len(), map.capacity());
        if len < capacity / 4 {
            map.shrink_to(len * 2);
        } else if len > capacity / 4 * 3 {
            map.reserve(len.min(per_shard.saturating_sub(len)));
        }
    }
}

/// Below this many entries a shard is never swept before it grows (small tables cost little).
const SWEEP_FLOOR: usize = 64;

/// (client, policy) -> (denied until, the cost that was denied).
type Map = HashMap<(u128, u64), (Micros, u64), BuildHasherDefault<PrehashedHasher>>;

pub(crate) struct DenyCache {
    shards: Vec<Shard>,
    per_shard: usize,
}

/// One shard: its entries, and how many there are as of its last change.
#[derive(Default)]
struct Shard {
    map: Mutex<Map>,
    /// The map's length, stored under its lock after every change: a shard that holds no
    /// denial (every shard, while no client is denied) answers without its lock, which every
    /// request to a remote store asks. A stale count costs at most a store call: the store
    /// denies what the cache did not.
    held: AtomicUsize,
}

impl Shard {
    fn lock(&self) -> MutexGuard<'_, Map> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records the map's length after a change made under `map`, its lock.
    fn note(&self, map: &Map) {
        self.held.store(map.len(), Ordering::Relaxed);
    }

    fn is_empty(&self) -> bool {
        self.held.load(Ordering::Relaxed) == 0
    }
}

impl DenyCache {
    pub(crate) fn new(capacity: usize) -> Self {
        let per_shard = capacity.div_ceil(SHARDS);
        Self {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            per_shard,
        }
    }

    fn shard(&self, client: &ClientKey, policy: u64) -> &Shard {
        let h = (client.as_u128() as u64) ^ policy.rotate_left(17);
        &self.shards[(h as usize) % SHARDS]
    }

    /// When the client is still denied under the policy at `now` for a request of `cost`:
    /// the instant it may retry.
    pub(crate) fn denied_until(
        &self,
        client: &ClientKey,
        policy: u64,
        now: Micros,
        cost: u64,
    ) -> Option<Micros> {
        let shard = self.shard(client, policy);
        if self.per_shard == 0 || shard.is_empty() {
            return None;
        }
        let mut map = shard.lock();
        let key = (client.as_u128(), policy);
        match map.get(&key) {
            Some(&(until, denied)) if until > now => (cost >= denied).then_some(until),
            Some(_) => {
                map.remove(&key);
                shard.note(&map);
                None
            }
            None => None,
        }
    }

    /// Remembers that a request of `cost` is denied to the client under the policy until
    /// `until`.
    pub(crate) fn deny(
        &self,
        client: &ClientKey,
        policy: u64,
        until: Micros,
        now: Micros,
        cost: u64,
    ) {
        if self.per_shard == 0 || until <= now {
            return;
        }
        let shard = self.shard(client, policy);
        let mut map = shard.lock();
        let key = (client.as_u128(), policy);
        make_room(&mut map, self.per_shard, &key, now, |(u, _)| *u);
        map.insert(key, (until, cost));
        shard.note(&map);
    }

    /// Until when the client is denied under the policy, whatever the cost (read-only).
    pub(crate) fn peek(&self, client: &ClientKey, policy: u64, now: Micros) -> Option<Micros> {
        let shard = self.shard(client, policy);
        if shard.is_empty() {
            return None;
        }
        let map = shard.lock();
        map.get(&(client.as_u128(), policy))
            .map(|&(until, _)| until)
            .filter(|&until| until > now)
    }

    /// Forgets the client's denial under the policy (an operator's reset).
    pub(crate) fn forget(&self, client: &ClientKey, policy: u64) {
        let shard = self.shard(client, policy);
        let mut map = shard.lock();
        map.remove(&(client.as_u128(), policy));
        shard.note(&map);
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// Every shard's count agrees with its map.
    #[cfg(test)]
    fn counted(&self) -> bool {
        self.shards
            .iter()
            .all(|s| s.lock().len() == s.held.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn under_churn_a_shard_holds_what_is_live_not_its_bound() {
        let cache = DenyCache::new(100_000);
        let mut now = 1_000_000;
        // 20,000 denials, each over 1 ms after it was made (a churn of short denials).
        for i in 0..20_000u128 {
            cache.deny(&key(i), 7, now + 500, now, 1);
            now += 1_000;
        }
        assert!(
            cache.len() < 32 * 2 * SWEEP_FLOOR,
            "{} entries held, almost all expired",
            cache.len()
        );
        // What is live is kept.
        assert!(cache.denied_until(&key(19_999), 7, now - 900, 1).is_some());
    }

    fn key(i: u128) -> ClientKey {
        ClientKey::from_u128(i.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835))
    }

    #[test]
    fn denies_until_the_retry_time_and_not_after() {
        let c = DenyCache::new(100);
        c.deny(&key(1), 7, 1_000, 0, 1);
        assert_eq!(c.denied_until(&key(1), 7, 999, 1), Some(1_000));
        assert_eq!(c.denied_until(&key(1), 7, 1_000, 1), None);
        assert_eq!(c.denied_until(&key(1), 8, 10, 1), None);
        assert_eq!(c.denied_until(&key(2), 7, 10, 1), None);
    }

    #[test]
    fn a_denial_answers_only_requests_costing_as_much_or_more() {
        let c = DenyCache::new(100);
        c.deny(&key(1), 7, 1_000, 0, 5);
        assert_eq!(c.denied_until(&key(1), 7, 10, 5), Some(1_000));
        assert_eq!(c.denied_until(&key(1), 7, 10, 9), Some(1_000));
        assert_eq!(c.denied_until(&key(1), 7, 10, 4), None);
    }

    #[test]
    fn stays_bounded_under_many_clients() {
        let c = DenyCache::new(64);
        for i in 0..10_000 {
            c.deny(&key(i), 1, 1_000_000 + i as u64, 0, 1);
        }
        assert!(c.len() <= 64, "{}", c.len());
    }

    /// Each shard's count, which lets a shard without denials answer without its lock,
    /// follows every change: denials made, expired, replaced, evicted and forgotten.
    #[test]
    fn a_shards_count_follows_every_change_and_an_empty_shard_still_answers() {
        let c = DenyCache::new(64);
        assert!(c.counted() && c.len() == 0);
        assert_eq!(c.denied_until(&key(1), 7, 0, 1), None);
        c.deny(&key(1), 7, 1_000, 0, 1);
        c.deny(&key(1), 7, 2_000, 0, 1);
        assert!(c.counted() && c.len() == 1, "a denial replaced");
        assert_eq!(c.denied_until(&key(1), 7, 1_500, 1), Some(2_000));
        assert_eq!(c.peek(&key(1), 7, 1_500), Some(2_000));
        for i in 2..500 {
            c.deny(&key(i), 7, 5_000, 0, 1);
        }
        assert!(c.counted() && c.len() <= 64, "evictions at the bound");
        c.forget(&key(1), 7);
        assert!(c.counted());
        assert_eq!(c.denied_until(&key(1), 7, 1_500, 1), None, "forgotten");
        for i in 2..500 {
            let _ = c.denied_until(&key(i), 7, 6_000, 1);
        }
        assert!(
            c.counted() && c.len() == 0,
            "every denial expired and dropped"
        );
        c.deny(&key(3), 7, 9_000, 6_000, 1);
        assert_eq!(
            c.denied_until(&key(3), 7, 7_000, 1),
            Some(9_000),
            "empty again, then not"
        );
    }

    #[test]
    fn zero_capacity_disables_it() {
        let c = DenyCache::new(0);
        c.deny(&key(1), 1, 100, 0, 1);
        assert_eq!(c.denied_until(&key(1), 1, 0, 1), None);
    }
}
