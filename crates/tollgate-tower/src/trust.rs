//! Which peers are trusted proxies, and how client addresses are grouped: one value, built
//! once from `[identity] trusted_proxies` and `ipv6_prefix`, that every part of the gateway
//! asks (the identity of a request, the forwarding headers the proxy keeps, the connection
//! bounds that exempt proxies and count IPv6 hosts by prefix), so they cannot disagree.

use ipnet::{IpNet, Ipv6Net};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// The trusted proxies and the IPv6 grouping prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trust {
    proxies: Arc<[IpNet]>,
    ipv6_prefix: u8,
}

impl Default for Trust {
    /// No trusted proxy; IPv6 clients grouped by /64.
    fn default() -> Self {
        Self::new(Vec::new(), 64)
    }
}

impl Trust {
    /// `proxies` (truncated to their networks) and an IPv6 prefix length (capped at 128).
    pub fn new(proxies: Vec<IpNet>, ipv6_prefix: u8) -> Self {
        let proxies: Vec<IpNet> = proxies.into_iter().map(|n| n.trunc()).collect();
        Self {
            proxies: proxies.into(),
            ipv6_prefix: ipv6_prefix.min(128),
        }
    }

    /// The trusted networks.
    pub fn proxies(&self) -> &[IpNet] {
        &self.proxies
    }

    /// IPv6 addresses are grouped to this prefix length.
    pub fn ipv6_prefix(&self) -> u8 {
        self.ipv6_prefix
    }

    /// Whether `ip` (an IPv4-mapped IPv6 address counts as its IPv4 address) is a trusted
    /// proxy.
    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.proxies.iter().any(|net| net.contains(&ip))
    }

    /// The address `ip` is counted and identified as: itself for IPv4 (and IPv4-mapped IPv6),
    /// the network of its prefix for IPv6, so one host cannot be many clients.
    pub fn group(&self, ip: IpAddr) -> IpAddr {
        match canonical(ip) {
            IpAddr::V6(v6) => Ipv6Net::new(v6, self.ipv6_prefix)
                .map_or(IpAddr::V6(v6), |net| IpAddr::V6(net.network())),
            v4 => v4,
        }
    }
}

/// Whether a connection's peer is a trusted proxy, decided once when the connection was
/// accepted and carried in each of its requests' extensions. It answers only for the trust
/// list it was decided with: after a reload changed the list, [`TrustedPeer::under`] says
/// nothing and the request is judged again, so an open keep-alive connection never keeps a
/// trust the operator took away.
#[derive(Debug, Clone)]
pub struct TrustedPeer {
    trust: Trust,
    trusted: bool,
    /// The peer's socket address, when the server put it here (one extension per request
    /// instead of this and a [`crate::PeerAddr`]).
    addr: Option<SocketAddr>,
}

impl TrustedPeer {
    /// Decides for `peer` under `trust`.
    pub fn of(trust: &Trust, peer: IpAddr) -> Self {
        Self {
            trusted: trust.is_trusted(peer),
            trust: trust.clone(),
            addr: None,
        }
    }

    /// The same decision, carrying the peer's socket address: a request whose extensions
    /// hold it needs no [`crate::PeerAddr`] (the layer and the gateway's proxy read it here).
    pub fn with_addr(self, addr: SocketAddr) -> Self {
        Self {
            addr: Some(addr),
            ..self
        }
    }

    /// The peer's socket address, when [`TrustedPeer::with_addr`] set it.
    pub fn addr(&self) -> Option<SocketAddr> {
        self.addr
    }

    /// The decision as it was made (for the server that made it).
    pub fn is_trusted(&self) -> bool {
        self.trusted
    }

    /// The decision, when it was made under this very `trust` (the same list, not an equal
    /// copy: a comparison of two pointers).
    pub fn under(&self, trust: &Trust) -> Option<bool> {
        (Arc::ptr_eq(&self.trust.proxies, &trust.proxies)
            && self.trust.ipv6_prefix == trust.ipv6_prefix)
            .then_some(self.trusted)
    }
}

/// IPv4-mapped IPv6 addresses (`::ffff:1.2.3.4`) are the IPv4 address they carry.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn trust_follows_the_networks_and_mapped_addresses() {
        let t = Trust::new(vec!["10.0.0.0/8".parse().expect("net")], 64);
        assert!(t.is_trusted(ip("10.9.8.7")));
        assert!(t.is_trusted(ip("::ffff:10.1.2.3")));
        assert!(!t.is_trusted(ip("11.0.0.1")));
        assert!(!Trust::default().is_trusted(ip("127.0.0.1")));
    }

    #[test]
    fn ipv6_hosts_are_grouped_by_prefix_and_ipv4_stays_whole() {
        let t = Trust::new(Vec::new(), 56);
        assert_eq!(t.group(ip("2001:db8:1:2ff::1")), ip("2001:db8:1:200::"));
        assert_eq!(t.group(ip("192.0.2.7")), ip("192.0.2.7"));
        assert_eq!(t.group(ip("::ffff:192.0.2.7")), ip("192.0.2.7"));
        assert_eq!(Trust::new(Vec::new(), 200).ipv6_prefix(), 128);
    }

    #[test]
    fn a_connection_s_decision_holds_only_under_the_list_it_was_made_with() {
        let t = Trust::new(vec!["127.0.0.1/32".parse().expect("net")], 64);
        let peer = TrustedPeer::of(&t, ip("127.0.0.1"));
        assert_eq!(peer.under(&t), Some(true));
        assert_eq!(
            peer.under(&t.clone()),
            Some(true),
            "a clone is the same list"
        );
        // A reload builds a new list, even an equal one: the request is judged again.
        let reloaded = Trust::new(vec!["127.0.0.1/32".parse().expect("net")], 64);
        assert_eq!(peer.under(&reloaded), None);
        assert_eq!(TrustedPeer::of(&t, ip("10.0.0.1")).under(&t), Some(false));
    }
}
