//! What the proxy changes in the headers it passes on: the hop-by-hop ones (RFC 9110 section
//! 7.6.1) are removed both ways, and the forwarding headers are ours to write. The upstream
//! believes `X-Forwarded-For` and its kin, so an untrusted client's copies are dropped and a
//! trusted proxy's are extended.

use http::header::{HeaderName, HeaderValue, CONNECTION};
use http::HeaderMap;
use std::net::IpAddr;

/// Headers that describe one connection, never forwarded (plus those `Connection` names).
/// `Upgrade` is hop-by-hop too; protocol upgrades are not proxied.
static HOP_BY_HOP: [HeaderName; 9] = [
    CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    http::header::PROXY_AUTHENTICATE,
    http::header::PROXY_AUTHORIZATION,
    http::header::TE,
    http::header::TRAILER,
    http::header::TRANSFER_ENCODING,
    http::header::UPGRADE,
];

/// Bit n set: some name of [`HOP_BY_HOP`] is n bytes long (all are shorter than 31).
const HOP_BY_HOP_LENGTHS: u32 = {
    let names = [
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    ];
    let mut bits = 0u32;
    let mut i = 0;
    while i < names.len() {
        bits |= 1 << names[i].len();
        i += 1;
    }
    bits
};

/// The forwarding headers a client names itself in (dropped unless it is a trusted proxy).
static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");
static FORWARDING: [&HeaderName; 5] = [
    &X_FORWARDED_FOR,
    &X_FORWARDED_PROTO,
    &X_FORWARDED_HOST,
    &http::header::FORWARDED,
    &X_REAL_IP,
];

/// Writes `ip` as header text: an IPv4 address digit by digit (`Display` through the
/// formatting machinery cost 1,300 instructions per proxied request under callgrind), an
/// IPv6 address by `Display` (its zero compression is not worth a copy).
pub(super) fn write_ip(ip: IpAddr, out: &mut Vec<u8>) {
    match ip {
        IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                let digits = [octet / 100, octet / 10 % 10, octet % 10];
                let skip = if octet >= 100 {
                    0
                } else if octet >= 10 {
                    1
                } else {
                    2
                };
                out.extend(digits[skip..].iter().map(|d| b'0' + d));
            }
        }
        IpAddr::V6(v6) => out.extend_from_slice(v6.to_string().as_bytes()),
    }
}

/// Whether `name` is one of the fixed hop-by-hop names (not those a `Connection` lists).
pub(super) fn is_hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP_LENGTHS & (1u32 << name.as_str().len().min(31)) != 0 && HOP_BY_HOP.contains(name)
}

/// Whether a `Connection` token names a field beyond the fixed hop-by-hop list (and
/// `close`): that field is then hop-by-hop too.
pub(super) fn names_another(token: &[u8]) -> bool {
    !token.is_empty()
        && !token.eq_ignore_ascii_case(b"close")
        && !HOP_BY_HOP
            .iter()
            .any(|h| h.as_str().as_bytes().eq_ignore_ascii_case(token))
}

/// Removes hop-by-hop headers, including every header `Connection` lists. Most requests
/// carry none: one pass over the names finds that without a lookup per hop-by-hop name.
/// Most responses carry only `Connection: keep-alive` (or `close`), which names nothing
/// beyond the fixed list: that costs no allocation either.
pub(super) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Bit i: HOP_BY_HOP[i] is present (bit 0: `Connection`).
    let mut present = 0u16;
    for k in headers.keys() {
        // Most names are of a length no hop-by-hop name has: one test, no comparisons.
        if HOP_BY_HOP_LENGTHS & (1u32 << k.as_str().len().min(31)) == 0 {
            continue;
        }
        if let Some(i) = HOP_BY_HOP.iter().position(|h| h == k) {
            present |= 1 << i;
        }
    }
    if present == 0 {
        return;
    }
    if present & 1 != 0 && names_more(headers) {
        remove_listed(headers);
    }
    for (i, name) in HOP_BY_HOP.iter().enumerate() {
        if present & (1 << i) != 0 {
            headers.remove(name);
        }
    }
}

/// Whether `Connection` names a header beyond the fixed list (and `close`). Most messages
/// say only `keep-alive` or `close`: that is two comparisons, no splitting.
fn names_more(headers: &HeaderMap) -> bool {
    headers.get_all(CONNECTION).iter().any(|v| {
        let v = v.as_bytes();
        !(v.eq_ignore_ascii_case(b"keep-alive") || v.eq_ignore_ascii_case(b"close"))
    })
}

/// Removes the headers `Connection` lists (its tokens beyond the fixed list and `close`).
fn remove_listed(headers: &mut HeaderMap) {
    let listed: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|name| names_another(name.as_bytes()))
        .filter_map(|name| HeaderName::from_bytes(name.as_bytes()).ok())
        .collect();
    for name in listed {
        headers.remove(name);
    }
}

