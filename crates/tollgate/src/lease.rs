//! Leases (`sync = "lease"`): fewer store calls for hot keys, with a stated error.
//!
//! A limiter takes a lease of units from a policy's shared state in one atomic call, serves
//! requests from it locally, and gives back what it did not use when the lease expires
//! (`lease_ttl`) or at shutdown. Units are charged to the shared state when leased, before
//! they are used, so **the shared count never exceeds the limit**. The error is one-sided:
//!
//! - **Under-admission**: units held by one limiter cannot serve a client's request arriving
//!   at another. At any instant at most `gateways x lease size` units are held, each for at
//!   most `lease_ttl`; they return to the shared state after that.
//! - **Timing**: a unit may be used up to `lease_ttl` after it was charged, so over any
//!   interval of length `D` the admitted units are at most `burst + rate x (D + lease_ttl)`
//!   (the exact bound is `burst + rate x D`). Over a whole run the total never exceeds what
//!   exact mode allows.
//! - A limiter killed with a lease in hand loses at most that lease (never given back): the
//!   shared state recovers as it refills (or at the end of the fixed window).
//!
//! Lease size follows demand: `want = clamp(ceil(rate x lease_ttl), cost, lease_max)`, where
//! `rate` is what this limiter was asked for this key since its last call. The store grants
//! `min(want, available)`. When it grants less than wanted (the shared state is running
//! dry), this limiter makes no other call for the key for a cooldown of `lease_ttl / 8`, and
//! denies requests its lease cannot cover until then: near the limit the store sees a bounded
//! number of calls per limiter and key, and the units not taken wait in the shared state for
//! whoever calls next.

use crate::metrics::{LeaseKind, PolicyStats};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use tollgate_core::{duration_to_micros, ClientKey, Micros};

const SHARDS: usize = 16;

/// The local side of one lease (one client under one policy).
#[derive(Debug, Default, Clone, Copy)]
struct Entry {
    /// Units in hand.
    units: u64,
    /// Until when they may be spent.
    expires: Micros,
    /// The fixed window they came from (0 for other algorithms).
    window: Micros,
    /// No store call for this key before this instant (cooldown).
    next_call: Micros,
    /// Units asked for since the last call: the demand estimate.
    requested: u64,
    /// When the last call was made.
    last_call: Micros,
}

/// What the local lease says about one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Take {
    /// Served from the lease: units left in it.
    Served { left: u64 },
    /// Denied without a call until the cooldown ends.
    Cooling { retry_after: Micros },
    /// A store call is needed: give back `give_back` units (from `window`), want `want`.
    Call {
        give_back: u64,
        window: Micros,
        want: u64,
    },
}

pub(crate) struct Leases {
    shards: Vec<Mutex<HashMap<(u128, u64), Entry>>>,
    capacity_per_shard: usize,
}

impl Leases {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            capacity_per_shard: capacity.div_ceil(SHARDS).max(1),
        }
    }

    fn shard(&self, key: &(u128, u64)) -> std::sync::MutexGuard<'_, HashMap<(u128, u64), Entry>> {
        let i = ((key.0 as u64) ^ key.1) as usize % SHARDS;
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tries to serve `cost` units of `client` under policy `id` from the local lease.
    /// `None`: the table is full and this key has no entry (decide exactly instead).
    pub(crate) fn take(
        &self,
        client: &ClientKey,
        id: u64,
        cost: u64,
        now: Micros,
        ttl: Duration,
        max: u64,
    ) -> Option<Take> {
        let key = (client.as_u128(), id);
        let mut map = self.shard(&key);
        if !map.contains_key(&key) && map.len() >= self.capacity_per_shard {
            map.retain(|_, e| e.units > 0 || e.next_call > now || e.expires > now);
            if map.len() >= self.capacity_per_shard {
                return None;
            }
        }
        let e = map.entry(key).or_default();
        e.requested = e.requested.saturating_add(cost);
        if now < e.expires && e.units >= cost {
            e.units -= cost;
            return Some(Take::Served { left: e.units });
        }
        if now < e.next_call {
            return Some(Take::Cooling {
                retry_after: e.next_call - now,
            });
        }
        let ttl_us = duration_to_micros(ttl).max(1);
        let elapsed = now
            .saturating_sub(e.last_call)
            .clamp(1_000, ttl_us.max(1_000));
        let want = if e.last_call == 0 {
            cost
        } else {
            let w = u128::from(e.requested) * u128::from(ttl_us);
            u64::try_from(w.div_ceil(u128::from(elapsed))).unwrap_or(u64::MAX)
        };
        let give_back = std::mem::take(&mut e.units);
        e.last_call = now;
        e.requested = 0;
        Some(Take::Call {
            give_back,
            window: e.window,
            want: want.clamp(cost, max.max(cost)),
        })
    }

    /// Drops the client's local lease under policy `id` without giving its units back (an
    /// operator's reset, which deletes the shared state they came from).
    pub(crate) fn forget(&self, client: &ClientKey, id: u64) {
        let key = (client.as_u128(), id);
        self.shard(&key).remove(&key);
    }

    /// Records a store grant for a request of `cost` that needed it: the rest is the lease.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn granted(
        &self,
        client: &ClientKey,
        id: u64,
        cost: u64,
        granted: u64,
        want: u64,
        expires: Micros,
        window: Micros,
        now: Micros,
        ttl: Duration,
    ) -> u64 {
        let key = (client.as_u128(), id);
        let mut map = self.shard(&key);
        let e = map.entry(key).or_default();
        if e.expires <= now {
            // Leftovers of an expired lease were given back by the caller that took them.
            e.units = 0;
        }
        e.units += granted.saturating_sub(cost);
        e.expires = e.expires.max(expires);
        e.window = window;
        if granted < want {
            e.next_call = now + cooldown(ttl);
        }
        e.units
    }

    /// Records a refusal: no call before `now + wait` (at least the cooldown).
    pub(crate) fn refused(
        &self,
        client: &ClientKey,
        id: u64,
        now: Micros,
        wait: Micros,
        ttl: Duration,
    ) -> Micros {
        let key = (client.as_u128(), id);
        let mut map = self.shard(&key);
        let e = map.entry(key).or_default();
        let wait = wait.max(cooldown(ttl));
        e.next_call = now + wait;
        wait
    }

    /// Puts back `cost` units taken from the lease for a request that another policy then
    /// rejected (all-or-nothing: the request consumed nothing).
    pub(crate) fn untake(&self, client: &ClientKey, id: u64, cost: u64) {
        let key = (client.as_u128(), id);
        let mut map = self.shard(&key);
        if let Some(e) = map.get_mut(&key) {
            e.units += cost;
        }
    }

    /// Removes and returns every lease whose units should go back now: expired ones, or all
    /// of them at shutdown. Entries with nothing left and no cooldown are dropped.
    pub(crate) fn drain(&self, now: Micros, all: bool) -> Vec<(ClientKey, u64, u64, Micros)> {
        let mut out = Vec::new();
        for shard in &self.shards {
            let mut map = shard.lock().unwrap_or_else(|e| e.into_inner());
            map.retain(|&(client, id), e| {
                if e.units > 0 && (all || e.expires <= now) {
                    out.push((ClientKey::from_u128(client), id, e.units, e.window));
                    e.units = 0;
                }
                e.units > 0 || e.next_call > now || (e.expires > now && !all)
            });
        }
        out
    }
}

