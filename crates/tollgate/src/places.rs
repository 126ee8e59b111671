//! A bounded pool of places, in all and per address, with a reserve: what the gateway's
//! connection bounds and the RLS listener's call bounds count with.
//!
//! A place is taken for a connection or a call and given back when its [`Place`] is dropped.
//! The last eighth of the pool (the reserve) goes only to an address that holds no place yet
//! (or to one exempt from the per-address bound): a host that fills its share from a few
//! addresses, each under its own bound, still leaves room for a newcomer (a health check,
//! Prometheus, an operator). Only many distinct addresses, one place of the reserve each,
//! can fill it.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// The bounds and what each address holds now.
#[derive(Debug)]
pub struct Places {
    total: usize,
    per_address: usize,
    reserve: usize,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    total: usize,
    /// Keyed by foldhash, seeded at random: the RLS listener takes and gives back a place on
    /// every call, and std's SipHash of an address cost about 190 instructions each way
    /// (callgrind). The keys are peers' addresses, at most `total` of them, and the seed is
    /// not the peers' to learn, so a peer cannot pick addresses that collide.
    per_address: HashMap<IpAddr, usize, foldhash::fast::RandomState>,
}

/// One place taken; dropping it gives it back.
#[derive(Debug)]
pub struct Place {
    pool: Arc<Places>,
    address: Option<IpAddr>,
}

impl Places {
    /// A pool of `total` places, at most `per_address` of them held by one address; the last
    /// eighth of `total` is the reserve.
    pub fn new(total: usize, per_address: usize) -> Arc<Self> {
        Arc::new(Self {
            total,
            per_address,
            reserve: reserve_for(total),
            held: Mutex::new(Held::default()),
        })
    }

    /// A place for `address` (`None`: exempt from the per-address bound, or an unknown
    /// address; counted in the pool's total only), or `None` past a bound.
    pub fn take(self: &Arc<Self>, address: Option<IpAddr>) -> Option<Place> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if held.total >= self.total {
            return None;
        }
        let in_reserve = held.total >= self.total - self.reserve;
        if let Some(ip) = address {
            let n = held.per_address.entry(ip).or_insert(0);
            if *n >= self.per_address || (in_reserve && *n > 0) {
                if *n == 0 {
                    held.per_address.remove(&ip);
                }
                return None;
            }
            *n += 1;
        }
        held.total += 1;
        Some(Place {
            pool: self.clone(),
            address,
        })
    }

    /// Places held now, in all and the number of addresses holding some.
    pub fn held(&self) -> (usize, usize) {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        (held.total, held.per_address.len())
    }
}

/// How many of `total` places are the reserve: an eighth (1,250 of 10,000; 8 of 64).
pub fn reserve_for(total: usize) -> usize {
    total / 8
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut held = self.pool.held.lock().unwrap_or_else(|e| e.into_inner());
        held.total = held.total.saturating_sub(1);
        if let Some(ip) = self.address {
            if let Some(n) = held.per_address.get_mut(&ip) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    held.per_address.remove(&ip);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_bounded_per_address_and_in_all_with_a_reserve_and_given_back_on_drop() {
        let pool = Places::new(16, 3);
        let a: IpAddr = "192.0.2.1".parse().expect("ip");
        let b: IpAddr = "192.0.2.2".parse().expect("ip");
        let a_places: Vec<_> = (0..3).filter_map(|_| pool.take(Some(a))).collect();
        assert_eq!(a_places.len(), 3);
        assert!(pool.take(Some(a)).is_none(), "a fourth from one address");
        let b1 = pool.take(Some(b)).expect("another address");
        assert_eq!(pool.held(), (4, 2));
        drop(a_places);
        assert!(pool.take(Some(a)).is_some(), "given back when dropped");
        drop(b1);
        assert_eq!(pool.held(), (0, 0), "nothing left behind");

        // Fill to the reserve (16 - 16/8 = 14) from addresses holding two each.
        let mut kept = Vec::new();
        for i in 0..7u8 {
            let ip = IpAddr::from([198, 51, 100, i]);
            kept.push(pool.take(Some(ip)).expect("first"));
            kept.push(pool.take(Some(ip)).expect("second"));
        }
        let holder = IpAddr::from([198, 51, 100, 0]);
        assert!(
            pool.take(Some(holder)).is_none(),
            "in the reserve, an address holding places gets no more"
        );
        let newcomer = IpAddr::from([203, 0, 113, 9]);
        kept.push(
            pool.take(Some(newcomer))
                .expect("the reserve is for a newcomer"),
        );
        kept.push(pool.take(None).expect("exempt: the total bound only"));
        assert!(pool.take(None).is_none(), "the total bound holds for all");
    }
}
