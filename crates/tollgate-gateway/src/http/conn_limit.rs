//! How many connections the gateway holds open, in all and per client address. An idle
//! connection costs little, but sixteen thousand of them from one client cost hundreds of
//! megabytes; a connection over either bound is closed as soon as it is accepted. Trusted
//! proxies are exempt from the per-address bound: one proxy carries many clients. IPv6 peers
//! are counted by prefix (`identity.ipv6_prefix`, /64 by default), as identities are: one host
//! owns a whole /64 and could otherwise open 256 connections from each of its addresses.
//!
//! A reserve: the last eighth of the places ([`tollgate::places`]) goes only to an address that
//! holds no connection yet (or to a trusted proxy). A host that fills its share from a few
//! addresses, each under its own bound, still leaves room for a newcomer: the health check,
//! Prometheus, an operator's curl. Only many distinct addresses, each taking one place of the
//! reserve, can fill it.

use std::net::IpAddr;
use std::sync::Arc;
use tollgate::places::{Place, Places};
use tollgate_tower::{Trust, TrustedPeer};

/// The bounds and the current counts.
pub(crate) struct ConnLimits {
    places: Arc<Places>,
    /// The trusted proxies and the IPv6 prefix, replaced by a reload.
    who: arc_swap::ArcSwap<Trust>,
}

/// One admitted connection; dropping it frees its place.
pub(crate) struct ConnSlot {
    _place: Place,
    /// Whether the peer is a trusted proxy, decided once for the connection (and carried
    /// with each of its requests).
    pub(crate) peer: TrustedPeer,
}

impl ConnLimits {
    pub(crate) fn new(max: usize, max_per_ip: usize, trust: Trust) -> Arc<Self> {
        Arc::new(Self {
            places: Places::new(max, max_per_ip),
            who: arc_swap::ArcSwap::from_pointee(trust),
        })
    }

    /// New trusted proxies and IPv6 prefix (a reload), for the connections accepted from now
    /// on; an open connection keeps the place it was counted in.
    pub(crate) fn update(&self, trust: Trust) {
        self.who.store(Arc::new(trust));
    }

    /// A slot for a connection from `ip`, or `None` when it would pass a bound.
    pub(crate) fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<ConnSlot> {
        let trust = self.who.load();
        let peer = TrustedPeer::of(&trust, ip);
        // Trusted proxies count in the total only; others by address (IPv6: by prefix).
        let counted = (!peer.is_trusted()).then(|| trust.group(ip));
        let place = self.places.take(counted)?;
        Some(ConnSlot {
            _place: place,
            peer,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_bounded_per_address_and_in_all_and_freed_on_drop() {
        let trusted = vec!["10.0.0.0/8".parse().expect("net")];
        let limits = ConnLimits::new(4, 2, Trust::new(trusted, 64));
        let a: IpAddr = "192.0.2.1".parse().expect("ip");
        let proxy: IpAddr = "10.0.0.1".parse().expect("ip");
        let a1 = limits.admit(a).expect("first");
        let _a2 = limits.admit(a).expect("second");
        assert!(limits.admit(a).is_none(), "third from one address");
        let _p1 = limits.admit(proxy).expect("proxy exempt");
        let _p2 = limits.admit(proxy).expect("proxy exempt");
        assert!(
            limits.admit(proxy).is_none(),
            "total bound holds for proxies too"
        );
        drop(a1);
        assert!(limits.admit(a).is_some(), "a dropped slot is free again");
    }

    #[test]
    fn the_reserve_goes_only_to_addresses_without_a_connection() {
        // 16 places, 2 kept: a host on four addresses fills 14, never the last 2.
        let limits = ConnLimits::new(16, 4, Trust::default());
        let mut held = Vec::new();
        for host in 1..=4u8 {
            for _ in 0..4 {
                if let Some(s) = limits.admit(IpAddr::from([127, 0, 0, host])) {
                    held.push(s);
                }
            }
        }
        assert_eq!(held.len(), 14, "the reserve held");
        let newcomer = limits
            .admit(IpAddr::from([127, 0, 0, 9]))
            .expect("a newcomer gets in");
        assert!(
            limits.admit(IpAddr::from([127, 0, 0, 9])).is_none(),
            "but only one place of the reserve"
        );
        let _other = limits
            .admit(IpAddr::from([127, 0, 0, 10]))
            .expect("another newcomer");
        assert!(
            limits.admit(IpAddr::from([127, 0, 0, 11])).is_none(),
            "all full"
        );
        drop(newcomer);
        assert!(limits.admit(IpAddr::from([127, 0, 0, 12])).is_some());
    }

    #[test]
    fn an_update_applies_to_the_next_connections() {
        let limits = ConnLimits::new(100, 1, Trust::new(Vec::new(), 64));
        let a: IpAddr = "192.0.2.1".parse().expect("ip");
        let _a1 = limits.admit(a).expect("first");
        assert!(limits.admit(a).is_none());
        limits.update(Trust::new(vec!["192.0.2.0/24".parse().expect("net")], 64));
        assert!(limits.admit(a).is_some(), "now a trusted proxy");
    }

    #[test]
    fn ipv6_peers_are_counted_by_prefix() {
        let limits = ConnLimits::new(100, 1, Trust::new(Vec::new(), 64));
        let one: IpAddr = "2001:db8::1".parse().expect("ip");
        let same_64: IpAddr = "2001:db8::ffff:2".parse().expect("ip");
        let other_64: IpAddr = "2001:db8:0:1::1".parse().expect("ip");
        let _a = limits.admit(one).expect("first");
        assert!(limits.admit(same_64).is_none(), "same /64, same client");
        assert!(limits.admit(other_64).is_some(), "another /64");
    }
}
