//! Who is the client? An ordered list of sources is tried and the first present wins; the
//! winning value is hashed with the keyed [`IdentityHasher`] together with the source's name,
//! so a store only ever sees 16 opaque bytes.
//!
//! Header values are hashed as raw bytes: a huge or non-UTF-8 value is just another client.
//! Addresses are canonicalised first (IPv4-mapped IPv6 is IPv4) and IPv6 addresses are
//! aggregated to a prefix, because one host usually owns a whole /64.

use crate::forwarded::{client_ip, ForwardHeader};
use crate::jwt::{claim_value, Claims, JwtVerifier};
use crate::trust::Trust;
use http::{HeaderMap, HeaderName, HeaderValue};
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use tollgate::{ClientKey, IdentityHasher};

/// Where an identity comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdentitySource {
    /// A request header, e.g. `header:x-api-key`.
    Header(HeaderName),
    /// The client address: the socket peer, or what a trusted proxy forwarded.
    Ip,
    /// A claim of a verified JWT, e.g. `jwt:sub` (needs [`IdentityConfig::jwt`]).
    Jwt(String),
}

impl IdentitySource {
    /// The name that is hashed with the value (`header:<lowercase name>` or `ip`).
    pub fn name(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for IdentitySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdentitySource::Header(h) => write!(f, "header:{}", h.as_str()),
            IdentitySource::Ip => f.write_str("ip"),
            IdentitySource::Jwt(claim) => write!(f, "jwt:{claim}"),
        }
    }
}

/// An identity source that is neither `ip` nor `header:<valid header name>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadIdentitySource(pub String);

impl fmt::Display for BadIdentitySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The value is not repeated: an error never echoes what a key held.
        f.write_str(
            "is not an identity source; expected \"ip\", \"header:NAME\" with a valid header name or \"jwt:CLAIM\"",
        )
    }
}

impl std::error::Error for BadIdentitySource {}

impl FromStr for IdentitySource {
    type Err = BadIdentitySource;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "ip" {
            return Ok(IdentitySource::Ip);
        }
        if let Some(claim) = s.strip_prefix("jwt:") {
            let ok = !claim.is_empty()
                && claim.len() <= 128
                && claim
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_-.:/".contains(&b));
            return if ok {
                Ok(IdentitySource::Jwt(claim.to_string()))
            } else {
                Err(BadIdentitySource(s.to_string()))
            };
        }
        let name = s
            .strip_prefix("header:")
            .ok_or_else(|| BadIdentitySource(s.to_string()))?;
        HeaderName::from_bytes(name.as_bytes())
            .map(IdentitySource::Header)
            .map_err(|_| BadIdentitySource(s.to_string()))
    }
}

/// How clients are identified.
#[derive(Debug, Clone)]
pub struct IdentityConfig {
    /// Tried in order; the first present wins. Default: `["ip"]`.
    pub sources: Vec<IdentitySource>,
    /// Peers whose forwarding header is believed, and the prefix IPv6 clients are grouped by
    /// (default: none, /64).
    pub trust: Trust,
    /// The only forwarding header read.
    pub client_ip_header: ForwardHeader,
    /// Verifies the bearer token that `jwt:<claim>` sources read; without it they are
    /// never present.
    pub jwt: Option<JwtVerifier>,
}

impl Default for IdentityConfig {
    fn default() -> Self {
        Self {
            sources: vec![IdentitySource::Ip],
            trust: Trust::default(),
            client_ip_header: ForwardHeader::XForwardedFor,
            jwt: None,
        }
    }
}

impl IdentityConfig {
    /// The client address of a request from `peer`, aggregated for IPv6, as it is hashed.
    pub fn client_addr(&self, peer: Option<IpAddr>, headers: &HeaderMap) -> Option<String> {
        let peer = peer?;
        let ip = client_ip(peer, headers, self.client_ip_header, &self.trust);
        Some(match self.trust.group(ip) {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => match ipnet::Ipv6Net::new(v6, self.trust.ipv6_prefix()) {
                // The form the keys were always hashed in: `network/prefix`.
                Ok(net) => net.to_string(),
                Err(_) => v6.to_string(),
            },
        })
    }

    /// The client key of a request under `sources` (or this config's own sources when
    /// `None`). When no source is present (no such header, no known peer), all such requests
    /// share one key per source list: missing identity never means unlimited.
    pub fn client_key(
        &self,
        hasher: &IdentityHasher,
        sources: Option<&[IdentitySource]>,
        peer: Option<IpAddr>,
        headers: &HeaderMap,
    ) -> ClientKey {
        self.client_key_with(hasher, sources, peer, headers, None)
    }