/// Writes the forwarding fields of a request from `peer` to `out`, as header lines sent after
/// the request's own (`headers`, from which it removes what it replaces), so that none of them
/// is put in the map and looked up again to be written (five insertions a request saved):
///
/// - from an untrusted peer, the fields a client names itself in are dropped and written
///   anew, and `X-Real-IP` is the peer;
/// - from a trusted proxy, the peer is appended to its `X-Forwarded-For` and `Forwarded`,
///   and its `X-Forwarded-Proto` and `X-Forwarded-Host` are kept when present;
/// - `X-Forwarded-Host` is the request's `host` when it has one.
///
/// Every value written is a header value already (the peer's address, the client's `Host`
/// and `X-Forwarded-For` values), so no line can be broken or added by a client.
pub(super) fn write_forwarding(
    headers: &mut HeaderMap,
    peer: IpAddr,
    host: Option<&HeaderValue>,
    trusted: bool,
    out: &mut Vec<u8>,
) {
    if !trusted {
        if headers.keys().any(|k| FORWARDING.contains(&k)) {
            for name in FORWARDING {
                headers.remove(name);
            }
        }
        out.extend_from_slice(b"x-real-ip: ");
        write_ip(peer, out);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"x-forwarded-for: ");
    if trusted {
        if let http::header::Entry::Occupied(prior) = headers.entry(&X_FORWARDED_FOR) {
            for v in prior.iter().filter(|v| v.to_str().is_ok()) {
                out.extend_from_slice(v.as_bytes());
                out.extend_from_slice(b", ");
            }
            prior.remove();
        }
    }
    write_ip(peer, out);
    out.extend_from_slice(b"\r\nforwarded: ");
    // An IPv6 address is quoted in brackets.
    let (open, close): (&[u8], &[u8]) = match peer {
        IpAddr::V4(_) => (b"for=", b""),
        IpAddr::V6(_) => (b"for=\"[", b"]\""),
    };
    out.extend_from_slice(open);
    write_ip(peer, out);
    out.extend_from_slice(close);
    out.extend_from_slice(b";proto=http");
    let quoted_host = host.map(HeaderValue::as_bytes).filter(|h| {
        !h.is_empty()
            && h.iter()
                .all(|&b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
    });
    if let Some(h) = quoted_host {
        out.extend_from_slice(b";host=\"");
        out.extend_from_slice(h);
        out.push(b'"');
    }
    out.extend_from_slice(b"\r\n");
    if !trusted || !headers.contains_key(&X_FORWARDED_PROTO) {
        out.extend_from_slice(b"x-forwarded-proto: http\r\n");
    }
    if let Some(h) = host {
        if !trusted || !headers.contains_key(&X_FORWARDED_HOST) {
            out.extend_from_slice(b"x-forwarded-host: ");
            out.extend_from_slice(h.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip_text(ip: IpAddr) -> Vec<u8> {
        let mut out = Vec::new();
        write_ip(ip, &mut out);
        out
    }

    /// `h` as the upstream reads it: its fields, then the forwarding lines written for a
    /// request from `peer` with `host`, `trusted` or not (each line checked to be one field).
    fn forwarded(h: &mut HeaderMap, peer: IpAddr, host: Option<&HeaderValue>, trusted: bool) {
        let mut out = Vec::new();
        write_forwarding(h, peer, host, trusted, &mut out);
        let text = String::from_utf8(out).expect("ASCII");
        assert!(text.ends_with("\r\n"), "{text:?}");
        for line in text.trim_end_matches("\r\n").split("\r\n") {
            assert!(!line.contains('\n') && !line.contains('\r'), "{line:?}");
            let (name, value) = line.split_once(": ").expect("a field line");
            h.append(
                HeaderName::from_bytes(name.as_bytes()).expect("name"),
                HeaderValue::from_str(value).expect("value"),
            );
        }
    }

    #[test]
    fn ip_text_writes_what_display_writes() {
        let mut seen = 0;
        for a in [0u8, 1, 9, 10, 99, 100, 127, 199, 200, 255] {
            for b in [0u8, 7, 42, 255] {
                let v4 = std::net::Ipv4Addr::new(a, b, 255 - b, a.wrapping_mul(3));
                assert_eq!(ip_text(IpAddr::V4(v4)), v4.to_string().as_bytes());
                seen += 1;
            }
        }
        assert_eq!(seen, 40);
        for v6 in ["::1", "2001:db8::7", "fe80::1:2:3:4", "::ffff:1.2.3.4"] {
            let ip: IpAddr = v6.parse().expect("ip");
            assert_eq!(ip_text(ip), ip.to_string().as_bytes());
        }
    }
    use http::header::HOST;

    #[test]
    fn the_length_filter_lets_every_hop_by_hop_name_through() {
        for name in &HOP_BY_HOP {
            let len = name.as_str().len();
            assert!(len < 31, "{name}");
            assert_ne!(HOP_BY_HOP_LENGTHS & (1 << len), 0, "{name}");
        }
        // And turns the usual names away without a comparison.
        for name in [
            "host",
            "date",
            "server",
            "content-type",
            "content-length",
            "x-api-key",
        ] {
            assert_eq!(HOP_BY_HOP_LENGTHS & (1 << name.len()), 0, "{name}");
        }
    }

    #[test]
    fn a_request_without_hop_by_hop_headers_keeps_all_of_them() {
        let mut h = HeaderMap::new();
        h.insert(HOST, HeaderValue::from_static("x"));
        h.insert("x-api-key", HeaderValue::from_static("k"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 2);
        h.insert(http::header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert(http::header::TE, HeaderValue::from_static("trailers"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 2);
        assert!(!h.contains_key(http::header::UPGRADE));
    }

    #[test]
    fn hop_by_hop_and_connection_listed_headers_are_removed() {
        let mut h = HeaderMap::new();
        h.insert(CONNECTION, HeaderValue::from_static("close, x-secret-hop"));
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-end-to-end", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-end-to-end"));
    }

    #[test]
    fn connection_naming_only_keep_alive_or_close_is_removed_alone_and_any_other_name_goes_too() {
        // (value of each `Connection` line, other headers, what stays)
        let cases: [(&[&str], &[&str], &[&str]); 6] = [
            (&["keep-alive"], &["x-a"], &["x-a"]),
            (&["Keep-Alive"], &["x-a"], &["x-a"]),
            (&["CLOSE"], &["x-a"], &["x-a"]),
            (&["keep-alive, x-a"], &["x-a", "x-b"], &["x-b"]),
            // A second line naming a header is not hidden by a first that names none.
            (&["close", "X-A"], &["x-a", "x-b"], &["x-b"]),
            (&["keep-alive,close", "keep-alive"], &["x-a"], &["x-a"]),
        ];
        for (lines, others, kept) in cases {
            let mut h = HeaderMap::new();
            for l in lines {
                h.append(CONNECTION, HeaderValue::from_str(l).expect("value"));
            }
            for o in others {
                h.insert(*o, HeaderValue::from_static("1"));
            }
            h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
            strip_hop_by_hop(&mut h);
            let mut left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
            left.sort_unstable();
            assert_eq!(left, kept, "Connection: {lines:?}");
        }
    }

    #[test]
    fn a_host_that_cannot_be_quoted_is_left_out_of_forwarded_only() {
        let mut h = HeaderMap::new();
        let peer: IpAddr = "192.0.2.7".parse().expect("ip");
        let host = HeaderValue::from_static("evil\"; for=1.2.3.4");
        forwarded(&mut h, peer, Some(&host), false);
        assert_eq!(h["forwarded"], "for=192.0.2.7;proto=http");
        assert_eq!(h["x-forwarded-host"], host);
        let mut h = HeaderMap::new();
        forwarded(&mut h, peer, None, false);
        assert_eq!(h["forwarded"], "for=192.0.2.7;proto=http");
        assert!(!h.contains_key("x-forwarded-host"));
    }

    #[test]
    fn an_untrusted_client_cannot_write_forwarding_headers() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "evil.example"),
            ("forwarded", "for=6.6.6.6"),
            ("x-real-ip", "6.6.6.6"),
        ] {
            h.insert(k, HeaderValue::from_static(v));
        }
        let peer: IpAddr = "192.0.2.7".parse().expect("ip");
        forwarded(
            &mut h,
            peer,
            Some(&HeaderValue::from_static("api.example")),
            false,
        );
        assert_eq!(h["x-forwarded-for"], "192.0.2.7");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["x-forwarded-host"], "api.example");
        assert_eq!(
            h["forwarded"],
            "for=192.0.2.7;proto=http;host=\"api.example\""
        );
        assert_eq!(h["x-real-ip"], "192.0.2.7");
    }

    #[test]
    fn forwarding_headers_append_the_peer() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("1.1.1.1"));
        h.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        let host = HeaderValue::from_static("example.com");
        let peer: IpAddr = "::1".parse().expect("ip");
        forwarded(&mut h, peer, Some(&host), true);
        assert_eq!(h["x-forwarded-for"], "1.1.1.1, ::1");
        assert_eq!(
            h["forwarded"],
            "for=\"[::1]\";proto=http;host=\"example.com\""
        );
        assert_eq!(h["x-forwarded-host"], "example.com");
        // A trusted proxy's scheme is kept, not replaced.
        assert_eq!(h["x-forwarded-proto"], "https");
    }

    #[test]
    fn forwarded_names_every_address_as_rfc_7239_writes_it() {
        for ip in [
            "0.0.0.0",
            "255.255.255.255",
            "::",
            "2001:db8::7",
            "fe80::1:2:3:4",
            "2001:db8:1234:5678:9abc:def0:1234:5678",
        ] {
            let peer: IpAddr = ip.parse().expect("ip");
            let mut h = HeaderMap::new();
            forwarded(&mut h, peer, None, false);
            let want = match peer {
                IpAddr::V4(v4) => format!("for={v4};proto=http"),
                IpAddr::V6(v6) => format!("for=\"[{v6}]\";proto=http"),
            };
            assert_eq!(h["forwarded"], want.as_str());
            assert_eq!(h["x-forwarded-for"], ip);
        }
    }
}
