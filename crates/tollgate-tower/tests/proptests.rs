//! Property tests of what a client feeds the layer: request paths, forwarding headers, identity
//! headers and forward-auth headers. Each runs `PROPTEST_CASES` cases (default 256, fast
//! enough for every test run); `PROPTEST_CASES=100000 cargo nextest run -p tollgate-tower
//! --test proptests` is the long run.

use http::{HeaderMap, HeaderName, HeaderValue, Request};
use proptest::prelude::*;
use std::net::{IpAddr, SocketAddr};
use tollgate::quota::{Algorithm, Limit, Quota};
use tollgate::{IdentityHasher, Limiter, LimiterConfig, PolicySpec};
use tollgate_tower::forwarded::client_ip;
use tollgate_tower::{
    normalize_path, normalize_strict, ForwardAuth, ForwardHeader, IdentityConfig, IdentitySource,
    PeerAddr, RateLimitLayer, RoutedPolicy,
};

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    ProptestConfig::with_cases(cases)
}

/// Paths built from the pieces that matter: separators, dots, escapes (valid, stray,
/// double), parameters, backslashes, case, controls and non-ASCII.
fn path() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("/".to_string()),
        Just(".".to_string()),
        Just("..".to_string()),
        Just("%".to_string()),
        Just("%2F".to_string()),
        Just("%2f".to_string()),
        Just("%5C".to_string()),
        Just("%25".to_string()),
        Just("%2E".to_string()),
        Just("%00".to_string()),
        Just("%c0%af".to_string()),
        Just("%20".to_string()),
        Just(";".to_string()),
        Just("\\".to_string()),
        Just("?".to_string()),
        Just("#".to_string()),
        Just("é".to_string()),
        "%[0-9a-fA-F]{2}",
        "[a-zA-Z0-9~_-]{1,4}",
        "[\\x00-\\x7f]",
    ];
    proptest::collection::vec(piece, 0..12).prop_map(|v| v.concat())
}

fn segments_ok(p: &str) -> bool {
    p.starts_with('/')
        && !p.contains("//")
        && p.split('/').all(|s| s != "." && s != "..")
        && !p.split('/').any(|s| s.ends_with('.'))
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn normalisation_is_idempotent_and_resolves_every_dot_and_slash(p in path()) {
        let once = normalize_path(&p);
        prop_assert!(once.starts_with('/'));
        prop_assert_eq!(normalize_path(&once), once.clone());
        prop_assert!(!once.contains("//"), "{}", once);
        prop_assert!(once.split('/').all(|s| s != "." && s != ".."), "{}", once);
    }

    #[test]
    fn a_strict_path_never_contains_an_ambiguous_form(p in path()) {
        if let Ok(n) = normalize_strict(&p) {
            prop_assert!(segments_ok(&n), "{:?} -> {:?}", p, n);
            for bad in ["\\", ";", "%2F", "%5C", "%00", "%C0", "%C1"] {
                prop_assert!(!n.contains(bad), "{:?} -> {:?}", p, n);
            }
            // A server that decodes twice finds no escape in what is left.
            let double = n.match_indices("%25").any(|(i, _)| {
                n.as_bytes().get(i + 3..i + 5).is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
            });
            prop_assert!(!double, "{:?} -> {:?}", p, n);
            prop_assert!(!n.bytes().any(|b| b < 0x20 || b == 0x7f), "{:?}", n);
            prop_assert_eq!(normalize_strict(&n), Ok(n.clone()));
            prop_assert_eq!(normalize_path(&p), n);
        }
    }

    #[test]
    fn a_query_never_changes_the_path(p in path(), q in "[ -~]{0,30}") {
        let base = normalize_path(&p);
        prop_assert_eq!(normalize_path(&format!("{base}?{q}")), base.clone());
        prop_assert_eq!(normalize_path(&format!("{base}#{q}")), base);
    }

    #[test]
    fn encoding_an_unreserved_character_changes_nothing(
        segs in proptest::collection::vec("[a-zA-Z0-9~_-]{1,6}", 1..5),
        which in any::<proptest::sample::Index>(),
    ) {
        let plain = format!("/{}", segs.join("/"));
        let i = which.index(plain.len());
        let b = plain.as_bytes()[i];
        let encoded = if b == b'/' {
            plain.clone()
        } else {
            format!("{}%{:02X}{}", &plain[..i], b, &plain[i + 1..])
        };
        prop_assert_eq!(normalize_strict(&encoded), normalize_strict(&plain));
    }

    #[test]
    fn forwarding_headers_never_make_an_untrusted_peer_someone_else(
        values in proptest::collection::vec("[ -~]{0,60}", 0..4),
        forwarded in any::<bool>(),
        peer_trusted in any::<bool>(),
    ) {
        let header = if forwarded { ForwardHeader::Forwarded } else { ForwardHeader::XForwardedFor };
        let mut h = HeaderMap::new();
        for v in &values {
            if let Ok(v) = HeaderValue::from_str(v) {
                h.append(header.name(), v);
            }
        }
        let peer: IpAddr = "10.1.2.3".parse().expect("ip");
        let trusted: Vec<ipnet::IpNet> = if peer_trusted {
            vec!["10.0.0.0/8".parse().expect("net")]
        } else {
            Vec::new()
        };
        let got = client_ip(peer, &h, header, &tollgate_tower::Trust::new(trusted, 64));
        if !peer_trusted {
            prop_assert_eq!(got, peer);
        } else if got != peer {
            // Whatever was picked was written in the header.
            let text = values.join(",");
            let shown = got.to_string();
            prop_assert!(text.contains(&shown) || text.to_ascii_lowercase().contains(&shown)
                || matches!(got, IpAddr::V4(_)) && text.contains("::ffff:"), "{} from {:?}", got, values);
        }
    }

    #[test]
    fn an_identity_is_its_value_alone(a in proptest::collection::vec(any::<u8>(), 1..64),
                                      b in proptest::collection::vec(any::<u8>(), 1..64)) {
        let hasher = IdentityHasher::new(b"p");
        let c = IdentityConfig {
            sources: vec!["header:x-api-key".parse().expect("source"), IdentitySource::Ip],
            ..IdentityConfig::default()
        };
        let key = |v: &[u8]| {
            let mut h = HeaderMap::new();
            if let Ok(v) = HeaderValue::from_bytes(v) {
                h.insert("x-api-key", v);
            }
            c.client_key(&hasher, None, "192.0.2.1".parse().ok(), &h)
        };
        prop_assert_eq!(key(&a), key(&a));
        let valid = |v: &[u8]| HeaderValue::from_bytes(v).is_ok();
        if a != b && valid(&a) && valid(&b) {
            prop_assert_ne!(key(&a), key(&b));
        }
    }
}