/// How long a limiter waits before calling again for a key whose last grant fell short.
pub(crate) fn cooldown(ttl: Duration) -> Micros {
    (duration_to_micros(ttl) / 8).max(1)
}

/// Counts the units of a lease call in the policy's metrics.
pub(crate) fn count(stats: &PolicyStats, granted: u64, returned: u64) {
    if granted > 0 {
        stats.lease(LeaseKind::Granted, granted);
    }
    if returned > 0 {
        stats.lease(LeaseKind::Returned, returned);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_millis(200);

    fn k() -> ClientKey {
        ClientKey([3; 16])
    }

    #[test]
    fn the_first_call_wants_the_cost_then_demand_sizes_the_lease() {
        let l = Leases::new(100);
        let t = l.take(&k(), 1, 1, 1_000_000, TTL, 500);
        assert_eq!(
            t,
            Some(Take::Call {
                give_back: 0,
                window: 0,
                want: 1
            })
        );
        l.granted(&k(), 1, 1, 1, 1, 1_200_000, 0, 1_000_000, TTL);
        // 10 units asked in 10 ms -> 1000/s -> 200 per 200 ms lease.
        for i in 0..9 {
            let _ = l.take(&k(), 1, 1, 1_001_000 + i * 1000, TTL, 500);
        }
        match l.take(&k(), 1, 1, 1_010_000, TTL, 500) {
            Some(Take::Call { want, .. }) => assert_eq!(want, 200),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn units_are_served_until_spent_or_expired() {
        let l = Leases::new(100);
        let _ = l.take(&k(), 1, 1, 10, TTL, 500);
        assert_eq!(l.granted(&k(), 1, 1, 3, 3, 1_000, 0, 10, TTL), 2);
        assert_eq!(
            l.take(&k(), 1, 1, 20, TTL, 500),
            Some(Take::Served { left: 1 })
        );
        assert_eq!(
            l.take(&k(), 1, 1, 30, TTL, 500),
            Some(Take::Served { left: 0 })
        );
        assert!(matches!(
            l.take(&k(), 1, 1, 40, TTL, 500),
            Some(Take::Call { give_back: 0, .. })
        ));
        l.granted(&k(), 1, 1, 5, 5, 1_000, 0, 40, TTL);
        // Expired with 4 in hand: they are given back by the next call.
        assert!(matches!(
            l.take(&k(), 1, 1, 1_000, TTL, 500),
            Some(Take::Call { give_back: 4, .. })
        ));
    }

    #[test]
    fn a_short_grant_starts_a_cooldown() {
        let l = Leases::new(100);
        let _ = l.take(&k(), 1, 1, 10, TTL, 500);
        l.granted(&k(), 1, 1, 1, 8, 1_000_000, 0, 10, TTL);
        assert_eq!(
            l.take(&k(), 1, 1, 20, TTL, 500),
            Some(Take::Cooling {
                retry_after: 25_000 - 10
            })
        );
        assert!(matches!(
            l.take(&k(), 1, 1, 25_010, TTL, 500),
            Some(Take::Call { .. })
        ));
    }

    #[test]
    fn drain_returns_expired_leases_and_everything_at_shutdown() {
        let l = Leases::new(100);
        let _ = l.take(&k(), 1, 1, 10, TTL, 500);
        l.granted(&k(), 1, 1, 6, 6, 100, 0, 10, TTL);
        let _ = l.take(&k(), 2, 1, 10, TTL, 500);
        l.granted(&k(), 2, 1, 4, 4, 1_000, 0, 10, TTL);
        let expired = l.drain(200, false);
        assert_eq!(expired, vec![(k(), 1, 5, 0)]);
        let rest = l.drain(200, true);
        assert_eq!(rest, vec![(k(), 2, 3, 0)]);
        assert!(l.drain(200, true).is_empty());
    }
}
