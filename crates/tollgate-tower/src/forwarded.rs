//! Reading the client address that a trusted proxy put in `X-Forwarded-For` or `Forwarded`.
//!
//! Only the rightmost addresses can be believed: each trusted hop appends what it saw, and
//! everything to the left of the first untrusted hop was written by someone we do not trust.
//! So the walk goes right to left, skipping trusted proxies, and stops at the first address
//! that is not one. An entry that does not parse ends the walk: the last address we could
//! verify is used instead of guessing past garbage.

pub use crate::trust::canonical;
use crate::trust::Trust;
use http::HeaderMap;
use std::net::IpAddr;

/// Which forwarding header carries the client address (only that one is read).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ForwardHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2`.
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client;proto=https, for="[2001:db8::1]:443"`.
    Forwarded,
}

impl ForwardHeader {
    /// The header's name.
    pub fn name(self) -> &'static str {
        match self {
            ForwardHeader::XForwardedFor => "x-forwarded-for",
            ForwardHeader::Forwarded => "forwarded",
        }
    }
}

/// The client address of a request whose peer is `peer`: the peer itself unless it is a
/// trusted proxy, else the rightmost untrusted address of the forwarding header.
pub fn client_ip(
    peer: IpAddr,
    headers: &HeaderMap,
    header: ForwardHeader,
    trust: &Trust,
) -> IpAddr {
    let peer = canonical(peer);
    if !trust.is_trusted(peer) {
        return peer;
    }
    let mut hops: Vec<Option<IpAddr>> = Vec::new();
    for value in headers.get_all(header.name()) {
        let Ok(text) = value.to_str() else {
            hops.push(None);
            continue;
        };
        for item in text.split(',') {
            hops.push(match header {
                ForwardHeader::XForwardedFor => parse_node(item.trim()),
                ForwardHeader::Forwarded => forwarded_for(item),
            });
        }
    }
    let mut client = peer;
    for hop in hops.into_iter().rev() {
        match hop {
            Some(ip) => {
                client = canonical(ip);
                if !trust.is_trusted(client) {
                    return client;
                }
            }
            None => return client,
        }
    }
    client
}

/// The `for=` parameter of one `Forwarded` element.
fn forwarded_for(element: &str) -> Option<IpAddr> {
    element.split(';').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        if k.trim().eq_ignore_ascii_case("for") {
            parse_node(v.trim().trim_matches('"'))
        } else {
            None
        }
    })
}

/// An address as forwarding headers write it: `1.2.3.4`, `1.2.3.4:80`, `2001:db8::1`,
/// `[2001:db8::1]`, `[2001:db8::1]:443`. `unknown` and obfuscated names are `None`.
fn parse_node(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Some(rest) = s.strip_prefix('[') {
        let (inside, _) = rest.split_once(']')?;
        return inside.parse().ok();
    }
    let (host, port) = s.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    host.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("test ip")
    }

    fn nets(list: &[&str]) -> Trust {
        Trust::new(
            list.iter().map(|s| s.parse().expect("test net")).collect(),
            64,
        )
    }

    fn headers(name: &'static str, values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(name, HeaderValue::from_str(v).expect("test header"));
        }
        h
    }

    #[test]
    fn untrusted_peer_cannot_spoof_its_address() {
        let h = headers("x-forwarded-for", &["9.9.9.9"]);
        let got = client_ip(
            ip("1.2.3.4"),
            &h,
            ForwardHeader::XForwardedFor,
            &Trust::default(),
        );
        assert_eq!(got, ip("1.2.3.4"));
    }

    #[test]
    fn trusted_peer_gives_rightmost_untrusted_address() {
        let trusted = nets(&["10.0.0.0/8"]);
        let h = headers("x-forwarded-for", &["6.6.6.6, 5.5.5.5", "10.0.0.7"]);
        let got = client_ip(ip("10.0.0.1"), &h, ForwardHeader::XForwardedFor, &trusted);
        assert_eq!(got, ip("5.5.5.5"));
    }

    #[test]
    fn garbage_stops_the_walk_at_the_last_verified_hop() {
        let trusted = nets(&["10.0.0.0/8"]);
        let h = headers("x-forwarded-for", &["5.5.5.5, nonsense, 10.0.0.9"]);
        let got = client_ip(ip("10.0.0.1"), &h, ForwardHeader::XForwardedFor, &trusted);
        assert_eq!(got, ip("10.0.0.9"));
    }

    #[test]
    fn forwarded_header_is_parsed_with_ports_and_brackets() {
        let trusted = nets(&["127.0.0.0/8"]);
        let h = headers(
            "forwarded",
            &["for=192.0.2.60;proto=http, For=\"[2001:db8:cafe::17]:4711\""],
        );
        let got = client_ip(ip("127.0.0.1"), &h, ForwardHeader::Forwarded, &trusted);
        assert_eq!(got, ip("2001:db8:cafe::17"));
        // Only the configured header is read.
        let got = client_ip(ip("127.0.0.1"), &h, ForwardHeader::XForwardedFor, &trusted);
        assert_eq!(got, ip("127.0.0.1"));
    }

    #[test]
    fn mapped_ipv4_is_ipv4() {
        assert_eq!(canonical(ip("::ffff:1.2.3.4")), ip("1.2.3.4"));
        // A trusted IPv4 network trusts the same peer seen on a dual-stack socket.
        let nets = nets(&["10.0.0.0/8"]);
        assert!(nets.is_trusted(ip("::ffff:10.1.2.3")));
        assert!(!nets.is_trusted(ip("::ffff:11.1.2.3")));
        assert_eq!(parse_node("1.2.3.4:80"), Some(ip("1.2.3.4")));
        assert_eq!(parse_node("unknown"), None);
    }
}