fn layer() -> RateLimitLayer {
    let limiter = Limiter::new(LimiterConfig::default());
    let limit = Limit::new(
        Algorithm::FixedWindow,
        Quota::per_hour(1_000_000).expect("quota"),
    )
    .expect("limit");
    let policy = limiter
        .policy(PolicySpec::new("api", limit))
        .expect("policy");
    RateLimitLayer::new(limiter, IdentityHasher::new(b"p"))
        .identity(IdentityConfig {
            sources: vec![
                "header:x-api-key".parse().expect("source"),
                IdentitySource::Ip,
            ],
            trust: tollgate_tower::Trust::new(vec!["127.0.0.0/8".parse().expect("net")], 64),
            ..IdentityConfig::default()
        })
        .forward_auth(Some(ForwardAuth {
            uri_header: HeaderName::from_static("x-original-uri"),
            ..ForwardAuth::default()
        }))
        .policy(RoutedPolicy::new(policy).path_prefix("/api"))
}

/// Header values as a forward-auth proxy or a client might write them.
fn header_value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        path().prop_map(String::into_bytes),
        proptest::collection::vec(any::<u8>(), 0..20),
        "[A-Z]{1,7}".prop_map(String::into_bytes),
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn the_layer_refuses_or_decides_but_never_panics(
        p in path(),
        headers in proptest::collection::vec(
            (prop_oneof![
                Just("x-api-key"), Just("x-original-uri"), Just("x-forwarded-method"),
                Just("x-forwarded-uri"), Just("x-forwarded-for")
            ], header_value()),
            0..5,
        ),
        trusted in any::<bool>(),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
        let Ok(mut req) = Request::builder().uri(p.as_str()).body(()) else {
            return Ok(()); // not a request target hyper would hand over
        };
        for (name, value) in &headers {
            if let Ok(v) = HeaderValue::from_bytes(value) {
                req.headers_mut().append(*name, v);
            }
        }
        let peer: SocketAddr = if trusted { "127.0.0.1:1" } else { "192.0.2.9:1" }
            .parse()
            .expect("addr");
        req.extensions_mut().insert(PeerAddr(peer));
        let l = layer();
        let got = rt.block_on(l.check_request(&req));
        let keys = req.headers().get_all("x-api-key").iter().count();
        if keys > 1 {
            prop_assert!(got.is_err(), "two keys must be refused");
        }
        if !trusted && keys <= 1 && normalize_strict(req.uri().path()).is_ok() {
            prop_assert!(got.is_ok(), "{:?}: {:?}", p, got);
        }
        if let Err(e) = got {
            prop_assert!(!e.to_string().is_empty());
        }
    }
}