    /// [`IdentityConfig::client_key`] with the claims of the request's verified token
    /// (see [`JwtVerifier::verify`]), which `jwt:<claim>` sources read.
    pub fn client_key_with(
        &self,
        hasher: &IdentityHasher,
        sources: Option<&[IdentitySource]>,
        peer: Option<IpAddr>,
        headers: &HeaderMap,
        claims: Option<&Claims>,
    ) -> ClientKey {
        self.client_key_by(hasher, sources, peer, headers, claims, |name| {
            headers.get(name)
        })
    }

    /// [`IdentityConfig::client_key_with`], each identity header's value found by `get` (a
    /// caller that has looked the headers up already saves a lookup each).
    pub(crate) fn client_key_by<'h>(
        &self,
        hasher: &IdentityHasher,
        sources: Option<&[IdentitySource]>,
        peer: Option<IpAddr>,
        headers: &HeaderMap,
        claims: Option<&Claims>,
        get: impl Fn(&HeaderName) -> Option<&'h HeaderValue>,
    ) -> ClientKey {
        let sources = sources.unwrap_or(&self.sources);
        for source in sources {
            match source {
                IdentitySource::Header(name) => {
                    if let Some(v) = get(name) {
                        if !v.as_bytes().is_empty() {
                            let source = [&b"header:"[..], name.as_str().as_bytes()];
                            return hasher.client_key_parts(&source, v.as_bytes());
                        }
                    }
                }
                IdentitySource::Ip => {
                    if let Some(addr) = self.client_addr(peer, headers) {
                        return hasher.client_key("ip", addr.as_bytes());
                    }
                }
                IdentitySource::Jwt(claim) => {
                    if let Some(v) = claims.and_then(|c| claim_value(c, claim)) {
                        let source = [&b"jwt:"[..], claim.as_bytes()];
                        return hasher.client_key_parts(&source, v.as_bytes());
                    }
                }
            }
        }
        let names: Vec<String> = sources.iter().map(IdentitySource::name).collect();
        hasher.client_key("anonymous", names.join(",").as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn cfg() -> IdentityConfig {
        IdentityConfig {
            sources: vec![
                "header:x-api-key".parse().expect("source"),
                IdentitySource::Ip,
            ],
            ..IdentityConfig::default()
        }
    }

    #[test]
    fn sources_parse_and_reject_nonsense() {
        assert_eq!("ip".parse::<IdentitySource>(), Ok(IdentitySource::Ip));
        assert!("header:X-Api-Key".parse::<IdentitySource>().is_ok());
        assert!("cookie:x".parse::<IdentitySource>().is_err());
        assert_eq!(
            "jwt:sub".parse::<IdentitySource>(),
            Ok(IdentitySource::Jwt("sub".into()))
        );
        assert!("jwt:".parse::<IdentitySource>().is_err());
        assert!("jwt:a b".parse::<IdentitySource>().is_err());
        assert!("header:bad name".parse::<IdentitySource>().is_err());
    }

    #[test]
    fn ipv6_addresses_in_one_prefix_are_one_client() {
        let h = IdentityHasher::new(b"s");
        let c = IdentityConfig::default();
        let a = c.client_key(&h, None, "2001:db8::1".parse().ok(), &HeaderMap::new());
        let b = c.client_key(&h, None, "2001:db8::ffff:2".parse().ok(), &HeaderMap::new());
        let other = c.client_key(&h, None, "2001:db8:0:1::1".parse().ok(), &HeaderMap::new());
        assert_eq!(a, b);
        assert_ne!(a, other);
    }

    #[test]
    fn first_present_source_wins_and_raw_bytes_hash() {
        let h = IdentityHasher::new(b"s");
        let c = cfg();
        let peer = "1.2.3.4".parse().ok();
        let mut with_key = HeaderMap::new();
        with_key.insert(
            "x-api-key",
            HeaderValue::from_bytes(b"k\xff\xfe").expect("opaque bytes"),
        );
        let by_key = c.client_key(&h, None, peer, &with_key);
        let by_ip = c.client_key(&h, None, peer, &HeaderMap::new());
        assert_ne!(by_key, by_ip);
        let only_ip = [IdentitySource::Ip];
        assert_eq!(c.client_key(&h, Some(&only_ip), peer, &with_key), by_ip);
    }
}
