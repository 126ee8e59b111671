//! The store's last answer for the rules of a plan that another rule denied, so that a plan
//! the deny cache answers locally reports every rule truthfully: the denied rules from the
//! deny cache, the others with what the store last said of them (their remaining and reset).
//!
//! Filled from denied plans of several rules only (a one-rule plan answered by the deny cache
//! has nothing else to report), refreshed by every later store answer for a rule it holds,
//! forgotten when the rule's state is back to fresh. Bounded like the deny cache: a fixed
//! number of shards, each with at most `capacity / shards` entries; a full shard drops the
//! entries whose reset passed, then the one that resets soonest. A rule it does not know sends
//! the plan to the store (which answers, and so fills it).

use crate::deny_cache::{make_room, PrehashedHasher};
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use tollgate_core::{ClientKey, Micros};

const SHARDS: usize = 16;

/// What the store last said of a rule for a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Known {
    /// Whether the rule allowed then (a shadow rule may have denied).
    pub(crate) allowed: bool,
    /// Units left then.
    pub(crate) remaining: u64,
    /// When the state is fresh again (microseconds since the epoch).
    pub(crate) reset_at: Micros,
}

type Map = HashMap<(u128, u64), Known, BuildHasherDefault<PrehashedHasher>>;

pub(crate) struct LastAnswers {
    shards: Vec<Mutex<Map>>,
    per_shard: usize,
    /// Entries held (approximately: for the fast "empty" test on the hot path).
    len: AtomicUsize,
}

impl LastAnswers {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(Map::default())).collect(),
            per_shard: capacity.div_ceil(SHARDS),
            len: AtomicUsize::new(0),
        }
    }

    fn shard(&self, client: &ClientKey, policy: u64) -> &Mutex<Map> {
        let h = (client.as_u128() as u64) ^ policy.rotate_left(29);
        &self.shards[(h as usize) % SHARDS]
    }

    /// Whether nothing is held (then a store answer has nothing to refresh).
    pub(crate) fn is_empty(&self) -> bool {
        self.len.load(Ordering::Relaxed) == 0
    }

    /// Remembers the store's answer for the client under the policy.
    pub(crate) fn remember(&self, client: &ClientKey, policy: u64, known: Known, now: Micros) {
        if self.per_shard == 0 || known.reset_at <= now {
            return;
        }
        let mut map = self
            .shard(client, policy)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let key = (client.as_u128(), policy);
        let before = map.len();
        make_room(&mut map, self.per_shard, &key, now, |k| k.reset_at);
        map.insert(key, known);
        self.adjust(before, map.len());
    }

    /// Replaces what is held for the client under the policy (nothing when nothing is held).
    pub(crate) fn refresh(&self, client: &ClientKey, policy: u64, known: Known) {
        let mut map = self
            .shard(client, policy)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(k) = map.get_mut(&(client.as_u128(), policy)) {
            *k = known;
        }
    }

    /// What the store last said, while the state it describes has not reset.
    pub(crate) fn known(&self, client: &ClientKey, policy: u64, now: Micros) -> Option<Known> {
        let mut map = self
            .shard(client, policy)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let key = (client.as_u128(), policy);
        match map.get(&key) {
            Some(k) if k.reset_at > now => Some(*k),
            Some(_) => {
                let before = map.len();
                map.remove(&key);
                self.adjust(before, map.len());
                None
            }
            None => None,
        }
    }

    /// Forgets the client's state under the policy (an operator's reset).
    pub(crate) fn forget(&self, client: &ClientKey, policy: u64) {
        let mut map = self
            .shard(client, policy)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let before = map.len();
        map.remove(&(client.as_u128(), policy));
        self.adjust(before, map.len());
    }

    fn adjust(&self, before: usize, after: usize) {
        if after > before {
            self.len.fetch_add(after - before, Ordering::Relaxed);
        } else {
            self.len.fetch_sub(before - after, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u128) -> ClientKey {
        ClientKey::from_u128(i.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835))
    }

    fn k(remaining: u64, reset_at: Micros) -> Known {
        Known {
            allowed: true,
            remaining,
            reset_at,
        }
    }

    #[test]
    fn answers_until_the_state_resets_and_refreshes_only_what_it_holds() {
        let l = LastAnswers::new(100);
        assert!(l.is_empty());
        l.remember(&key(1), 7, k(10, 1_000), 0);
        assert!(!l.is_empty());
        assert_eq!(l.known(&key(1), 7, 999), Some(k(10, 1_000)));
        l.refresh(&key(1), 7, k(9, 2_000));
        assert_eq!(l.known(&key(1), 7, 1_500), Some(k(9, 2_000)));
        l.refresh(&key(2), 7, k(1, 5_000));
        assert_eq!(l.known(&key(2), 7, 0), None, "refresh never adds");
        assert_eq!(l.known(&key(1), 7, 2_000), None, "reset: fresh again");
        assert!(l.is_empty());
        l.remember(&key(3), 1, k(1, 10), 0);
        l.forget(&key(3), 1);
        assert_eq!(l.known(&key(3), 1, 0), None);
    }

    #[test]
    fn stays_bounded_under_many_clients() {
        let l = LastAnswers::new(64);
        for i in 0..10_000u64 {
            l.remember(&key(u128::from(i)), 1, k(1, 1_000_000 + i), 0);
        }
        let held: usize = l
            .shards
            .iter()
            .map(|s| s.lock().map_or(0, |m| m.len()))
            .sum();
        assert!(held <= 64, "{held}");
        assert_eq!(l.len.load(Ordering::Relaxed), held);
    }
}
